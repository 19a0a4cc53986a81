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

from . import HostTimer, allocation_bytes, cupy_movement, reduced, register_device, standin
from .array_kernels import ArrayKernels
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


register_device(sys.modules[__name__])

kernels = ArrayKernels(xp, to_host=to_host, gemm=_gemm)
kernels.bind(globals())
