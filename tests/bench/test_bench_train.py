"""bench/bench_train.py's summary of where a net's bf16 GEMM shapes went (the chosen engine, an
engine raced shape by shape, float32), read from the plan table: the line a device run on an
AMX Xeon prints to say what its races chose."""
import importlib.util
import pathlib
from collections import Counter

from cct import _C
from cct.backend import plans

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_train", ROOT / "bench" / "bench_train.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_bf16_plans_count_each_shape_where_it_went(monkeypatch):
    key = [False, False, 8, 9, 10]
    table = {"gemm": [key + [2, 2, False, False], key + [2, 2, True, True],
                      key + [2, 2, False, 3], key + [2, 2, False, plans.MKL_CHOICE],
                      key + [2, 2, True, 8], key + [2, 2, False, 9],
                      key + [2, 2, False, plans.BF16_SKINNY_CHOICE],
                      key + [2, 2, True, plans.BF16_THIN_CHOICE],
                      key + [4, 2, False, False]],   # float32's own row: not counted
              "gemm_batch": [key + [16, 2, 2, False, plans.BF16_ITEMS_CHOICE],
                             key + [16, 2, 2, True, 0], key + [16, 2, 2, False, 8],
                             key + [16, 4, 2, False, 0]]}
    monkeypatch.setattr(plans, "table", lambda: table)
    engine = _C.bf16_engine()   # (a shape choice of the engine itself counts as it)
    want_plain = Counter([engine, engine, "float32", "float32", "mkl_threaded", "avx512bf16",
                          "avx512bf16 skinny", "avx512bf16 thin"])
    want_batched = Counter([engine, "float32", "mkl_threaded"])

    def spread(counts):
        return ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))

    got = bench.bf16_plans()
    assert f"8 plain ({spread(want_plain)})" in got, got
    assert f"3 batched ({spread(want_batched)})" in got, got
    assert got.startswith(f"engine {engine}, shape by shape also ")


def test_rounds_alternate_the_arms_and_take_the_median_of_each_rounds_ratio(monkeypatch,
                                                                             capsys, tmp_path):
    """--rounds 3: every arm once a round, in the same order each round; the row shows each
    speed's median and each ratio's median over the rounds' own ratios (not the ratio of the
    medians), and the line under it each round's ratio."""
    calls = []
    # cct's step time per round, and PyTorch's, the host slowing both in the third: the
    # rounds' ratios are 2, 1 and 2 (median 2), where the medians' ratio would be 1
    seconds = {"cct": [0.01, 0.02, 0.04], "torch": [0.02, 0.02, 0.08]}

    def spawn(kind, net, args):
        calls.append((kind, net))
        if kind == "peak":
            return {"gflops": 100.0, "machine": "a machine"}
        done = sum(1 for k, n in calls if k == kind and n == net) - 1
        return {"times": [seconds[kind][done]], "flops_per_image": 1e6, "update_s": 0.001,
                "faults_per_iter": 0, "peak_rss_mb": 10.0 + done}

    monkeypatch.setattr(bench, "spawn", spawn)
    # PyTorch "installed" for the driver, which only reads its version (the workers are
    # stand-ins): the light test extra has no PyTorch
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr("importlib.metadata.version", lambda name: "0.0")
    bench.main(["--nets", "lenet", "--rounds", "3", "--zoo", str(tmp_path)])
    out = capsys.readouterr().out
    assert [k for k, n in calls if n == "lenet"] == ["cct", "torch"] * 3
    [row] = [line for line in out.splitlines() if line.startswith("lenet ")]
    batch = bench.NETS["lenet"][1]
    # both medians batch / 0.02; PyTorch's largest RSS; the ratios' median
    assert f"{batch / 0.02:>9.1f}" in row and f"{batch / 0.02:>13.1f}" in row, row
    assert row.endswith(f"{12:>11.0f}{2.0:>7.2f}"), row
    assert (f"  lenet, 3 rounds: cct / torch 2.00 1.00 2.00; cct img/s {batch / 0.01:.1f} "
            f"{batch / 0.02:.1f} {batch / 0.04:.1f}") in out, out


def test_rounds_below_one_are_refused(tmp_path, capsys):
    import pytest
    with pytest.raises(SystemExit):
        bench.main(["--nets", "lenet", "--rounds", "0", "--zoo", str(tmp_path)])
    assert "--rounds must be 1 or more, got 0" in capsys.readouterr().err
