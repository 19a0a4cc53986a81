"""The device side of the command line without a GPU: device_query on the CPU, -gpu as a
clear error (Caffe's CPU-only build stops there too), and a solver's solver_mode: GPU that
falls back to the CPU with one warning."""
import subprocess
import sys

import pytest

from cct.backend import gpu


def cct(*args, cwd):
    return subprocess.run([sys.executable, "-m", "cct.cli", *args], cwd=cwd,
                          capture_output=True, text=True)


needs_no_gpu = pytest.mark.skipif(gpu.available()[0], reason="a GPU is usable here; these "
                                  "tests check the fallback on machines without one")


def test_device_query_on_the_cpu_measures_it(tmp_path):
    run = cct("device_query", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "Querying CPU" in run.stderr
    line = [l for l in run.stderr.splitlines() if "Measured SGEMM:" in l][0]
    assert float(line.split("Measured SGEMM:")[1].split()[0]) > 0


@needs_no_gpu
def test_device_query_gpu_without_one_says_why(tmp_path):
    run = cct("device_query", "-gpu", "0", cwd=tmp_path)
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("cct: error: device_query -gpu 0: ") and "pip install" in last
    assert "Traceback" not in run.stderr


NET = """name: "t"
layer { name: "d" type: "DummyData" top: "x" top: "y"
        dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 }
                           data_filler { type: "gaussian" } data_filler { type: "constant" } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip"
        inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "y" top: "loss" }
"""


@needs_no_gpu
@pytest.mark.parametrize("command", ["time", "test", "train"])
def test_an_explicit_gpu_flag_without_a_gpu_is_an_error(tmp_path, command):
    """-gpu asks for a GPU in so many words: Caffe's CPU-only build stops there too."""
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text('net: "net.prototxt" base_lr: 0.1 '
                                              'lr_policy: "fixed" max_iter: 2')
    what = {"time": ["--model=net.prototxt", "--iterations=1"],
            "test": ["--model=net.prototxt", "--weights=w.caffemodel", "--iterations=1"],
            "train": ["--solver=solver.prototxt"]}[command]
    run = cct(command, *what, "-gpu", "0", cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"cct: error: {command}: -gpu 0 asks for a GPU, but ")
    # The reason, up to the install hint (whose path follows the folder it runs in).
    assert gpu.available()[1].split("; to use a GPU")[0] in last
    assert "Leave out -gpu to run on the CPU." in last


@needs_no_gpu
def test_solver_mode_gpu_falls_back_to_the_cpu_once(tmp_path):
    """Caffe's own example solvers say solver_mode: GPU and must train on machines without
    one."""
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text('net: "net.prototxt" base_lr: 0.1 '
                                              'lr_policy: "fixed" max_iter: 2 display: 1 '
                                              'solver_mode: GPU')
    run = cct("train", "--solver=solver.prototxt", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr.count("Running on the CPU") == 1 and "Use CPU." in run.stderr
    assert "solver_mode: GPU (device_id 0): GPU devices asked for, but" in run.stderr
    assert "Optimization Done." in run.stderr
    bad = cct("train", "--solver=solver.prototxt", "-gpu", "zero", cwd=tmp_path)
    assert bad.returncode == 1 and "-gpu takes GPU ids" in bad.stderr


def test_test_and_time_run_on_one_device_of_devices(tmp_path):
    """``cct test`` and ``cct time`` take cct's -devices with one device: on the stand-in (the
    GPU path without a GPU) the same scores as on the CPU; several devices are refused."""
    (tmp_path / "solver.prototxt").write_text('net: "net.prototxt" base_lr: 0.1 random_seed: 1 '
                                              'lr_policy: "fixed" max_iter: 2 '
                                              'snapshot_prefix: "w"')
    # Constant inputs: each run draws DummyData's gaussian afresh, unseeded, as Caffe does.
    (tmp_path / "net.prototxt").write_text(NET.replace(
        'data_filler { type: "gaussian" } data_filler { type: "constant" }',
        'data_filler { type: "constant" value: 0.5 } data_filler { type: "constant" value: 1 }'))
    assert cct("train", "--solver=solver.prototxt", cwd=tmp_path).returncode == 0
    scores = []
    for extra in ([], ["--devices=standin"]):
        run = cct("test", "--model=net.prototxt", "--weights=w_iter_2.caffemodel",
                  "--iterations=3", *extra, cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        scores.append([l.split("] ", 1)[1] for l in run.stderr.splitlines()
                       if "caffe.cpp" in l and "loss =" in l])
    assert scores[0] and len(scores[0]) == len(scores[1])
    assert "Use device standin." in run.stderr
    for want, got in zip(*scores):
        assert float(got.rsplit("=", 1)[1].split()[0]) == pytest.approx(
            float(want.rsplit("=", 1)[1].split()[0]), rel=1e-5)
    timed = cct("time", "--model=net.prototxt", "--iterations=2", "--devices=standin",
                cwd=tmp_path)
    assert timed.returncode == 0 and "Average Forward-Backward" in timed.stderr
    bad = cct("test", "--model=net.prototxt", "--weights=w_iter_2.caffemodel",
              "--devices=cpu:1,standin", cwd=tmp_path)
    assert bad.returncode == 1 and "runs one net on one device" in bad.stderr
    assert "Traceback" not in bad.stderr
