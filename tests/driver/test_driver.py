"""The asynchronous driver (cct/driver): one group is plain training, loss for loss and bit for
bit; simulated staleness has the mean its model says; momentum auto follows the staleness; a
failing group is dropped and the others go on; the losses of every group reach the log."""
import re

import numpy as np
import pytest

from cct.api import Solver
from cct.devices import CPUDevice, available_cores
from cct.driver import (AsyncDriver, MomentumPolicy, StalenessStats, group_devices,
                        implicit_momentum, schedule)
from cct.errors import CCTError

from ..test_scheduler import data_list, params_of, solver_param  # noqa: F401  (fixture)


def losses(log: str):
    return [float(x) for x in re.findall(r"Iteration \d+ \(.*\), loss = ([\d.e+-]+)", log)]


def plain(param, capfd, iters):
    solver = Solver(param)
    try:
        capfd.readouterr()
        solver.step(iters)
        return params_of(solver), losses(capfd.readouterr().err)
    finally:
        solver.close()


def driven(param, capfd, iters, **kw):
    solver = Solver(param)
    driver = AsyncDriver(solver, **kw)
    try:
        capfd.readouterr()
        driver.step(iters)
        return params_of(solver), losses(capfd.readouterr().err), driver
    finally:
        driver.close()
        solver.close()


@pytest.mark.parametrize("engine", ["threads", "simulated"])
def test_one_groups_batchnorm_statistics_are_plain_trainings(data_list, tmp_path,  # noqa: F811
                                                            engine):
    """A group keeps its own running averages (a pull leaves them, as each of Caffe's
    multi-GPU solvers keeps its own); the train net takes group 0's for tests and snapshots."""
    from cct.driver.groups import unlearned_params
    param = solver_param(data_list, tmp_path, batch_norm=True, display=0)
    got = []
    for kw in (None, dict(groups=1, engine=engine)):
        solver = Solver(param)
        driver = None if kw is None else AsyncDriver(solver, **kw)
        try:
            if driver is None:
                solver.step(5)
            else:
                driver.step(5)
                driver.pull_statistics()
            got.append([p.data.copy() for p in unlearned_params(solver.net)])
        finally:
            if driver is not None:
                driver.close()
            solver.close()
    assert len(got[0]) == 3 and float(got[0][2][0]) > 0    # mean, variance, factor
    for a, b in zip(*got):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("engine", ["threads", "simulated"])
def test_one_group_is_plain_training_bit_for_bit(data_list, tmp_path, capfd, engine):  # noqa: F811
    param = solver_param(data_list, tmp_path)
    want_params, want_losses = plain(param, capfd, 6)
    got_params, got_losses, _ = driven(param, capfd, 6, groups=1, engine=engine)
    assert got_losses == want_losses and len(got_losses) == 6
    for a, b in zip(want_params, got_params):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("groups", [2, 3, 5])
def test_round_robin_staleness_is_g_minus_1_after_the_first_round(data_list, tmp_path, capfd,  # noqa: F811
                                                                   groups):
    param = solver_param(data_list, tmp_path, display=0)
    _, _, driver = driven(param, capfd, 4 * groups, groups=groups, engine="simulated")
    hist = driver.store.stats.histogram
    # The first round reads version 0: group k's update is k versions late.
    assert hist == {**{k: 1 for k in range(groups - 1)}, groups - 1: 3 * groups + 1}


def test_exponential_staleness_has_mean_g_minus_1():
    groups, n = 6, 60000
    order = schedule("exponential", groups, seed=3)
    read = [0] * groups
    stats = StalenessStats()
    for version in range(n):
        k = next(order)
        stats.record(version - read[k])
        read[k] = version + 1
    # Geometric with mean g - 1 (Theorem 5): variance (g - 1) g.
    sigma = np.sqrt((groups - 1) * groups / n)
    assert abs(stats.mean() - (groups - 1)) < 4 * sigma
    assert stats.histogram[0] / n == pytest.approx(1 / groups, abs=0.01)


def test_staleness_line_in_the_log(data_list, tmp_path, capfd):  # noqa: F811
    param = solver_param(data_list, tmp_path, display=4)
    solver = Solver(param)
    driver = AsyncDriver(solver, groups=3, engine="simulated", momentum="auto")
    try:
        capfd.readouterr()
        driver.step(9)
        log = capfd.readouterr().err
    finally:
        driver.close()
        solver.close()
    lines = re.findall(r"Staleness mean ([\d.]+) max (\d+) over (\d+) updates; momentum "
                       r"explicit ([\d.e+-]+) \(implicit ~([\d.e+-]+)\)", log)
    assert [(float(m), int(k), int(n)) for m, k, n, _, _ in lines] == [
        (0.0, 0, 1), (1.75, 2, 4), (2.0, 2, 4)]
    explicit, implicit = float(lines[-1][3]), float(lines[-1][4])
    assert explicit == pytest.approx(max(0.0, 0.9 - implicit), abs=1e-4)


def test_momentum_policy():
    stats = StalenessStats()
    for _ in range(10):
        stats.record(3)
    assert implicit_momentum(3) == 0.75
    assert MomentumPolicy("auto", 0.9)(stats) == pytest.approx((0.15, 0.75))
    assert MomentumPolicy("auto", 0.5)(stats) == pytest.approx((0.0, 0.75))
    assert MomentumPolicy("auto", 0.5, allow_negative=True)(stats) == pytest.approx((-0.25, 0.75))
    assert MomentumPolicy("0.3", 0.9)(stats)[0] == 0.3


def test_groups_partition_the_devices():
    devices = [CPUDevice([0]), CPUDevice([0]), CPUDevice([0])]
    parts = group_devices(2, devices)
    assert parts == [devices[:1], devices[1:]]
    with pytest.raises(CCTError, match="--groups=3 needs at least 3 devices"):
        group_devices(3, "cpu:1,cpu:1")


def test_a_failing_group_is_dropped_and_training_goes_on(data_list, tmp_path, capfd,  # noqa: F811
                                                         monkeypatch):
    param = solver_param(data_list, tmp_path, display=0)
    solver = Solver(param)
    driver = AsyncDriver(solver, groups=2, engine="threads")
    calls = {"n": 0}
    original = driver.groups[1].compute

    def dies_on_its_first_batch():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("device lost")
        return original()

    monkeypatch.setattr(driver.groups[1], "compute", dies_on_its_first_batch)
    try:
        capfd.readouterr()
        driver.step(10)
        log = capfd.readouterr().err
        assert solver.iter == 10
        assert len(driver.groups) == 1
        assert "group 1" in log and "failed and is dropped: RuntimeError: device lost" in log
    finally:
        driver.close()
        solver.close()


def test_a_closed_driver_gives_the_blas_thread_count_back(data_list, tmp_path, capfd):  # noqa: F811
    """OpenBLAS rounds differently with another thread count: two groups of one core each set
    it to 1 while they run, and a plain run after them in the same process must see the count
    it had before, and repeat its weights to the bit."""
    from cct import _C
    param = solver_param(data_list, tmp_path)
    want_params, _ = plain(param, capfd, 3)
    before = _C.blas_num_threads()
    solver = Solver(param)
    driver = AsyncDriver(solver, groups=2, engine="threads")
    assert _C.blas_num_threads() == 1 or len(available_cores()) < 2
    driver.close()
    solver.close()
    assert _C.blas_num_threads() == before
    got_params, _ = plain(param, capfd, 3)
    for a, b in zip(want_params, got_params):
        assert np.array_equal(a, b)


def test_staleness_distribution_is_kept_with_the_snapshot(data_list, tmp_path, capfd):  # noqa: F811
    param = solver_param(data_list, tmp_path, display=0)
    solver = Solver(param)
    driver = AsyncDriver(solver, groups=2, engine="simulated")
    try:
        driver.step(5)
        solver.snapshot()
        kept = driver.store.stats.state()
    finally:
        driver.close()
        solver.close()
    again = Solver(param)
    resumed = AsyncDriver(again, groups=2, engine="simulated")
    try:
        again.restore(str(tmp_path / "snap_iter_5.solverstate"))
        assert resumed.store.stats.state() == kept
    finally:
        resumed.close()
        again.close()


def test_processes_engine_one_group_is_plain_training(data_list, tmp_path, capfd):  # noqa: F811
    param = solver_param(data_list, tmp_path)
    want_params, want_losses = plain(param, capfd, 6)
    got_params, got_losses, _ = driven(param, capfd, 6, groups=1, engine="processes",
                                       devices="cpu")
    assert got_losses == want_losses
    for a, b in zip(want_params, got_params):
        assert np.array_equal(a, b)


def test_processes_engine_brings_batchnorm_statistics_back_and_resumes_them(  # noqa: F811
        data_list, tmp_path, capfd):
    from cct.driver.groups import unlearned_params
    param = solver_param(data_list, tmp_path, batch_norm=True, display=0)
    solver = Solver(param)
    try:
        solver.step(6)
        want = [p.data.copy() for p in unlearned_params(solver.net)]
        want_params = params_of(solver)
    finally:
        solver.close()
    assert want and any(np.abs(w).sum() > 0 for w in want)
    solver = Solver(param)
    driver = AsyncDriver(solver, groups=1, engine="processes", devices="cpu")
    try:
        driver.step(3)
        solver.snapshot()       # the group process's running averages go into the snapshot
    finally:
        driver.close()
        solver.close()
    solver = Solver(param)
    driver = AsyncDriver(solver, groups=1, engine="processes", devices="cpu")
    try:
        solver.restore(str(tmp_path / "snap_iter_3.solverstate"))   # and back to the process
        driver.step(3)
        driver.pull_statistics()
        for a, b in zip(want, [p.data for p in unlearned_params(solver.net)]):
            assert np.array_equal(a, b)
        for a, b in zip(want_params, params_of(solver)):
            assert np.array_equal(a, b)
    finally:
        driver.close()
        solver.close()
    # Snapshots due while another group computes read the statistics from its block.
    param = solver_param(data_list, tmp_path, batch_norm=True, display=0, snapshot=2)
    solver = Solver(param)
    driver = AsyncDriver(solver, groups=2, engine="processes", devices="cpu:1,cpu:1")
    try:
        driver.step(6)
        assert solver.iter == 6 and (tmp_path / "snap_iter_6.caffemodel").exists()
        assert float(solver.net.layer_dict["bn"].blobs[2].data[0]) > 0
    finally:
        driver.close()
        solver.close()


def test_a_killed_group_process_is_dropped_and_training_reaches_the_end(data_list, tmp_path,  # noqa: F811
                                                                        capfd):
    import os
    import signal

    param = solver_param(data_list, tmp_path, display=0, max_iter=40)
    solver = Solver(param)
    driver = AsyncDriver(solver, groups=2, engine="processes", momentum="auto")
    try:
        log = capfd.readouterr().err
        assert re.findall(r"group \d \(pid (\d+), cores", log) == [
            str(g.process.pid) for g in driver.groups]
        driver.step(8)
        victim = driver.groups[1]
        os.kill(victim.process.pid, signal.SIGKILL)
        driver.step(32)
        log = capfd.readouterr().err
        assert solver.iter == 40
        assert [g.index for g in driver.groups] == [0]
        assert f"group 1 (pid {victim.process.pid}" in log and "failed and is dropped" in log
    finally:
        driver.close()
        solver.close()


def test_sync_fc_one_group_is_plain_training(data_list, tmp_path, capfd):  # noqa: F811
    """With one group the FC layers' separate update changes nothing: same losses, same
    weights (SGD's update of one param does not depend on the others)."""
    param = solver_param(data_list, tmp_path)
    want_params, want_losses = plain(param, capfd, 6)
    got_params, got_losses, _ = driven(param, capfd, 6, groups=1, engine="simulated",
                                       sync_fc=True)
    assert got_losses == want_losses
    for a, b in zip(want_params, got_params):
        assert np.array_equal(a, b)


def test_sync_fc_layers_are_never_stale(data_list, tmp_path, capfd, monkeypatch):  # noqa: F811
    """Round-robin over 3 groups: the conv params' gradients are 2 updates late, the FC ones
    are computed on the store's FC weights of the moment they are applied."""
    param = solver_param(data_list, tmp_path, display=0)
    solver = Solver(param)
    driver = AsyncDriver(solver, groups=3, engine="simulated", sync_fc=True)
    store, first, fc, conv = driver.groups[0].sync_fc
    # conv's weight and bias, then ip's and ip2's: the InnerProduct layers are the FC part.
    assert driver.groups[0].net.layer_names[first] == "ip" and (conv, fc) == ([0, 1], [2, 3, 4, 5])
    seen = []
    original = store.fc_step

    def fc_step(net, first_fc, fc_params, gradients):
        before = [store.params.blobs[i].data.copy() for i in fc_params]
        loss = original(net, first_fc, fc_params, gradients)
        # The FC weights the group computed on are the store's at that moment.
        seen.append(all(np.array_equal(b, gradients.blobs[i].data)
                        for b, i in zip(before, fc_params)))
        return loss

    monkeypatch.setattr(store, "fc_step", fc_step)
    try:
        driver.step(9)
        assert seen == [True] * 9
        assert driver.store.stats.histogram == {0: 1, 1: 1, 2: 7}
    finally:
        driver.close()
        solver.close()


def test_sync_fc_is_refused_where_it_cannot_run(data_list, tmp_path):  # noqa: F811
    param = solver_param(data_list, tmp_path, iter_size=2)
    solver = Solver(param)
    try:
        with pytest.raises(CCTError, match="--sync-fc needs iter_size 1"):
            AsyncDriver(solver, groups=2, engine="simulated", sync_fc=True)
    finally:
        solver.close()


@pytest.mark.parametrize("staleness", ["round-robin", "exponential"])
def test_simulated_runs_resume_exactly(data_list, tmp_path, capfd, staleness):  # noqa: F811
    """A simulated async run snapshotted at iteration 5 and resumed ends with the bytes of the
    uninterrupted run: the groups' read weights, read versions and the schedule go with it."""
    param = solver_param(data_list, tmp_path, display=0, snapshot=5)
    kw = dict(groups=3, engine="simulated", staleness=staleness, momentum="auto", seed=4)
    whole, _, _ = driven(param, capfd, 11, **kw)
    assert (tmp_path / "snap_iter_5.solverstate.cct.groups.npz").is_file()
    solver = Solver(param)
    driver = AsyncDriver(solver, **kw)
    try:
        solver.restore(str(tmp_path / "snap_iter_5.solverstate"))
        driver.step(6)
        resumed = params_of(solver)
    finally:
        driver.close()
        solver.close()
    for a, b in zip(whole, resumed):
        assert np.array_equal(a, b)


def with_dropout(param):
    from google.protobuf import text_format
    from cct.proto import caffe_pb2

    net = param.net_param
    layer = caffe_pb2.LayerParameter()
    text_format.Merge('name: "drop" type: "Dropout" bottom: "pool" top: "pool" '
                      'dropout_param { dropout_ratio: 0.5 }', layer)
    layers = list(net.layer)
    at = [lp.name for lp in layers].index("relu") + 1
    del net.layer[:]
    net.layer.extend(layers[:at] + [layer] + layers[at:])
    return param


@pytest.mark.parametrize("engine", ["threads", "simulated"])
def test_one_group_with_dropout_is_plain_training(data_list, tmp_path, capfd, engine):  # noqa: F811
    """Building the groups draws nothing from the process-wide generator (each group net has
    its own), and group 0's Dropout masks come from it as plain training's do."""
    param = with_dropout(solver_param(data_list, tmp_path))
    want_params, want_losses = plain(param, capfd, 6)
    got_params, got_losses, _ = driven(param, capfd, 6, groups=1, engine=engine)
    assert got_losses == want_losses
    for a, b in zip(want_params, got_params):
        assert np.array_equal(a, b)


def test_groups_draw_their_own_dropout_masks_reproducibly(data_list, tmp_path, capfd):  # noqa: F811
    param = with_dropout(solver_param(data_list, tmp_path))
    first, _, _ = driven(param, capfd, 6, groups=3, engine="simulated",
                         staleness="exponential")
    again, _, _ = driven(param, capfd, 6, groups=3, engine="simulated",
                         staleness="exponential")
    for a, b in zip(first, again):
        assert np.array_equal(a, b)
