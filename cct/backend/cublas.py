"""float32 GEMMs through a cuBLAS handle of cct's own (issue 29, item 3: CUDA graphs).

CuPy sets its cuBLAS handle's stream before every call and refuses to while a stream captures
("calling cuBLAS API during stream capture is currently unsupported", its cublas.setStream),
so no GEMM of CuPy's can sit in a CUDA graph. cuBLAS itself takes a capture when its handle's
stream was set before the capture began and a workspace of its own was given
(cublasSetWorkspace; otherwise it may allocate inside the capture): the cuBLAS guide's "CUDA
Graphs Support". This module calls that cuBLAS (the library CuPy loaded, found in the
process's mappings) through ctypes on such a handle, one per GPU: :func:`matmul` is
``xp.matmul``'s contract for the shapes the layers use (2-D, and stacks of 2-D of one count,
the grouped convolution's), float32, into ``out`` when given. Anything else goes to
``cupy.matmul``, which a capture refuses, so a graph falls back saying so.

The handle's math mode is cuBLAS's default (no TF32 unless NVIDIA_TF32_OVERRIDE says so), the
float32 arithmetic CuPy's matmul uses with ``CUPY_TF32`` unset. In another precision
(:attr:`CublasGemm.precision`, cct/backend/reduced.py) the same float32 matrices go through
``cublasGemmEx`` with the precision's compute type: the tensor cores round the operands down,
the sums and the result stay float32.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Dict, Optional, Tuple

import numpy as np

from .reduced import COMPUTE_TYPE

OP_N, OP_T = 0, 1
CUDA_R_32F = 0
CUBLAS_GEMM_DEFAULT = -1
#: The workspace given to each handle: cuBLAS's guide asks for one when capturing (its own
#: default is at most 32 MiB on Hopper).
WORKSPACE_BYTES = 32 << 20


def _library_path() -> str:
    """The libcublas CuPy loaded (its first cuBLAS call loads it)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if line.strip() else ""
            if os.path.basename(path).startswith("libcublas.so"):
                return path
    raise OSError("libcublas is not loaded in this process")


class CublasGemm:
    """The handles (one per GPU, with the stream last set and the workspace) and the calls;
    ``precision``: what the GEMMs multiply in (reduced.PRECISIONS), set by the backend's
    ``set_precision``."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.precision = "float32"
        self._lib = None
        self._lock = threading.Lock()
        self._handles: Dict[int, Tuple[ctypes.c_void_p, object, list]] = {}
        self._one = ctypes.c_float(1.0)
        self._zero = ctypes.c_float(0.0)

    def _load(self):
        if self._lib is None:
            self.cupy.cuda.device.get_cublas_handle()        # CuPy loads libcublas
            lib = ctypes.CDLL(_library_path())
            for name in ("cublasCreate_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2",
                         "cublasSgemm_v2", "cublasGemmEx"):
                getattr(lib, name).restype = ctypes.c_int
            lib.cublasSgemm_v2.argtypes = [
                ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            lib.cublasGemmEx.argtypes = [
                ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
            lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            lib.cublasSetWorkspace_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_size_t]
            self._lib = lib
        return self._lib

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"cuBLAS {what} failed with status {status}")

    def _handle(self, stream_ptr: int):
        """This GPU's handle, its stream set to ``stream_ptr`` (never inside a capture: the
        capture's stream is set before it begins, :meth:`use_stream`)."""
        device = self.cupy.cuda.runtime.getDevice()
        entry = self._handles.get(device)
        if entry is None:
            with self._lock:
                lib = self._load()
                handle = ctypes.c_void_p()
                self._check(lib.cublasCreate_v2(ctypes.byref(handle)), "create")
                workspace = self.cupy.empty(WORKSPACE_BYTES, dtype=np.uint8)
                self._check(lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(
                    workspace.data.ptr), WORKSPACE_BYTES), "setWorkspace")
                entry = self._handles[device] = (handle, workspace, [None])
        handle, _, stream = entry
        if stream[0] != stream_ptr:
            self._check(self._lib.cublasSetStream_v2(handle, ctypes.c_void_p(stream_ptr)),
                        "setStream")
            stream[0] = stream_ptr
        return handle

    def use_stream(self, stream) -> None:
        """Sets this GPU's handle to ``stream`` now (before a capture on it begins)."""
        self._handle(stream.ptr)

    # -- a @ b -----------------------------------------------------------------------------
    @staticmethod
    def _operand(x):
        """(x or a contiguous copy, transposed?, leading dimension) of a 2-D matrix or a stack
        of them, read as row-major: C-contiguous rows, or the transpose of such."""
        rows, cols = x.shape[-2], x.shape[-1]
        item = x.itemsize
        if x.strides[-1] == item and (x.strides[-2] == cols * item or rows == 1):
            return x, False, cols
        if x.strides[-2] == item and (x.strides[-1] == rows * item or cols == 1):
            return x, True, rows
        return None

    def matmul(self, a, b, out=None):
        cupy = self.cupy
        if (a.dtype != np.float32 or b.dtype != np.float32 or a.ndim != b.ndim
                or a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[0] != b.shape[0])
                or a.shape[-1] != b.shape[-2]):
            return cupy.matmul(a, b, out=out)
        ta, tb = self._operand(a), self._operand(b)
        if ta is None:
            a = cupy.ascontiguousarray(a)
            ta = self._operand(a)
        if tb is None:
            b = cupy.ascontiguousarray(b)
            tb = self._operand(b)
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        shape = a.shape[:-2] + (m, n)
        if out is None or not out.flags.c_contiguous or out.shape != shape \
                or out.dtype != np.float32:
            c = cupy.empty(shape, np.float32)
        else:
            c = out
        if m and n:
            self._gemms(a, ta, b, tb, c, m, n, k)
        if out is not None and c is not out:
            out[...] = c
            return out
        return c

    def _gemms(self, a, ta, b, tb, c, m: int, n: int, k: int) -> None:
        """C = A B (row-major) as cuBLAS's column-major C^T = B^T A^T, per matrix of a stack."""
        handle = self._handle(self.cupy.cuda.get_current_stream().ptr)
        _, a_t, lda = ta
        _, b_t, ldb = tb
        count = a.shape[0] if a.ndim == 3 else 1
        sa = a.strides[0] if a.ndim == 3 else 0
        sb = b.strides[0] if b.ndim == 3 else 0
        sc = m * n * 4
        one, zero = ctypes.byref(self._one), ctypes.byref(self._zero)
        compute = COMPUTE_TYPE[self.precision]
        for i in range(count):
            if k == 0:
                c[i if c.ndim == 3 else ...].fill(0)
                continue
            op_b, op_a = OP_T if b_t else OP_N, OP_T if a_t else OP_N
            pb = ctypes.c_void_p(b.data.ptr + i * sb)
            pa = ctypes.c_void_p(a.data.ptr + i * sa)
            pc = ctypes.c_void_p(c.data.ptr + i * sc)
            if self.precision == "float32":
                status = self._lib.cublasSgemm_v2(handle, op_b, op_a, n, m, k, one, pb, ldb,
                                                  pa, lda, zero, pc, n)
                self._check(status, "Sgemm")
            else:
                status = self._lib.cublasGemmEx(
                    handle, op_b, op_a, n, m, k, one, pb, CUDA_R_32F, ldb, pa, CUDA_R_32F,
                    lda, zero, pc, CUDA_R_32F, n, compute, CUBLAS_GEMM_DEFAULT)
                self._check(status, f"GemmEx ({self.precision})")


_gemm: Optional[CublasGemm] = None


def gemm(cupy) -> CublasGemm:
    """The process's handles (made at the first GEMM, outside any capture)."""
    global _gemm
    if _gemm is None:
        _gemm = CublasGemm(cupy)
    return _gemm
