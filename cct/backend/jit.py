"""CPU kernels compiled by numba: the solver rules other than SGD, fused; BatchNorm; Eltwise PROD
and MAX; the data transform.

Each kernel does what sgd_solver.cpp and its siblings do in several passes over memory (L2
Regularize, ComputeUpdateValue with its temporaries, Blob::Update) in one pass, element by
element, with the same float operations in the same order: the results are the staged NumPy
path's to the bit (numba neither contracts a*b+c into an FMA nor reorders without
``fastmath``; ``error_model="numpy"`` lets a division vectorize instead of checking for a
zero divisor). Measured in bench/bench_update_rules.py against the staged NumPy expressions
(bench/RESULTS.md). SGD stays in C++ (``_C.sgd_update``), which measured as fast.

Arguments: the flat (``reshape(-1)``) data, diff and history arrays of one param, then the
rule's scalars in the arrays' dtype, then ``local_decay`` (0: no regularization term, so that
an inf or NaN weight does not turn its update into NaN where Caffe's would not). The update
value is left in diff, as Caffe leaves it. Compiled on first use (about a second per rule and
dtype), cached on disk in cct's user cache folder (below).
"""
from __future__ import annotations

import os

import numpy as np

# Where colorama is installed, numba colours its error messages, and formatting the first one
# (numba builds some at import) calls colorama.init(), whose exit handler writes a colour reset
# to a terminal after the run's last log line. cct's kernels have no use for the colours.
os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")
import numba  # noqa: E402
from numba import njit  # noqa: E402

from .plans import user_cache_folder  # noqa: E402

# The compiled kernels are cached in cct's user cache folder, not numba's default beside this
# module: files written into an installed package outlive `pip uninstall` (which removes what
# it installed), and the folder left in site-packages, with no __init__.py, then shadows an
# editable install of cct as a namespace package (README's two commands in one environment:
# `import cct` in a subprocess found no cct.Net). A NUMBA_CACHE_DIR of the user's is kept.
if not numba.config.CACHE_DIR:
    numba.config.CACHE_DIR = os.path.join(user_cache_folder(), "numba")

_jit = njit(nogil=True, cache=True, error_model="numpy")


@_jit
def nesterov(w, g, h, local_rate, momentum, one_plus_momentum, local_decay):
    for i in range(w.size):
        gi = g[i]
        if local_decay:
            gi += w[i] * local_decay
        old = h[i]
        hi = h[i] * momentum + gi * local_rate
        h[i] = hi
        u = hi * one_plus_momentum + old * -momentum
        g[i] = u
        w[i] -= u


@_jit
def adagrad(w, g, h, local_rate, delta, local_decay):
    for i in range(w.size):
        gi = g[i]
        if local_decay:
            gi += w[i] * local_decay
        hi = h[i] + gi * gi
        h[i] = hi
        u = gi / (np.sqrt(hi) + delta) * local_rate
        g[i] = u
        w[i] -= u


@_jit
def rmsprop(w, g, h, local_rate, rms_decay, delta, one_minus_decay, local_decay):
    for i in range(w.size):
        gi = g[i]
        if local_decay:
            gi += w[i] * local_decay
        hi = h[i] * rms_decay + gi * gi * one_minus_decay
        h[i] = hi
        u = gi / (np.sqrt(hi) + delta) * local_rate
        g[i] = u
        w[i] -= u


@_jit
def adadelta(w, g, h, s, local_rate, momentum, delta, one_minus_momentum, local_decay):
    for i in range(w.size):
        gi = g[i]
        if local_decay:
            gi += w[i] * local_decay
        hi = h[i] * momentum + gi * gi * one_minus_momentum
        h[i] = hi
        gi = gi * np.sqrt((s[i] + delta) / (hi + delta))
        s[i] = s[i] * momentum + gi * gi * one_minus_momentum
        u = gi * local_rate
        g[i] = u
        w[i] -= u


@_jit
def adam(w, g, m, v, beta1, beta2, delta, one_minus_beta1, one_minus_beta2, step,
         local_decay):
    for i in range(w.size):
        gi = g[i]
        if local_decay:
            gi += w[i] * local_decay
        mi = m[i] * beta1 + gi * one_minus_beta1
        vi = v[i] * beta2 + gi * gi * one_minus_beta2
        m[i] = mi
        v[i] = vi
        u = mi / (np.sqrt(vi) + delta) * step
        g[i] = u
        w[i] -= u


# BatchNorm (cct/layers/normalization.py) on N x C x S arrays, a channel at a time: the NumPy
# expressions make a temporary per step (centred, its square, the quotient; in backward dy * y
# and two more); these read each value once per statistic and write once. The sums are in
# float64 over eight interleaved partial sums (a fixed order, so the same bits on every run,
# which LLVM can put in vector registers; one running sum is a serial chain it may not
# reorder): at least as accurate as NumPy's float32 pairwise sums, not the same bits. The
# elementwise steps are the NumPy expressions' float operations in order.
_LANES = 8


@_jit
def _channel_sum(x, j):
    """Sum over i, k of x[i, j, k], in eight float64 lanes."""
    n, _, s = x.shape
    lanes = np.zeros(_LANES)
    for i in range(n):
        k = 0
        while k + _LANES <= s:
            for lane in range(_LANES):
                lanes[lane] += x[i, j, k + lane]
            k += _LANES
        while k < s:
            lanes[0] += x[i, j, k]
            k += 1
    return lanes.sum()


@_jit
def _channel_squares(x, j, centre):
    """Sum over i, k of (x[i, j, k] - centre)^2, in eight float64 lanes."""
    n, _, s = x.shape
    lanes = np.zeros(_LANES)
    for i in range(n):
        k = 0
        while k + _LANES <= s:
            for lane in range(_LANES):
                d = x[i, j, k + lane] - centre
                lanes[lane] += d * d
            k += _LANES
        while k < s:
            d = x[i, j, k] - centre
            lanes[0] += d * d
            k += 1
    return lanes.sum()


@_jit
def _channel_sums_dy(dy, y, j):
    """(sum of dy, sum of dy * y) over channel j, in eight float64 lanes each."""
    n, _, s = dy.shape
    total = np.zeros(_LANES)
    dot = np.zeros(_LANES)
    for i in range(n):
        k = 0
        while k + _LANES <= s:
            for lane in range(_LANES):
                d = dy[i, j, k + lane]
                total[lane] += d
                dot[lane] += d * y[i, j, k + lane]
            k += _LANES
        while k < s:
            total[0] += dy[i, j, k]
            dot[0] += dy[i, j, k] * y[i, j, k]
            k += 1
    return total.sum(), dot.sum()


@_jit
def batch_norm_statistics(x, mean, var):
    n, c, s = x.shape
    count = n * s
    for j in range(c):
        mu = _channel_sum(x, j) / count
        mean[j] = mu
        var[j] = _channel_squares(x, j, mu) / count


@_jit
def batch_norm_normalize(x, mean, std, out):
    n, c, s = x.shape
    for i in range(n):
        for j in range(c):
            m = mean[j]
            sd = std[j]
            for k in range(s):
                out[i, j, k] = (x[i, j, k] - m) / sd


@_jit
def batch_norm_backward(dy, y, std, global_stats, out):
    n, c, s = dy.shape
    count = n * s
    means = np.empty(2, dy.dtype)  # the two means in the arrays' dtype, as NumPy's are
    for j in range(c):
        sd = std[j]
        if global_stats:
            for i in range(n):
                for k in range(s):
                    out[i, j, k] = dy[i, j, k] / sd
            continue
        total, dot = _channel_sums_dy(dy, y, j)
        means[0] = total / count
        means[1] = dot / count
        mean_dy = means[0]
        mean_dy_y = means[1]
        for i in range(n):
            for k in range(s):
                out[i, j, k] = (dy[i, j, k] - mean_dy - mean_dy_y * y[i, j, k]) / sd


# Eltwise (cct/layers/eltwise.py) on flat arrays: one pass each where the NumPy expressions
# made a temporary per bottom (PROD) or four (MAX: the comparison, np.where, the mask and its
# int32 copy). The same operations in the same order as those expressions, so the same bits.
# (SUM is the C++ kernel's, csrc/elementwise.cpp: threaded, as a memory-bound pass must be
# to use the machine's bandwidth.)
@_jit
def eltwise_prod(a, b, out):
    for i in range(out.size):
        out[i] = a[i] * b[i]


@_jit
def eltwise_max_first(a, b, out, mask):
    # Caffe's rule: bottom 1 unless bottom 0 is strictly greater.
    for i in range(out.size):
        if a[i] > b[i]:
            out[i] = a[i]
            mask[i] = 0
        else:
            out[i] = b[i]
            mask[i] = 1


@_jit
def eltwise_max_next(b, index, out, mask):
    for i in range(out.size):
        if b[i] > out[i]:
            out[i] = b[i]
            mask[i] = index


@_jit
def eltwise_max_backward(dy, mask, index, out):
    zero = out.dtype.type(0)
    for i in range(out.size):
        out[i] = dy[i] if mask[i] == index else zero


@_jit
def transform_example(image, mean, per_channel, h_off, w_off, flip, scale, out):
    """out (C x h x w, float32) = (image[:, h_off + h, w_off + w'] - mean) * scale, w' = w or
    (w_out - 1 - w) mirrored; mean is C x 1 x 1 (per channel) or the mean file's C x H x W,
    taken at the example's own (uncropped) positions (cct/data_transformer.py). One pass where
    the NumPy expressions made three (the cropped copy, the mean subtracted, the scale):
    1.2-1.35x on CaffeNet's batches (bench/RESULTS.md), in the same float32 operations, so
    the same bits."""
    c, oh, ow = out.shape
    for k in range(c):
        for r in range(oh):
            src = image[k, h_off + r, w_off:w_off + ow]
            dst = out[k, r]
            if per_channel:
                m = mean[k, 0, 0]
                if flip:
                    for q in range(ow):
                        dst[q] = (np.float32(src[ow - 1 - q]) - m) * scale
                else:
                    for q in range(ow):
                        dst[q] = (np.float32(src[q]) - m) * scale
            else:
                mrow = mean[k, h_off + r, w_off:w_off + ow]
                if flip:
                    for q in range(ow):
                        dst[q] = (np.float32(src[ow - 1 - q]) - mrow[ow - 1 - q]) * scale
                else:
                    for q in range(ow):
                        dst[q] = (np.float32(src[q]) - mrow[q]) * scale
