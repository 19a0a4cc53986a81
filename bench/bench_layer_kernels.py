"""The layer kernels that were NumPy expressions with temporaries, each against its one-pass
numba version, in the same run (issue 16, item 5).

- BatchNorm and Eltwise: cct's CPU backend (numba, cct/backend/jit.py; Eltwise SUM in C++,
  csrc/elementwise.cpp, threaded) against the array kernels on NumPy (the GPU backend's code,
  what the CPU ran before);
- the data transform (crop, mirror, mean file or values, scale): cct's kernel (numba,
  cct/backend/jit.py) against the NumPy expressions it replaced, copied here;
- Dropout's forward: the layer's NumPy (draw, compare, two products) against a fused numba
  loop defined here, over the same draws, so that keeping NumPy is a measured choice.

Printed per kernel and shape: best of --repeat calls (ms) each way, and NumPy / numba (> 1:
numba faster). Usage: python bench/bench_layer_kernels.py [--repeat N]
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
from numba import njit

from cct.backend import cpu
from cct.backend.array_kernels import ArrayKernels
from cct.backend.jit import transform_example

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))   # after the installed cct
from bench.worker import best_of, cpu_model  # noqa: E402

NUMPY = ArrayKernels(np)


def batch_norm_rows(rng):
    for shape in [(100, 32, 256), (100, 64, 64), (32, 256, 784)]:
        x = rng.standard_normal(shape, dtype=np.float32)
        dy = rng.standard_normal(shape, dtype=np.float32)
        mean, var = cpu.batch_norm_statistics(x)
        std = np.sqrt(var + np.float32(1e-5))
        y, dx = np.empty_like(x), np.empty_like(x)
        label = "x".join(map(str, shape))
        for name, fn in [("statistics", lambda k: k.batch_norm_statistics(x)),
                         ("normalize", lambda k: k.batch_norm_normalize(x, mean, std, out=y)),
                         ("backward", lambda k: k.batch_norm_backward(dy, y, std, False,
                                                                      out=dx))]:
            yield f"BatchNorm {name}", label, lambda fn=fn: fn(NUMPY), lambda fn=fn: fn(cpu)


def eltwise_rows(rng):
    # a ResNet block's sum (b32, 256 x 56 x 56) and CIFAR-sized ones
    for shape in [(32, 256, 56, 56), (100, 32, 16, 16)]:
        a = rng.standard_normal(shape, dtype=np.float32)
        b = rng.standard_normal(shape, dtype=np.float32)
        top, dx = np.empty_like(a), np.empty_like(a)
        mask = np.empty(shape, np.int32)
        label = "x".join(map(str, shape))
        yield ("Eltwise SUM (coeff 1, -0.5)", label,
               lambda: NUMPY.eltwise_sum([a, b], [1.0, -0.5], out=top),
               lambda: cpu.eltwise_sum([a, b], [1.0, -0.5], out=top))
        yield ("Eltwise PROD", label, lambda: NUMPY.eltwise_prod([a, b], out=top),
               lambda: cpu.eltwise_prod([a, b], out=top))
        yield ("Eltwise MAX", label, lambda: NUMPY.eltwise_max([a, b], out=top, mask=mask),
               lambda: cpu.eltwise_max([a, b], out=top, mask=mask))
        cpu.eltwise_max([a, b], out=top, mask=mask)
        yield ("Eltwise MAX backward", label,
               lambda: NUMPY.eltwise_max_backward(a, mask, 1, out=dx),
               lambda: cpu.eltwise_max_backward(a, mask, 1, out=dx))


def _transform_numpy(images, mean, mean_file, h_off, w_off, flips, scale, crop):
    """The data transform as it was: a cropped (mirrored) copy, the mean, the scale."""
    n, c = len(images), images[0].shape[0]
    out = np.empty((n, c, crop, crop), np.float32)
    for i, im in enumerate(images):
        rows = slice(int(h_off[i]), int(h_off[i]) + crop)
        cols = slice(int(w_off[i]), int(w_off[i]) + crop)
        x = im[:, rows, cols]
        if not mean_file:
            out[i] = x[..., ::-1] if flips[i] else x
        else:
            m = mean[:, rows, cols]
            out[i] = (x[..., ::-1] - m[..., ::-1]) if flips[i] else (x - m)
    if not mean_file:
        out -= mean.reshape(1, c, 1, 1)
    out *= scale
    return out


def _transform_numba(images, mean, mean_file, h_off, w_off, flips, scale, crop):
    n, c = len(images), images[0].shape[0]
    out = np.empty((n, c, crop, crop), np.float32)
    for i, im in enumerate(images):
        transform_example(im, mean, not mean_file, int(h_off[i]), int(w_off[i]),
                           bool(flips[i]), scale, out[i])
    return out


def transform_rows(rng):
    # CaffeNet's: 256 examples of 3 x 256 x 256 pixels, crop 227, mirror, mean file or values
    n, c, h, crop = 256, 3, 256, 227
    images = [rng.integers(0, 256, (c, h, h), dtype=np.uint8) for _ in range(n)]
    h_off, w_off = rng.integers(0, h - crop + 1, n), rng.integers(0, h - crop + 1, n)
    flips = rng.integers(0, 2, n).astype(bool)
    scale = np.float32(0.017)
    for label, mean, mean_file in [
            ("mean file", rng.random((c, h, h), dtype=np.float32) * 255, True),
            ("mean values", np.array([104, 117, 123], np.float32).reshape(c, 1, 1), False)]:
        args = (images, mean, mean_file, h_off, w_off, flips, scale, crop)
        want = _transform_numpy(*args)
        if not np.array_equal(want.view(np.int32), _transform_numba(*args).view(np.int32)):
            raise SystemExit(f"bench: the data transform's kernel differs ({label})")
        yield ("data transform", f"256x3x256^2 crop 227, {label}",
               lambda args=args: _transform_numpy(*args), lambda args=args: _transform_numba(*args))


@njit(nogil=True, error_model="numpy")
def _dropout_numba(x, u, threshold, scale, y, mask):
    for i in range(x.size):
        keep = u[i] < threshold
        mask[i] = keep
        y[i] = x[i] * np.float32(keep) * scale


def dropout_rows(rng):
    for shape in [(256, 4096), (32, 4096)]:
        x = rng.standard_normal(shape, dtype=np.float32)
        y, mask = np.empty(x.size, np.float32), np.empty(x.size, np.bool_)
        scale = np.float32(2)

        def numpy_path(x=x):  # DropoutLayer.neuron_forward
            keep = rng.random(x.shape) < 0.5
            return x * keep * scale

        def numba_path(x=x, y=y, mask=mask):
            _dropout_numba(x.reshape(-1), rng.random(x.size), 0.5, scale, y, mask)

        yield "Dropout forward (with its draws)", "x".join(map(str, shape)), numpy_path, \
            numba_path
        yield "  of which the draws alone", "x".join(map(str, shape)), \
            lambda x=x: rng.random(x.shape), None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10, help="timed calls per kernel and way")
    args = ap.parse_args(argv)
    print(f"CPU: {cpu_model()}; best of {args.repeat} calls; float32")
    print(f"{'kernel':<34} {'shape':<34} {'NumPy ms':>9} {'numba ms':>9} {'NumPy/numba':>11}")
    rng = np.random.default_rng(0)
    for rows in (batch_norm_rows, eltwise_rows, transform_rows, dropout_rows):
        for kernel, shape, numpy_call, numba_call in rows(rng):
            t_np = best_of(numpy_call, args.repeat)
            if numba_call is None:
                print(f"{kernel:<34} {shape:<34} {t_np * 1e3:9.2f}", flush=True)
                continue
            t_nb = best_of(numba_call, args.repeat)
            print(f"{kernel:<34} {shape:<34} {t_np * 1e3:9.2f} {t_nb * 1e3:9.2f} "
                  f"{t_np / t_nb:11.2f}", flush=True)


if __name__ == "__main__":
    main()
