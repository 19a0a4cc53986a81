"""What the optimizer's log says about its plan and its stop (issue 31): the winner's
prediction as an iteration of the run, and the iteration an early stop leaves the run at,
the one the snapshot after training is named by."""
import math
import os
import re

from cct import cli
from cct.optimizer import Candidate, Optimizer
from cct.optimizer.curve import CurveFit
from cct.optimizer.plan import Plan

from ..test_scheduler import data_list  # noqa: F401  (fixture)
from .test_optimizer import _solver, _solver_file


def _candidate(lr, a, c, last, he=0.01):
    cand = Candidate("sync", 1, 16, lr, 0.9, he=he, status="kept", probed=20)
    cand.fit = CurveFit(a, c, 20, last, c_se=0.0)      # an exact fit: evidence
    return cand


def _scored(data_list, tmp_path, candidates, target_loss=None):  # noqa: F811
    solver = _solver(data_list, tmp_path, max_iter=400)
    opt = Optimizer(solver, engine="simulated", groups=[1], target_loss=target_loss)
    try:
        plan = Plan(candidates=candidates)
        plan.winner = opt._score(plan, candidates)
        return plan, opt._reason(plan)
    finally:
        opt.close()
        solver.close()


def test_a_low_smoothed_loss_does_not_win_in_0_iterations(data_list, tmp_path):  # noqa: F811
    """The reference loss (no target) is under every candidate's smoothed loss too: a noisy
    low smoothed loss gave its candidate "0 iterations" and the next best "infx"."""
    low = _candidate(0.05, 10.0, 0.5, 1.9)       # model 2.236 at iteration 20, smoothed 1.9
    other = _candidate(0.15, 10.0, 0.4, 2.7)
    plan, reason = _scored(data_list, tmp_path, [low, other])
    assert plan.reference_loss < 1.9
    assert all(0 < c.iters < math.inf for c in (low, other))
    assert plan.winner is low
    assert "infx" not in reason and "x 0 iterations" not in reason


def test_the_winners_prediction_is_an_iteration_of_the_run(data_list, tmp_path):  # noqa: F811
    """Not "0.01 s/iter x 2 iterations" for a run of 400: the iteration the winner is predicted
    at the reference, counted as the log counts them, and how far past its probe that is."""
    win = _candidate(0.05, 10.0, 0.5, 2.2)
    lose = _candidate(0.15, 10.0, 0.2, 6.0)
    plan, reason = _scored(data_list, tmp_path, [win, lose], target_loss=2.0)
    t_star = (10.0 / 2.0) ** (1 / 0.5)                          # the model's 25.0
    assert math.isclose(win.iters, t_star - 20)
    assert reason.startswith(f"{win.describe()} wins: predicted to reach the target loss 2 "
                             "at iteration 25, 5 iterations after its probe's end at "
                             "iteration 20 (0.05 s at 0.01 s/iter); next best")
    assert re.search(r"next best .* at [\d.]+ s \([\d.]+x\)$", reason)


def test_a_winner_whose_probe_reached_the_target(data_list, tmp_path):  # noqa: F811
    win = _candidate(0.05, 10.0, 0.5, 1.9)
    lose = _candidate(0.15, 10.0, 0.2, 6.0)
    plan, reason = _scored(data_list, tmp_path, [win, lose], target_loss=2.0)
    assert win.iters == 0
    assert "its probe reached it (smoothed loss 1.9 at iteration 20)" in reason
    assert "x)" not in reason                   # no ratio to a prediction of 0 s


def test_an_early_stop_names_its_snapshots_iteration(data_list, tmp_path, capfd):  # noqa: F811
    """A target reached at iteration N (Caffe's count, as "Iteration N, loss") stops the run
    when that iteration ends, at N + 1: the log says so, and the snapshot after training is
    named by it."""
    path = _solver_file(data_list, tmp_path, max_iter=400, display=10)
    assert cli.main(["train", "-solver", path, "--optimize", "--target-loss", "1.2",
                     "-engine", "simulated", "--retune-every", "1000"]) == 0
    err = capfd.readouterr().err
    reached = int(re.search(r"Optimizer: target loss 1.2 reached at iteration (\d+) .*; "
                            r"stopping when this iteration ends\.", err)[1])
    stopped = int(re.search(r"Optimizer: stopped early at iteration (\d+): target loss 1.2 "
                            r"reached at iteration (\d+)", err)[1])
    assert stopped == reached + 1
    assert f"Trained {stopped} iterations" in err
    assert os.path.exists(tmp_path / f"snap_iter_{stopped}.caffemodel")
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".caffemodel")) == \
        [f"snap_iter_{stopped}.caffemodel"]
