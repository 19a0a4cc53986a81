"""MAX pooling forward (top and Caffe's argmax mask) on the zoo's pooling shapes: cct's CPU
kernel (csrc/pooling.cpp) against PyTorch's max_pool2d with indices, in the same run and on
the same threads, and against the NumPy array kernels (the GPU backend's code on the CPU).

Printed per shape: best of --repeat calls (ms) each way, and PyTorch / cct and NumPy / cct
(> 1: cct faster). PyTorch is optional (its columns are left out without it).
Usage: python bench/bench_pooling.py [--repeat N]
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

from cct.backend import cpu
from cct.backend.array_kernels import ArrayKernels

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))   # after the installed cct
from bench.worker import best_of, cpu_model  # noqa: E402

# (where it comes from, bottom shape, kernel, stride, pad)
SHAPES = [
    ("CIFAR10-quick pool1 b100", (100, 32, 32, 32), 3, 2, 0),
    ("LeNet pool1 b64", (64, 20, 24, 24), 2, 2, 0),
    ("CaffeNet pool1 b32", (32, 96, 55, 55), 3, 2, 0),
    ("GoogLeNet pool1/3x3_s2 b32", (32, 64, 112, 112), 3, 2, 0),
    ("GoogLeNet inception_3a/pool b32", (32, 192, 28, 28), 3, 1, 1),
    ("GoogLeNet pool3/3x3_s2 b32", (32, 480, 28, 28), 3, 2, 0),
]


def torch_pool():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(cpu.get_num_threads())

    def pool(x, k, s, p):
        t = torch.from_numpy(x)
        return lambda: torch.nn.functional.max_pool2d(t, k, s, p, ceil_mode=True,
                                                      return_indices=True)
    return pool


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20, help="timed calls per kernel and way")
    args = ap.parse_args(argv)
    numpy_kernels = ArrayKernels(np)
    torch = torch_pool()
    print(f"CPU: {cpu_model()}; {cpu.get_num_threads()} threads; best of {args.repeat} calls; "
          f"float32")
    print(f"{'layer':<33} {'bottom':<18} {'k/s/p':<6} {'cct ms':>8} {'torch ms':>9} "
          f"{'torch/cct':>9} {'NumPy ms':>9} {'NumPy/cct':>9}")
    rng = np.random.default_rng(0)
    for name, shape, k, s, p in SHAPES:
        x = rng.standard_normal(shape, dtype=np.float32)
        pooled = tuple(cpu.pool_out_size(d, k, s, p, True) for d in shape[2:])
        geom = ((k, k), (s, s), (p, p), pooled)
        y, mask = cpu.max_pool_forward(x, *geom)
        t_cct = best_of(lambda: cpu.max_pool_forward(x, *geom, out=y, mask=mask), args.repeat)
        t_np = best_of(lambda: numpy_kernels.max_pool_forward(x, *geom), max(3, args.repeat // 5))
        torch_cols = f"{'-':>9} {'-':>9}"
        if torch is not None:
            t_torch = best_of(torch(x, k, s, p), args.repeat)
            torch_cols = f"{t_torch * 1e3:9.2f} {t_torch / t_cct:9.2f}"
        print(f"{name:<33} {'x'.join(map(str, shape)):<18} {f'{k}/{s}/{p}':<6} "
              f"{t_cct * 1e3:8.2f} {torch_cols} {t_np * 1e3:9.2f} {t_np / t_cct:9.2f}",
              flush=True)


if __name__ == "__main__":
    main()
