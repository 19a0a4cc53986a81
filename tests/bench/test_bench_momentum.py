"""bench/bench_momentum.py's metric: the first checked iteration at the target, the best
explicit momenta of a row (ties kept, auto left out), and ratios with runs past the cap."""
import importlib.util
import pathlib

spec = importlib.util.spec_from_file_location(
    "bench_momentum", pathlib.Path(__file__).resolve().parents[2] / "bench" / "bench_momentum.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_iterations_to_target_is_the_first_checkpoint_at_or_above_it():
    curve = [(100, 0.91), (200, 0.9795), (300, 0.98), (400, 0.975), (500, 0.99)]
    assert bench.iterations_to_target(curve, 0.98) == 300
    # A float32 mean of twenty k/100 fractions may land just below 0.98.
    assert bench.iterations_to_target([(100, 0.97999996)], 0.98) == 100
    assert bench.iterations_to_target(curve[:2], 0.98) is None
    assert bench.iterations_to_target([], 0.98) is None


def test_best_momenta_keeps_ties_and_ignores_auto():
    cells = {"0": None, "0.45": 1200, "0.675": 900, "0.9": 900, "auto": 600}
    assert bench.best_momenta(cells) == ["0.675", "0.9"]
    assert bench.best_momenta({"0": None, "auto": 500}) == []


def test_ratio_bounds_a_run_past_the_cap():
    assert bench.ratio(600, 1200, 3000) == "0.50"
    assert bench.ratio(600, None, 3000) == "<0.20"
    assert bench.ratio(None, 1500, 3000) == ">2.00"
    assert bench.ratio(None, None, 3000) == "-"


def test_cell_spells_capped_and_diverged_runs():
    assert bench.cell({"iterations": 700, "status": "reached"}, 3000) == "700"
    assert bench.cell({"iterations": None, "status": "capped"}, 3000) == ">3000"
    assert bench.cell({"iterations": None, "status": "diverged"}, 3000) == "div"
    assert bench.cell(None, 3000) == ""


def test_ratio_cell_says_when_mu_09_diverged():
    auto = {"iterations": None, "status": "capped", "curve": [(100, 0.95), (200, 0.975)]}
    fixed = {"iterations": None, "status": "diverged", "curve": []}
    assert bench.ratio_cell(auto, fixed, 3000) == "0.9 diverged"
    reached = {"iterations": 400, "status": "reached", "curve": [(400, 0.98)]}
    assert bench.ratio_cell(auto, reached, 3000, 0.97) == "0.50"
