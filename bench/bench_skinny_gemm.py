"""What the skinny float32 GEMM engine (csrc/gemm_skinny.cpp, GEMM choice 4; 6 for its 16-lane
tile on AVX-512 CPUs) gives: the fully connected layers' forward and backward-data GEMMs at
batch 32 in each engine (OpenBLAS in its two operand orders, the skinny engine's tiles) and in
PyTorch, then whole training iterations of nets with the plans the race chose against the same
plans with every skinny choice replaced by the faster BLAS order. Rounds alternate, so that the
host's drift falls on all arms alike.

    python bench/bench_skinny_gemm.py [--nets caffenet_b32,alexnet_b32] [--rounds 8]

Prints the machine and its SGEMM peak, a row per GEMM shape (ms as median / best, GFLOP/s of
the faster skinny tile's best, PyTorch / that best), and a row per net (iteration ms with and
without the engine, median / best, and the ratio of the medians).
"""
import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))  # after the installed cct

from bench.bench_train import (NETS, add_net_arguments, alternated_tables,  # noqa: E402
                               chosen_nets, machine, sgemm_peak, synthetic_net)
from bench.worker import seconds  # noqa: E402

SKINNY, SKINNY16 = 4, 6  # cct/backend/plans.py's SKINNY_CHOICES
# (name, m, n, k, trans_b): C (m x n) = X (m x k) W^T (trans_b: the forward, W n x k) or X W
# (the backward data dx = dy W, W k x n) of CaffeNet's and AlexNet's fully connected layers at
# batch 32 (fc8 with ImageNet's 1,000 classes), and of LeNet's ip1 at 64.
SHAPES = [("fc6 b32", 32, 4096, 9216, True), ("fc7 b32", 32, 4096, 4096, True),
          ("fc8 b32", 32, 1000, 4096, True), ("lenet ip1 b64", 64, 500, 800, True),
          ("fc6 b32 dx", 32, 9216, 4096, False), ("fc7 b32 dx", 32, 4096, 4096, False),
          ("fc8 b32 dx", 32, 4096, 1000, False), ("lenet ip1 b64 dx", 64, 800, 500, False)]


def gemm_times(m: int, n: int, k: int, trans_b: bool, rounds: int) -> dict:
    """Seconds of out += X W^T (trans_b) or X W per round for each cct choice, and PyTorch's
    addmm_."""
    import torch
    from cct import _C
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k), np.float32)
    w = rng.standard_normal((n, k) if trans_b else (k, n), np.float32)
    out = np.zeros((m, n), np.float32)
    threads = _C.blas_num_threads()
    tx, tw, tout = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(out.copy())
    tw = tw.t() if trans_b else tw
    arms = {}
    for choice in (0, 1, SKINNY) + ((SKINNY16,) if _C.gemm_skinny16_available() else ()):
        def run(choice=choice):
            _C.load_gemm_choices([(False, trans_b, m, n, k, 4, threads, True, choice)])
            _C.gemm(x, w, False, trans_b, measured=True, out=out, accumulate=True)
        arms[choice] = run
    times = {arm: [] for arm in arms}
    for call in arms.values():
        call()
    for r in range(rounds):
        for arm in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            times[arm].append(seconds(arms[arm]))
    _C.clear_plans()
    # PyTorch after cct's arms, not between them: its OpenMP threads spin on after a call and
    # would take the cores from whichever cct arm came next.
    tout.addmm_(tx, tw)
    times["torch"] = [seconds(lambda: tout.addmm_(tx, tw)) for _ in range(rounds)]
    time.sleep(0.5)
    return times


def without_skinny(table: dict, rounds: int) -> dict:
    """``table`` with each skinny GEMM choice replaced by the faster of the BLAS's two operand
    orders, timed here on the shape (random operands, best of ``rounds``)."""
    from cct import _C
    rng = np.random.default_rng(1)
    rows = []
    for row in table["gemm"]:
        ta, tb, m, n, k, size, threads, accumulate, choice = row
        if choice in (SKINNY, SKINNY16):
            a = rng.standard_normal((k, m) if ta else (m, k), np.float32)
            b = rng.standard_normal((n, k) if tb else (k, n), np.float32)
            out = np.zeros((m, n), np.float32)
            best = {}
            for order in (0, 1):
                _C.load_gemm_choices([(ta, tb, m, n, k, size, threads, accumulate, order)])
                best[order] = min(seconds(lambda: _C.gemm(a, b, ta, tb, measured=True, out=out,
                                                          accumulate=accumulate))
                                  for _ in range(rounds))
            choice = bool(min(best, key=best.get))
        rows.append([ta, tb, m, n, k, size, threads, accumulate, choice])
    return dict(table, gemm=rows)


def iteration_times(net, rounds: int) -> dict:
    from cct.backend import plans
    for _ in range(2):                           # plans measured
        net.clear_param_diffs()
        net.forward_backward()
    tables = {"with": plans.table()}
    tables["without"] = without_skinny(tables["with"], 3)
    skinny = sum(1 for r in tables["with"]["gemm"] if r[8] in (SKINNY, SKINNY16))
    times = alternated_tables(tables, net.forward_backward, rounds, reset=net.clear_param_diffs)
    plans.install(tables["with"])
    return {"skinny": skinny, "gemms": len(tables["with"]["gemm"]), **times}


def ms(values) -> str:
    return f"{1e3 * statistics.median(values):7.2f} / {1e3 * min(values):7.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_net_arguments(ap, "caffenet_b32,alexnet_b32")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--no-shapes", action="store_true", help="only the nets' iterations")
    args = ap.parse_args()
    names = chosen_nets(ap, args)
    print(machine())
    print(f"SGEMM peak {sgemm_peak():.1f} GFLOP/s; {args.rounds} rounds, alternated; ms as "
          f"median / best")
    if not args.no_shapes:
        from cct import _C
        wide = _C.gemm_skinny16_available()
        print(f"{'GEMM (out += X W^T; dx: X W)':28} {'OpenBLAS direct':>17} "
              f"{'OpenBLAS transp.':>17} {'skinny':>17} "
              + (f"{'skinny 16 lanes':>17} " if wide else "")
              + f"{'PyTorch':>17} {'skinny GF/s':>11} {'PyTorch/skinny':>14}")
        for name, m, n, k, trans_b in SHAPES:
            t = gemm_times(m, n, k, trans_b, args.rounds)
            flops = 2.0 * m * n * k
            best = min(min(t[c]) for c in (SKINNY, SKINNY16) if c in t)
            print(f"{name + f' {m}x{n}x{k}':28} {ms(t[0]):>17} {ms(t[1]):>17} "
                  f"{ms(t[SKINNY]):>17} " + (f"{ms(t[SKINNY16]):>17} " if wide else "")
                  + f"{ms(t['torch']):>17} {flops / best / 1e9:11.1f} "
                  f"{min(t['torch']) / best:14.2f}", flush=True)
    print(f"{'net':16} {'skinny GEMMs':>12} {'iteration with':>19} {'without':>19} "
          f"{'without/with':>12}")
    for name in names:
        rel, batch = NETS[name]
        r = iteration_times(synthetic_net(args.zoo / rel, batch), args.rounds)
        ratio = statistics.median(r["without"]) / statistics.median(r["with"])
        print(f"{name:16} {r['skinny']:>5} of {r['gemms']:<4} {ms(r['with']):>19} "
              f"{ms(r['without']):>19} {ratio:12.3f}", flush=True)


if __name__ == "__main__":
    main()
