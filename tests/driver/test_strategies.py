"""The driver's heterogeneous strategies (issue 10): Hogbatch's batch per group, Adaptive
Hogbatch's balance of update rates, Crossbow's SMA; the record-level feeder under them; exact
resumes of simulated runs."""
import re

import h5py
import numpy as np
import pytest

from cct.api import Solver
from cct.driver import BatchFeeder, Driver, LearnerTuner, parse_batch_sizes
from cct.errors import CCTError

from ..test_scheduler import data_list, params_of, solver_param  # noqa: F401  (fixture)
from .test_driver import losses, plain


# -- the feeder: every record once, in the data layers' order --------------------------------
@pytest.fixture
def indexed_list(tmp_path):
    """64 records whose target's first value is their position (the data layers' batch is
    16)."""
    rs = np.random.RandomState(1)
    with h5py.File(tmp_path / "i.h5", "w") as f:
        f["data"] = rs.randn(64, 2, 10, 10).astype(np.float32)
        f["label"] = (np.arange(64) % 5).astype(np.float32)
        target = rs.randn(64, 3).astype(np.float32)
        target[:, 0] = np.arange(64)
        f["target"] = target
    (tmp_path / "ilist.txt").write_text(f"{tmp_path / 'i.h5'}\n")
    return tmp_path / "ilist.txt"


def test_the_feeder_hands_out_each_record_once_in_order(indexed_list, tmp_path):
    solver = Solver(solver_param(indexed_list, tmp_path))
    try:
        feeder = BatchFeeder(solver.net)
        taken = []
        for n, group in [(3, 0), (5, 1), (16, 0), (13, 1), (40, 0), (16, 1)]:
            arrays = [np.empty((n,) + tuple(t.shape[1:]), np.float32) for t in feeder.tops]
            feeder.feed_arrays(arrays, n, group)
            taken.append(arrays[2][:, 0].astype(int).tolist())
        flat = [x for batch in taken for x in batch]
        assert flat == [k % 64 for k in range(len(flat))]      # no record twice, none skipped
        assert dict(feeder.records) == {0: 59, 1: 34}
    finally:
        solver.close()


def test_hogbatch_groups_read_the_next_records_of_the_epoch(indexed_list, tmp_path, capfd):
    solver = Solver(solver_param(indexed_list, tmp_path, display=0))
    driver = Driver(solver, groups=2, engine="simulated", strategy="hogbatch",
                    batch_sizes="3,5")
    seen = []
    for g in driver.groups:
        def compute(fed=False, g=g, inner=g.compute):
            loss = inner(fed)
            seen.append((g.index, g.inputs[2].data[:, 0].astype(int).tolist()))
            return loss
        g.compute = compute
    try:
        driver.step(12)
        assert [len(batch) for k, batch in seen] == [3 if k == 0 else 5 for k, _ in seen]
        # In the order they asked: a simulated round-robin asks 0, 1, 0, 1 ...
        flat = [x for _, batch in seen for x in batch]
        assert flat == [k % 64 for k in range(len(flat))]
        log = capfd.readouterr().err
        assert "Batches: group 0 3, group 1 5 (the data layers' batch is 16" in log
        assert re.search(r"Updates by group: group 0 6 \(50.0%\), group 1 6 \(50.0%\); "
                         r"records: group 0 18, group 1 30", log)
    finally:
        driver.close()
        solver.close()


def test_batch_sizes_by_device_name_and_their_errors():
    groups = [["cpu:0"], ["cpu:1"], ["gpu0"]]
    assert parse_batch_sizes("cpu:16,gpu0:256", groups) == [16, 16, 256]
    assert parse_batch_sizes("cpu:1:8", groups) == [None, 8, None]
    assert parse_batch_sizes("4,5,6", groups) == [4, 5, 6]
    with pytest.raises(CCTError, match="gives 2 batch size"):
        parse_batch_sizes("4,5", groups)
    with pytest.raises(CCTError, match="no group runs on 'gpu1'"):
        parse_batch_sizes("gpu1:8", groups)
    with pytest.raises(CCTError, match="must be batch sizes"):
        parse_batch_sizes("cpu:lots", groups)
    with pytest.raises(CCTError, match="at least 1"):
        parse_batch_sizes("0,1,2", groups)


# -- update shares: Hogbatch's fast group dominates, Adaptive Hogbatch balances ------------
def shares_after_warm_up(data_list, tmp_path, capfd, strategy, warm=40, updates=160):  # noqa: F811
    param = solver_param(data_list, tmp_path, display=0)
    solver = Solver(param)
    driver = Driver(solver, groups=2, engine="simulated", strategy=strategy,
                    batch_sizes="16,16", simulate_speeds=[1, 8], threshold=0.05)
    try:
        driver.step(warm)
        before = dict(driver.balance.updates)
        driver.step(updates)
        after = driver.balance.updates
        done = {k: after[k] - before.get(k, 0) for k in after}
        return ({k: v / updates for k, v in done.items()}, [g.batch for g in driver.groups],
                capfd.readouterr().err)
    finally:
        driver.close()
        solver.close()


def test_adaptive_hogbatch_keeps_each_share_within_the_threshold(data_list, tmp_path, capfd):  # noqa: F811
    hog, hog_batches, _ = shares_after_warm_up(data_list, tmp_path, capfd, "hogbatch")
    adaptive, batches, log = shares_after_warm_up(data_list, tmp_path, capfd,
                                                  "adaptive-hogbatch")
    # Plain Hogbatch: the 8x faster group issues 8 of every 9 updates.
    assert hog_batches == [16, 16] and hog[1] == pytest.approx(8 / 9, abs=0.02)
    assert abs(hog[0] - 0.5) > 0.05
    # Adaptive: the slow group's batch falls to 16/8 = 2; both issue half the updates.
    assert batches == [2, 16]
    assert all(abs(share - 0.5) <= 0.05 for share in adaptive.values()), adaptive
    assert "Adaptive Hogbatch: update shares 0." in log and "batches 16,16 -> 2,16" in log


def test_display_shows_each_groups_rate_batch_and_share(data_list, tmp_path, capfd):  # noqa: F811
    param = solver_param(data_list, tmp_path, display=8)
    solver = Solver(param)
    driver = Driver(solver, groups=2, engine="simulated", strategy="hogbatch",
                    batch_sizes="8,16", simulate_speeds=[1, 1])
    try:
        capfd.readouterr()
        driver.step(17)
        lines = re.findall(r"group (\d) \([^)]*\): batch (\d+), (\d+) updates \(([\d.]+)%\), ([\d.]+) "
                           r"updates/s; (\d+) records so far", capfd.readouterr().err)
        # Virtual time: group 0's steps end at 8, 16, 24 ..., group 1's at 16, 32 ... (ties:
        # group 0 first). Iteration 8 is group 1's push at 48, iteration 16 group 0's at 96:
        # between them group 0 pushed 6 times and group 1 twice, over 48 virtual seconds.
        assert lines[-2:] == [("0", "8", "6", "75.0", "0.125", "96"),
                              ("1", "16", "2", "25.0", "0.04167", "80")]
    finally:
        driver.close()
        solver.close()


# -- SMA -------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["threads", "simulated"])
def test_sma_one_learner_alpha_0_is_plain_sgd(data_list, tmp_path, capfd, engine):  # noqa: F811
    param = solver_param(data_list, tmp_path)
    want_params, want_losses = plain(param, capfd, 6)
    solver = Solver(param)
    driver = Driver(solver, engine=engine, strategy="sma", learners=1, sma_alpha=0.0)
    try:
        z0 = params_of(solver)
        capfd.readouterr()
        driver.step(6)
        assert losses(capfd.readouterr().err) == want_losses and len(want_losses) == 6
        for a, b in zip(want_params, driver.groups[0].params.weights()):
            assert np.array_equal(a, b)          # the learner is plain training
        for a, b in zip(z0, params_of(solver)):
            assert np.array_equal(a, b)          # alpha 0: z never moves
    finally:
        driver.close()
        solver.close()


def test_sma_synchronisation_is_crossbows_rule(data_list, tmp_path):  # noqa: F811
    solver = Solver(solver_param(data_list, tmp_path))
    driver = Driver(solver, engine="simulated", strategy="sma", learners=3, sma_alpha=0.25,
                    sma_momentum=0.5)
    try:
        sma = driver.sma
        rs = np.random.RandomState(3)
        z = [rs.randn(*p.shape).astype(np.float32) for p in sma.previous]
        zprev = [rs.randn(*p.shape).astype(np.float32) for p in sma.previous]
        ws = [[rs.randn(*p.shape).astype(np.float32) for p in sma.previous] for _ in range(3)]
        solver.params.set_weights(z)
        for p, v in zip(sma.previous, zprev):
            p[...] = v
        for g, w in zip(driver.groups, ws):
            g.params.set_weights(w)
        sma.synchronise()
        for i in range(len(z)):
            c = [0.25 * (w[i].astype(np.float64) - z[i]) for w in ws]
            want_z = z[i] + sum(c) + 0.5 * (z[i].astype(np.float64) - zprev[i])
            np.testing.assert_allclose(solver.params.blobs[i].data, want_z, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(sma.previous[i], z[i])
            for g, w, cj in zip(driver.groups, ws, c):
                np.testing.assert_allclose(g.params.blobs[i].data, w[i] - cj, rtol=1e-5,
                                           atol=1e-6)
    finally:
        driver.close()
        solver.close()


def test_sma_learners_auto_stops_when_throughput_stops_improving(data_list, tmp_path, capfd):  # noqa: F811
    # Two simulated devices: one learner each, then two each, which is no faster.
    param = solver_param(data_list, tmp_path, display=0)
    solver = Solver(param)
    driver = Driver(solver, engine="simulated", strategy="sma", learners="auto",
                    simulate_speeds=[1, 1])
    try:
        capfd.readouterr()
        driver.step(20)
        log = capfd.readouterr().err
        steps = re.findall(r"SMA autotune: (\d) learner\(s\): ([\d.]+) records/s(.*)", log)
        assert [(k, v) for k, v, _ in steps] == [("2", "2"), ("4", "2")]
        assert "adding 2" in steps[0][2]
        assert "removing the last 2: 2 learner(s), tuning stops" in steps[1][2]
        assert len(driver.groups) == 2
    finally:
        driver.close()
        solver.close()


def test_learner_tuner_adds_while_throughput_gains_ten_percent():
    tuner = LearnerTuner(per_step=1, interval=2)
    actions = []
    for learners, speed in [(1, 100.0), (2, 150.0), (3, 160.0)]:
        for _ in range(3):
            actions.append(tuner.round(int(speed), 1.0, learners))
    assert [a for a in actions if a] == ["add", "add", "remove"]
    assert tuner.done and tuner.round(1, 1.0, 2) is None


# -- snapshots: exact resumes ----------------------------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(strategy="sma", learners=2, sync_period=2, sma_momentum=0.3),
    dict(strategy="adaptive-hogbatch", groups=2, batch_sizes="6,16", simulate_speeds=[1, 4]),
])
def test_a_simulated_run_resumes_exactly(data_list, tmp_path, capfd, kw):  # noqa: F811
    param = solver_param(data_list, tmp_path, display=0, max_iter=24)

    def run(steps, resume=None):
        solver = Solver(param)
        driver = Driver(solver, engine="simulated", **kw)
        try:
            if resume:
                solver.restore(resume)
            for n in steps:
                driver.step(n)
                if n != steps[-1]:
                    solver.snapshot()
            return params_of(solver), solver.last_snapshot
        finally:
            driver.close()
            solver.close()

    whole, _ = run([24])
    _, state = run([11, 13])          # 11: mid-batch for the feeder and between syncs
    capfd.readouterr()
    resumed, _ = run([13], resume=str(tmp_path / "snap_iter_11.solverstate"))
    for a, b in zip(whole, resumed):
        assert np.array_equal(a, b)


def test_sma_saves_the_central_model_as_the_caffemodel(data_list, tmp_path):  # noqa: F811
    from cct.io.weights import load_weights
    solver = Solver(solver_param(data_list, tmp_path))
    driver = Driver(solver, engine="simulated", strategy="sma", learners=2)
    try:
        driver.step(5)
        solver.snapshot()
        saved = load_weights(str(tmp_path / "snap_iter_5.caffemodel"))
        z = [b.data for b in solver.net.learnable_params]
        assert np.array_equal(saved["conv"][0], z[0])
        learner = driver.groups[1].params.blobs[0].data
        assert not np.array_equal(saved["conv"][0], learner)
        assert (tmp_path / "snap_iter_5.solverstate.cct.sma.npz").exists()
    finally:
        driver.close()
        solver.close()


def test_processes_engine_runs_hogbatch_and_sma(data_list, tmp_path, capfd):  # noqa: F811
    param = solver_param(data_list, tmp_path, display=0)
    for kw in (dict(strategy="adaptive-hogbatch", groups=2, batch_sizes="8,16"),
               dict(strategy="sma", learners=2, batch_sizes="8,8")):
        solver = Solver(param)
        driver = Driver(solver, engine="processes", **kw)
        try:
            driver.step(8)
            assert solver.iter == 8
            assert all(np.isfinite(p).all() for p in params_of(solver))
        finally:
            driver.close()
            solver.close()


@pytest.mark.parametrize("kw, needle", [
    (dict(strategy="sma", learners=1, sma_alpha=2.0), "--sma-alpha must be in [0, 1]"),
    (dict(strategy="sma", learners=1, sync_period=0), "--sync-period must be at least 1"),
    (dict(strategy="async", simulate_speeds=[1, 2]), "add --engine=simulated"),
    (dict(strategy="hogbatch", engine="simulated", groups=2, simulate_speeds=[1]),
     "gives 1 speed(s) for 2 group(s)"),
    (dict(strategy="adaptive-hogbatch", engine="simulated", threshold=1.5),
     "--threshold is the tolerated gap"),
    (dict(strategy="sync"), "sync is the solver's own solve()"),
    (dict(strategy="sma", momentum="auto"), "with sma the learners use the solver's"),
])
def test_bad_strategy_settings(data_list, tmp_path, kw, needle):  # noqa: F811
    solver = Solver(solver_param(data_list, tmp_path))
    try:
        with pytest.raises(CCTError) as e:
            Driver(solver, **kw).close()
        assert needle in str(e.value)
    finally:
        solver.close()


def test_a_group_of_two_devices_takes_its_own_batch_and_changes_it(data_list, tmp_path):  # noqa: F811
    # Its HybridScheduler keeps both devices' threads busy: the group runs on its own thread.
    from ..test_scheduler import one_core_devices
    solver = Solver(solver_param(data_list, tmp_path, display=0))
    driver = Driver(solver, groups=1, devices=one_core_devices(2), strategy="hogbatch",
                    batch_sizes=[12])
    try:
        driver.step(3)
        driver.groups[0].batch = 7          # as Adaptive Hogbatch re-sizes it
        driver.step(3)
        assert solver.iter == 6 and dict(driver.feeder.records) == {0: 3 * 12 + 3 * 7}
        assert all(np.isfinite(p).all() for p in params_of(solver))
    finally:
        driver.close()
        solver.close()


def test_a_setting_refused_after_the_groups_exist_stops_them(data_list, tmp_path):  # noqa: F811
    import multiprocessing
    solver = Solver(solver_param(data_list, tmp_path))
    try:
        with pytest.raises(CCTError, match="--sync-fc runs with the threads and simulated"):
            Driver(solver, groups=2, engine="processes", sync_fc=True)
        assert not multiprocessing.active_children()
    finally:
        solver.close()
