"""Pooling on the zoo's pooling shapes: cct's CPU kernels (csrc/pooling.cpp) against
PyTorch's in the same run and on the same threads, and against the NumPy array kernels (the
GPU backend's code on the CPU). MAX: forward, with Caffe's argmax mask (PyTorch's
max_pool2d with indices), and backward, each top diff routed to its window's argmax (PyTorch's
max_pool2d backward). AVE: forward and backward (PyTorch's avg_pool2d, whose divisor counts
the padding, as Caffe's does).

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
    ("LeNet pool2 b64", (64, 50, 8, 8), 2, 2, 0),
    ("CaffeNet pool1 b32", (32, 96, 55, 55), 3, 2, 0),
    ("GoogLeNet pool1/3x3_s2 b32", (32, 64, 112, 112), 3, 2, 0),
    ("GoogLeNet inception_3a/pool b32", (32, 192, 28, 28), 3, 1, 1),
    ("GoogLeNet inception_4a/pool b32", (32, 480, 14, 14), 3, 1, 1),
    ("GoogLeNet inception_5a/pool b32", (32, 832, 7, 7), 3, 1, 1),
    ("GoogLeNet pool3/3x3_s2 b32", (32, 480, 28, 28), 3, 2, 0),
    ("CaffeNet pool5 b32", (32, 256, 13, 13), 3, 2, 0),
]
# AVE: CIFAR10-quick's pool2 and pool3, GoogLeNet's global pool and loss pools, a 3x3/1 one
AVE_SHAPES = [
    ("CIFAR10-quick pool2 b100", (100, 32, 16, 16), 3, 2, 0),
    ("CIFAR10-quick pool3 b100", (100, 64, 8, 8), 3, 2, 0),
    ("GoogLeNet pool5/7x7_s1 b32", (32, 1024, 7, 7), 7, 1, 0),
    ("GoogLeNet loss1/ave_pool b32", (32, 512, 14, 14), 5, 3, 0),
    ("3x3/1 pad 1 b32", (32, 192, 28, 28), 3, 1, 1),
]


def torch_pools():
    """PyTorch's (max forward, ave forward, ave backward, max backward) calls for (x, k, s, p),
    or None."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(cpu.get_num_threads())
    F = torch.nn.functional

    def max_forward(x, k, s, p):
        t = torch.from_numpy(x)
        return lambda: F.max_pool2d(t, k, s, p, ceil_mode=True, return_indices=True)

    def ave_forward(x, k, s, p):
        t = torch.from_numpy(x)
        return lambda: F.avg_pool2d(t, k, s, p, ceil_mode=True)

    def backward(pool):
        def call(x, k, s, p):
            t = torch.from_numpy(x).requires_grad_()
            y = pool(t, k, s, p, ceil_mode=True)
            dy = torch.ones_like(y)
            return lambda: torch.autograd.grad(y, t, dy, retain_graph=True)
        return call
    return max_forward, ave_forward, backward(F.avg_pool2d), backward(F.max_pool2d)


def row(name, shape, k, s, p, t_cct, t_torch, t_np) -> str:
    torch_cols = f"{'-':>9} {'-':>9}"
    if t_torch is not None:
        torch_cols = f"{t_torch * 1e3:9.2f} {t_torch / t_cct:9.2f}"
    return (f"{name:<33} {'x'.join(map(str, shape)):<18} {f'{k}/{s}/{p}':<6} "
            f"{t_cct * 1e3:8.2f} {torch_cols} {t_np * 1e3:9.2f} {t_np / t_cct:9.2f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20, help="timed calls per kernel and way")
    args = ap.parse_args(argv)
    numpy_kernels = ArrayKernels(np)
    torch = torch_pools()
    print(f"CPU: {cpu_model()}; {cpu.get_num_threads()} threads; best of {args.repeat} calls; "
          f"float32")
    header = (f"{'cct ms':>8} {'torch ms':>9} {'torch/cct':>9} {'NumPy ms':>9} "
              f"{'NumPy/cct':>9}")
    rng = np.random.default_rng(0)
    few = max(3, args.repeat // 5)  # the NumPy kernels are slow

    def geometry(shape, k, s, p):
        pooled = tuple(cpu.pool_out_size(d, k, s, p, True) for d in shape[2:])
        return ((k, k), (s, s), (p, p), pooled)

    print(f"MAX forward\n{'layer':<33} {'bottom':<18} {'k/s/p':<6} {header}")
    for name, shape, k, s, p in SHAPES:
        x = rng.standard_normal(shape, dtype=np.float32)
        geom = geometry(shape, k, s, p)
        y, mask = cpu.max_pool_forward(x, *geom)
        t_cct = best_of(lambda: cpu.max_pool_forward(x, *geom, out=y, mask=mask), args.repeat)
        t_np = best_of(lambda: numpy_kernels.max_pool_forward(x, *geom), few)
        t_torch = best_of(torch[0](x, k, s, p), args.repeat) if torch else None
        print(row(name, shape, k, s, p, t_cct, t_torch, t_np), flush=True)
    print(f"MAX backward\n{'layer':<33} {'bottom':<18} {'k/s/p':<6} {header}")
    for name, shape, k, s, p in SHAPES:
        x = rng.standard_normal(shape, dtype=np.float32)
        geom = geometry(shape, k, s, p)
        y, mask = cpu.max_pool_forward(x, *geom)
        numpy_kernels.max_pool_forward(x, *geom)   # the array kernels' windows, for their backward
        dy = rng.standard_normal(y.shape, dtype=np.float32)
        dx = np.empty_like(x)
        t_cct = best_of(lambda: cpu.max_pool_backward(dy, mask, shape, out=dx), args.repeat)
        t_np = best_of(lambda: numpy_kernels.max_pool_backward(dy, mask, shape), few)
        t_torch = best_of(torch[3](x, k, s, p), args.repeat) if torch else None
        print(row(name, shape, k, s, p, t_cct, t_torch, t_np), flush=True)
    for way in ("forward", "backward"):
        print(f"AVE {way}\n{'layer':<33} {'bottom':<18} {'k/s/p':<6} {header}")
        for name, shape, k, s, p in AVE_SHAPES:
            x = rng.standard_normal(shape, dtype=np.float32)
            geom = geometry(shape, k, s, p)
            y = cpu.ave_pool_forward(x, *geom)
            dx = np.empty_like(x)
            if way == "forward":
                t_cct = best_of(lambda: cpu.ave_pool_forward(x, *geom, out=y), args.repeat)
                t_np = best_of(lambda: numpy_kernels.ave_pool_forward(x, *geom), few)
            else:
                t_cct = best_of(lambda: cpu.ave_pool_backward(y, shape, *geom, out=dx),
                                args.repeat)
                t_np = best_of(lambda: numpy_kernels.ave_pool_backward(y, shape, *geom), few)
            t_torch = (best_of(torch[1 if way == "forward" else 2](x, k, s, p), args.repeat)
                       if torch else None)
            print(row(name, shape, k, s, p, t_cct, t_torch, t_np), flush=True)


if __name__ == "__main__":
    main()
