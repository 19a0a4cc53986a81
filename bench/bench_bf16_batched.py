"""Winograd's products in bf16 against float32 on this CPU (issue 34, item 2: "bf16
lowering/Winograd where it pays"): every strided batched GEMM that a net's convolution races
meet under bf16 (Winograd F(2x2, 3x3)'s 16 products a layer, the pointwise layout's), timed in
float32 (OpenBLAS's batched call; MKL's where MKL is offered) and in bf16 items on each engine
that runs here (the process's engine, MKL whole on its own threads, cct's AVX512-BF16 kernel),
and in bf16 in one call of oneDNN's matmul where oneDNN is installed.

    python bench/bench_bf16_batched.py [--nets cifar10_quick,caffenet_b32] [--rounds 5]

cct's float32 convolutions mostly run Winograd, with 2.25-4x fewer multiplies than a lowered
GEMM, so bf16 can only double a net's speed where these products run well over twice as fast
in bf16 as in float32 (bench/RESULTS.md, thirty-fifth session). Printed per net and shape: ms
(best of ``--rounds`` alternated rounds) and GFLOP/s of each arm, the plan the race chose, and
float32's best time over bf16's best (> 1: bf16 faster); then the sums over the net's shapes.
Needs a CPU with bf16 units (AVX512-BF16, AMX through MKL); elsewhere it says so and stops.
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))  # after the installed cct

from bench.bench_thin_gemm import net_rows  # noqa: E402
from bench.bench_train import add_net_arguments, chosen_nets, machine  # noqa: E402
from bench.worker import seconds  # noqa: E402

# a batched row's choice (csrc/gemm.cpp): 0 the BLAS's float32 call, 5 MKL's, 7 the items one
# by one in bf16 on the process's engine, 8 on MKL's own threads, 9 on cct's kernel, 13 the
# whole batch on oneDNN's matmul
ARMS = {0: "float32", 5: "f32 MKL", 7: "bf16", 8: "bf16 MKLt", 9: "bf16 cct", 13: "bf16 oneDNN"}
FLOAT32_ARMS = (0, 5)


def arms_here() -> list:
    """The choices that run on this machine as themselves (an engine that does not run falls
    back to another arm's call, which would time it twice under two names)."""
    from cct import _C
    arms = [0, 7]
    if _C.mkl_sgemm_offered():
        arms.append(5)
    if _C.mkl_loaded() and _C.mkl_threaded():
        arms.append(8)
    if _C.bf16_kernel_supported():
        arms.append(9)
    if _C.onednn_offered(True):
        arms.append(13)
    return sorted(arms)


def batched_rows(name: str, zoo) -> list:
    """The bf16 batched rows (element size 2) of the net's convolution races, each once."""
    return [r for r in net_rows(name, zoo)[1] if r[6] == 2]


def row_times(row, arms: list, rounds: int) -> dict:
    """Seconds of one batched row's call under each arm, best of ``rounds`` alternated, on the
    same operands; each bf16 arm's product checked against float32's within bf16's rounding."""
    from cct import _C
    ta, tb, m, n, k, count, _, _, accumulate, _ = row
    rng = np.random.default_rng(0)
    a = rng.standard_normal((count, k, m) if ta else (count, m, k), np.float32)
    b = rng.standard_normal((count, n, k) if tb else (count, k, n), np.float32)
    outs = {arm: np.zeros((count, m, n), np.float32) for arm in arms}

    def run(arm):
        _C.load_gemm_batch_choices([tuple(row[:9]) + (arm,)])
        _C.gemm_batch(a, b, ta, tb, out=outs[arm], accumulate=accumulate)
    for arm in arms:
        outs[arm][...] = 0
        run(arm)
    scale = np.abs(outs[0]).max() + 1e-30
    for arm in arms:
        # bf16 operands: each product's relative error about 2^-8, summed over k terms
        assert np.abs(outs[arm] - outs[0]).max() <= 0.05 * scale, \
            f"{ARMS[arm]}'s batched product differs from float32's on {row}"
    times = {arm: [] for arm in arms}
    for r in range(rounds):
        for arm in (arms if r % 2 == 0 else arms[::-1]):
            times[arm].append(seconds(lambda: run(arm)))
    _C.load_gemm_batch_choices([tuple(row)])
    return {arm: min(v) for arm, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_net_arguments(ap, "cifar10_quick,caffenet_b32")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    names = chosen_nets(ap, args)
    from cct import _C
    from cct.backend import mkl, onednn, precision
    print(machine())
    mkl.offer_sgemm()  # MKL's batched sgemm in the float32 arm, as in cct train's runs
    onednn.offer()  # oneDNN's matmul in the bf16 arms (and its convolutions in the races)
    if not _C.cpu_has_bf16_units() or \
            precision.set_precision("bf16", source="bench_bf16_batched") != "bf16":
        raise SystemExit("bench_bf16_batched: this CPU has no bf16 units (emulated bf16 "
                         "would time nothing of bf16's speed)")
    print(precision.engine_description())
    arms = arms_here()
    print(f"{args.rounds} rounds, alternated; ms, best; f32/bf16: float32's best over bf16's")
    for name in names:
        rows = batched_rows(name, args.zoo)
        print(f"\n{name}: {len(rows)} bf16 batched GEMM shapes")
        print(f"{'ta tb    m     n      k count':30} "
              + " ".join(f"{ARMS[arm]:>10} {'GF/s':>6}" for arm in arms)
              + f" {'plan':>9} {'f32/bf16':>8}")
        total = {"f32": 0.0, "bf16": 0.0}
        for row in rows:
            ta, tb, m, n, k, count = row[:6]
            t = row_times(row, arms, args.rounds)
            flops = 2.0 * m * n * k * count
            f32 = min(t[arm] for arm in arms if arm in FLOAT32_ARMS)
            bf16 = min(t[arm] for arm in arms if arm not in FLOAT32_ARMS)
            total["f32"] += f32
            total["bf16"] += bf16
            print(f"{int(ta):2} {int(tb):2} {m:5} {n:5} {k:6} {count:5} "
                  + " ".join(f"{1e3 * t[arm]:10.3f} {flops / t[arm] / 1e9:6.1f}"
                             for arm in arms)
                  + f" {ARMS[row[-1]]:>9} {f32 / bf16:8.2f}", flush=True)
        if rows:
            print(f"sum: float32's best {1e3 * total['f32']:.1f} ms, bf16's best "
                  f"{1e3 * total['bf16']:.1f} ms: {total['f32'] / total['bf16']:.2f}x")


if __name__ == "__main__":
    main()
