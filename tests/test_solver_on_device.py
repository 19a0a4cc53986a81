"""The solver on a device backend (issue 28): all six of Caffe's solvers and every lr policy
give the CPU's numbers on the CuPy-rules stand-in (the ``numpy`` backend, the GPU path without
a GPU); a device run's snapshot resumes on the CPU and a CPU run's on the device, each the
continuous run's numbers; ``cct train --devices=standin`` is the one-device path (``-gpu 0``),
LeNet-style, with Caffe's log; pycaffe's arrays over a device solver are host arrays."""
import subprocess
import sys

import numpy as np
import pytest

from cct.api import Solver
from cct.backend import gpu, host, plans

from .test_scheduler import assert_same_params, data_list, solver_param  # noqa: F401

GPU_OK, GPU_REASON = gpu.available()
DEVICES = ["numpy", pytest.param("gpu", marks=pytest.mark.skipif(
    not GPU_OK, reason=f"no usable GPU: {GPU_REASON}"))]

SOLVERS = [("SGD", {}), ("Nesterov", {}), ("AdaGrad", dict(momentum=0.0)),
           ("RMSProp", dict(momentum=0.0, rms_decay=0.98)),
           ("AdaDelta", dict(base_lr=1.0, momentum=0.95, delta=1e-6)),
           ("Adam", dict(base_lr=0.01, momentum=0.9, momentum2=0.999))]
POLICIES = [dict(lr_policy="step", gamma=0.5, stepsize=2), dict(lr_policy="exp", gamma=0.9),
            dict(lr_policy="inv", gamma=0.01, power=0.75),
            dict(lr_policy="multistep", gamma=0.5), dict(lr_policy="poly", power=2.0),
            dict(lr_policy="sigmoid", gamma=0.5, stepsize=3)]


def params_of(solver):
    return [np.array(host(p.data)) for p in solver.net.learnable_params]


def _run(param, backend, iters=4):
    solver = Solver(param, backend=backend)
    try:
        solver.step(iters)
        return params_of(solver), [np.array(host(h)) for h in solver.history]
    finally:
        solver.close()


def _param(data_list, tmp_path, **fields):
    param = solver_param(data_list, tmp_path, display=0)
    for k, v in fields.items():
        setattr(param, k, v)
    if param.lr_policy == "multistep":
        param.stepvalue.extend([1, 3])
    return param


@pytest.mark.parametrize("backend", DEVICES)
@pytest.mark.parametrize("kind,fields", SOLVERS, ids=[s[0] for s in SOLVERS])
def test_every_solver_gives_the_cpus_numbers(data_list, tmp_path, kind, fields,  # noqa: F811
                                             backend):
    param = _param(data_list, tmp_path, type=kind, **fields)
    want, want_history = _run(param, "cpu")
    got, got_history = _run(param, backend)
    assert_same_params(want, got, rtol=1e-4)
    assert len(got_history) == len(want_history)
    assert_same_params(want_history, got_history, rtol=1e-3)


@pytest.mark.parametrize("backend", DEVICES)
@pytest.mark.parametrize("fields", POLICIES, ids=[p["lr_policy"] for p in POLICIES])
def test_every_lr_policy_gives_the_cpus_numbers(data_list, tmp_path, fields,  # noqa: F811
                                                backend):
    param = _param(data_list, tmp_path, max_iter=6, **fields)
    assert_same_params(_run(param, "cpu", 6)[0], _run(param, backend, 6)[0], rtol=1e-4)


@pytest.mark.parametrize("backend", DEVICES)
@pytest.mark.parametrize("kind,fields", SOLVERS, ids=[s[0] for s in SOLVERS])
def test_the_update_object_is_apply_update_on_the_device(data_list, tmp_path, kind,  # noqa: F811
                                                         fields, backend, request):
    """The loop in pieces with the solver's update and schedule called directly (as the
    drivers do: a history of one's own, the rate from ``learning_rate``) is ``step`` on the
    same backend, to the bit (deterministic plans: cuDNN's fastest weight-gradient engines
    add with atomics, in another order each run, as Caffe's do)."""
    param = _param(data_list, tmp_path, type=kind, lr_policy="multistep", gamma=0.5,
                   **fields)   # stepvalue 1, 3
    was = plans.deterministic()
    plans.set_deterministic(True)
    request.addfinalizer(lambda: plans.set_deterministic(was))
    want, want_history = _run(param, backend)
    solver = Solver(param, backend=backend)
    try:
        history = solver.update.init(solver.params)
        for _ in range(4):
            solver.begin_iteration()
            solver.record_loss(solver.compute_gradients())
            solver.update.apply(history, solver.params, solver.learning_rate(), solver.iter)
            solver.end_iteration()
        assert solver.current_step == 2
        for a, b in zip(want + want_history, params_of(solver) + [host(h) for h in history]):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    finally:
        solver.close()


@pytest.mark.parametrize("backend", DEVICES)
@pytest.mark.parametrize("first,then", [("device", "cpu"), ("cpu", "device")])
@pytest.mark.parametrize("fmt", ["BINARYPROTO", "HDF5"])
def test_a_snapshot_resumes_on_the_other_side(data_list, tmp_path, first, then,  # noqa: F811
                                              fmt, backend):
    """Caffe's files carry no device: 3 iterations on one side, a snapshot, 3 more on the
    other after restoring it, are 6 continuous iterations on the CPU."""
    from cct.proto import caffe_pb2
    param = _param(data_list, tmp_path, max_iter=6, snapshot=3,
                   snapshot_format=getattr(caffe_pb2.SolverParameter, fmt))
    side = {"device": backend, "cpu": "cpu"}
    want, _ = _run(param, "cpu", 6)
    solver = Solver(param, backend=side[first])
    try:
        solver.step(3)          # writes the iteration-3 snapshot
    finally:
        solver.close()
    state = f"{param.snapshot_prefix}_iter_3.solverstate" + (".h5" if fmt == "HDF5" else "")
    solver = Solver(param, backend=side[then])
    try:
        solver.restore(state)
        solver.step(3)
        assert solver.iter == 6
        assert_same_params(want, params_of(solver), rtol=1e-4)
    finally:
        solver.close()


def test_pycaffe_arrays_of_a_device_solver_are_host_arrays(data_list, tmp_path):  # noqa: F811
    solver = Solver(_param(data_list, tmp_path), backend="numpy")
    try:
        solver.step(1)
        for blob in solver.net.blobs.values():
            assert type(blob.data) is np.ndarray and type(blob.diff) is np.ndarray
        for blobs in solver.net.params.values():
            for b in blobs:
                b.data[...] *= 0.5      # written on the host, used by the next step
        w = solver.net.params["ip"][0].data.copy()
        solver.step(1)
        assert not np.array_equal(solver.net.params["ip"][0].data, w)
        assert np.isfinite(solver.net.params["ip"][0].data).all()
    finally:
        solver.close()


def test_cct_train_on_the_stand_in_device(data_list, tmp_path):  # noqa: F811
    """``--devices=standin`` is the one-device path, as ``-gpu 0`` is on a GPU: Caffe's log,
    the snapshots, and the CPU's loss to float32 rounding."""
    param = _param(data_list, tmp_path, max_iter=4, display=1, snapshot=4)
    (tmp_path / "solver.prototxt").write_text(str(param))
    want = subprocess.run([sys.executable, "-m", "cct.cli", "train", "--solver=solver.prototxt"],
                          cwd=tmp_path, capture_output=True, text=True)
    got = subprocess.run([sys.executable, "-m", "cct.cli", "train", "--solver=solver.prototxt",
                          "--devices=standin"], cwd=tmp_path, capture_output=True, text=True)
    assert want.returncode == 0 and got.returncode == 0, got.stderr[-2000:]
    assert "Traceback" not in got.stderr

    def losses(log):
        return [float(line.rsplit("=", 1)[1]) for line in log.splitlines()
                if "solver.cpp" in line and ", loss = " in line]
    assert len(losses(got.stderr)) == len(losses(want.stderr)) >= 4
    np.testing.assert_allclose(losses(got.stderr), losses(want.stderr), rtol=1e-5)
    assert (tmp_path / "snap_iter_4.caffemodel").is_file()
    assert "Optimization Done." in got.stderr


def test_cct_train_splits_batches_with_the_device(data_list, tmp_path):  # noqa: F811
    """``--devices=cpu:1,standin`` (the hybrid scheduler with a device): the whole batch's
    update, so the CPU's losses to float32 rounding, and no device dropped."""
    param = _param(data_list, tmp_path, max_iter=4, display=1)
    (tmp_path / "solver.prototxt").write_text(str(param))
    runs = [subprocess.run([sys.executable, "-m", "cct.cli", "train",
                            "--solver=solver.prototxt"] + extra, cwd=tmp_path,
                           capture_output=True, text=True)
            for extra in ([], ["--devices=cpu:1,standin"])]
    assert [r.returncode for r in runs] == [0, 0], runs[1].stderr[-2000:]
    assert "failed" not in runs[1].stderr and "Traceback" not in runs[1].stderr

    def losses(log):
        return [float(line.rsplit("=", 1)[1]) for line in log.splitlines()
                if "solver.cpp" in line and ", loss = " in line]
    np.testing.assert_allclose(losses(runs[1].stderr), losses(runs[0].stderr), rtol=1e-4)


# -- no waiting for the device inside an iteration ---------------------------------------------
def _iterations(solver, count: int) -> None:
    """``count`` iterations in the pieces a driver calls (no final read, as step has)."""
    solver.start_steps()
    for _ in range(count):
        solver.begin_iteration()
        solver.record_loss(solver.compute_gradients())
        solver.apply_update()
        solver.end_iteration()


def test_a_device_iteration_copies_nothing_to_the_host_until_the_loss_is_read(
        data_list, tmp_path):  # noqa: F811
    """The loss and SoftmaxWithLoss's label check stay on the device (a host copy waits for
    the GPU): iterations without a display line copy nothing back; the losses of all of them
    come back in one copy, and give the smoothed loss the CPU gives. (The CUDA graph's
    capture reads its one check of the graph against an eager pass: the warm-up takes the
    run past it.)"""
    from cct.backend import npdevice
    from cct.graphed import WARMUP

    param = _param(data_list, tmp_path, display=0, average_loss=3)
    solver = Solver(param, backend="numpy")
    cpu = Solver(param, backend="cpu")
    try:
        solver.step(WARMUP + 1)   # kernels and index arrays built, data read, graph captured
        cpu.step(WARMUP + 1)
        assert solver.gradient_source.graph is not None
        with npdevice.copies.counting() as copies:
            _iterations(solver, 5)
            assert copies.to_host == 0
            solver.read_pending_losses()
            assert copies.to_host == 1
        _iterations(cpu, 5)
        np.testing.assert_allclose(float(solver.smoothed_loss), float(cpu.smoothed_loss),
                                   rtol=1e-5)
    finally:
        solver.close()
        cpu.close()


def test_a_deferred_nan_names_the_iteration_it_came_from(data_list, tmp_path):  # noqa: F811
    """A loss read late still stops the run at the iteration it came from, before any
    snapshot of the weights it reached."""
    from cct.errors import CCTError

    param = _param(data_list, tmp_path, display=0, base_lr=1e30, max_iter=40, snapshot=20)
    solver = Solver(param, backend="numpy")
    try:
        with pytest.raises(CCTError, match=r"loss is (NaN|infinite) at iteration (\d+)") as e:
            solver.solve()
        iteration = int(e.value.args[0].split("at iteration ")[1].split(";")[0])
        assert iteration < 20 and not (tmp_path / "snap_iter_20.caffemodel").exists()
    finally:
        solver.close()


def test_a_bad_label_on_the_device_is_the_layers_error(tmp_path):
    """SoftmaxWithLoss's label check on the device, read with the loss: the same error as
    on the CPU, naming the layer and the label."""
    import h5py

    from cct.errors import CCTError
    from .test_scheduler import solver_param as scheduler_param

    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["data"] = np.zeros((64, 2, 10, 10), np.float32)
        f["label"] = np.full(64, 7, np.float32)          # the net has 5 classes
        f["target"] = np.zeros((64, 3), np.float32)
    (tmp_path / "list.txt").write_text(f"{tmp_path / 'd.h5'}\n")
    param = scheduler_param(tmp_path / "list.txt", tmp_path, display=0)
    messages = []
    for backend in ("cpu", "numpy"):
        solver = Solver(param, backend=backend)
        try:
            with pytest.raises(CCTError, match="label 7 is out of range") as e:
                solver.step(3)
            messages.append(str(e.value))
        finally:
            solver.close()
    assert messages[0] == messages[1]
