"""NumPy reference implementations of the CPU kernels that :mod:`cct.backend.cpu` runs in C++.

Independent of the C++ code (array slicing and ``np.matmul``, vectorised over the whole
mini-batch), kept as the oracle the C++ kernels are tested against
(tests/backend/test_cpu_kernels.py). Same signatures and results as the functions of the same
names in :mod:`cct.backend.cpu`.
"""
from __future__ import annotations

import numpy as np

from .shapes import conv_out_size, store as _store


# --------------------------------------------------------------------------------------------
# Convolution lowered to GEMM over the whole mini-batch
# --------------------------------------------------------------------------------------------
def _lower(x, kernel, stride, pad, dilation, group):
    """Expand x (N, C, H, W) into columns (group, C/group*kh*kw, N*Ho*Wo), a contiguous copy.

    One strided slice copy per kernel tap: much faster than copying a 7-axis strided view."""
    n, c, h, w = x.shape
    kh, kw = kernel
    sh, sw = stride
    ph, pw = pad
    dh, dw = dilation
    ho = conv_out_size(h, kh, sh, ph, dh)
    wo = conv_out_size(w, kw, sw, pw, dw)
    if ph or pw:
        xpad = np.zeros((n, c, h + 2 * ph, w + 2 * pw), x.dtype)
        xpad[:, :, ph:ph + h, pw:pw + w] = x
    else:
        xpad = x
    cg = c // group
    xg = xpad.reshape(n, group, cg, xpad.shape[2], xpad.shape[3]).transpose(1, 2, 0, 3, 4)
    cols = np.empty((group, cg, kh, kw, n, ho, wo), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = xg[:, :, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                                  j * dw:j * dw + sw * (wo - 1) + 1:sw]
    return cols.reshape(group, cg * kh * kw, n * ho * wo), ho, wo


def _unlower(cols, x_shape, kernel, stride, pad, dilation, group, ho, wo):
    """Adjoint of :func:`_lower`: sum columns back into an (N, C, H, W) array (a view).

    Accumulates in the columns' (C, N, H, W) order, so every tap adds a contiguous block."""
    n, c, h, w = x_shape
    kh, kw = kernel
    sh, sw = stride
    ph, pw = pad
    dh, dw = dilation
    cg = c // group
    cols = cols.reshape(group, cg, kh, kw, n, ho, wo)
    acc = np.zeros((group, cg, n, h + 2 * ph, w + 2 * pw), cols.dtype)
    for i in range(kh):
        for j in range(kw):
            acc[:, :, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                j * dw:j * dw + sw * (wo - 1) + 1:sw] += cols[:, :, i, j]
    xpad = acc.reshape(c, n, h + 2 * ph, w + 2 * pw).transpose(1, 0, 2, 3)
    return xpad[:, :, ph:ph + h, pw:pw + w]


def conv_forward(x, weight, bias, kernel, stride, pad, dilation, group, out=None,
                 engine="DEFAULT"):
    """y = conv(x, weight) + bias. weight: (O, C/group, kh, kw); returns (N, O, Ho, Wo).
    Every ``engine`` (convolution_param.engine) is Caffe's lowering here."""
    n = x.shape[0]
    o = weight.shape[0]
    cols, ho, wo = _lower(x, kernel, stride, pad, dilation, group)
    wmat = weight.reshape(group, o // group, -1)
    y = np.matmul(wmat, cols)  # (group, O/group, N*P)
    y = y.reshape(o, n, ho, wo).transpose(1, 0, 2, 3)
    y = np.ascontiguousarray(y)
    if bias is not None:
        y += bias.reshape(1, o, 1, 1)
    return _store(y, out)


def conv_backward_data(dy, weight, x_shape, kernel, stride, pad, dilation, group, out=None,
                       engine="DEFAULT"):
    """Gradient of :func:`conv_forward` with respect to x (Caffe's backward_cpu_gemm + col2im).

    ``x_shape`` is (N, C, H, W); Deconvolution's forward pass is this function."""
    n, o, ho, wo = dy.shape
    dymat = np.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(group, o // group, n * ho * wo)
    wmat = weight.reshape(group, o // group, -1)
    dcols = np.matmul(wmat.transpose(0, 2, 1), dymat)
    return _store(_unlower(dcols, x_shape, kernel, stride, pad, dilation, group, ho, wo), out)


def conv_backward_weight(x, dy, kernel, stride, pad, dilation, group, out=None,
                         accumulate=False, engine="DEFAULT"):
    """Gradient of :func:`conv_forward` with respect to the weight, shape (O, C/group, kh, kw)
    (Caffe's weight_cpu_gemm, summed over the batch); added into ``out`` with accumulate."""
    n, o, ho, wo = dy.shape
    dymat = np.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(group, o // group, n * ho * wo)
    cols, _, _ = _lower(x, kernel, stride, pad, dilation, group)
    dw = np.matmul(dymat, cols.transpose(0, 2, 1))
    return _store(dw.reshape(o, x.shape[1] // group, kernel[0], kernel[1]), out, accumulate)


def bias_backward(dy, out=None, accumulate=False):
    """Sum of dy over every axis but 1 (in float64, then the dy's dtype)."""
    axes = (0,) + tuple(range(2, dy.ndim))
    return _store(dy.sum(axis=axes, dtype=np.float64).astype(dy.dtype), out, accumulate)


def matmul(a, b, out=None, accumulate=False):
    return _store(np.matmul(a, b), out, accumulate)


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------
def _pool_padded(x, kernel, stride, pad, out, fill):
    """x padded with ``fill`` far enough that every window lies inside (x itself if it does)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (ho, wo) = kernel, stride, pad, out
    need_h = max((ho - 1) * sh + kh, h + ph)
    need_w = max((wo - 1) * sw + kw, w + pw)
    if (ph, pw, need_h, need_w) == (0, 0, h, w):
        return x
    xpad = np.full((n, c, need_h, need_w), fill, x.dtype)
    xpad[:, :, ph:ph + h, pw:pw + w] = x
    return xpad


def _pool_taps(xpad, kernel, stride, out):
    """Yield (i, j, tap): tap[n, c, ph, pw] is element (i, j) of window (ph, pw), taps in
    row-major window order."""
    (kh, kw), (sh, sw), (ho, wo) = kernel, stride, out
    for i in range(kh):
        for j in range(kw):
            yield i, j, xpad[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]


def max_pool_forward(x, kernel, stride, pad, pooled, out=None, mask=None):
    """Max over each window of the unpadded bottom, scanned in row-major window order with a
    strict ``>`` as Caffe does (ties go to the first element, NaN never wins).
    Returns (top, argmax as the flat index h * W + w in the bottom's plane)."""
    n, c, h, w = x.shape
    (_, kw), (sh, sw), (ph, pw), (ho, wo) = kernel, stride, pad, pooled
    xpad = _pool_padded(x, kernel, stride, pad, pooled, -np.inf)
    taps = list(_pool_taps(xpad, kernel, stride, pooled))
    y = np.full((n, c, ho, wo), -np.inf, x.dtype)
    for _, _, tap in taps:
        np.fmax(y, tap, out=y)
    # The first tap equal to the maximum wins: scan backwards so earlier taps overwrite.
    arg = np.zeros((n, c, ho, wo), np.intp)
    for i, j, tap in reversed(taps):
        arg = np.where(tap == y, i * kw + j, arg)
    hh = (np.arange(ho) * sh - ph)[:, None] + arg // kw
    ww = (np.arange(wo) * sw - pw)[None, :] + arg % kw
    return _store(y, out), _store(hh * w + ww, mask)


def max_pool_backward(dy, mask, x_shape, out=None, relu=None):
    """Route each top diff to the bottom element that won its window (sums where windows
    overlap); through relu_backward where ``relu`` gives a ReLU's (src, negative_slope)."""
    n, c, h, w = x_shape
    plane = h * w
    offs = (np.arange(n * c) * plane).reshape(n, c, 1, 1)
    dx = np.bincount((mask + offs).ravel(), weights=dy.ravel(), minlength=n * c * plane)
    dx = dx.reshape(x_shape).astype(dy.dtype, copy=False)
    if relu is not None:
        dx = relu_backward(relu[0], dx, relu[1])
    return _store(dx, out)


def _ave_divisors(size, kernel, stride, pad, out):
    starts = np.arange(out) * stride - pad
    ends = np.minimum(starts + kernel, size + pad)
    return ends - starts


def ave_pool_forward(x, kernel, stride, pad, pooled, out=None):
    """Mean over each window; the divisor counts padding but not what lies beyond it (Caffe).
    Summed in row-major window order, as Caffe does."""
    n, c, h, w = x.shape
    xpad = _pool_padded(x, kernel, stride, pad, pooled, 0)
    acc = np.zeros((n, c) + tuple(pooled), x.dtype)
    for _, _, tap in _pool_taps(xpad, kernel, stride, pooled):
        acc += tap
    div = np.outer(_ave_divisors(h, kernel[0], stride[0], pad[0], pooled[0]),
                   _ave_divisors(w, kernel[1], stride[1], pad[1], pooled[1])).astype(x.dtype)
    return _store(acc / div, out)


def ave_pool_backward(dy, x_shape, kernel, stride, pad, pooled, out=None):
    n, c, h, w = x_shape
    (kh, kw), (sh, sw), (ph, pw), (ho, wo) = kernel, stride, pad, pooled
    div = np.outer(_ave_divisors(h, kh, sh, ph, ho),
                   _ave_divisors(w, kw, sw, pw, wo)).astype(dy.dtype)
    g = dy / div
    need_h = max((ho - 1) * sh + kh, h + ph)
    need_w = max((wo - 1) * sw + kw, w + pw)
    dpad = np.zeros((n, c, need_h, need_w), dy.dtype)
    for i in range(kh):
        for j in range(kw):
            dpad[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw] += g
    return _store(np.ascontiguousarray(dpad[:, :, ph:ph + h, pw:pw + w]), out)


# --------------------------------------------------------------------------------------------
# In-place kernels: same signatures as in cct.backend.cpu (``out`` written when given)
# --------------------------------------------------------------------------------------------


def relu_forward(x, negative_slope, out=None):
    slope = x.dtype.type(negative_slope)
    return _store(np.maximum(x, 0) + slope * np.minimum(x, 0), out)


def relu_backward(src, dy, negative_slope, out=None):
    slope = dy.dtype.type(negative_slope)
    return _store(dy * ((src > 0) + slope * (src <= 0)), out)


def concat_forward(bottoms, axis, out=None):
    return _store(np.concatenate(bottoms, axis), out)


def concat_backward(dy, axis, counts, outs, relu=None):
    shares = np.split(dy, np.cumsum(counts)[:-1], axis)
    results = []
    for k, (share, out) in enumerate(zip(shares, outs)):
        if out is not None:
            if relu is not None and relu[k] is not None:
                share = relu_backward(relu[k][0], share, relu[k][1])
            out = _store(share, out)
        results.append(out)
    return results


def _channel_window_sum(a, size):
    """Sum over a window of ``size`` channels centred on each channel (zero outside)."""
    n, c = a.shape[:2]
    pre = (size - 1) // 2
    padded = np.zeros((n, c + size - 1) + a.shape[2:], a.dtype)
    padded[:, pre:pre + c] = a
    csum = np.cumsum(padded, axis=1)
    out = csum[:, size - 1:size - 1 + c].copy()
    out[:, 1:] -= csum[:, :c - 1]
    return out


def lrn_across_forward(x, size, alpha, beta, k, out=None, scale=None):
    s = k + (alpha / size) * _channel_window_sum(x * x, size)
    return _store(x * s ** -beta, out), _store(s, scale)


def lrn_across_backward(x, y, scale, dy, size, alpha, beta, out=None, relu=None):
    ratio = _channel_window_sum(dy * y / scale, size)
    dx = dy * scale ** -beta - (2.0 * alpha * beta / size) * x * ratio
    if relu is not None:
        dx = relu_backward(relu[0], dx, relu[1])
    return _store(dx, out)


def softmax_forward(x, out=None):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return _store(e / e.sum(axis=1, keepdims=True), out)


def softmax_backward(y, dy, out=None):
    return _store((dy - (dy * y).sum(axis=1, keepdims=True)) * y, out)


_FLT_MIN = float(np.finfo(np.float32).tiny)


def _labels(label, channels, ignore_label):
    lab = label.astype(np.int64)  # truncation towards zero, as static_cast<int>
    valid = np.ones(lab.shape, bool) if ignore_label is None else lab != ignore_label
    in_range = (lab >= 0) & (lab < channels)
    bad = lab[valid & ~in_range]
    return lab, valid & in_range, (int(bad[0]) if bad.size else None)


def softmax_loss_forward(x, label, ignore_label, prob=None):
    p = softmax_forward(x, prob)
    lab, use, bad = _labels(label, x.shape[1], ignore_label)
    picked = np.take_along_axis(p, np.where(use, lab, 0)[:, None, :], axis=1)[:, 0, :]
    loss = -np.log(np.maximum(picked, _FLT_MIN))[use].sum(dtype=np.float64)
    return p, x.dtype.type(loss), int(use.sum()), bad


def softmax_loss_backward(prob, label, ignore_label, scale, out=None):
    lab, use, _ = _labels(label, prob.shape[1], ignore_label)
    d = prob - (np.arange(prob.shape[1])[None, :, None] == lab[:, None, :])
    if ignore_label is not None:
        d = d * (lab != ignore_label)[:, None, :]
    return _store((d * prob.dtype.type(scale)).astype(prob.dtype, copy=False), out)


def sgd_update(data, diff, history, local_rate, momentum, local_decay):
    dt = data.dtype.type
    if dt(local_decay):
        diff += data * dt(local_decay)
    diff *= dt(local_rate)
    history *= dt(momentum)
    history += diff
    diff[...] = history
    data -= history


def batch_norm_statistics(x):
    """Per channel of N x C x S: mean and biased variance, in float64."""
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=(0, 2))
    return mean, ((x - mean[:, None]) ** 2).mean(axis=(0, 2))


def batch_norm_normalize(x, mean, std):
    return (np.asarray(x, np.float64) - np.asarray(mean, np.float64)[:, None]) / \
        np.asarray(std, np.float64)[:, None]


def batch_norm_backward(dy, y, std, global_stats):
    dy, y = np.asarray(dy, np.float64), np.asarray(y, np.float64)
    std = np.asarray(std, np.float64)[:, None]
    if global_stats:
        return dy / std
    return (dy - dy.mean(axis=(0, 2), keepdims=True)
            - (dy * y).mean(axis=(0, 2), keepdims=True) * y) / std


def eltwise_sum(bottoms, coeffs):
    return sum(float(c) * np.asarray(b, np.float64) for c, b in zip(coeffs, bottoms))


def eltwise_prod(bottoms):
    return np.prod([np.asarray(b, np.float64) for b in bottoms], axis=0)


def eltwise_max(bottoms):
    """(top, mask) by Caffe's rule, one element at a time: bottom 1 unless bottom 0 is
    strictly greater, then a later bottom only where strictly greater."""
    flat = [np.asarray(b).reshape(-1) for b in bottoms]
    top = np.empty(flat[0].size, np.float64)
    mask = np.empty(flat[0].size, np.int32)
    for i in range(top.size):
        best = 0 if flat[0][i] > flat[1][i] else 1
        for k in range(2, len(flat)):
            if flat[k][i] > flat[best][i]:
                best = k
        top[i], mask[i] = flat[best][i], best
    return top.reshape(bottoms[0].shape), mask.reshape(bottoms[0].shape)


def eltwise_max_backward(dy, mask, index):
    return np.where(np.asarray(mask) == index, np.asarray(dy, np.float64), 0.0)
