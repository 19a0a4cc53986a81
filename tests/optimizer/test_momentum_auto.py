"""``--momentum=auto`` (cct/optimizer/momentum.py): the candidate momenta from a measured
implicit momentum (the grid capped, pruned below the rule's centre, negatives only where
allowed or where the staleness is high), the probe lengths, a small end-to-end choice on the
tiny HDF5 net with the simulated engine (the run left where it was), and the command line
logging its choice."""
import re

import numpy as np
import pytest

from cct.api import Solver
from cct.optimizer.momentum import (GRID, MIN_ROUND, candidate_momenta, choose_momentum,
                                    first_round)

from ..driver.test_cli_driver import losses
from ..test_cli_train import cct, workdir  # noqa: F401  (fixture)
from ..test_scheduler import data_list, solver_param  # noqa: F401  (fixture)


@pytest.mark.parametrize("implicit, probed, left", [
    # 8 round-robin groups, E[tau] = 7: centre 0.025, floor -0.125: the whole grid
    (0.875, list(GRID), []),
    # 2 groups, E[tau] = 1: centre 0.4, floor 0.25
    (0.5, [0.3, 0.45, 0.6, 0.75, 0.9], [0.0, 0.15]),
    # one group: the solver's momentum and one step below it
    (0.0, [0.75, 0.9], [0.0, 0.15, 0.3, 0.45, 0.6]),
])
def test_grid_capped_and_pruned_below_the_rule(implicit, probed, left):
    momenta, pruned, note = candidate_momenta(0.9, implicit)
    assert momenta == probed and pruned == left
    assert "not considered" in note


def test_grid_capped_at_the_solvers_momentum():
    momenta, pruned, _ = candidate_momenta(0.5, 0.0)
    assert momenta == [0.45] and 0.6 in pruned and 0.9 in pruned


def test_negative_momenta_only_where_allowed_or_staleness_is_high():
    # 8 groups: the centre 0.025 is not negative; allowed, -0.15 is still below the floor
    assert min(candidate_momenta(0.9, 0.875)[0]) == 0.0
    momenta, _, note = candidate_momenta(0.9, 0.875, allow_negative=True)
    assert min(momenta) == 0.0 and "considered (allowed" in note and "none within" in note
    # 16 groups, E[tau] = 15: implicit 0.9375 > 0.9, centre -0.0375: -0.15 without the flag
    momenta, _, note = candidate_momenta(0.9, 15 / 16)
    assert momenta[0] == -0.15 and momenta[1] == 0.0 and "exceeds the solver's 0.9" in note
    # solver momentum 0.6 at 8 groups: centre -0.275, floor -0.425
    momenta, _, _ = candidate_momenta(0.6, 0.875)
    assert momenta == [-0.3, -0.15, 0.0, 0.15, 0.3, 0.45, 0.6]
    # allowed, 2 groups: nothing below zero is within a step of the centre 0.4
    assert min(candidate_momenta(0.9, 0.5, allow_negative=True)[0]) == 0.3


def test_probe_lengths_from_the_staleness_and_the_budget():
    assert first_round(7.0, 7, 10_000) == 72            # 9 (E[tau] + 1)
    assert first_round(6.125, 7, 500 - 32) == 65        # LeNet at 8 groups, measured
    assert first_round(7.0, 7, 7 * 30) == 30            # one round of 7 within the budget
    assert first_round(0.0, 2, 10_000) == MIN_ROUND
    assert first_round(7.0, 7, 10) == MIN_ROUND


def _state(solver):
    return ([np.array(p.data) for p in solver.net.params_list],
            [np.array(h) for h in solver.history], solver.iter)


def test_choice_on_a_tiny_solver_leaves_the_run_where_it_was(data_list, tmp_path,  # noqa: F811
                                                               capfd):
    solver = Solver(solver_param(data_list, tmp_path, display=0, max_iter=100))
    try:
        solver.step(2)
        before = _state(solver)
        capfd.readouterr()
        choice = choose_momentum(solver, groups=4, engine="simulated", budget=200)
        after = _state(solver)
        for a, b in zip(before[0] + before[1], after[0] + after[1]):
            assert np.array_equal(a, b)
        assert before[2] == after[2]
        # 4 round-robin groups over 16 updates: staleness 0, 1, 2, then 3: E[tau] = 42/16
        assert choice.measure_updates == 16
        assert choice.staleness_mean == pytest.approx(42 / 16)
        assert choice.implicit == pytest.approx(42 / 58)
        probed = sorted(c.momentum for c in choice.candidates)
        assert probed == [m for m in GRID if m >= choice.centre - 0.15 - 1e-9]
        assert choice.momentum in probed
        assert [c.status for c in choice.candidates].count("chosen") == 1
        assert choice.probe_updates <= 200
        assert choice.probe_updates == choice.measure_updates + sum(
            c.probed for c in choice.candidates)
        err = capfd.readouterr().err
        assert re.search(r"Momentum auto: probed \d+ momenta at 4 groups \(measured staleness "
                         r"E\[tau\]=2\.62 over 16 updates, implicit 0\.724", err)
        assert f"Momentum auto: chose {choice.momentum:.4g}: the lowest end loss" in err
    finally:
        solver.close()


def test_cli_momentum_auto_logs_its_choice_and_trains_with_it(workdir):  # noqa: F811
    # --deterministic: kernel plans timed apart would round the two runs' losses apart
    run = cct("train", "--solver=solver.prototxt", "--strategy=async", "--groups=2",
              "--engine=simulated", "--momentum=auto", "--deterministic", cwd=workdir)
    assert run.returncode == 0, run.stderr[-3000:]
    log = run.stderr
    chose = re.search(r"Momentum auto: chose ([-\d.]+): ", log)
    assert chose and "Momentum auto: probed" in log and "probe updates, thrown away" in log
    explicit = {float(m) for m in re.findall(r"momentum explicit ([-\d.e]+) \(implicit", log)}
    assert explicit == {float(chose.group(1))}
    assert not re.search(r"\(-[\d.]+ iter/s", log)     # the probes' display lines undone
    # the probes were thrown away: training is that of -momentum=<the choice>
    fixed = cct("train", "--solver=solver.prototxt", "--strategy=async", "--groups=2",
                "--engine=simulated", f"--momentum={chose.group(1)}", "--deterministic",
                cwd=workdir)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert losses(log) == losses(fixed.stderr) and len(losses(log)) > 4


def test_the_probes_drivers_take_the_runs_seed_and_sync_fc(data_list, tmp_path):  # noqa: F811
    """A probe of another configuration than the run's measures another staleness: the run's
    -seed (exponential staleness) and -sync-fc reach every probe's driver."""
    from cct.driver import DriverConfig
    from cct.optimizer import Optimizer
    solver = Solver(solver_param(data_list, tmp_path, max_iter=100, display=0))
    opt = Optimizer(solver, engine="simulated", groups=[2], staleness="exponential",
                    driver_config=DriverConfig(seed=5, sync_fc=True))
    try:
        opt.configure(opt._candidate(2, opt.data_batch, 0.01, 0.5))
        assert opt.driver.seed == 5
        assert all(g.sync_fc is not None for g in opt.driver.groups)
    finally:
        opt.close()
        solver.close()
