"""Full-length LeNet training with Caffe's own solver settings on Caffe's LMDBs reaches the
test accuracy real Caffe reached (lenet_train.log: 0.9815 at 2000 iterations), and
continuing from Caffe's own iteration-1000 snapshot ends where Caffe's resumed run did, and
so does training with every batch split across two devices.
So does LeNet with bf16 GEMMs, to within 0.3 point.
These are the slowest tests in the suite (tens of seconds each)."""
import re
import shutil

import pytest

from cct.api import Solver
from cct.backend import precision
from cct.install import install_hint
from cct.io.prototxt import read_solver_text
from cct.proto import caffe_pb2

CAFFE_FINAL_ACCURACY = 0.9815  # lenet_train.log and lenet_resume.log, iteration 2000


@pytest.fixture
def lenet_dir(caffe_fixtures, tmp_path, monkeypatch):
    for name in ("lenet_train_test.prototxt", "lenet_solver.prototxt", "mnist10k_train_lmdb",
                 "mnist10k_test_lmdb", "lenet_iter_1000.caffemodel",
                 "lenet_iter_1000.solverstate"):
        src = caffe_fixtures / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(resume, capfd, devices=None, precision=None) -> float:
    param = read_solver_text("lenet_solver.prototxt")
    if precision is not None:
        param.precision = precision
    param.test_interval = param.max_iter  # test once, at the end
    param.test_initialization = False
    param.snapshot = 0
    param.snapshot_after_train = False
    solver = Solver(param, source="lenet_solver.prototxt", devices=devices)
    try:
        capfd.readouterr()
        if resume:
            solver.restore(resume)
        solver.solve()
    finally:
        solver.close()
    log = capfd.readouterr().err
    return float(re.findall(r"Test net output #0: accuracy = ([\d.]+)", log)[-1])


def test_lenet_2000_iterations_reaches_caffes_accuracy(lenet_dir, capfd):
    accuracy = run(None, capfd)
    print(f"cct LeNet accuracy at 2000: {accuracy} (Caffe: {CAFFE_FINAL_ACCURACY})")
    assert abs(accuracy - CAFFE_FINAL_ACCURACY) <= 0.005


def test_resuming_caffes_snapshot_ends_where_caffe_did(lenet_dir, capfd):
    accuracy = run("lenet_iter_1000.solverstate", capfd)
    print(f"cct accuracy after resuming Caffe's 1000 to 2000: {accuracy}")
    assert abs(accuracy - CAFFE_FINAL_ACCURACY) <= 0.005


def test_lenet_split_across_two_devices_reaches_caffes_accuracy(lenet_dir, capfd):
    """The hybrid scheduler (every batch split over two 1-core CPU devices in proportion to
    their measured speed) trains as well as one device: its update is the whole batch's."""
    from cct.devices import CPUDevice, available_cores
    cores = available_cores()
    accuracy = run(None, capfd, devices=[CPUDevice([cores[0]]), CPUDevice([cores[-1]])])
    print(f"cct LeNet on two devices, accuracy at 2000: {accuracy}")
    assert abs(accuracy - CAFFE_FINAL_ACCURACY) <= 0.005


@pytest.mark.skipif(not precision.has_engine(),
                    reason=f"no bf16 GEMM engine: {install_hint('bf16')} (MKL)")
def test_lenet_in_bf16_reaches_float32_accuracy(lenet_dir, capfd, monkeypatch):
    """bf16 GEMMs (emulated where the CPU has no bf16 units: the same numerics) train LeNet to
    within 0.3 point of float32's accuracy (Caffe's, which cct's float32 reaches above)."""
    monkeypatch.setenv("CCT_BF16", "emulate")
    try:
        accuracy = run(None, capfd, precision=caffe_pb2.SolverParameter.BF16)
    finally:
        precision.set_precision("float32")
    print(f"cct LeNet in bf16, accuracy at 2000: {accuracy} (float32: {CAFFE_FINAL_ACCURACY})")
    assert accuracy >= CAFFE_FINAL_ACCURACY - 0.003


def test_resuming_caffes_snapshot_on_the_device_ends_where_caffe_did(lenet_dir, capfd):
    """The GPU path (the CuPy-rules stand-in: ``-gpu 0`` without a GPU) resumes Caffe's
    snapshot and ends at Caffe's accuracy."""
    from cct.devices import StandInDevice
    accuracy = run("lenet_iter_1000.solverstate", capfd, devices=[StandInDevice()])
    print(f"cct on the device stand-in, Caffe's 1000 to 2000: {accuracy}")
    assert abs(accuracy - CAFFE_FINAL_ACCURACY) <= 0.005
