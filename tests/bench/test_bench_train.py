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
