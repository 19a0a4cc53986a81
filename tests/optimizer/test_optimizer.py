"""The optimizer (cct/optimizer) on the tiny HDF5 net of tests/test_scheduler.py with the
simulated engine: probes branch and restore exactly, the plan and its reason reach the log,
`cct plan` writes nothing, a re-tune changes lr/momentum in this process, a target stops the
run."""
import os
import re

import numpy as np
import pytest
from google.protobuf import text_format

from cct import cli
from cct.api import Solver
from cct.optimizer import Candidate, Optimizer

from ..test_scheduler import data_list, solver_param  # noqa: F401  (fixture)


def _solver(data_list, tmp_path, **fields):  # noqa: F811
    fields.setdefault("display", 0)
    return Solver(solver_param(data_list, tmp_path, **fields))


def _state(solver):
    return ([np.array(p.data) for p in solver.net.params_list],
            [np.array(h) for h in solver.history], solver.iter, solver.current_step)


def test_probe_branch_restores_weights_history_and_data_exactly(data_list, tmp_path):  # noqa: F811
    solver = _solver(data_list, tmp_path, max_iter=40)
    opt = Optimizer(solver, engine="simulated", groups=[1, 2])
    try:
        solver.step(3)                       # a non-zero history to restore
        before = _state(solver)
        opt.probe(Candidate("sync", 1, 16, 0.1, 0.5), 5)
        opt.probe(Candidate("async", 2, 16, 0.1, 0.2), 5)
        after = _state(solver)
        for a, b in zip(before[0] + before[1], after[0] + after[1]):
            assert np.array_equal(a, b)
        assert before[2:] == after[2:]
        # and the data position: the next iteration is the one the run would have taken
        plain = _solver(data_list, tmp_path / "p", max_iter=40)
        plain.step(4)
        solver.step(1)
        for a, b in zip(plain.net.params_list, solver.net.params_list):
            assert np.array_equal(a.data, b.data)
        plain.close()
    finally:
        opt.close()
        solver.close()


def test_plan_table_and_reason_in_the_log(data_list, tmp_path, capfd):  # noqa: F811
    solver = _solver(data_list, tmp_path, max_iter=40)
    opt = Optimizer(solver, engine="simulated", groups=[1, 2], probe_iters=15,
                    lr_multiples=(0.3, 1.0))
    try:
        capfd.readouterr()
        plan = opt.make_plan()
        opt.log_plan(plan)
        err = capfd.readouterr().err
    finally:
        opt.close()
        solver.close()
    assert "Optimizer plan at iteration 0" in err
    assert "HE s/iter" in err and "pred s" in err and "chosen" in err
    assert f"Optimizer: {plan.winner.describe()} wins: predicted" in err
    assert sum(1 for c in plan.candidates if c.status == "chosen") == 1
    assert all(c.status == "kept" or c.status == "chosen" or c.status.startswith("pruned")
               for c in plan.candidates)


def _solver_file(data_list, tmp_path, **fields):  # noqa: F811
    p = solver_param(data_list, tmp_path, **fields)
    path = tmp_path / "solver.prototxt"
    path.write_text(text_format.MessageToString(p))
    return str(path)


def test_cct_plan_writes_nothing(data_list, tmp_path, capfd, monkeypatch):  # noqa: F811
    path = _solver_file(data_list, tmp_path, max_iter=40, snapshot=10)
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    assert cli.main(["plan", "-solver", path, "-engine", "simulated"]) == 0
    err = capfd.readouterr().err
    assert sorted(os.listdir(tmp_path)) == before
    assert "wins: predicted" in err and "Advisor: batch per device" in err
    assert "Advisor: store shards on a cluster" in err


def test_retune_changes_lr_and_momentum_in_this_process(data_list, tmp_path, capfd):  # noqa: F811
    solver = _solver(data_list, tmp_path, max_iter=60)
    opt = Optimizer(solver, engine="simulated", groups=[1], probe_iters=10,
                    lr_multiples=(1.0,), retune_every=20)
    pid = os.getpid()
    try:
        opt.start()
        opt.configure(Candidate("async", 2, 16, 0.02, -0.1))
        solver.step(0)
        assert opt.driver is not None and opt.driver.store.momentum.value == -0.1
        assert solver.param.base_lr == np.float32(0.02)
        capfd.readouterr()
        first = solver.iter             # past 0 when the plan's winner kept its probe
        opt.step(40)
        err = capfd.readouterr().err
        assert f"Optimizer re-tune at iteration {(first // 20 + 1) * 20} (every 20 " \
            "iterations)" in err
        assert f"(pid {pid})" in err and os.getpid() == pid
        assert solver.iter == first + 40
        cur = opt.current
        assert solver.param.base_lr == np.float32(cur.lr)
        if cur.strategy == "sync":
            assert solver.param.momentum == np.float32(cur.momentum)
        else:
            assert opt.driver.store.momentum.value == cur.momentum
    finally:
        opt.close()
        solver.close()


def test_a_retune_due_where_a_callers_step_ends_comes_in_the_next(data_list, tmp_path,  # noqa: F811
                                                                   capfd):
    """A caller stepping a re-tune interval at a time (a Python loop of `step(100)`, the
    bench's evaluations) ends each call on a re-tune's iteration; the re-tune comes at the
    start of the next call instead of never (LeNet with Adam trained 2,600 iterations without
    one)."""
    solver = _solver(data_list, tmp_path, max_iter=100)
    opt = Optimizer(solver, engine="simulated", groups=[1], probe_iters=5,
                    lr_multiples=(1.0,), retune_every=10)
    try:
        opt.start(limit=0)              # nothing kept: training starts at iteration 0
        assert solver.iter == 0
        capfd.readouterr()
        for _ in range(3):
            opt.step(10)
        err = capfd.readouterr().err
        assert "Optimizer re-tune at iteration 10 (every 10 iterations)" in err
        assert "Optimizer re-tune at iteration 20 (every 10 iterations)" in err
        assert "re-tune at iteration 30" not in err        # due when the next call starts
        assert opt.retunes == 2 and solver.iter == 30
    finally:
        opt.close()
        solver.close()


def _tested(data_list, tmp_path, **fields):  # noqa: F811
    """The tiny solver with its own test net: two batches of 16 of the 64 samples a test, so
    that where the test data stands matters."""
    fields.setdefault("display", 5)
    p = solver_param(data_list, tmp_path, max_iter=100, test_interval=10, **fields)
    p.test_iter.append(2)
    return Solver(p)


TESTED_LINES = re.compile(r"Iteration \d+, Testing net|Test net output #\d+: .*|"
                          r"Iteration \d+ \([^)]*\), loss = \S+|Train net output #\d+: .*")


def _run_lines(err):
    """The log's test, display and train-output lines, without the display's rate."""
    return [re.sub(r" \([^)]*iter/s[^)]*\)", "", m.group(0))
            for m in TESTED_LINES.finditer(err)]


def test_a_probe_passing_tests_runs_them_when_applied_as_the_run_would(data_list, tmp_path,  # noqa: F811
                                                                       capfd):
    """The plateau's probes pass the run's tests (_branch): none runs on the branch; applied,
    each runs in its place, on the probe's weights there. Weights, history, iteration, the
    log's display and test lines and the test data's position are those of the solver
    trained without the optimizer."""
    plain = _tested(data_list, tmp_path / "p")
    solver = _tested(data_list, tmp_path)
    opt = Optimizer(solver, engine="simulated", groups=[1])
    try:
        capfd.readouterr()
        plain.step(35)
        want = _run_lines(capfd.readouterr().err)
        cand = opt._candidate(1, opt.data_batch, 0.05, 0.9)     # the solver's own settings
        opt.probe(cand, 5, keep=True)         # from where the run is: its test at 0 is the run's
        opt.probe(cand, 30, keep=True, due=True)     # passes those at 10, 20 and 30
        assert solver.iter == 0 and len(cand.due) == 3 and cand.probed == 35
        assert "Testing net" not in capfd.readouterr().err     # none ran on a branch
        opt._apply(cand)
        err = capfd.readouterr().err
        assert solver.iter == 35
        assert _run_lines(err) == want
        assert [line for line in want if "Testing net" in line] == [
            f"Iteration {i}, Testing net" for i in (0, 10, 20, 30)]
        for a, b in zip(_state(plain)[0] + _state(plain)[1],
                        _state(solver)[0] + _state(solver)[1]):
            assert np.array_equal(a, b)
        plain.step(10)                        # the test at 40: the same test batches
        solver.step(10)
        assert solver.test_scores == plain.test_scores
    finally:
        opt.close()
        solver.close()
        plain.close()


def test_a_probe_passing_snapshots_writes_them_when_applied_as_the_run_would(  # noqa: F811
        data_list, tmp_path, capfd):
    """The same for snapshots (every 10, with the tests): none is written on a branch; the
    applied probe's are written in their place, from its state at each, and equal the plain
    run's, byte for byte (and a snapshot at the probe's end is written too)."""
    (tmp_path / "p").mkdir()
    plain = _tested(data_list, tmp_path / "p", snapshot=10)
    solver = _tested(data_list, tmp_path, snapshot=10)
    opt = Optimizer(solver, engine="simulated", groups=[1])
    try:
        capfd.readouterr()
        plain.step(30)
        want = _run_lines(capfd.readouterr().err)
        cand = opt._candidate(1, opt.data_batch, 0.05, 0.9)
        opt.probe(cand, 5, keep=True)
        opt.probe(cand, 25, keep=True, due=True)   # snapshots at 10, 20, 30; tests at 10, 20
        assert not list(tmp_path.glob("snap_iter_*"))       # none written on a branch
        assert [(snap, test) for _, _, snap, test in cand.due] == \
            [(True, True), (True, True), (True, False)]
        opt._apply(cand)
        err = capfd.readouterr().err
        assert solver.iter == 30 and _run_lines(err) == want
        assert [m.group(1) for m in re.finditer(r"Snapshotting to binary proto file .*_iter_"
                                                r"(\d+)\.caffemodel", err)] == ["10", "20", "30"]
        for n in (10, 20, 30):
            assert (tmp_path / f"snap_iter_{n}.caffemodel").read_bytes() == \
                (tmp_path / "p" / f"snap_iter_{n}.caffemodel").read_bytes()
        assert solver.last_snapshot.endswith("snap_iter_30.solverstate")
    finally:
        opt.close()
        solver.close()
        plain.close()


def test_a_snapshot_whose_capture_would_not_fit_is_left_to_the_run(data_list, tmp_path,  # noqa: F811
                                                                      monkeypatch):
    """A probe that cannot keep a snapshot's capture ends one iteration before it, so that the
    run's own step writes it: no snapshot is lost."""
    from cct.optimizer import plan as plan_module
    (tmp_path / "p").mkdir()
    plain = _tested(data_list, tmp_path / "p", snapshot=10)
    solver = _tested(data_list, tmp_path, snapshot=10)
    opt = Optimizer(solver, engine="simulated", groups=[1])
    try:
        one = (sum(int(p.data.nbytes) for p in solver.net.params_list)
               + sum(int(h.nbytes) for h in solver.history))
        monkeypatch.setattr(plan_module, "BRANCH_MEMORY", 4 * one)    # one capture's room
        plain.step(21)
        cand = opt._candidate(1, opt.data_batch, 0.05, 0.9)
        opt.probe(cand, 5, keep=True)
        opt.probe(cand, 25, keep=True, due=True)
        assert cand.probed == 19 and len(cand.due) == 1
        opt._apply(cand)
        assert solver.iter == 19
        solver.step(2)
        for n in (10, 20):
            assert (tmp_path / f"snap_iter_{n}.caffemodel").read_bytes() == \
                (tmp_path / "p" / f"snap_iter_{n}.caffemodel").read_bytes()
    finally:
        opt.close()
        solver.close()
        plain.close()


def test_a_test_at_the_target_inside_the_winners_probe_ends_the_run_there(  # noqa: F811
        data_list, tmp_path, capfd):
    plain = _tested(data_list, tmp_path / "p")
    solver = _tested(data_list, tmp_path)
    opt = Optimizer(solver, engine="simulated", groups=[1], target_accuracy=1e-6)
    try:
        plain.step(10)
        cand = opt._candidate(1, opt.data_batch, 0.05, 0.9)
        opt.probe(cand, 5, keep=True)
        opt.probe(cand, 30, keep=True, due=True)
        capfd.readouterr()
        opt._apply(cand)
        err = capfd.readouterr().err
        assert "target accuracy 1e-06 reached at iteration 10" in err
        assert "Iteration 20, Testing net" not in err
        assert "the run ends at iteration 10, where the winner's probe passed this test" in err
        assert solver.iter == 10 and solver.requested_early_exit
        for a, b in zip(_state(plain)[0], _state(solver)[0]):
            assert np.array_equal(a, b)
    finally:
        opt.close()
        solver.close()
        plain.close()


def test_a_probe_stops_at_a_test_whose_capture_would_not_fit(data_list, tmp_path,  # noqa: F811
                                                             monkeypatch):
    from cct.optimizer import plan as plan_module
    solver = _tested(data_list, tmp_path)
    opt = Optimizer(solver, engine="simulated", groups=[1])
    try:
        one = (sum(int(p.data.nbytes) for p in solver.net.params_list)
               + sum(int(h.nbytes) for h in solver.history))
        monkeypatch.setattr(plan_module, "BRANCH_MEMORY", 4 * one)    # one test's capture
        cand = opt._candidate(1, opt.data_batch, 0.05, 0.9)
        opt.probe(cand, 5, keep=True)
        opt.probe(cand, 30, keep=True, due=True)
        assert cand.probed == 20 and len(cand.due) == 1 and cand.state is not None
        assert len(cand.losses) == 20
    finally:
        opt.close()
        solver.close()


def test_the_optimizers_chunks_are_one_caffe_step(data_list, tmp_path, capfd):  # noqa: F811
    """Trained in chunks between re-tunes, the run's smoothed loss (what a target loss is
    checked against) and display lines are one Step's: with average_loss 10 a chunk that
    began a Step of its own started the mean again from one batch."""
    plain = _solver(data_list, tmp_path / "p", max_iter=400, display=50, average_loss=10)
    solver = _solver(data_list, tmp_path, max_iter=400, display=50, average_loss=10)
    opt = Optimizer(solver, engine="simulated", groups=[1], retune_every=1000)
    seen = {id(plain): [], id(solver): []}
    for s in (plain, solver):
        s.add_callback(lambda: None, lambda s=s: seen[id(s)].append(float(s.smoothed_loss)))
    try:
        opt.configure(opt._candidate(1, opt.data_batch, 0.05, 0.9))    # the solver's own
        capfd.readouterr()
        plain.step(250)
        want = _run_lines(capfd.readouterr().err)
        opt.step(250)                         # chunks of 100
        assert _run_lines(capfd.readouterr().err) == want
        assert seen[id(solver)] == seen[id(plain)]
    finally:
        opt.close()
        solver.close()
        plain.close()


def test_target_loss_stops_the_run_and_says_so(data_list, tmp_path, capfd):  # noqa: F811
    path = _solver_file(data_list, tmp_path, max_iter=400, display=10)
    assert cli.main(["train", "-solver", path, "--optimize", "--target-loss", "1.2",
                     "-engine", "simulated", "--retune-every", "1000"]) == 0
    err = capfd.readouterr().err
    assert "Optimizer: target loss 1.2 reached at iteration" in err
    assert "Optimization stopped early." in err
    assert "Iteration 400" not in err


def test_without_target_runs_to_max_iter(data_list, tmp_path, capfd):  # noqa: F811
    path = _solver_file(data_list, tmp_path, max_iter=50, display=10)
    assert cli.main(["train", "-solver", path, "--optimize", "-engine", "simulated",
                     "--retune-every", "1000"]) == 0
    err = capfd.readouterr().err
    assert "Iteration 50, loss" in err and "stopped early" not in err


def test_an_optimized_runs_snapshots_are_caffe_files_and_resume(data_list, tmp_path,  # noqa: F811
                                                                 capfd):
    from cct.io import solverstate
    from cct.io.weights import load_weights
    path = _solver_file(data_list, tmp_path, max_iter=60, display=10, snapshot=20)
    assert cli.main(["train", "-solver", path, "--optimize", "-engine", "simulated",
                     "--retune-every", "30"]) == 0
    prefix = str(tmp_path / "snap")
    weights = load_weights(f"{prefix}_iter_40.caffemodel")      # Caffe's NetParameter
    assert set(weights) >= {"conv", "ip", "ip2"}
    state = solverstate.read_solver_state(f"{prefix}_iter_40.solverstate")
    assert state["iter"] == 40
    capfd.readouterr()
    assert cli.main(["train", "-solver", path, "-snapshot", f"{prefix}_iter_40.solverstate"]) == 0
    err = capfd.readouterr().err
    assert "Resuming from" in err and "Iteration 60, loss" in err


def test_the_winner_goes_on_from_its_probe_bit_for_bit(data_list, tmp_path):  # noqa: F811
    """The winner's probe is training: a run that keeps it equals the solver trained with the
    winner's settings from the start, to the bit, and its iterations are not repeated."""
    solver = _solver(data_list, tmp_path, max_iter=40)
    opt = Optimizer(solver, engine="simulated", groups=[1], probe_iters=10,
                    lr_multiples=(1.0,), momentum_offsets=(0.0,), retune_every=1000)
    try:
        plan = opt.start()
        assert plan.winner.probed == 10 and solver.iter == 10
        opt.step(8)
        assert solver.iter == 18
        plain = _solver(data_list, tmp_path / "p", max_iter=40)
        plain.step(18)
        for a, b in zip(_state(plain)[0] + _state(plain)[1], _state(solver)[0] + _state(solver)[1]):
            assert np.array_equal(a, b)
        plain.close()
    finally:
        opt.close()
        solver.close()


def test_halving_keeps_probing_the_better_half_only(data_list, tmp_path):  # noqa: F811
    solver = _solver(data_list, tmp_path, max_iter=4000)
    opt = Optimizer(solver, engine="simulated", groups=[1], probe_iters=10,
                    lr_multiples=(0.1, 0.3, 1.0, 3.0))
    try:
        plan = opt.make_plan()
    finally:
        opt.close()
        solver.close()
    probed = [c for c in plan.candidates if c.probed]
    assert plan.rounds[0] == f"{len(probed)} x 10"
    assert plan.winner.probed == max(c.probed for c in probed)
    for c in probed:
        if c is not plan.winner and c.probed < plan.winner.probed:
            assert c.status.startswith("pruned")
    assert all(c.state is None for c in plan.candidates if c is not plan.winner)
    # the round structure says what was probed: n candidates x their iterations so far
    for r in plan.rounds[1:]:
        n, iters = (int(x) for x in r.split(" x "))
        assert sum(c.probed >= iters for c in probed) >= n


def test_kept_probes_skip_no_snapshot_and_no_display_line(data_list, tmp_path,  # noqa: F811
                                                          capfd):
    import re
    path = _solver_file(data_list, tmp_path, max_iter=60, display=1, snapshot=25)
    assert cli.main(["train", "-solver", path, "--optimize", "-engine", "simulated",
                     "--retune-every", "30"]) == 0
    err = capfd.readouterr().err
    assert "training goes on from the winner's probe: iterations 0 to" in err
    for i in (25, 50, 60):
        assert os.path.exists(tmp_path / f"snap_iter_{i}.caffemodel")
    shown = [int(m) for m in re.findall(r"\] Iteration (\d+) \(", err)]
    assert shown == list(range(0, 60)), shown
    stamps = re.findall(r"^I\d{4} (\d\d:\d\d:\d\d\.\d{6})", err, flags=re.M)
    assert stamps == sorted(stamps)         # held lines are written with the time they come out


def test_a_driven_winner_goes_on_from_its_probe(data_list, tmp_path):  # noqa: F811
    solver = _solver(data_list, tmp_path, max_iter=60)
    opt = Optimizer(solver, engine="simulated", groups=[2], probe_iters=10,
                    lr_multiples=(1.0,), retune_every=1000)
    try:
        plan = opt.start()
        assert plan.winner.strategy == "async" and opt.driver is not None
        assert solver.iter == plan.winner.probed
        first = solver.iter
        opt.step(5)
        assert solver.iter == first + 5
        assert all(np.isfinite(p.data).all() for p in solver.net.params_list)
    finally:
        opt.close()
        solver.close()


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")   # the blow-up itself
def test_a_divergence_in_training_steps_back_with_a_smaller_lr(data_list, tmp_path,  # noqa: F811
                                                               capfd):
    solver = _solver(data_list, tmp_path, max_iter=200)
    opt = Optimizer(solver, engine="simulated", groups=[1], retune_every=1000)
    try:
        opt.configure(Candidate("sync", 1, 16, 3.0, 0.99))      # blows up within steps
        capfd.readouterr()
        opt.step(60)
        err = capfd.readouterr().err
        assert solver.iter == 60 and 1 <= opt.recoveries <= 3
        assert "Optimizer: the loss diverged at iteration" in err and "recovery 1 of" in err
        assert opt.current.lr < 3.0 and opt.current.momentum <= 0.9
        assert all(np.isfinite(p.data).all() for p in solver.net.params_list)
    finally:
        opt.close()
        solver.close()


@pytest.mark.parametrize("kind,momentum,low,high", [("AdaGrad", 0.0, 0.0, 0.0),
                                                    ("Adam", 0.9, 0.0, 0.99)])
def test_momenta_stay_in_what_the_solver_type_allows(data_list, tmp_path, kind,  # noqa: F811
                                                     momentum, low, high):
    """AdaGrad and RMSProp refuse any momentum but 0 (Caffe's check), Adam's momentum is beta1
    in [0, 1): the search's offsets and the groups' staleness correction stay inside."""
    solver = _solver(data_list, tmp_path, max_iter=200, type=kind, momentum=momentum,
                     base_lr=0.01)
    opt = Optimizer(solver, engine="simulated", groups=[1, 2], probe_iters=5)
    try:
        plan = opt.make_plan()
    finally:
        opt.close()
        solver.close()
    assert plan.winner is not None
    assert all(low <= c.momentum <= high for c in plan.candidates)


def test_close_leaves_the_solver_as_it_found_it(data_list, tmp_path):  # noqa: F811
    solver = _solver(data_list, tmp_path, max_iter=40)
    before = solver.action_request
    opt = Optimizer(solver, engine="simulated", groups=[1])
    assert len(solver._callbacks) == 1
    opt.close()
    assert solver.action_request is before
    assert solver._callbacks == []          # its hooks are gone, not merely idle
    calls = []
    solver.add_callback(lambda: calls.append("start"), lambda: calls.append("ready"))
    solver.step(1)
    solver.close()
    assert calls == ["start", "ready"]      # only the pair added after the optimizer left
