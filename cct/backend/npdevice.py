"""The ``numpy`` backend: the GPU backend's kernels (:mod:`cct.backend.array_kernels`) on NumPy
memory that behaves as CuPy's device memory does (:mod:`cct.backend.standin`).

It exists so that CI, which has no GPU, runs the GPU code path end to end: the same
array-generic kernels, the same layers, the same host/device synchronisation of blobs
(:class:`cct.blob.DeviceBlob`), and the same refusals: a device array here cannot be converted,
filled or mixed with host arrays implicitly, exactly where CuPy raises, so code that would
stop on a GPU stops in CI. ``copies`` counts every host<->device copy.
"""
from __future__ import annotations

import sys
from typing import Optional

import numpy as np

from . import (HostTimer, allocation_bytes, caffe_cuda, cudnn, cupy_movement, reduced,
               register_device, standin)
from .array_kernels import ArrayKernels
from .shapes import pair
from .standin import Copies, DeviceArray, OutOfMemoryError, namespace

name = "numpy"

copies = Copies()
xp = namespace("cct.backend.npdevice.xp", copies)


def is_device(array) -> bool:
    return isinstance(array, DeviceArray)


# The GPU backend's movement, the same code (CuPy's get/set/asarray), on the stand-in.
to_host, to_device = cupy_movement(xp, is_device)


class AsideCopies:
    """The GPU backend's copies off the current stream (cct.backend.gpu.AsideCopies) on the
    stand-in, where nothing is queued: each copy is made (and counted) at once."""

    def mark(self):
        return None

    def to_host(self, src, out: np.ndarray, after=None) -> np.ndarray:
        return src.get(out=out)

    def to_device(self, src: np.ndarray, out, after=None):
        out.set(src)
        return out


aside = AsideCopies()


class Graphs:
    """CUDA graphs on the stand-in (cct.backend.gpu.Graphs' contract): :meth:`capture` runs a
    function under :func:`standin.begin_capture`, which records its device operations and
    refuses what a real capture refuses; the graph's ``launch()`` replays them."""

    def capture(self, fn) -> standin.Graph:
        standin.begin_capture()
        try:
            fn()
        finally:
            graph = standin.end_capture()
        return graph


graphs = Graphs()


def synchronize() -> None:
    """NumPy has finished when it returns."""


def device() -> int:
    """The device the arrays live on: the stand-in has one, 0."""
    return 0


def timer() -> HostTimer:
    """A timer of the device's work: host clocks, since NumPy has finished when it returns."""
    return HostTimer()


def out_of_memory(exc: BaseException) -> Optional[int]:
    """The bytes asked for when ``exc`` is the stand-in device running out of memory
    (:class:`OutOfMemoryError`, CuPy's message), else None."""
    if not isinstance(exc, OutOfMemoryError):
        return None
    size = allocation_bytes(exc)
    return exc._size if size is None else size


class _Gemm:
    """The kernels' GEMM: the stand-in's own cuBLAS handle, in the precision set."""

    def __init__(self):
        self.precision = "float32"

    def __call__(self, a, b, out=None):
        return standin.own_matmul(a, b, out=out, precision=self.precision)


_gemm = _Gemm()


def set_precision(name: str, source: str = "precision") -> str:
    """The GEMMs' arithmetic from now on (cct/backend/reduced.py; the GPU's rounding of the
    operands, emulated); returns it."""
    _gemm.precision = reduced.check(name, source)
    return _gemm.precision


def precision() -> str:
    return _gemm.precision


class CaffeKernelsStandIn:
    """The calls gpu.py routes to Caffe's CUDA kernels (caffe_cuda.CaffeKernels' methods), made
    here by array kernels of their own. The stand-in has no CUDA to launch, but the wrappers
    around those kernels are GPU code too: each call's arguments, its out= arrays and its
    first-use check run here as on a GPU, so a wrapper that drops an argument or writes the
    wrong array fails in CI (a relu= that the wrappers lacked made every MAX pooling backward
    a TypeError on CuPy, which CI did not see)."""

    def __init__(self, array_kernels: ArrayKernels):
        self.k = array_kernels

    def max_forward(self, x, kernel, stride, pad, pooled, out, mask):
        return self.k.max_pool_forward(x, kernel, stride, pad, pooled, out=out, mask=mask)

    def max_backward(self, dy, mask, x_shape, kernel, stride, pad, out):
        # the windows are those of this object's max_forward calls (the array kernels' rule)
        return self.k.max_pool_backward(dy, mask, x_shape, out=out)

    def ave_forward(self, x, kernel, stride, pad, pooled, out):
        return self.k.ave_pool_forward(x, kernel, stride, pad, pooled, out=out)

    def ave_backward(self, dy, x_shape, kernel, stride, pad, pooled, out):
        return self.k.ave_pool_backward(dy, x_shape, kernel, stride, pad, pooled, out=out)

    def relu_forward(self, x, negative_slope, out):
        return self.k.relu_forward(x, negative_slope, out=out)

    def relu_backward(self, src, dy, negative_slope, out):
        return self.k.relu_backward(src, dy, negative_slope, out=out)

    def sgd_update(self, data, diff, history, local_rate, momentum, local_decay):
        # Caffe's step leaves the update in diff (caffe_cuda.wrap_update clears it after)
        self.k.sgd_update(data, diff, history, local_rate, momentum, local_decay)

    def lrn_forward(self, x, size, alpha, beta, k, out, scale):
        return self.k.lrn_across_forward(x, size, alpha, beta, k, out=out, scale=scale)

    def lrn_backward(self, x, y, scale, dy, size, alpha, beta, out):
        return self.k.lrn_across_backward(x, y, scale, dy, size, alpha, beta, out=out)

    def softmax_loss_forward(self, x, label, ignore_label, prob, deferred):
        return self.k.softmax_loss_forward(x, label, ignore_label, prob=prob, deferred=deferred)

    def release(self) -> None:
        """Nothing cached to give back."""


class ConvolutionsStandIn:
    """cudnn.Convolutions' three calls (the engines gpu.py routes every convolution but
    engine CAFFE's through), answered with the lowering's own result, float32 only as
    cuDNN's graphs are: so that cudnn.wrap_lowering's code (the bias it adds after cuDNN's
    forward, the accumulation into a param diff, out=) runs in CI too."""

    @staticmethod
    def _take(dtype, out, lowered):
        if np.dtype(dtype) != np.float32:
            return None   # the lowering runs instead, as for cuDNN
        result = lowered()
        if out is None:
            return result
        out[...] = result
        return out

    def forward(self, x, weight, stride, pad, dilation, out, lowered):
        return self._take(x.dtype, out, lowered)

    def backward_data(self, dy, weight, x_shape, stride, pad, dilation, out, lowered):
        return self._take(dy.dtype, out, lowered)

    def backward_weight(self, x, dy, weight_shape, stride, pad, dilation, out, accumulate,
                        lowered):
        if accumulate and out is not None:
            dw = self._take(x.dtype, None, lowered)
            if dw is None:
                return None
            out += dw
            return out
        return self._take(x.dtype, out, lowered)


register_device(sys.modules[__name__])

kernels = ArrayKernels(xp, to_host=to_host, gemm=_gemm)
# gpu.py's wrappers, over the stand-in's Caffe kernels (the same order as there)
_caffe_kernels = CaffeKernelsStandIn(ArrayKernels(xp, to_host=to_host, gemm=_gemm))
caffe_cuda.wrap_all(kernels, _caffe_kernels, pair)
_convolutions = ConvolutionsStandIn()
cudnn.wrap_lowering(kernels, _convolutions, pair)
kernels.bind(globals())
