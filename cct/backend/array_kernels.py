"""The kernels of :mod:`cct.backend.cpu`, written once against an array module ``xp``
(NumPy or CuPy): the GPU backend (:mod:`cct.backend.gpu`) binds them to CuPy, the ``numpy``
backend (:mod:`cct.backend.npdevice`) to NumPy so that CI runs the same code.

Lowering is whole-batch and gather-only, so that a GPU needs no custom kernel, no atomics and
no scatter-add (results are deterministic):

* Arrays are handled batch-last: the bottom (N, C, H, W) is transposed once to (C*H*W, N) with
  one zero row appended (the "zero slot"). im2col is then ONE ``xp.take`` along axis 0 with an
  int index array (group, K, P), K = C/group*kh*kw and P = Ho*Wo, that points every padded tap
  at the zero slot; the columns come out as (group, K, P*N) and each gather moves N contiguous
  values.
* The convolution GEMMs are ``xp.matmul`` on (group, ., .) stacks (cuBLAS strided-batched GEMM
  over the groups on CuPy), every one over the whole mini-batch.
* col2im is a gather-and-sum: the inverse index (C*H*W, M) lists, for every bottom element, the
  column entries that read it (M the most any element has), padded with the index of a zero
  row; one ``take`` and a sum over M.
* Pooling gathers windows the same way (P, kh*kw, N*C). MAX backward gathers, for every bottom
  element, the argmax of each window that contains it and adds the top diff where the argmax is
  that element.

Index arrays are built on the host with NumPy and cached per geometry (not per batch size, the
batch being the last axis) and device. Semantics are Caffe's, as cpu.py and reference.py have
them; results are float32 or float64, like the inputs.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Dict, Hashable, Optional, Tuple

import numpy as np

from .shapes import conv_out_size, deconv_out_size, pool_out_size, store as _store
from .shapes import (accumulating as _accumulating, concat_shape as _concat_shape,
                     disjoint as _disjoint, float_dtype as _dtype, pair as _pair,
                     result as _result, target as _target)

#: the public kernels, the same names and signatures as in cct.backend.cpu
KERNELS = ("conv_out_size", "deconv_out_size", "dot", "matmul", "conv_forward",
           "conv_forward_relu", "conv_backward_data",
           "conv_backward_weight", "bias_backward", "pool_out_size", "max_pool_forward",
           "max_pool_backward", "ave_pool_forward", "ave_pool_backward", "relu_forward",
           "relu_backward", "lrn_across_forward", "lrn_across_backward", "softmax_forward",
           "softmax_backward", "softmax_loss_forward", "softmax_loss_backward", "sgd_update",
           "nesterov_update", "adagrad_update", "rmsprop_update", "adadelta_update",
           "adam_update", "batch_norm_statistics", "batch_norm_normalize", "batch_norm_backward",
           "eltwise_sum", "eltwise_prod", "eltwise_max", "eltwise_max_backward",
           "dropout_mask", "concat_forward", "concat_backward")

_FLT_MIN = float(np.finfo(np.float32).tiny)
# The out= convention and the dtype check are cct/backend/shapes.py's, shared with the CPU
# kernels; a refused dtype names this family.
_FAMILY = "array kernels"


# --------------------------------------------------------------------------------------------
# Index arrays (host NumPy, int64). Built once per geometry.
# --------------------------------------------------------------------------------------------
def conv_columns_index(c, h, w, kernel, stride, pad, dilation, group) -> np.ndarray:
    """(group, C/group*kh*kw, Ho*Wo): the flat bottom element c*H*W + h*W + w each column
    entry reads, C*H*W (the zero slot) where the tap falls in the padding. Rows are ordered
    (channel, kh, kw) like a weight (O, C/group, kh, kw) flattened."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, pad, dilation
    ho = conv_out_size(h, kh, sh, ph, dh)
    wo = conv_out_size(w, kw, sw, pw, dw)
    rows = ((np.arange(kh) * dh)[:, None, None, None]
            + (np.arange(ho) * sh - ph)[None, None, :, None])
    cols = ((np.arange(kw) * dw)[None, :, None, None]
            + (np.arange(wo) * sw - pw)[None, None, None, :])
    inside = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)     # (kh, kw, Ho, Wo)
    plane = np.where(inside, rows * w + cols, -1)
    chan = np.arange(c)[:, None, None, None, None] * (h * w)
    src = np.where(plane[None] >= 0, chan + plane[None], c * h * w)  # (C, kh, kw, Ho, Wo)
    return src.reshape(group, (c // group) * kh * kw, ho * wo)


def inverse_index(src: np.ndarray, targets: int, exclude: int) -> np.ndarray:
    """(targets, M): for every target t, the positions q (in ``src.ravel()`` order) with
    ``src[q] == t``, ascending; rows are padded with ``src.size`` (a zero row appended to
    whatever the positions index). Entries equal to ``exclude`` are left out."""
    flat = src.ravel()
    q = np.flatnonzero(flat != exclude)
    t = flat[q]
    order = np.argsort(t, kind="stable")
    t, q = t[order], q[order]
    counts = np.bincount(t, minlength=targets)
    start = np.cumsum(counts) - counts
    rank = np.arange(t.size) - start[t]
    inv = np.full((targets, int(counts.max(initial=0))), flat.size, np.int64)
    inv[t, rank] = q
    return inv


def _pool_rows(size, kernel, stride, pad, pooled):
    """Per window start, per tap: the bottom coordinate, whether MAX reads it (inside the
    bottom), and the window's extent for AVE's divisor (clipped to the padded bottom)."""
    start = np.arange(pooled) * stride - pad
    coord = start[:, None] + np.arange(kernel)[None, :]               # (pooled, kernel)
    inside = (coord >= 0) & (coord < size)
    extent = np.minimum(start + kernel, size + pad) - start
    return coord, inside, extent


def pool_windows_index(h, w, kernel, stride, pad, pooled, for_max: bool):
    """(Ho*Wo, kh*kw) flat bottom element h*W + w of every window tap, in Caffe's row-major
    window order, and AVE's window divisors (Ho*Wo,). A tap outside the bottom reads the slot
    H*W (zero for AVE, -inf for MAX); for MAX it repeats instead the window's first element
    inside the bottom, which can tie but never beat it, so that the first maximum (Caffe's
    strict ``>``) is still found and its index is a real one. Only a window wholly outside the
    bottom (ceil rounding without pad) reads the slot for MAX."""
    (kh, kw), (sh, sw), (ph, pw), (ho, wo) = kernel, stride, pad, pooled
    rh, ih, eh = _pool_rows(h, kh, sh, ph, ho)
    rw, iw, ew = _pool_rows(w, kw, sw, pw, wo)
    inside = ih[:, None, :, None] & iw[None, :, None, :]               # (Ho, Wo, kh, kw)
    flat = rh[:, None, :, None] * w + rw[None, :, None, :]
    if for_max:
        first = np.maximum(rh[:, 0], 0)[:, None] * w + np.maximum(rw[:, 0], 0)[None, :]
        first = np.where(inside.any(axis=(2, 3)), first, h * w)
        idx = np.where(inside, flat, first[:, :, None, None])
    else:
        idx = np.where(inside, flat, h * w)
    divisor = (eh[:, None] * ew[None, :]).reshape(ho * wo)
    return idx.reshape(ho * wo, kh * kw), divisor


def pool_members_index(h, w, geometries, pooled) -> np.ndarray:
    """(H*W, M): for every bottom element, the windows (flat Ho*Wo index) that contain it
    under any of ``geometries`` ((kernel, stride, pad) triples of the same H, W -> Ho, Wo),
    padded with Ho*Wo."""
    p = pooled[0] * pooled[1]
    keys = []
    for kernel, stride, pad in geometries:
        idx, _ = pool_windows_index(h, w, kernel, stride, pad, pooled, for_max=False)
        win, tap = np.nonzero(idx < h * w)
        keys.append(idx[win, tap] * (p + 1) + win)
    keys = np.unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)
    elem, win = keys // (p + 1), keys % (p + 1)
    counts = np.bincount(elem, minlength=h * w)
    start = np.cumsum(counts) - counts
    inv = np.full((h * w, int(counts.max(initial=0))), p, np.int64)
    inv[elem, np.arange(elem.size) - start[elem]] = win
    return inv


class _LRU:
    """A small least-recently-used cache (geometries of a net are few; random test shapes are
    many)."""

    def __init__(self, size: int):
        self.size = size
        self.items: "OrderedDict[Hashable, object]" = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key, make: Callable[[], object]):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = make()
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value


def _planes_into(buf, n0: int, n1: int, t) -> None:
    """A chunk's (P, planes) result, one column per (image, channel) plane, into images
    n0 .. n1 of ``buf`` (N, C, ...), each plane's P values in a row."""
    buf[n0:n1].reshape(-1, t.shape[0])[...] = t.T


#: :attr:`ArrayKernels.col_budget`'s default: large enough that a chunk's GEMM stays large
#: (CaffeNet b256's conv2: 8 chunks of 32 images, each 128 x 1,200 x 23,328 per group).
COL_BUDGET = 256 << 20


class ArrayKernels:
    """The kernels bound to one array module. ``device`` returns a key for the device that
    arrays are allocated on now (index arrays are cached per device); ``index_dtype`` is the
    integer type of the gathers' indices (int32 halves their memory traffic on a GPU);
    ``to_host`` is the backend's device-to-host copy (the one a kernel makes: SoftmaxWithLoss's
    loss and count)."""

    def __init__(self, xp, device: Callable[[], Hashable] = lambda: None,
                 index_dtype=np.intp, cache_size: int = 256,
                 to_host: Callable = np.asarray, uniform: Optional[Callable] = None,
                 gemm: Optional[Callable] = None, col_budget: int = COL_BUDGET):
        self.xp = xp
        # Bytes one convolution or pooling call gathers at once (lowered columns, column
        # diffs, windows): a batch that passes it goes a chunk of images at a time (the CPU's
        # col_buffer_limit, csrc/conv.cpp). Whole, CaffeNet's conv2 at batch 256 held 1.8 GB
        # of column diffs and as much again gathered back, its MAX pooling's backward 2.7 GB,
        # on top of the net's 2.7 GB.
        self.col_budget = int(col_budget)
        # ``a @ b`` (2-D, or stacks of the same count), into ``out`` when given: the GPU's
        # through a cuBLAS handle of cct's own, which a CUDA graph's capture takes (CuPy's
        # matmul refuses a capturing stream), the stand-in's likewise; else xp.matmul.
        self._gemm = gemm or xp.matmul
        # Uniform [0, 1) draws for Dropout: by default from the run's host generator, copied
        # over (the CPU's draws, so the stand-in repeats the CPU to the bit); a GPU draws on
        # the device instead (uniform(shape, rng): its own generator seeded from rng).
        self._uniform = uniform or (lambda shape, rng: xp.asarray(rng.random(shape)))
        self.to_host = to_host
        self.device = device
        self.index_dtype = np.dtype(index_dtype)
        self._cache = _LRU(cache_size)
        # MAX backward's signature has no window geometry: forward records it per
        # (H, W, Ho, Wo) so that backward can find the windows that contain each element.
        self._pool_geometries: Dict[Tuple[int, int, int, int], frozenset] = {}

    def bind(self, namespace: dict) -> None:
        """Put the kernels into a backend module's namespace."""
        for name in KERNELS:
            namespace[name] = getattr(self, name)

    # -- helpers -----------------------------------------------------------------------------
    def _index(self, key, make: Callable[[], np.ndarray]):
        """A device copy of a host index array, cached per key and device."""
        def upload():
            host = make()
            dtype = self.index_dtype
            if host.size and int(host.max()) > np.iinfo(dtype).max:
                dtype = np.dtype(np.int64)
            return self.xp.asarray(host.astype(dtype, copy=False))
        return self._cache.get((key, self.device()), upload)

    def _batch_last(self, a, rows: int, fill: float = 0.0):
        """(rows + 1, cols) copy of a (cols, rows) view of ``a``, with one last row of
        ``fill`` (the zero slot the gathers index for padding)."""
        xp = self.xp
        flat = a.reshape(-1, rows)
        t = xp.empty((rows + 1, flat.shape[0]), a.dtype)
        t[:rows] = flat.T
        t[rows] = fill
        return t

    # -- GEMM --------------------------------------------------------------------------------
    def dot(self, a, b):
        """Caffe's ``caffe_gpu_dot``: the sum of ``a * b`` over two 1-D arrays, a 0-d array,
        through the kernels' GEMM (CuPy's ``dot`` is cuBLAS's, which a graph cannot hold)."""
        return self._gemm(a.reshape(1, -1), b.reshape(-1, 1)).reshape(())

    def matmul(self, a, b, out=None, accumulate=False):
        """``a @ b`` for 2-D arrays (cuBLAS on CuPy); ``out += a @ b`` with ``accumulate``."""
        _dtype(a, _FAMILY)
        _accumulating("matmul", out, accumulate)
        _disjoint(self.xp, "matmul", out, a=a, b=b)
        return _store(self._gemm(a, b), out, accumulate)

    def bias_backward(self, dy, out=None, accumulate=False):
        """Sum of dy over every axis but 1: the bias gradient of Convolution-like layers
        (N, C, ...) and InnerProduct (M, N); added into ``out`` with ``accumulate``."""
        dt = _dtype(dy, _FAMILY)
        _accumulating("bias_backward", out, accumulate)
        _disjoint(self.xp, "bias_backward", out, dy=dy)
        axes = (0,) + tuple(range(2, dy.ndim))
        return _store(dy.sum(axis=axes, dtype=dt), out, accumulate)

    # -- convolution -------------------------------------------------------------------------
    def _columns(self, x, kernel, stride, pad, dilation, group):
        """im2col for the whole batch: (group, K, P*N), one gather."""
        n, c, h, w = x.shape
        geom = (c, h, w, _pair(kernel), _pair(stride), _pair(pad), _pair(dilation), int(group))
        idx = self._index(("conv",) + geom, lambda: conv_columns_index(*geom))
        cols = self.xp.take(self._batch_last(x, c * h * w), idx, axis=0)  # (G, K, P, N)
        return cols.reshape(idx.shape[0], idx.shape[1], idx.shape[2] * n)

    def _top_batch_last(self, dy, group):
        """dy (N, O, Ho, Wo) as (group, O/group, P*N)."""
        n, o = dy.shape[:2]
        t = self.xp.ascontiguousarray(dy.reshape(n, o, -1).transpose(1, 2, 0))
        return t.reshape(group, o // group, -1)

    def _chunks(self, n: int, per_image: int):
        """[n0, n1) slices of a batch of ``n`` whose ``per_image`` bytes each fit the column
        budget together (at least one image a chunk; one chunk when the batch fits)."""
        step = max(1, min(n, self.col_budget // max(1, per_image)))
        return [(n0, min(n, n0 + step)) for n0 in range(0, n, step)] or [(0, 0)]

    def conv_forward(self, x, weight, bias, kernel, stride, pad, dilation, group, out=None,
                     engine="DEFAULT"):
        """y = conv(x, weight) + bias. x (N, C, H, W), weight (O, C/group, kh, kw), bias (O,)
        or None; y (N, O, Ho, Wo), written into ``out`` when given. Every ``engine`` is
        Caffe's here: these kernels only lower (im2col and one GEMM per group), in chunks of
        images within the column budget."""
        xp = self.xp
        dt = _dtype(x, _FAMILY)
        _disjoint(self.xp, "conv_forward", out, x=x, weight=weight, bias=bias)
        n, c, h, w = x.shape
        o = weight.shape[0]
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (_pair(kernel), _pair(stride), _pair(pad),
                                                  _pair(dilation))
        ho, wo = conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw)
        wmat = weight.reshape(group, o // group, -1).astype(dt, copy=False)
        buf, dest = _target(self.xp, out, (n, o, ho, wo), dt)
        per_image = c * kh * kw * ho * wo * np.dtype(dt).itemsize
        for n0, n1 in self._chunks(n, per_image):
            cols = self._columns(x[n0:n1], kernel, stride, pad, dilation, group)
            yt = self._gemm(wmat, cols).reshape(o, ho * wo, n1 - n0).transpose(2, 0, 1)
            top = buf[n0:n1].reshape(n1 - n0, o, ho * wo)
            if bias is None:
                top[...] = yt
            else:
                xp.add(yt, bias.reshape(1, o, 1).astype(dt, copy=False), out=top)
        return _result(buf, dest)

    def conv_forward_relu(self, x, weight, bias, kernel, stride, pad, dilation, group, out=None,
                          engine="DEFAULT"):
        """relu_forward(conv_forward(...), 0): here the two kernels one after the other (the
        device's own, cuDNN's convolution and Caffe's ReLU where the GPU backend wraps them),
        the bits of the two layers; the CPU's kernel saves the ReLU's pass."""
        y = self.conv_forward(x, weight, bias, kernel, stride, pad, dilation, group, out=out,
                              engine=engine)
        return self.relu_forward(y, 0.0, out=y)

    def conv_backward_data(self, dy, weight, x_shape, kernel, stride, pad, dilation, group,
                           out=None, engine="DEFAULT"):
        """Gradient of :func:`conv_forward` with respect to x (Caffe's backward_cpu_gemm +
        col2im), of shape ``x_shape`` (N, C, H, W), written into ``out`` when given.
        Deconvolution's forward pass is this function."""
        xp = self.xp
        dt = _dtype(dy, _FAMILY)
        _disjoint(self.xp, "conv_backward_data", out, dy=dy, weight=weight)
        n, c, h, w = (int(s) for s in x_shape)
        o = dy.shape[1]
        geom = (c, h, w, _pair(kernel), _pair(stride), _pair(pad), _pair(dilation), int(group))
        wmat = weight.reshape(group, o // group, -1).astype(dt, copy=False)
        k = wmat.shape[2]
        p = dy.shape[2] * dy.shape[3]
        inv = self._index(("col2im",) + geom, lambda: inverse_index(
            conv_columns_index(*geom), c * h * w, exclude=c * h * w))
        buf, dest = _target(self.xp, out, (n, c, h, w), dt)
        # A chunk holds its column diffs and what the inverse index gathers from them.
        per_image = (group * k * p + inv.size) * np.dtype(dt).itemsize
        for n0, n1 in self._chunks(n, per_image):
            nb = n1 - n0
            # The chunk's column diffs, with one zero row for the inverse index's padding.
            dcols = xp.empty((group * k * p + 1, nb), dt)
            self._gemm(wmat.transpose(0, 2, 1), self._top_batch_last(dy[n0:n1], group),
                       out=dcols[:-1].reshape(group, k, p * nb))
            dcols[-1] = 0
            dxt = xp.take(dcols, inv, axis=0).sum(axis=1)                 # (C*H*W, nb)
            buf[n0:n1].reshape(nb, c * h * w)[...] = dxt.T
        return _result(buf, dest)

    def conv_backward_weight(self, x, dy, kernel, stride, pad, dilation, group, out=None,
                             accumulate=False, engine="DEFAULT"):
        """Gradient of :func:`conv_forward` with respect to the weight, shape
        (O, C/group, kh, kw) (Caffe's weight_cpu_gemm, summed over the batch); added into
        ``out`` with ``accumulate`` (a param diff: Caffe accumulates them)."""
        _dtype(x, _FAMILY)
        _accumulating("conv_backward_weight", out, accumulate)
        _disjoint(self.xp, "conv_backward_weight", out, x=x, dy=dy)
        o = dy.shape[1]
        kh, kw = _pair(kernel)
        per_image = x.shape[1] * kh * kw * dy.shape[2] * dy.shape[3] * x.dtype.itemsize
        dw = None
        # Chunks' gradients added in batch order (one chunk: the whole batch's GEMM).
        for n0, n1 in self._chunks(x.shape[0], per_image):
            cols = self._columns(x[n0:n1], kernel, stride, pad, dilation, group)
            part = self._gemm(self._top_batch_last(dy[n0:n1], group), cols.transpose(0, 2, 1))
            dw = part if dw is None else self.xp.add(dw, part, out=dw)
        return _store(dw.reshape(o, x.shape[1] // group, kh, kw), out, accumulate)

    conv_out_size = staticmethod(conv_out_size)
    deconv_out_size = staticmethod(deconv_out_size)
    pool_out_size = staticmethod(pool_out_size)

    # -- pooling -----------------------------------------------------------------------------
    def _windows(self, x, kernel, stride, pad, pooled, for_max):
        n, c, h, w = x.shape
        geom = (h, w, kernel, stride, pad, pooled)
        kind = "max_windows" if for_max else "ave_windows"
        idx = self._index((kind,) + geom,
                          lambda: pool_windows_index(*geom, for_max=for_max)[0])
        fill = -np.inf if for_max else 0.0
        return self.xp.take(self._batch_last(x, h * w, fill), idx, axis=0), idx  # (P, T, N*C)

    def max_pool_forward(self, x, kernel, stride, pad, pooled, out=None, mask=None):
        """Max over each window of the unpadded bottom, in row-major window order with a
        strict ``>`` as Caffe does (ties go to the first element, NaN never wins).
        ``pooled`` is the top's (height, width). Returns (top, argmax as the flat index
        h * W + w in the bottom's plane, int32), written into ``out`` and ``mask`` when given;
        a window with nothing above -FLT_MAX gives -FLT_MAX and index -1, as in Caffe."""
        xp = self.xp
        dt = _dtype(x, _FAMILY)
        _disjoint(self.xp, "max_pool_forward", out, x=x)
        n, c, h, w = x.shape
        kernel, stride, pad, pooled = _pair(kernel), _pair(stride), _pair(pad), _pair(pooled)
        key = (h, w) + pooled
        geoms = self._pool_geometries.get(key, frozenset())
        if (kernel, stride, pad) not in geoms:
            self._pool_geometries[key] = geoms | {(kernel, stride, pad)}
        shape = (n, c) + pooled
        ybuf, ydest = _target(xp, out, shape, dt)
        mbuf, mdest = _target(xp, mask, shape, np.dtype(np.int32))
        p, taps = pooled[0] * pooled[1], kernel[0] * kernel[1]
        lowest = dt.type(-np.finfo(dt).max)
        # A chunk holds its windows' taps and, per window, the argmax, index, top and mask.
        for n0, n1 in self._chunks(n, c * p * (taps * dt.itemsize + 32)):
            win, idx = self._windows(x[n0:n1], kernel, stride, pad, pooled, for_max=True)
            xp.fmax(win, -np.inf, out=win)           # NaN never wins
            arg = win.argmax(axis=1)                 # first maximum in window order
            y = xp.take_along_axis(win, arg[:, None, :], axis=1)[:, 0]
            where = xp.take(idx.reshape(-1), arg + (xp.arange(idx.shape[0]) * taps)[:, None])
            found = y > lowest
            _planes_into(ybuf, n0, n1, xp.where(found, y, lowest))
            _planes_into(mbuf, n0, n1, xp.where(found, where, -1).astype(np.int32))
        return _result(ybuf, ydest), _result(mbuf, mdest)

    def max_pool_backward(self, dy, mask, x_shape, out=None, relu=None):
        """Route each top diff to the bottom element that won its window (sums where windows
        overlap); dx of shape ``x_shape``, written into ``out`` when given, through
        relu_backward where ``relu`` gives a ReLU's (src, negative_slope). The windows are
        those of the max_pool_forward calls made on this backend for the same bottom and top
        sizes."""
        xp = self.xp
        dt = _dtype(dy, _FAMILY)
        _disjoint(self.xp, "max_pool_backward", out, dy=dy)
        n, c, h, w = (int(s) for s in x_shape)
        pooled = (int(dy.shape[2]), int(dy.shape[3]))
        p = pooled[0] * pooled[1]
        geoms = self._pool_geometries.get((h, w) + pooled)
        if not geoms:
            raise RuntimeError(f"max_pool_backward: no max_pool_forward from a {h}x{w} bottom "
                               f"to a {pooled[0]}x{pooled[1]} top ran on this backend, so "
                               f"the windows are unknown")
        inv = self._index(("max_members", h, w, pooled, geoms),
                          lambda: pool_members_index(h, w, sorted(geoms), pooled))
        mask = xp.asarray(mask)
        here = xp.arange(h * w, dtype=mask.dtype)[:, None, None]
        buf, dest = _target(xp, out, (n, c, h, w), dt)
        # A chunk holds the gathered diffs and masks of every bottom element's windows.
        for n0, n1 in self._chunks(n, c * inv.size * (dt.itemsize + mask.dtype.itemsize + 1)):
            g = self._batch_last(dy[n0:n1].astype(dt, copy=False), p)    # (P + 1, nb*C)
            m = self._batch_last(mask[n0:n1], p, fill=-1)
            _planes_into(buf, n0, n1, xp.where(xp.take(m, inv, axis=0) == here,
                                               xp.take(g, inv, axis=0), dt.type(0)).sum(axis=1))
        if relu is not None:
            self.relu_backward(relu[0], buf.reshape(n, c, h, w), relu[1],
                               out=buf.reshape(n, c, h, w))
        return _result(buf, dest)

    def _divisors(self, h, w, kernel, stride, pad, pooled, dt):
        """AVE's window divisors as a (P, 1) device array of dtype ``dt``."""
        geom = (h, w, kernel, stride, pad, pooled)
        def upload():
            divisor = pool_windows_index(*geom, for_max=False)[1]
            return self.xp.asarray(divisor.astype(dt)[:, None])
        return self._cache.get(("ave_divisors", geom, dt.str, self.device()), upload)

    def ave_pool_forward(self, x, kernel, stride, pad, pooled, out=None):
        """Mean over each window; the divisor counts padding but not what lies beyond it
        (Caffe). ``pooled`` is the top's (height, width)."""
        dt = _dtype(x, _FAMILY)
        _disjoint(self.xp, "ave_pool_forward", out, x=x)
        n, c, h, w = x.shape
        kernel, stride, pad, pooled = _pair(kernel), _pair(stride), _pair(pad), _pair(pooled)
        div = self._divisors(h, w, kernel, stride, pad, pooled, dt)
        p = pooled[0] * pooled[1]
        buf, dest = _target(self.xp, out, (n, c) + pooled, dt)
        for n0, n1 in self._chunks(n, c * p * kernel[0] * kernel[1] * dt.itemsize):
            win, _ = self._windows(x[n0:n1], kernel, stride, pad, pooled, for_max=False)
            _planes_into(buf, n0, n1, win.sum(axis=1) / div)
        return _result(buf, dest)

    def ave_pool_backward(self, dy, x_shape, kernel, stride, pad, pooled, out=None):
        """Each top diff, divided by its window's divisor, added to every bottom element of
        the window; dx of shape ``x_shape``. ``pooled`` is dy's (height, width)."""
        xp = self.xp
        dt = _dtype(dy, _FAMILY)
        _disjoint(self.xp, "ave_pool_backward", out, dy=dy)
        n, c, h, w = (int(s) for s in x_shape)
        kernel, stride, pad, pooled = _pair(kernel), _pair(stride), _pair(pad), _pair(pooled)
        p = pooled[0] * pooled[1]
        div = self._divisors(h, w, kernel, stride, pad, pooled, dt)
        geom = (h, w, kernel, stride, pad, pooled)
        inv = self._index(("ave_members", geom),
                          lambda: pool_members_index(h, w, [(kernel, stride, pad)], pooled))
        buf, dest = _target(xp, out, (n, c, h, w), dt)
        for n0, n1 in self._chunks(n, c * inv.size * dt.itemsize):
            g = self._batch_last(dy[n0:n1].astype(dt, copy=False), p)
            g[:p] /= div
            _planes_into(buf, n0, n1, xp.take(g, inv, axis=0).sum(axis=1))   # (H*W, nb*C)
        return _result(buf, dest)

    # -- ReLU --------------------------------------------------------------------------------
    def relu_forward(self, x, negative_slope, out=None):
        """y = max(x, 0) + negative_slope * min(x, 0); ``out`` may be ``x`` (in place)."""
        xp = self.xp
        dt = _dtype(x, _FAMILY)
        # Caffe's formula as written, also for slope 0: it decides -0, inf and NaN.
        low = xp.minimum(x, dt.type(0))
        low *= dt.type(negative_slope)
        buf, dest = _target(self.xp, out, x.shape, dt)
        y = buf.reshape(x.shape)
        xp.maximum(x, dt.type(0), out=y)
        y += low
        return _result(buf, dest)

    def relu_backward(self, src, dy, negative_slope, out=None):
        """dx = dy * ([src > 0] + negative_slope [src <= 0]); ``out`` may be ``dy``."""
        xp = self.xp
        dt = _dtype(dy, _FAMILY)
        factor = (src > 0).astype(dt)
        if negative_slope != 0:
            factor += (src <= 0).astype(dt) * dt.type(negative_slope)
        buf, dest = _target(self.xp, out, dy.shape, dt)
        xp.multiply(dy, factor.reshape(dy.shape), out=buf.reshape(dy.shape))
        return _result(buf, dest)

    # -- Concat: slice assignments, one per bottom ---------------------------------------------
    def concat_forward(self, bottoms, axis, out=None):
        """The ``bottoms`` joined along ``axis`` (Concat's top; Slice's backward), written into
        ``out`` when given."""
        dt = _dtype(bottoms[0], _FAMILY)
        shape = _concat_shape([b.shape for b in bottoms], axis)
        _disjoint(self.xp, "concat_forward", out,
                  **{f"bottom {k}": b for k, b in enumerate(bottoms)})
        buf, dest = _target(self.xp, out, shape, dt)
        top, start = buf.reshape(shape), 0
        for b in bottoms:
            top[(slice(None),) * axis + (slice(start, start + b.shape[axis]),)] = b
            start += b.shape[axis]
        return _result(buf, dest)

    def concat_backward(self, dy, axis, counts, outs, relu=None):
        """Each bottom's share of the top diff ``dy`` along ``axis`` into ``outs[k]`` (None:
        not wanted), through relu_backward where ``relu[k]`` gives a ReLU's (src,
        negative_slope): cpu.concat_backward's contract."""
        if sum(counts) != dy.shape[axis] or len(outs) != len(counts):
            raise ValueError(f"concat_backward: counts {list(counts)} do not cut axis {axis} "
                             f"of shape {dy.shape} into {len(outs)} outputs")
        start, results = 0, []
        for k, (count, out) in enumerate(zip(counts, outs)):
            share = dy[(slice(None),) * axis + (slice(start, start + count),)]
            start += count
            if out is not None and relu is not None and relu[k] is not None:
                out = self.relu_backward(relu[k][0], share, relu[k][1], out=out)
            elif out is not None:
                out[...] = share
            results.append(out)
        return results

    # -- LRN across channels -----------------------------------------------------------------
    def _channel_window_sum(self, a, size):
        """Sum over ``size`` channels centred on each channel (zero beyond the ends): ``size``
        shifted adds, with no running-sum cancellation."""
        xp = self.xp
        n, c = a.shape[:2]
        pre = (size - 1) // 2
        padded = xp.zeros((n, c + size - 1) + a.shape[2:], a.dtype)
        padded[:, pre:pre + c] = a
        acc = padded[:, 0:c].copy()
        for i in range(1, size):
            acc += padded[:, i:i + c]
        return acc

    def lrn_across_forward(self, x, size, alpha, beta, k, out=None, scale=None):
        """y = x * scale^-beta, scale = k + alpha/size * sum of x^2 over ``size`` neighbouring
        channels. Returns (y, scale); ``out`` must not be ``x``."""
        xp = self.xp
        dt = _dtype(x, _FAMILY)
        if out is not None and xp.may_share_memory(out, x):
            raise ValueError("lrn_across_forward: out must not be x (the scale is computed "
                             "from x while y is written)")
        size = int(size)
        sbuf, sdest = _target(self.xp, scale, x.shape, dt)
        s = sbuf.reshape(x.shape)
        acc = self._channel_window_sum(x * x, size)
        acc *= dt.type(alpha / size)
        xp.add(acc, dt.type(k), out=s)
        buf, dest = _target(self.xp, out, x.shape, dt)
        y = buf.reshape(x.shape)
        xp.power(s, dt.type(-beta), out=y)
        y *= x
        return _result(buf, dest), _result(sbuf, sdest)

    def lrn_across_backward(self, x, y, scale, dy, size, alpha, beta, out=None, relu=None):
        """dx = dy scale^-beta - 2 alpha beta / size * x * (window sum of dy y / scale);
        ``out`` may be ``dy``; through relu_backward where ``relu`` gives a ReLU's (src,
        negative_slope)."""
        xp = self.xp
        dt = _dtype(x, _FAMILY)
        ratio = self._channel_window_sum(dy * y / scale, int(size))
        ratio *= x
        ratio *= dt.type(2.0 * alpha * beta / size)
        dx = xp.power(scale, dt.type(-beta))
        dx *= dy
        dx -= ratio
        if relu is not None:
            dx = self.relu_backward(relu[0], dx, relu[1], out=dx)
        return _store(dx, out)

    # -- softmax -----------------------------------------------------------------------------
    def softmax_forward(self, x, out=None):
        """Softmax over axis 1 of an (outer, channels, inner) array, shifted by the channel
        max as in Caffe so that exp never overflows. ``out`` may be ``x``."""
        xp = self.xp
        dt = _dtype(x, _FAMILY)
        top = x.max(axis=1, keepdims=True)
        buf, dest = _target(self.xp, out, x.shape, dt)
        y = buf.reshape(x.shape)
        xp.subtract(x, top, out=y)
        xp.exp(y, out=y)
        y /= y.sum(axis=1, keepdims=True)
        return _result(buf, dest)

    def batch_norm_statistics(self, x):
        """Per channel of an N x C x S array: the mean and the biased variance over N x S."""
        mean = x.mean(axis=(0, 2))
        centred = x - mean[:, None]
        return mean, self.xp.mean(centred * centred, axis=(0, 2))

    def batch_norm_normalize(self, x, mean, std, out=None):
        """(x - mean_c) / std_c for an N x C x S array and per-channel mean and std."""
        buf, dest = _target(self.xp, out, x.shape, _dtype(x, _FAMILY))
        y = buf.reshape(x.shape)
        self.xp.subtract(x, mean[:, None], out=y)
        y /= std[:, None]
        return _result(buf, dest)

    def batch_norm_backward(self, dy, y, std, global_stats, out=None):
        """BatchNorm's bottom diff from the top diff dy and the normalized top y (N x C x S):
        (dy - mean(dy) - mean(dy y) y) / std per channel, or dy / std with global statistics."""
        buf, dest = _target(self.xp, out, dy.shape, _dtype(dy, _FAMILY))
        dx = buf.reshape(dy.shape)
        if global_stats:
            self.xp.divide(dy, std[:, None], out=dx)
        else:
            mean_dy = dy.mean(axis=(0, 2), keepdims=True)
            mean_dy_y = (dy * y).mean(axis=(0, 2), keepdims=True)
            self.xp.subtract(dy, mean_dy, out=dx)
            dx -= mean_dy_y * y
            dx /= std[:, None]
        return _result(buf, dest)

    # -- Eltwise: the whole-array expressions (a temporary per bottom), computed apart from
    # ``out`` (which may be one of the bottoms) and then stored in it.
    @staticmethod
    def _eltwise_bottoms(kernel: str, bottoms) -> np.dtype:
        if len(bottoms) < 2:
            raise ValueError(f"{kernel}: takes two or more bottoms, got {len(bottoms)}")
        dt = _dtype(bottoms[0], _FAMILY)
        for i, b in enumerate(bottoms):
            if b.shape != bottoms[0].shape or b.dtype != dt:
                raise ValueError(f"{kernel}: bottom {i} is {b.dtype.name} {b.shape}, bottom 0 "
                                 f"{dt.name} {bottoms[0].shape}; they must agree")
        return dt

    def eltwise_sum(self, bottoms, coeffs, out=None):
        """sum_i coeffs[i] * bottoms[i], left to right, each product rounded before it is
        added (Eltwise SUM)."""
        dt = self._eltwise_bottoms("eltwise_sum", bottoms)
        if len(coeffs) != len(bottoms):
            raise ValueError(f"eltwise_sum: {len(coeffs)} coeffs for {len(bottoms)} bottoms")
        c = [dt.type(v) for v in coeffs]
        if all(v == 1 for v in c):
            # Split's backward: a coefficient 1 multiplies nothing (x * 1 is x, the same
            # bits), and the sum goes straight into out where no later bottom is in it.
            xp = self.xp
            direct = out is not None and out.shape == bottoms[0].shape and out.dtype == dt \
                and not any(xp.may_share_memory(out, b) for b in bottoms[2:])
            y = xp.add(bottoms[0], bottoms[1], out=out if direct else None)
            for b in bottoms[2:]:
                y += b
            return y if direct else _store(y, out)
        y = c[0] * bottoms[0]
        for cb, b in zip(c[1:], bottoms[1:]):
            y += cb * b
        return _store(y, out)

    def eltwise_prod(self, bottoms, out=None):
        """The product of the bottoms, left to right (Eltwise PROD, and its stable gradient:
        the other bottoms' product times the top diff)."""
        self._eltwise_bottoms("eltwise_prod", bottoms)
        y = bottoms[0] * bottoms[1]
        for b in bottoms[2:]:
            y *= b
        return _store(y, out)

    def eltwise_max(self, bottoms, out=None, mask=None):
        """(top, mask): the element-wise maximum and the index of the bottom it came from
        (int32), Caffe's winner: bottom 1 unless bottom 0 is strictly greater, then each later
        bottom only where strictly greater than the running maximum."""
        xp = self.xp
        self._eltwise_bottoms("eltwise_max", bottoms)
        first = bottoms[0] > bottoms[1]
        y = xp.where(first, bottoms[0], bottoms[1])
        m = xp.where(first, 0, 1).astype(xp.int32)
        for index, b in enumerate(bottoms[2:], start=2):
            better = b > y
            y = xp.where(better, b, y)
            m[better] = index
        if mask is not None:
            mask[...] = m
            m = mask
        return _store(y, out), m

    def eltwise_max_backward(self, top_diff, mask, index, out=None):
        """The top diff where bottom ``index`` won the maximum (``mask``), zero elsewhere."""
        _dtype(top_diff, _FAMILY)
        if mask.shape != top_diff.shape:
            raise ValueError(f"eltwise_max_backward: mask {mask.shape} for a top diff "
                             f"{top_diff.shape}")
        dx = self.xp.where(mask == index, top_diff, 0).astype(top_diff.dtype, copy=False)
        return _store(dx, out)

    def softmax_backward(self, y, dy, out=None):
        """dx = (dy - sum over channels of dy y) y; ``out`` may be ``dy``."""
        xp = self.xp
        dt = _dtype(y, _FAMILY)
        dot = (dy * y).sum(axis=1, keepdims=True)
        buf, dest = _target(self.xp, out, y.shape, dt)
        dx = buf.reshape(y.shape)
        xp.subtract(dy, dot, out=dx)
        dx *= y
        return _result(buf, dest)

    # -- Dropout -----------------------------------------------------------------------------
    def dropout_mask(self, shape, keep: float, scale, dtype, rng):
        """Caffe's Dropout mask, scaled: ``scale`` where a uniform draw is below ``keep``, else
        0, of ``shape`` and ``dtype``; the draws as the kernels' constructor says (see
        ``uniform``), ``rng`` the run's host generator."""
        dt = np.dtype(dtype)
        keep_mask = self._uniform(tuple(shape), rng) < keep
        return keep_mask.astype(dt) * dt.type(scale)

    # -- SoftmaxWithLoss ---------------------------------------------------------------------
    @staticmethod
    def _labels(label, channels, ignore_label):
        lab = label.astype(np.int64)  # truncation towards zero, as static_cast<int>
        keep = None if ignore_label is None else lab != int(ignore_label)
        in_range = (lab >= 0) & (lab < channels)
        use = in_range if keep is None else keep & in_range
        return lab, keep, use

    def softmax_loss_forward(self, x, label, ignore_label, prob=None, deferred=False):
        """SoftmaxWithLoss's forward core on x (outer, channels, inner) and label (outer,
        inner), labels truncated to int. Returns (prob, loss, count, bad_label): loss the sum
        of -log(max(p[label], FLT_MIN)) over the positions whose label is not
        ``ignore_label`` (a dtype scalar), count those positions, bad_label the first label
        outside [0, channels) that is not ignored (None when all are fine; the loss skips it).
        The three host values come back in one device-to-host copy; with ``deferred`` they
        stay on the device (nothing waits for the GPU): loss and count as 0-d arrays,
        bad_label as the array [any bad, the first bad label], which the net reads with the
        loss (a layer's ``pending_check``, cct/net.py's PendingLoss)."""
        xp = self.xp
        dt = _dtype(x, _FAMILY)
        p = self.softmax_forward(x, prob)
        pv = p.reshape(x.shape)
        lab, keep, use = self._labels(label.reshape(x.shape[0], -1), x.shape[1], ignore_label)
        picked = xp.take_along_axis(pv, xp.where(use, lab, 0)[:, None, :], axis=1)[:, 0, :]
        nll = -xp.log(xp.maximum(picked, dt.type(_FLT_MIN)))
        bad = ~use if keep is None else keep & ~use
        first_bad = bad.reshape(-1).astype(np.int8).argmax()
        stats = xp.stack([
            xp.where(use, nll, dt.type(0)).sum(dtype=np.float64),
            use.sum(dtype=np.float64),
            bad.any().astype(np.float64),
            lab.reshape(-1)[first_bad].astype(np.float64)])
        if deferred:
            return p, stats[0].astype(dt), stats[1], stats[2:]
        loss, count, any_bad, bad_label = (float(v) for v in self.to_host(stats))
        return p, dt.type(loss), int(count), (int(bad_label) if any_bad else None)

    def softmax_loss_backward(self, prob, label, ignore_label, scale, out=None):
        """dx = (prob - onehot(label)) * scale, 0 at positions labelled ``ignore_label``."""
        xp = self.xp
        dt = _dtype(prob, _FAMILY)
        outer, channels = prob.shape[:2]
        lab, keep, _ = self._labels(label.reshape(outer, -1), channels, ignore_label)
        buf, dest = _target(self.xp, out, prob.shape, dt)
        dx = buf.reshape(prob.shape)
        onehot = xp.arange(channels)[None, :, None] == lab[:, None, :]
        xp.subtract(prob, onehot.reshape(prob.shape).astype(dt), out=dx)
        # The scale may be a device scalar (the top's diff, as Caffe's loss layers read it):
        # it stays on the device, a cast there, never a host conversion.
        factor = scale.astype(dt) if isinstance(scale, xp.ndarray) else dt.type(scale)
        if keep is not None:
            dx *= (keep.astype(dt) * factor).reshape((outer, 1) + prob.shape[2:])
        else:
            dx *= factor
        return _result(buf, dest)

    # -- solver ------------------------------------------------------------------------------
    # Caffe's update rules (cct/solver_rules.py's table), in place, each as Caffe's steps one
    # by one (scale then add, as its axpby): L2 regularization g += local_decay data (0: none),
    # the rule, which leaves the update value in diff, and data -= diff. The CPU backend runs
    # the same steps fused (C++ for SGD, numba for the others), to the bit.
    @staticmethod
    def _update_dtype(kernel: str, *arrays):
        dtype = _dtype(arrays[0], _FAMILY)
        if any(a.dtype != dtype for a in arrays):
            raise TypeError(f"{kernel}: data, diff and history must share one dtype, got "
                            f"{', '.join(str(a.dtype) for a in arrays)}")
        if any(a.size != arrays[0].size for a in arrays):
            raise ValueError(f"{kernel}: data, diff and history have different sizes "
                             f"({', '.join(str(a.size) for a in arrays)})")
        return dtype.type

    @staticmethod
    def _regularize(data, diff, local_decay) -> None:
        if local_decay:
            diff += data * local_decay

    def sgd_update(self, data, diff, history, local_rate, momentum, local_decay,
                   clear_diff=False):
        """h = momentum h + local_rate g; g = h (0 with clear_diff: the CPU kernel's next
        ClearParamDiffs, here a second pass)."""
        dt = self._update_dtype("sgd_update", data, diff, history)
        self._regularize(data, diff, dt(local_decay))
        diff *= dt(local_rate)
        history *= dt(momentum)
        history += diff
        diff[...] = 0 if clear_diff else history
        data -= history

    def nesterov_update(self, data, diff, history, local_rate, momentum, one_plus_momentum,
                        local_decay):
        """h' = momentum h + local_rate g; g = (1 + momentum) h' - momentum h."""
        dt = self._update_dtype("nesterov_update", data, diff, history)
        self._regularize(data, diff, dt(local_decay))
        old = history.copy()
        diff *= dt(local_rate)
        history *= dt(momentum)
        history += diff
        old *= -dt(momentum)
        self.xp.multiply(history, dt(one_plus_momentum), out=diff)
        diff += old
        data -= diff

    def adagrad_update(self, data, diff, history, local_rate, delta, local_decay):
        """h += g^2; g = local_rate g / (sqrt(h) + delta)."""
        dt = self._update_dtype("adagrad_update", data, diff, history)
        self._regularize(data, diff, dt(local_decay))
        history += diff * diff
        u = self.xp.sqrt(history)
        u += dt(delta)
        diff /= u
        diff *= dt(local_rate)
        data -= diff

    def rmsprop_update(self, data, diff, history, local_rate, rms_decay, delta,
                       one_minus_decay, local_decay):
        """h = rms_decay h + (1 - rms_decay) g^2; g = local_rate g / (sqrt(h) + delta)."""
        dt = self._update_dtype("rmsprop_update", data, diff, history)
        self._regularize(data, diff, dt(local_decay))
        u = diff * diff
        history *= dt(rms_decay)
        u *= dt(one_minus_decay)
        history += u
        self.xp.sqrt(history, out=u)
        u += dt(delta)
        diff /= u
        diff *= dt(local_rate)
        data -= diff

    def adadelta_update(self, data, diff, history, history2, local_rate, momentum, delta,
                        one_minus_momentum, local_decay):
        """h = momentum h + (1 - momentum) g^2; g = g sqrt((s + delta) / (h + delta));
        s = momentum s + (1 - momentum) g^2; g = local_rate g."""
        dt = self._update_dtype("adadelta_update", data, diff, history, history2)
        self._regularize(data, diff, dt(local_decay))
        u = diff * diff
        history *= dt(momentum)
        u *= dt(one_minus_momentum)
        history += u
        self.xp.add(history2, dt(delta), out=u)
        u /= history + dt(delta)
        self.xp.sqrt(u, out=u)
        diff *= u
        self.xp.multiply(diff, diff, out=u)
        history2 *= dt(momentum)
        u *= dt(one_minus_momentum)
        history2 += u
        diff *= dt(local_rate)
        data -= diff

    def adam_update(self, data, diff, m, v, beta1, beta2, delta, one_minus_beta1,
                    one_minus_beta2, step, local_decay):
        """m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; g = step m / (sqrt(v) + delta),
        step = local_rate x the bias correction (cct/solver_rules.py)."""
        dt = self._update_dtype("adam_update", data, diff, m, v)
        self._regularize(data, diff, dt(local_decay))
        m *= dt(beta1)
        m += diff * dt(one_minus_beta1)
        u = diff * diff
        v *= dt(beta2)
        u *= dt(one_minus_beta2)
        v += u
        self.xp.sqrt(v, out=u)
        u += dt(delta)
        self.xp.divide(m, u, out=u)
        self.xp.multiply(u, dt(step), out=diff)
        data -= diff
