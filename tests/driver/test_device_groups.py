"""The driver's strategies with a group on a device (issue 28): every strategy on the threads
engine with one group on the CuPy-rules stand-in (``standin``, the GPU path without a GPU),
giving the CPU's numbers; one group per device when ``--devices`` names several and
``--groups`` is not given; a programming error in a group stops the run instead of passing
for a lost device; and the copies one synchronous device iteration makes."""
import re

import numpy as np
import pytest

from cct.api import Solver
from cct.backend import npdevice
from cct.devices import CPUDevice, StandInDevice, available_cores, parse_devices
from cct.driver import AsyncDriver

from ..test_scheduler import assert_same_params, data_list, params_of, solver_param  # noqa: F401
from .test_driver import driven, losses, plain

STRATEGIES = ["async", "hogbatch", "adaptive-hogbatch", "sma"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_one_group_on_the_device_gives_the_cpus_numbers(data_list, tmp_path, capfd,  # noqa: F811
                                                        strategy):
    """One group (SMA: one learner) on the device is the same group on CPU cores, loss for
    loss, to float32 rounding (the device's kernels sum in another order); for the parameter
    store's strategies both are plain training."""
    param = solver_param(data_list, tmp_path)
    cpu = [CPUDevice(available_cores()[:1])]
    want_params, want_losses, _ = driven(param, capfd, 6, strategy=strategy, devices=cpu,
                                          groups=None)
    got_params, got_losses, _ = driven(param, capfd, 6, strategy=strategy, groups=None,
                                        devices=[StandInDevice()])
    assert len(got_losses) == 6
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
    assert_same_params(want_params, got_params, rtol=1e-4)
    if strategy != "sma":
        plain_params, plain_losses = plain(param, capfd, 6)
        np.testing.assert_allclose(got_losses, plain_losses, rtol=1e-5)
        assert_same_params(plain_params, got_params, rtol=1e-4)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_cpu_group_and_a_device_group_train_together(data_list, tmp_path, capfd,  # noqa: F811
                                                       strategy):
    """``--devices=cpu:1,standin`` without ``--groups``: one group per device, said in the log;
    both groups' updates (or learners' rounds) reach the store."""
    param = solver_param(data_list, tmp_path, display=3)
    devices = [CPUDevice(available_cores()[:1]), StandInDevice()]
    sizes = "cpu:4,standin:8" if strategy != "async" else None
    solver = Solver(param)
    driver = AsyncDriver(solver, groups=None, devices=devices, strategy=strategy,
                         batch_sizes=sizes)
    try:
        assert [[d.name for d in g.devices] for g in driver.groups] == \
            [[devices[0].name], ["standin"]]
        driver.step(6)
        log = capfd.readouterr().err
        assert "One compute group per device: cpu:" in log and ", standin (--groups=1" in log
        got = losses(log)
        assert got and all(np.isfinite(got))
        if strategy != "sma":
            counts = re.findall(r"Updates by group: group 0 (\d+) .*group 1 (\d+)", log)
            if strategy == "async":
                counts = [(1, 1)]   # async logs no balance lines; it ran without a drop
            assert counts and all(int(a) > 0 and int(b) > 0 for a, b in counts[-1:])
        assert "failed and is dropped" not in log
        for p in params_of(solver):
            assert np.isfinite(p).all()
    finally:
        driver.close()
        solver.close()


def test_groups_name_a_hybrid_group_explicitly(data_list, tmp_path):  # noqa: F811
    """``--groups=1`` with two devices is one group splitting each batch between them."""
    solver = Solver(solver_param(data_list, tmp_path, display=0))
    driver = AsyncDriver(solver, groups=1, devices=[CPUDevice(available_cores()[:1]),
                                                    StandInDevice()])
    try:
        assert len(driver.groups) == 1 and len(driver.groups[0].devices) == 2
        driver.step(2)
    finally:
        driver.close()
        solver.close()


def test_a_bug_in_a_group_stops_the_run(data_list, tmp_path, capfd):  # noqa: F811
    """A TypeError from code is a bug, not a lost device: it propagates with its traceback
    after a loud line, and no group is quietly dropped."""
    solver = Solver(solver_param(data_list, tmp_path))
    driver = AsyncDriver(solver, groups=2, devices=[CPUDevice(available_cores()[:1]),
                                                    StandInDevice()])
    try:
        def broken(fed=False):
            raise TypeError("Implicit conversion to a NumPy array is not allowed")
        driver.groups[1].compute = broken
        with pytest.raises(TypeError, match="Implicit conversion"):
            driver.step(4)
        assert "This is a bug (in cct or a Python layer), not a lost device" in \
            capfd.readouterr().err
    finally:
        driver.close()
        solver.close()


def test_a_device_lost_is_still_dropped(data_list, tmp_path, capfd):  # noqa: F811
    """A device's own failure (CuPy raises RuntimeError subclasses for a lost GPU) keeps the
    drop-and-go-on rule."""
    solver = Solver(solver_param(data_list, tmp_path))
    driver = AsyncDriver(solver, groups=2, devices=[CPUDevice(available_cores()[:1]),
                                                    StandInDevice()])
    try:
        def lost(fed=False):
            raise RuntimeError("cudaErrorDevicesUnavailable: CUDA-capable device(s) is/are busy")
        driver.groups[1].compute = lost
        driver.step(4)
        assert "group 1 (standin) failed and is dropped" in capfd.readouterr().err
    finally:
        driver.close()
        solver.close()


def test_standin_is_a_device_spelling():
    devices = parse_devices("cpu:1,standin")
    assert [type(d) for d in devices] == [CPUDevice, StandInDevice]
    assert devices[1].backend == "numpy" and not devices[1].host_memory


def test_a_synchronous_device_iteration_copies_no_weights(data_list, tmp_path):  # noqa: F811
    """Plain training on the device (``-gpu`` with one GPU): an iteration copies its batch in
    and the loss out, never a weight, a gradient or a history."""
    solver = Solver(solver_param(data_list, tmp_path, display=0), backend="numpy")
    try:
        solver.step(1)      # the first iteration builds index arrays and buffers
        params = {int(np.prod(p.shape)) * 4 for p in solver.net.learnable_params}
        batch = sum(int(np.prod(solver.net.blobs[n].shape)) * 4
                    for n in ("data", "label", "target"))
        with npdevice.copies.counting() as copies:
            solver.step(1)
        assert copies.bytes_to_device == batch, copies.sizes
        assert copies.bytes_to_host <= 64, copies.sizes       # the loss and its counts
        assert not params & {n for _, n in copies.sizes if n > 64}, copies.sizes
    finally:
        solver.close()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_device_group_in_its_own_process(data_list, tmp_path, capfd, strategy):  # noqa: F811
    """The processes engine builds a device group's net on its device in the group's process
    (a GPU made current there): the same numbers as a CPU group's process."""
    param = solver_param(data_list, tmp_path, display=0)
    want, want_losses, _ = driven(param, capfd, 4, strategy=strategy, engine="processes",
                                   devices="cpu:1", groups=None)
    got, got_losses, _ = driven(param, capfd, 4, strategy=strategy, engine="processes",
                                 devices="standin", groups=None)
    assert_same_params(want, got, rtol=1e-4)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)


def test_the_processes_engine_refuses_a_group_mixing_a_device(data_list, tmp_path):  # noqa: F811
    from cct.errors import CCTError
    solver = Solver(solver_param(data_list, tmp_path))
    try:
        with pytest.raises(CCTError, match="use --engine=threads"):
            AsyncDriver(solver, groups=1, engine="processes", devices="cpu:1,standin")
    finally:
        solver.close()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_device_group_on_the_simulated_engine(data_list, tmp_path, capfd, strategy):  # noqa: F811
    """Simulated staleness with a group on the device (the groups take turns, each on its own
    device's thread): the numbers of the same schedule with both groups on the CPU."""
    param = solver_param(data_list, tmp_path, display=0)
    sizes = None if strategy == "async" else "4,8"
    cores = available_cores()
    want, want_losses, _ = driven(param, capfd, 6, strategy=strategy, engine="simulated",
                                   groups=2, batch_sizes=sizes)
    got, got_losses, _ = driven(param, capfd, 6, strategy=strategy, engine="simulated",
                                 groups=None, batch_sizes=sizes,
                                 devices=[CPUDevice(cores[:1]), StandInDevice()])
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-4)
    assert_same_params(want, got, rtol=1e-3)


def test_a_device_given_no_images_makes_no_copies(data_list, tmp_path):  # noqa: F811
    """The hybrid split with the device's share 0 (a slow device left out): it costs no
    host<->device copy at all, its weights are not even sent."""
    from cct.scheduler import HybridScheduler
    solver = Solver(solver_param(data_list, tmp_path, display=0))
    try:
        solver.set_gradient_source(HybridScheduler(
            solver.net, [CPUDevice(available_cores()[:1]), StandInDevice()], split=[16, 0]))
        solver.step(1)
        with npdevice.copies.counting() as copies:
            solver.step(2)
        assert copies.sizes == []
    finally:
        solver.close()


@pytest.mark.parametrize("split,weights_cross", [([0, 16], False), ([8, 8], True)])
def test_the_master_on_the_device_copies_only_the_cpus_share(data_list, tmp_path, split,  # noqa: F811
                                                            weights_cross):
    """With a device of its own memory among the devices, the master (weights, update, the
    gradients' sum) lives on it and its replica shares the master's weights: a split that
    gives it every image copies no weight and no gradient (the batch comes from the host);
    one that gives the CPU a share sends the CPU replica the weights and takes its gradient
    back, once each."""
    from cct.scheduler import HybridScheduler, master_place
    devices = [CPUDevice(available_cores()[:1]), StandInDevice()]
    devices, backend = master_place(devices, "cpu")
    assert backend == "numpy" and len(devices) == 2
    solver = Solver(solver_param(data_list, tmp_path, display=0), backend=backend)
    try:
        solver.set_gradient_source(HybridScheduler(solver.net, devices, split=split))
        solver.step(1)
        model = sum(int(np.prod(p.shape)) * 4 for p in solver.net.learnable_params)
        with npdevice.copies.counting() as copies:
            solver.step(1)
        params = {int(np.prod(p.shape)) * 4 for p in solver.net.learnable_params}
        crossed = [n for _, n in copies.sizes if n in params]
        if weights_cross:
            assert copies.bytes_to_host >= model and sum(crossed) >= 2 * model
        else:
            assert crossed == [], copies.sizes
            # Out: the loss and output scalars only; in: the batch (and a few scalars).
            assert all(n <= 64 for d, n in copies.sizes if d == "to_host"), copies.sizes
            batch = sum(int(np.prod(solver.net.blobs[n].shape)) * 4
                        for n in ("data", "label", "target"))
            assert batch <= copies.bytes_to_device <= batch + 64, copies.sizes
    finally:
        solver.close()


def test_a_store_on_the_device_gives_its_device_group_no_copies(data_list, tmp_path):  # noqa: F811
    """The parameter store where the solver's nets are: on the device, its group pulls and
    pushes without a copy (the batch still comes from the data layers' host records)."""
    solver = Solver(solver_param(data_list, tmp_path, display=0), backend="numpy")
    driver = AsyncDriver(solver, groups=None, devices=[StandInDevice()])
    try:
        driver.step(1)
        params = {int(np.prod(p.shape)) * 4 for p in solver.net.learnable_params}
        with npdevice.copies.counting() as copies:
            driver.step(2)
        assert not params & {n for _, n in copies.sizes}, copies.sizes
    finally:
        driver.close()
        solver.close()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_cct_train_puts_the_store_on_the_device(data_list, tmp_path, strategy):  # noqa: F811
    """``cct train --strategy=... --devices=cpu:1,standin``: the store on the stand-in, a CPU
    group and a device group training together, the CPU's losses at the first iteration."""
    import subprocess
    import sys
    param = solver_param(data_list, tmp_path, display=1, max_iter=4)
    (tmp_path / "solver.prototxt").write_text(str(param))
    sizes = [] if strategy == "async" else ["--batch-sizes=cpu:8,standin:16"]
    run = subprocess.run([sys.executable, "-m", "cct.cli", "train", "--solver=solver.prototxt",
                          f"--strategy={strategy}", "--devices=cpu:1,standin", *sizes],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "One compute group per device" in run.stderr and "Traceback" not in run.stderr
    assert "failed and is dropped" not in run.stderr
    got = losses(run.stderr)
    assert got and all(np.isfinite(got))
