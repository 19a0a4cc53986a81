"""bench/bench_cli_time_to_accuracy.py's pure parts: the seeds, the first test at the target
read from a Caffe log (cct train's lines), the table's per-seed ratios and medians."""
import importlib.util
import pathlib

spec = importlib.util.spec_from_file_location(
    "bench_cli_time_to_accuracy",
    pathlib.Path(__file__).resolve().parents[2] / "bench" / "bench_cli_time_to_accuracy.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

LOG = """I1127 12:21:30.1 25593 solver.cpp:347] Iteration 100, Testing net (#0)
I1127 12:21:30.2 25593 solver.cpp:414]     Test net output #0: accuracy = 0.9655
I1127 12:21:30.2 25593 solver.cpp:414]     Test net output #1: loss = 0.11 (* 1 = 0.11 loss)
I1127 12:21:31.1 25593 solver.cpp:347] Iteration 200, Testing net (#0)
I1127 12:21:31.2 25593 solver.cpp:414]     Test net output #0: accuracy = 0.98
I1127 12:21:32.1 25593 solver.cpp:347] Iteration 300, Testing net (#0)
I1127 12:21:32.2 25593 solver.cpp:414]     Test net output #0: accuracy = 0.9905
"""


def test_seeds_take_ranges_and_lists():
    assert bench.seeds_of("1701-1703") == [1701, 1702, 1703]
    assert bench.seeds_of("1701,1704-1705") == [1701, 1704, 1705]


def test_the_first_test_at_the_target_is_read_from_the_log():
    assert bench.first_at_target(LOG.splitlines(), 0.98) == 200
    assert bench.first_at_target(LOG.splitlines(), 0.99) == 300
    assert bench.first_at_target(LOG.splitlines(), 0.995) is None


def test_report_gives_per_seed_ratios_and_the_ratio_of_medians():
    runs = [{"seed": 1, "arm": "caffe", "iter": 1400, "seconds": 12.0},
            {"seed": 1, "arm": "optimize", "iter": 900, "seconds": 8.0},
            {"seed": 2, "arm": "caffe", "iter": 700, "seconds": 6.0},
            {"seed": 2, "arm": "optimize", "iter": None, "seconds": 30.0},
            {"seed": 3, "arm": "caffe", "iter": 1000, "seconds": 9.0},
            {"seed": 3, "arm": "optimize", "iter": 500, "seconds": 4.5}]
    rows = bench.report(runs)
    assert rows[2] == "| 1 | 12 (1400) | 8 (900) | 1.50x |"
    assert rows[3] == "| 2 | 6 (700) | never | 0.00x |"         # never: infinitely slow
    assert rows[4] == "| 3 | 9 (1000) | 4.5 (500) | 2.00x |"
    assert rows[5] == "| median | 9 | 8 | 1.12x |"
