"""CPU kernels: functions of arrays, the heavy ones in C++ (``cct._C``, csrc/).

Convolution is lowered to GEMM for the whole batch at once (Caffe con Troll): per group the
input is expanded into a K x N*P matrix with K = C/group*kh*kw and P = Ho*Wo, and one large GEMM
does the group's work for the whole mini-batch, instead of Caffe's one small GEMM per image;
or the batch is partitioned, one slice per core, each lowered in cache-sized chunks and
multiplied with single-threaded BLAS. A 1x1 convolution with stride 1 and no pad may also skip
the lowering (pointwise layout: one GEMM per image on the blobs themselves, through OpenBLAS's
strided batched GEMM). Each layer's kernels take whichever plan was fastest at their first call
(csrc/conv.cpp). Pooling is csrc/pooling.cpp; ReLU, LRN across channels, softmax,
SoftmaxWithLoss and the fused SGD update are elementwise.cpp, lrn.cpp and softmax.cpp.

Every kernel writes into ``out`` when given (a blob's own array, so layers copy nothing) and
returns it; the weight-gradient kernels (``conv_backward_weight``, ``matmul``,
``bias_backward``) add into it with ``accumulate=True`` (for the GEMMs, beta = 1), as Caffe
accumulates param diffs. An ``out`` that overlaps an input is refused.

The kernels release the GIL and use cct's threads: ``set_num_threads(n)`` sets them for the
BLAS (OpenBLAS) and cct's own loops together; the default is the cores available to the
process. NumPy's ``@`` runs on NumPy's own OpenBLAS, a separate library with its own threads.

The NumPy implementations these replace are :mod:`cct.backend.reference`, the tests' oracle.
Arrays must be float32 or float64; the C++ side works on C-contiguous arrays of one dtype, so
the wrappers here make them so (a no-op for blobs).
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence, Tuple

import numpy as np

from ..native import _C  # after OpenBLAS's environment (cct/native.py)
from . import HostTimer
from .shapes import conv_out_size, deconv_out_size, pool_out_size  # noqa: F401  (the backend's)
from .shapes import (accumulating as _accumulating, concat_runs as _concat_runs,
                     concat_shape as _concat_shape, disjoint as _disjoint, float_dtype as _dtype,
                     pair as _pair, result as _result, target as _target)

xp = np
name = "cpu"


# Movement: host memory is this backend's own, so these copy only into a given ``out``.
def is_device(array) -> bool:
    return False


def to_host(array, out: Optional[np.ndarray] = None) -> np.ndarray:
    if out is None:
        return np.asarray(array)
    np.copyto(out, array)
    return out


def to_device(host, out: Optional[np.ndarray] = None) -> np.ndarray:
    return to_host(host, out)


def synchronize() -> None:
    """Host kernels return when done."""


def device() -> None:
    """The device the arrays live on: none, the host."""


def timer() -> HostTimer:
    """A timer of the CPU's work (Caffe's Timer in CPU mode): host clocks, since the kernels
    have finished when they return."""
    return HostTimer()


def out_of_memory(exc: BaseException) -> Optional[int]:
    """The bytes asked for when ``exc`` is NumPy failing to allocate an array (its
    MemoryError carries the shape and dtype), else None."""
    shape, dtype = getattr(exc, "shape", None), getattr(exc, "dtype", None)
    if not isinstance(exc, MemoryError) or shape is None or dtype is None:
        return None
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


set_num_threads = _C.set_num_threads
get_num_threads = _C.get_num_threads

# The out= convention and the dtype check are cct/backend/shapes.py's, shared with the array
# kernels: an ``out`` the C++ side cannot write directly (another dtype, not C-contiguous,
# read-only) is computed into a temporary and copied in, which starts as a copy of ``out`` for
# the kernels that add into it (``keep``). A refused dtype names this family.
_FAMILY = "cpu kernels"


def _arr(a, dtype: np.dtype) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=dtype)


def _shape4(shape: Sequence[int]) -> Tuple[int, int, int, int]:
    return tuple(int(d) for d in shape)


# --------------------------------------------------------------------------------------------
# GEMM
# --------------------------------------------------------------------------------------------
def _gemm_operand(a: np.ndarray, dtype: np.dtype) -> Tuple[np.ndarray, bool]:
    """(C-contiguous array, transposed?) standing for the 2-D ``a``, without a copy for
    transposed views."""
    if a.dtype == dtype and a.flags.f_contiguous and not a.flags.c_contiguous:
        return a.T, True
    return _arr(a, dtype), False


def dot(a, b):
    """Caffe's ``caffe_cpu_dot``: the sum of ``a * b`` over two 1-D arrays (NumPy's dot)."""
    return a.dot(b)


def matmul(a, b, out=None, accumulate: bool = False) -> np.ndarray:
    """``a @ b`` for 2-D arrays on cct's BLAS (``out += a @ b`` with ``accumulate``), in the
    operand order (``a @ b`` or ``(b.T @ a.T).T``) measured fastest for the shape on its first
    call.

    Layers use this rather than NumPy's ``@``: NumPy's OpenBLAS is a second library with its own
    thread pool, whose threads keep spinning for a while after each call and would compete with
    cct's for the same cores (LeNet trained 5x slower so)."""
    dt = _dtype(a, _FAMILY)
    _accumulating("matmul", out, accumulate)
    _disjoint(np, "matmul", out, a=a, b=b)
    a2, ta = _gemm_operand(a, dt)
    b2, tb = _gemm_operand(b, dt)
    if out is None:
        return _C.gemm(a2, b2, ta, tb, measured=True)
    buf, dest = _target(np, out, (a.shape[0], b.shape[1]), dt, keep=accumulate)
    _C.gemm(a2, b2, ta, tb, measured=True, out=buf, accumulate=accumulate)
    return _result(buf, dest)


# --------------------------------------------------------------------------------------------
# Convolution (csrc/conv.cpp)
# --------------------------------------------------------------------------------------------
def conv_forward(x, weight, bias: Optional[np.ndarray], kernel, stride, pad, dilation,
                 group: int, out=None, engine: str = "DEFAULT") -> np.ndarray:
    """y = conv(x, weight) + bias. x (N, C, H, W), weight (O, C/group, kh, kw), bias (O,) or
    None; y (N, O, Ho, Wo), written into ``out`` when given. ``engine`` is
    convolution_param.engine's name: "CAFFE" keeps to Caffe's own arithmetic (the lowered
    GEMM), the others let the measured plan take any layout (direct, Winograd)."""
    return _conv_forward(x, weight, bias, kernel, stride, pad, dilation, group, out, engine,
                         False)


def conv_forward_relu(x, weight, bias: Optional[np.ndarray], kernel, stride, pad, dilation,
                      group: int, out=None, engine: str = "DEFAULT") -> np.ndarray:
    """relu_forward(conv_forward(...), 0) with its bits, Caffe's ReLU applied as each layout
    writes the top, without the ReLU's own pass over memory: what a Convolution with an
    in-place ReLU after it runs (Net._find_relu_fusions)."""
    return _conv_forward(x, weight, bias, kernel, stride, pad, dilation, group, out, engine,
                         True)


def _conv_forward(x, weight, bias, kernel, stride, pad, dilation, group, out, engine,
                  relu: bool) -> np.ndarray:
    dt = _dtype(x, _FAMILY)
    _disjoint(np, "conv_forward", out, x=x, weight=weight, bias=bias)
    kernel, stride, pad, dilation = (_pair(v) for v in (kernel, stride, pad, dilation))
    shape = (x.shape[0], weight.shape[0]) + tuple(
        conv_out_size(x.shape[2 + i], kernel[i], stride[i], pad[i], dilation[i])
        for i in range(2))
    buf, dest = _target(np, out, shape, dt)
    _C.conv_forward(_arr(x, dt), _arr(weight, dt), None if bias is None else _arr(bias, dt),
                    kernel, stride, pad, dilation, int(group), buf, engine == "CAFFE", bool(relu))
    return _result(buf, dest)


def conv_backward_data(dy, weight, x_shape, kernel, stride, pad, dilation, group: int,
                       out=None, engine: str = "DEFAULT") -> np.ndarray:
    """Gradient of :func:`conv_forward` with respect to x (Caffe's backward_cpu_gemm + col2im),
    of shape ``x_shape`` (N, C, H, W), written into ``out`` when given (overwritten, as Caffe
    overwrites a bottom diff). Deconvolution's forward pass is this function."""
    dt = _dtype(dy, _FAMILY)
    _disjoint(np, "conv_backward_data", out, dy=dy, weight=weight)
    buf, dest = _target(np, out, _shape4(x_shape), dt)
    _C.conv_backward_data(_arr(dy, dt), _arr(weight, dt), _pair(kernel), _pair(stride),
                          _pair(pad), _pair(dilation), int(group), buf, engine == "CAFFE")
    return _result(buf, dest)


def conv_backward_weight(x, dy, kernel, stride, pad, dilation, group: int, out=None,
                         accumulate: bool = False, engine: str = "DEFAULT") -> np.ndarray:
    """Gradient of :func:`conv_forward` with respect to the weight, shape (O, C/group, kh, kw)
    (Caffe's weight_cpu_gemm, summed over the batch). With ``accumulate`` it is added into
    ``out`` (a param diff: Caffe accumulates them), by the GEMM itself (beta = 1)."""
    dt = _dtype(x, _FAMILY)
    _accumulating("conv_backward_weight", out, accumulate)
    _disjoint(np, "conv_backward_weight", out, x=x, dy=dy)
    shape = (dy.shape[1], x.shape[1] // int(group), int(kernel[0]), int(kernel[1]))
    buf, dest = _target(np, out, shape, dt, keep=accumulate)
    _C.conv_backward_weight(_arr(x, dt), _arr(dy, dt), _pair(kernel), _pair(stride), _pair(pad),
                            _pair(dilation), int(group), buf, accumulate, engine == "CAFFE")
    return _result(buf, dest)


def bias_backward(dy, out=None, accumulate: bool = False) -> np.ndarray:
    """Sum of dy over every axis but 1: the bias gradient of Convolution-like layers (N, C, ...)
    and InnerProduct (M, N); added into ``out`` with ``accumulate``."""
    dt = _dtype(dy, _FAMILY)
    _accumulating("bias_backward", out, accumulate)
    _disjoint(np, "bias_backward", out, dy=dy)
    buf, dest = _target(np, out, (dy.shape[1],), dt, keep=accumulate)
    _C.bias_backward(_arr(dy, dt), buf, accumulate)
    return _result(buf, dest)


# --------------------------------------------------------------------------------------------
# Pooling (csrc/pooling.cpp)
# --------------------------------------------------------------------------------------------
def max_pool_forward(x, kernel, stride, pad, pooled, out=None,
                     mask=None) -> Tuple[np.ndarray, np.ndarray]:
    """Max over each window of the unpadded bottom, scanned in row-major window order with a
    strict ``>`` as Caffe does (ties go to the first element). ``pooled`` is the top's
    (height, width). Returns (top, argmax as the flat index h * W + w in the bottom's plane,
    int32), written into ``out`` and ``mask`` when given."""
    dt = _dtype(x, _FAMILY)
    _disjoint(np, "max_pool_forward", out, x=x)
    shape = tuple(x.shape[:2]) + _pair(pooled)
    buf, dest = _target(np, out, shape, dt)
    mbuf, mdest = _target(np, mask, shape, np.dtype(np.int32))
    _C.max_pool_forward(_arr(x, dt), _pair(kernel), _pair(stride), _pair(pad), _pair(pooled),
                        buf, mbuf)
    return _result(buf, dest), _result(mbuf, mdest)


def max_pool_backward(dy, mask, x_shape, out=None, relu=None) -> np.ndarray:
    """Route each top diff to the bottom element that won its window (sums where windows
    overlap); dx of shape ``x_shape``, written into ``out`` when given. ``relu``, when given,
    is the (src, negative_slope) of a ReLU in place on the bottom whose backward runs here,
    plane by plane: dx = relu_backward(src, the routed diffs)
    (Net._find_relu_backward_fusions)."""
    dt = _dtype(dy, _FAMILY)
    _disjoint(np, "max_pool_backward", out, dy=dy, relu_src=None if relu is None else relu[0])
    buf, dest = _target(np, out, _shape4(x_shape), dt)
    _C.max_pool_backward(_arr(dy, dt), np.ascontiguousarray(mask, np.int32), buf,
                         None if relu is None else _arr(relu[0], dt).reshape(buf.shape),
                         0.0 if relu is None else float(relu[1]))
    return _result(buf, dest)


def ave_pool_forward(x, kernel, stride, pad, pooled, out=None) -> np.ndarray:
    """Mean over each window; the divisor counts padding but not what lies beyond it (Caffe).
    Summed in row-major window order, as Caffe does. ``pooled`` is the top's (height, width)."""
    dt = _dtype(x, _FAMILY)
    _disjoint(np, "ave_pool_forward", out, x=x)
    buf, dest = _target(np, out, tuple(x.shape[:2]) + _pair(pooled), dt)
    _C.ave_pool_forward(_arr(x, dt), _pair(kernel), _pair(stride), _pair(pad), _pair(pooled),
                        buf)
    return _result(buf, dest)


def ave_pool_backward(dy, x_shape, kernel, stride, pad, pooled, out=None) -> np.ndarray:
    """Each top diff, divided by its window's divisor, added to every bottom element of the
    window; dx of shape ``x_shape``. ``pooled`` is dy's (height, width) (kept for the
    reference's signature)."""
    dt = _dtype(dy, _FAMILY)
    _disjoint(np, "ave_pool_backward", out, dy=dy)
    buf, dest = _target(np, out, _shape4(x_shape), dt)
    _C.ave_pool_backward(_arr(dy, dt), _pair(kernel), _pair(stride), _pair(pad), buf)
    return _result(buf, dest)


# --------------------------------------------------------------------------------------------
# In-place kernels: ReLU, LRN, softmax, SoftmaxWithLoss, SGD (csrc/elementwise.cpp, lrn.cpp,
# softmax.cpp). Each writes into ``out`` when given, which may be an input where said (in place).
# --------------------------------------------------------------------------------------------
def dropout_mask(shape, keep: float, scale, dtype, rng) -> np.ndarray:
    """Caffe's Dropout mask, scaled: ``scale`` where a uniform draw of ``rng`` (the run's
    generator, cct.rng) is below ``keep``, else 0, of ``shape`` and ``dtype``. x * mask is
    x * m * scale to the bit, m being 0 or 1."""
    dt = np.dtype(dtype)
    return (rng.random(tuple(shape)) < keep).astype(dt) * dt.type(scale)


def relu_forward(x, negative_slope: float, out=None) -> np.ndarray:
    """y = max(x, 0) + negative_slope * min(x, 0); ``out`` may be ``x`` (in place)."""
    dt = _dtype(x, _FAMILY)
    buf, dest = _target(np, out, x.shape, dt)
    _C.relu_forward(_arr(x, dt), buf, float(negative_slope))
    return _result(buf, dest)


def relu_backward(src, dy, negative_slope: float, out=None) -> np.ndarray:
    """dx = dy * ([src > 0] + negative_slope [src <= 0]); src is the bottom data (or the top
    data, whose sign is the bottom's when negative_slope >= 0). ``out`` may be ``dy``."""
    dt = _dtype(dy, _FAMILY)
    buf, dest = _target(np, out, dy.shape, dt)
    _C.relu_backward(_arr(src, dt), _arr(dy, dt), buf, float(negative_slope))
    return _result(buf, dest)


def lrn_across_forward(x, size, alpha, beta, k, out=None, scale=None):
    """y = x * scale^-beta, scale = k + alpha/size * sum of x^2 over ``size`` neighbouring
    channels (Caffe's running sum over the window). Returns (y, scale); scale is kept for the
    backward pass. ``out`` must not be ``x``."""
    dt = _dtype(x, _FAMILY)
    x = _arr(x, dt)
    buf, dest = _target(np, out, x.shape, dt)
    sbuf, sdest = _target(np, scale, x.shape, dt)
    _C.lrn_across_forward(x, buf, sbuf, int(size), float(alpha), float(beta), float(k))
    return _result(buf, dest), _result(sbuf, sdest)


def lrn_across_backward(x, y, scale, dy, size, alpha, beta, out=None, relu=None):
    """dx = dy scale^-beta - 2 alpha beta / size * x * (window sum of dy y / scale);
    ``out`` may be ``dy``. ``relu``, when given, is the (src, negative_slope) of a ReLU in
    place on the bottom whose backward runs here, on each dx as it is stored
    (Net._find_relu_backward_fusions)."""
    dt = _dtype(x, _FAMILY)
    _disjoint(np, "lrn_across_backward", out, relu_src=None if relu is None else relu[0])
    buf, dest = _target(np, out, x.shape, dt)
    _C.lrn_across_backward(_arr(x, dt), _arr(y, dt), _arr(scale, dt), _arr(dy, dt), buf,
                           int(size), float(alpha), float(beta),
                           None if relu is None else _arr(relu[0], dt).reshape(buf.shape),
                           0.0 if relu is None else float(relu[1]))
    return _result(buf, dest)


def softmax_forward(x, out=None) -> np.ndarray:
    """Softmax over axis 1 of an (outer, channels, inner) array, shifted by the channel max as
    in Caffe so that exp never overflows. ``out`` may be ``x``."""
    dt = _dtype(x, _FAMILY)
    buf, dest = _target(np, out, x.shape, dt)
    _C.softmax_forward(_arr(x, dt), buf.reshape(x.shape))
    return _result(buf, dest)


def softmax_backward(y, dy, out=None) -> np.ndarray:
    """dx = (dy - sum over channels of dy y) y on (outer, channels, inner) arrays; ``out`` may
    be ``dy``."""
    dt = _dtype(y, _FAMILY)
    buf, dest = _target(np, out, y.shape, dt)
    _C.softmax_backward(_arr(y, dt), _arr(dy, dt), buf.reshape(y.shape))
    return _result(buf, dest)


def softmax_loss_forward(x, label, ignore_label: Optional[int], prob=None, deferred=False):
    """SoftmaxWithLoss's forward core on x (outer, channels, inner) and label (outer, inner),
    labels truncated to int as Caffe does. Returns (prob, loss, count, bad_label): loss the sum
    of -log(max(p[label], FLT_MIN)) over the positions whose label is not ``ignore_label``
    (a dtype scalar, summed in memory order), count those positions, bad_label the first label
    outside [0, channels) that is not ignored (None when all are fine; the loss skips it).
    ``deferred`` lets a device keep them on the device; here they are at hand anyway."""
    dt = _dtype(x, _FAMILY)
    x = _arr(x, dt)
    buf, dest = _target(np, prob, x.shape, dt)
    loss, count, bad = _C.softmax_loss_forward(x, _arr(label, dt), buf.reshape(x.shape),
                                               ignore_label)
    return _result(buf, dest), dt.type(loss), count, bad


def softmax_loss_backward(prob, label, ignore_label: Optional[int], scale, out=None):
    """dx = (prob - onehot(label)) * scale, 0 at positions labelled ``ignore_label``."""
    dt = _dtype(prob, _FAMILY)
    buf, dest = _target(np, out, prob.shape, dt)
    _C.softmax_loss_backward(_arr(prob, dt), _arr(label, dt), buf.reshape(prob.shape),
                             ignore_label, float(scale))
    return _result(buf, dest)


def sgd_update(data, diff, history, local_rate, momentum, local_decay,
               clear_diff: bool = False) -> None:
    """SGD with momentum and L2 weight decay, fused and in place (sgd_solver.cpp's Regularize,
    ComputeUpdateValue and Blob::Update in one pass): g = local_rate (diff + local_decay data),
    history = momentum history + g, diff = history, data -= history. The three arrays must be
    C-contiguous, of one dtype (a blob's data and diff and its history are). ``clear_diff``
    leaves the diff zero rather than holding the update: the next iteration's ClearParamDiffs
    in the same pass over memory (the solver's step loop asks for it where nothing reads the
    update value first)."""
    _C.sgd_update(data, diff, history, float(local_rate), float(momentum), float(local_decay),
                  clear_diff=bool(clear_diff))


# The other solver rules, fused, in numba (cct/backend/jit.py, imported on first use): the
# param's arrays, the rule's scalars (in its dtype, from cct/solver_rules.py's table), the decay.
def _jit_update(rule: str, arrays, scalars, local_decay) -> None:
    from . import jit
    dt = _dtype(arrays[0], _FAMILY)
    for a in arrays:
        if a.dtype != dt or not a.flags.c_contiguous or a.size != arrays[0].size:
            raise ValueError(f"{rule}_update: the arrays must be C-contiguous, of one dtype and "
                             f"size; got {[(x.dtype.name, x.size) for x in arrays]}")
    getattr(jit, rule)(*(a.reshape(-1) for a in arrays), *(dt.type(v) for v in scalars),
                       dt.type(local_decay))


def nesterov_update(data, diff, history, local_rate, momentum, one_plus_momentum,
                    local_decay) -> None:
    _jit_update("nesterov", (data, diff, history),
                (local_rate, momentum, one_plus_momentum), local_decay)


def adagrad_update(data, diff, history, local_rate, delta, local_decay) -> None:
    _jit_update("adagrad", (data, diff, history), (local_rate, delta), local_decay)


def rmsprop_update(data, diff, history, local_rate, rms_decay, delta, one_minus_decay,
                   local_decay) -> None:
    _jit_update("rmsprop", (data, diff, history),
                (local_rate, rms_decay, delta, one_minus_decay), local_decay)


def adadelta_update(data, diff, history, history2, local_rate, momentum, delta,
                    one_minus_momentum, local_decay) -> None:
    _jit_update("adadelta", (data, diff, history, history2),
                (local_rate, momentum, delta, one_minus_momentum), local_decay)


def adam_update(data, diff, m, v, beta1, beta2, delta, one_minus_beta1, one_minus_beta2, step,
                local_decay) -> None:
    _jit_update("adam", (data, diff, m, v),
                (beta1, beta2, delta, one_minus_beta1, one_minus_beta2, step), local_decay)


# --------------------------------------------------------------------------------------------
# BatchNorm (cct/backend/jit.py: numba, a channel at a time)
# --------------------------------------------------------------------------------------------
# Below this many values per image and channel the channel-at-a-time loops lose to NumPy's
# whole-array expressions (a BatchNorm after InnerProduct, S = 1: 2-4x slower), which then run
# instead (bench/RESULTS.md).
_BN_MIN_SPATIAL = 8


@functools.lru_cache(maxsize=None)
def _numpy_kernels():
    from .array_kernels import ArrayKernels  # it imports this module
    return ArrayKernels(np)


def _bn_numpy(x):
    """NumPy's array kernels where x's spatial extent is too short for the numba loops."""
    return _numpy_kernels() if x.shape[2] < _BN_MIN_SPATIAL else None


def _bn_arrays(kernel: str, *arrays) -> np.dtype:
    dt = _dtype(arrays[0], _FAMILY)
    for a in arrays:
        if a.dtype != dt or a.ndim != 3:
            raise ValueError(f"{kernel}: the arrays must be N x C x S of one dtype; got "
                             f"{[(x.dtype.name, x.shape) for x in arrays]}")
    return dt


def batch_norm_statistics(x) -> Tuple[np.ndarray, np.ndarray]:
    """Per channel of an N x C x S array: the mean and the biased variance over N x S."""
    from . import jit
    dt = _bn_arrays("batch_norm_statistics", x)
    numpy_path = _bn_numpy(x)
    if numpy_path:
        return numpy_path.batch_norm_statistics(x)
    mean, var = np.empty(x.shape[1], dt), np.empty(x.shape[1], dt)
    jit.batch_norm_statistics(x, mean, var)
    return mean, var


def batch_norm_normalize(x, mean, std, out=None) -> np.ndarray:
    """(x - mean_c) / std_c for an N x C x S array and per-channel mean and std."""
    from . import jit
    dt = _bn_arrays("batch_norm_normalize", x)
    numpy_path = _bn_numpy(x)
    if numpy_path:
        return numpy_path.batch_norm_normalize(x, _arr(mean, dt), _arr(std, dt), out)
    buf, dest = _target(np, out, x.shape, dt)
    jit.batch_norm_normalize(x, _arr(mean, dt), _arr(std, dt), buf.reshape(x.shape))
    return _result(buf, dest)


def batch_norm_backward(dy, y, std, global_stats: bool, out=None) -> np.ndarray:
    """BatchNorm's bottom diff from the top diff dy and the normalized top y (N x C x S):
    (dy - mean(dy) - mean(dy y) y) / std per channel, or dy / std with global statistics."""
    from . import jit
    dt = _bn_arrays("batch_norm_backward", dy, y)
    numpy_path = _bn_numpy(dy)
    if numpy_path:
        return numpy_path.batch_norm_backward(dy, y, _arr(std, dt), global_stats, out)
    buf, dest = _target(np, out, dy.shape, dt)
    jit.batch_norm_backward(dy, y, _arr(std, dt), bool(global_stats), buf.reshape(dy.shape))
    return _result(buf, dest)


# --------------------------------------------------------------------------------------------
# Concat (csrc/elementwise.cpp's concat_copy: the copies split between cct's threads, where
# NumPy's slice assignment runs on one)
# --------------------------------------------------------------------------------------------
def concat_forward(bottoms, axis: int, out=None) -> np.ndarray:
    """The ``bottoms`` joined along ``axis`` (Concat's top; Slice's backward), written into
    ``out`` when given."""
    dt = _dtype(bottoms[0], _FAMILY)
    shape = _concat_shape([b.shape for b in bottoms], axis)
    _disjoint(np, "concat_forward", out, **{f"bottom {k}": b for k, b in enumerate(bottoms)})
    buf, dest = _target(np, out, shape, dt)
    runs, inner = _concat_runs(shape, axis)
    flat, start = buf.reshape(-1), 0
    for b in bottoms:
        run = b.shape[axis] * inner
        _C.concat_copy(_arr(b, dt).reshape(-1), 0, run, flat, start * inner, shape[axis] * inner,
                       runs, run)
        start += b.shape[axis]
    return _result(buf, dest)


def concat_backward(dy, axis: int, counts: Sequence[int], outs, relu=None) -> list:
    """Each bottom's share of the top diff ``dy`` along ``axis`` (Concat's backward; Slice's
    forward): bottom k spans ``counts[k]`` indices of the axis and its share is written into
    ``outs[k]`` (None: not wanted). ``relu[k]``, when given, is the (src, negative_slope) of a
    ReLU in place on bottom k whose backward runs here: outs[k] = relu_backward(src, share)
    (Net._find_relu_backward_fusions). Returns the outputs."""
    dt = _dtype(dy, _FAMILY)
    if sum(counts) != dy.shape[axis] or len(outs) != len(counts):
        raise ValueError(f"concat_backward: counts {list(counts)} do not cut axis {axis} of "
                         f"shape {dy.shape} into {len(outs)} outputs")
    runs, inner = _concat_runs(dy.shape, axis)
    src, start, results = _arr(dy, dt).reshape(-1), 0, []
    for k, (count, out) in enumerate(zip(counts, outs)):
        shape = dy.shape[:axis] + (count,) + dy.shape[axis + 1:]
        fused = relu[k] if relu is not None else None
        if out is not None:
            _disjoint(np, "concat_backward", out, dy=dy,
                      relu_src=None if fused is None else fused[0])
            buf, dest = _target(np, out, shape, dt)
            mask = None if fused is None else _arr(fused[0], dt).reshape(-1)
            _C.concat_copy(src, start * inner, dy.shape[axis] * inner, buf.reshape(-1), 0,
                           count * inner, runs, count * inner, mask,
                           0.0 if fused is None else float(fused[1]))
            out = _result(buf, dest)
        results.append(out)
        start += count
    return results


# --------------------------------------------------------------------------------------------
# Eltwise (cct/backend/jit.py: numba, one pass per bottom; bench/RESULTS.md has the NumPy
# expressions' times against them). Bottoms are arrays of one shape and dtype, two or more;
# ``out`` may be one of them (an in-place Eltwise: every element is read before it is
# written), except one that a later pass would still read, which gets a temporary.
# --------------------------------------------------------------------------------------------
def _eltwise(kernel: str, bottoms, out):
    """(flat contiguous bottoms, dtype, buffer to write, array to copy it into or None)."""
    if len(bottoms) < 2:
        raise ValueError(f"{kernel}: takes two or more bottoms, got {len(bottoms)}")
    dt = _dtype(bottoms[0], _FAMILY)
    shape = bottoms[0].shape
    for i, b in enumerate(bottoms):
        if b.shape != shape or b.dtype != dt:
            raise ValueError(f"{kernel}: bottom {i} is {b.dtype.name} {b.shape}, bottom 0 "
                             f"{dt.name} {shape}; they must agree")
    flat = [_arr(b, dt).reshape(-1) for b in bottoms]
    if out is not None and any(np.may_share_memory(out, b) for b in bottoms[2:]):
        buf, dest = np.empty(shape, dt), out
    else:
        buf, dest = _target(np, out, shape, dt)
    return flat, dt, buf, dest


def eltwise_sum(bottoms, coeffs, out=None) -> np.ndarray:
    """sum_i coeffs[i] * bottoms[i], left to right, each product rounded before it is added
    (Eltwise SUM; Split's backward, every coeff 1): one pass over the bottoms on cct's
    threads."""
    flat, dt, buf, dest = _eltwise("eltwise_sum", bottoms, out)
    if len(coeffs) != len(flat):
        raise ValueError(f"eltwise_sum: {len(coeffs)} coeffs for {len(flat)} bottoms")
    _C.eltwise_sum(flat, [float(dt.type(v)) for v in coeffs], buf.reshape(-1))
    return _result(buf, dest)


def eltwise_prod(bottoms, out=None) -> np.ndarray:
    """The product of the bottoms, left to right (Eltwise PROD, and its stable gradient: the
    other bottoms' product times the top diff)."""
    from . import jit
    flat, _, buf, dest = _eltwise("eltwise_prod", bottoms, out)
    y = buf.reshape(-1)
    jit.eltwise_prod(flat[0], flat[1], y)
    for b in flat[2:]:
        jit.eltwise_prod(y, b, y)
    return _result(buf, dest)


def eltwise_max(bottoms, out=None, mask=None) -> Tuple[np.ndarray, np.ndarray]:
    """(top, mask): the element-wise maximum and the index of the bottom it came from (int32),
    Caffe's winner: bottom 1 unless bottom 0 is strictly greater, then each later bottom only
    where strictly greater than the running maximum."""
    from . import jit
    flat, _, buf, dest = _eltwise("eltwise_max", bottoms, out)
    m_buf, m_dest = _target(np, mask, bottoms[0].shape, np.dtype(np.int32))
    y, m_flat = buf.reshape(-1), m_buf.reshape(-1)
    jit.eltwise_max_first(flat[0], flat[1], y, m_flat)
    for index, b in enumerate(flat[2:], start=2):
        jit.eltwise_max_next(b, index, y, m_flat)
    return _result(buf, dest), _result(m_buf, m_dest)


def eltwise_max_backward(top_diff, mask, index: int, out=None) -> np.ndarray:
    """The top diff where bottom ``index`` won the maximum (``mask``), zero elsewhere."""
    from . import jit
    dt = _dtype(top_diff, _FAMILY)
    if mask.shape != top_diff.shape:
        raise ValueError(f"eltwise_max_backward: mask {mask.shape} for a top diff "
                         f"{top_diff.shape}")
    buf, dest = _target(np, out, top_diff.shape, dt)
    jit.eltwise_max_backward(_arr(top_diff, dt).reshape(-1),
                             np.ascontiguousarray(mask, np.int32).reshape(-1), int(index),
                             buf.reshape(-1))
    return _result(buf, dest)
