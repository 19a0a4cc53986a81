"""The optimizer's report (cct/optimizer/report.py, issue 33): the plan table's evidence per
candidate (probe length, loss slope c ± se, the prediction and its range), the PNG of the
probes' curves, and -plot refused before any probe when it cannot be written."""
import math
import os
import sys

import numpy as np
import pytest

from cct import cli
from cct.errors import CCTError
from cct.optimizer import Candidate, Optimizer, fit_power_law
from cct.optimizer.curve import CurveFit
from cct.optimizer.plan import Plan
from cct.optimizer.report import check_plot_path, plot, table

from ..test_scheduler import data_list  # noqa: F401  (fixture)
from .test_optimizer import _solver, _solver_file

OLD_COLUMNS = ["#", "strategy", "groups", "batch", "lr", "momentum", "HE s/iter", "probe it",
               "probe loss", "pred iters", "pred s", "status"]


def _probed(lr, c, noise, seed, status="kept", start=100, n=40):
    """A candidate whose probe ran iterations start+1 .. start+n of L = 2 t^-c, noisy."""
    rng = np.random.default_rng(seed)
    t = start + 1 + np.arange(n)
    cand = Candidate("sync", 1, 16, lr, 0.9, he=0.01, status=status, probed=n)
    cand.losses = list(2.0 * t ** -c * (1 + noise * rng.standard_normal(n)))
    cand.fit = fit_power_law(cand.losses, start)
    return cand


def _plan():
    falling = _probed(0.01, 0.4, 0.05, 0)
    winner = _probed(0.03, 0.6, 0.05, 1, status="chosen")
    flat = _probed(0.1, 0.0, 0.1, 2)
    pruned = Candidate("async", 2, 16, 0.01, 0.5, he=0.02,
                       status="pruned: HE 0.02 s/iter not 10% better than 0.01 with fewer "
                              "groups")
    plan = Plan(candidates=[falling, winner, flat, pruned], winner=winner,
                reference_loss=0.2)
    for c in (falling, winner, flat):
        c.iters = c.fit.iterations_to(plan.reference_loss)
        c.seconds = c.iters * c.he
    return plan


def test_the_table_keeps_the_old_columns_in_order_and_adds_the_evidence():
    plan = _plan()
    rows = table(plan)
    assert rows == plan.table()
    head = rows[0]
    at = [head.index(name) for name in OLD_COLUMNS]
    assert at == sorted(at)
    assert "slope c±se" in head and "pred iters [range]" in head
    assert len(rows) == len(plan.candidates) + 2          # the header, the rows, a legend
    assert "not a promise" in rows[-1]


def test_each_row_shows_its_probe_slope_and_predicted_range():
    plan = _plan()
    falling, winner, flat, pruned = plan.candidates
    rows = {id(c): row for c, row in zip(plan.candidates, table(plan)[1:])}
    f = falling.fit
    assert f.falling
    assert f"{f.c:.3g}±{f.c_se:.2g} falling" in rows[id(falling)]
    lo, hi = f.iterations_interval(0.2)
    assert 0 < lo < falling.iters < hi < math.inf
    assert f"{falling.iters:.4g} [" in rows[id(falling)]
    assert rows[id(falling)].split()[:6] == ["0", "sync", "1", "16", "0.01", "0.9"]
    assert " 40 " in rows[id(falling)]                               # the probe's iterations
    assert not flat.fit.falling and "flat?" in rows[id(flat)] and "-inf]" in rows[id(flat)]
    assert rows[id(winner)].endswith("  chosen")
    assert rows[id(pruned)].endswith("with fewer groups") and "±" not in rows[id(pruned)]


def test_the_range_is_written_short():
    """L(20) = 10 / sqrt(20) = 2.236 falling at c = 0.5 +- 0.1 to 0.5: t* = 20 (2.236 / 0.5)^(1/c')
    = 400 at c' = 0.5, 170 at 0.7 and 2948 at 0.3; after the probe's 20 iterations."""
    cand = Candidate("sync", 1, 16, 0.01, 0.9, he=0.01, status="kept", probed=20)
    cand.fit = CurveFit(10.0, 0.5, 20, 10.0 * 20 ** -0.5, c_se=0.1)
    cand.iters = cand.fit.iterations_to(0.5)
    row = table(Plan(candidates=[cand], reference_loss=0.5))[1]
    assert " 380 [150-2.9e3] " in row
    assert "0.5±0.1 falling" in row


def test_a_made_fit_without_an_error_shows_its_prediction_alone():
    cand = Candidate("sync", 1, 16, 0.01, 0.9, he=0.01, status="kept", probed=20)
    cand.fit = CurveFit(10.0, 0.5, 20, 2.3, c_se=0.0)
    cand.iters = cand.fit.iterations_to(2.0)
    row = table(Plan(candidates=[cand], reference_loss=2.0))[1]
    assert f" {cand.iters:.4g} " in row and "[" not in row


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="-plot draws with matplotlib")
    plan = _plan()
    path = tmp_path / "probes.png"
    plot(plan, str(path), title="four candidates")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(tmp_path) == ["probes.png"]             # no temporary file left


def test_plot_draws_a_diverged_probe(tmp_path):
    pytest.importorskip("matplotlib", reason="-plot draws with matplotlib")
    plan = _plan()
    gone = Candidate("sync", 1, 16, 1.0, 0.9, status="pruned: diverged", probed=20)
    gone.losses = [2.0, 3.0, 9.0, float("inf")] + [float("nan")] * 16
    gone.fit = fit_power_law(gone.losses, 100)
    plan.candidates.append(gone)
    plot(plan, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 0
    assert "diverged" in table(plan)[len(plan.candidates)]


def test_a_plot_into_a_missing_folder_is_refused(tmp_path):
    missing = tmp_path / "nowhere" / "probes.png"
    with pytest.raises(CCTError, match=r"-plot=.*nowhere/probes.png: the folder .* does not "
                                       r"exist"):
        check_plot_path(str(missing))
    with pytest.raises(CCTError, match="is a folder"):
        check_plot_path(str(tmp_path))


def test_plot_without_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    for name in ("matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(CCTError, match=r"-plot needs matplotlib.*pip install .*\[plot\]"):
        plot(_plan(), str(tmp_path / "p.png"))


@pytest.mark.parametrize("argv", [
    ["plan", "-solver=nowhere.prototxt"],
    ["train", "-solver=nowhere.prototxt", "-optimize"],
])
def test_the_cli_refuses_a_plot_into_a_missing_folder_before_anything(capsys, tmp_path, argv):
    """Checked where the flag is parsed: the solver file does not even exist."""
    path = tmp_path / "nowhere" / "p.png"
    assert cli.main([*argv, f"-plot={path}"]) == 1
    err = capsys.readouterr().err
    assert f"{argv[0]}: -plot={path}: the folder '{path.parent}' does not exist" in err
    assert "nowhere.prototxt" not in err


def test_train_refuses_plot_without_optimize(capsys, tmp_path):
    assert cli.main(["train", "-solver=nowhere.prototxt", f"-plot={tmp_path / 'p.png'}"]) == 1
    assert "does nothing without -optimize" in capsys.readouterr().err


def test_cct_plan_plots_its_probes(data_list, tmp_path, capfd):  # noqa: F811
    pytest.importorskip("matplotlib", reason="-plot draws with matplotlib")
    path = _solver_file(data_list, tmp_path, max_iter=40)
    out = tmp_path / "probes.png"
    assert cli.main(["plan", "-solver", path, "-engine", "simulated", f"-plot={out}"]) == 0
    err = capfd.readouterr().err
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert "slope c±se" in err and "pred iters [range]" in err
    assert f"the probes' loss curves are in {out}" in err


def test_the_optimizer_plots_its_plan_when_it_starts(data_list, tmp_path):  # noqa: F811
    pytest.importorskip("matplotlib", reason="-plot draws with matplotlib")
    solver = _solver(data_list, tmp_path, max_iter=40)
    out = tmp_path / "start.png"
    opt = Optimizer(solver, engine="simulated", groups=[1], probe_iters=15,
                    lr_multiples=(0.3, 1.0), plot=str(out))
    try:
        plan = opt.start()
    finally:
        opt.close()
        solver.close()
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert all(c.losses for c in plan.candidates if c.probed)
