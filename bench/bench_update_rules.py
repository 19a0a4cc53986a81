"""The solver update per rule: the fused CPU kernel against the steps one by one in NumPy.

For every Caffe solver type, one whole update (L2 weight decay, the rule, w -= g) over the
params of LeNet (431 K) and CaffeNet (61 M), float32: cct's fused CPU kernel (SGD in C++ on
cct's threads, the others in numba on one thread, cct/backend/jit.py) against the same rule as
NumPy expressions with temporaries, Caffe's steps one by one (the array kernels, the GPU
backend's code, on NumPy: what the CPU ran for every rule but SGD before), and for SGD also
against the same loop in numba, so that the faster of C++ and numba is kept knowingly. Best of
several runs after a warm-up (which compiles the numba kernels).

Then, for SGD on the CPU, what the solver's step loop spares between two iterations of one
step (Solver._update_may_clear): the update followed by the next iteration's ClearParamDiffs
(every diff zeroed, as Net.clear_param_diffs does), against the update leaving the diffs zero
in its own pass (clear_diffs), alternated round by round; medians.
Usage: python bench/bench_update_rules.py [--nets lenet,caffenet] [--repeat N] [--threads T]
"""
import argparse
import pathlib
import statistics
import sys
import time

import numpy as np
from numba import njit

from cct import _C
from cct.backend import get as get_backend
from cct.backend.array_kernels import ArrayKernels
from cct.params import ParamSet, StoreBlob
from cct.proto import caffe_pb2
from cct.solver_rules import RULES, UpdatePipeline

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))   # after the installed cct
from bench.worker import cpu_model  # noqa: E402

SHAPES = {
    "lenet": [(20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (500, 800), (500,), (10, 500), (10,)],
    "caffenet": [(96, 3, 11, 11), (96,), (256, 48, 5, 5), (256,), (384, 256, 3, 3), (384,),
                 (384, 192, 3, 3), (384,), (256, 192, 3, 3), (256,), (4096, 9216), (4096,),
                 (4096, 4096), (4096,), (1000, 4096), (1000,)],
}


@njit(nogil=True, error_model="numpy")
def _sgd_numba(w, g, h, local_rate, momentum, local_decay):
    for i in range(w.size):
        gi = g[i]
        if local_decay:
            gi += w[i] * local_decay
        hi = h[i] * momentum + gi * local_rate
        h[i] = hi
        g[i] = hi
        w[i] -= hi


class _NumbaSGD:
    """A backend whose sgd_update is the numba loop above (the C++ kernel's rival)."""

    @staticmethod
    def sgd_update(data, diff, history, local_rate, momentum, local_decay):
        dt = data.dtype.type
        _sgd_numba(data.reshape(-1), diff.reshape(-1), history.reshape(-1), dt(local_rate),
                   dt(momentum), dt(local_decay))


def time_update(kind: str, shapes, backend, repeat: int) -> float:
    p = caffe_pb2.SolverParameter(type=kind, weight_decay=5e-4,
                                  momentum=0.0 if kind in ("AdaGrad", "RMSProp") else 0.9)
    rs = np.random.default_rng(0)
    params = ParamSet([StoreBlob(rs.standard_normal(s, dtype=np.float32)) for s in shapes],
                      [1.0] * len(shapes), [1.0] * len(shapes), backend)
    grads = [rs.standard_normal(s, dtype=np.float32) for s in shapes]
    pipeline = UpdatePipeline(RULES[kind], p, params)
    best = float("inf")
    for it in range(repeat + 1):            # the first compiles and touches the scratch
        for b, g in zip(params.blobs, grads):
            b.diff[...] = g
        t0 = time.perf_counter()
        pipeline.apply(1e-4, it)
        if it:
            best = min(best, time.perf_counter() - t0)
    return best


def time_clearing(shapes, repeat: int):
    """Median seconds of SGD's update then the diffs cleared, and of the update that leaves
    them zero itself, on the CPU backend, the two alternated round by round."""
    p = caffe_pb2.SolverParameter(type="SGD", weight_decay=5e-4, momentum=0.9)
    rs = np.random.default_rng(0)
    params = ParamSet([StoreBlob(rs.standard_normal(s, dtype=np.float32)) for s in shapes],
                      [1.0] * len(shapes), [1.0] * len(shapes), get_backend("cpu"))
    grads = [rs.standard_normal(s, dtype=np.float32) for s in shapes]
    pipeline = UpdatePipeline(RULES["SGD"], p, params)

    def then_clear(it):
        pipeline.apply(1e-4, it)
        for b in params.blobs:
            b.diff[...] = 0

    def fused(it):
        if not pipeline.update.apply(pipeline.history, params, 1e-4, it, clear_diffs=True):
            raise SystemExit("bench_update_rules: the CPU's SGD update did not clear the diffs")

    times = {then_clear: [], fused: []}
    for it in range(repeat + 1):
        for run in ((then_clear, fused) if it % 2 else (fused, then_clear)):
            for b, g in zip(params.blobs, grads):
                b.diff[...] = g
            t0 = time.perf_counter()
            run(it)
            if it:
                times[run].append(time.perf_counter() - t0)
    return statistics.median(times[then_clear]), statistics.median(times[fused])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="lenet,caffenet")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1,
                    help="cct's threads (the C++ SGD kernel's); the numba kernels use one")
    args = ap.parse_args()
    _C.set_num_threads(args.threads)
    cpu = get_backend("cpu")
    staged = ArrayKernels(np)               # the steps one by one, in NumPy
    print(f"CPU: {cpu_model()}; cct threads {args.threads}; float32; best of {args.repeat}")
    print("| net | rule | steps in NumPy ms | fused ms | fused kernel | steps / fused |")
    print("|---|---|---|---|---|---|")
    for net in args.nets.split(","):
        shapes = SHAPES[net]
        for kind in RULES:
            t_staged = time_update(kind, shapes, staged, args.repeat)
            t_fused = time_update(kind, shapes, cpu, args.repeat)
            how = "C++" if kind == "SGD" else "numba"
            print(f"| {net} | {kind} | {1e3 * t_staged:.3g} | {1e3 * t_fused:.3g} | {how} | "
                  f"{t_staged / t_fused:.2f} |", flush=True)
            if kind == "SGD":
                t_numba = time_update(kind, shapes, _NumbaSGD, args.repeat)
                print(f"| {net} | SGD | {1e3 * t_staged:.3g} | {1e3 * t_numba:.3g} | numba "
                      f"(C++ / numba {t_fused / t_numba:.2f}) | {t_staged / t_numba:.2f} |",
                      flush=True)
    print(f"\nSGD's update and the next iteration's clear (medians of {args.repeat}, "
          f"alternated):")
    print("| net | update, then clear ms | update leaving the diffs zero ms | ratio |")
    print("|---|---|---|---|")
    for net in args.nets.split(","):
        apart, fused = time_clearing(SHAPES[net], args.repeat)
        print(f"| {net} | {1e3 * apart:.3g} | {1e3 * fused:.3g} | {apart / fused:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
