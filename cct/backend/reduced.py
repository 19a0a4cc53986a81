"""The device backends' arithmetic (issue 29, item 4): float32, Caffe's, or tensor-core GEMMs
and convolutions in TF32, bf16 or fp16.

Storage stays float32 everywhere: blobs, weights, their history and the update, the files
read and written. What a precision changes is what the GEMMs and the convolutions multiply:

* ``tf32``: cuBLAS's ``CUBLAS_COMPUTE_32F_FAST_TF32`` (operands rounded to TF32, 10 mantissa
  bits; float32 accumulation) and cuDNN's TF32 engines (their DOWN_CONVERT_INPUTS note);
* ``bf16``: ``CUBLAS_COMPUTE_32F_FAST_16BF`` (operands rounded to bf16, 7 mantissa bits,
  float32's range; float32 accumulation), cuDNN on bf16 copies of its operands;
* ``fp16``: ``CUBLAS_COMPUTE_32F_FAST_16F`` (operands rounded to IEEE half: 10 mantissa
  bits, but a range of 6e-8 to 65504, so small gradients vanish and large activations
  overflow), cuDNN on half copies: trained with a loss scale (cct/solver/loss_scale.py).

Rounding the operands is all the difference a tensor core makes that a test can see, so the
stand-in device (cct/backend/standin.py) rounds its GEMM's operands with :func:`round_operand`
(round to nearest even, as the hardware's conversions do; bf16 by the CPU's own bf16 rounding,
csrc/bf16.cpp) and CI trains in these precisions without a GPU; the order of the float32 sums
differs, as between any two GEMM kernels.
"""
from __future__ import annotations

import numpy as np

from ..errors import CCTError
from ..native import _C

PRECISIONS = ("float32", "tf32", "bf16", "fp16")
#: cuBLAS's cublasComputeType_t for each (cublas_api.h): float32 inputs and outputs, the
#: tensor cores allowed to round the inputs down
COMPUTE_TYPE = {"float32": 68, "tf32": 77, "bf16": 75, "fp16": 74}
#: how far a kernel in a precision may be from another kernel's result of the same call,
#: relative to its largest magnitude: a few units of the operands' rounding (2^-11 for TF32
#: and fp16, 2^-8 for bf16) grown over sums of thousands of terms; float32's is the rounding
#: of such sums alone
ACCURACY = {"float32": 1e-4, "tf32": 4e-3, "bf16": 3e-2, "fp16": 4e-3}
#: what the log says a precision does
DESCRIPTION = {
    "float32": "float32 GEMMs and convolutions",
    "tf32": "tensor-core GEMMs and convolutions on TF32-rounded operands, float32 sums; "
            "weights, history and update float32",
    "bf16": "tensor-core GEMMs and convolutions on bf16 operands, float32 sums; weights, "
            "history and update float32",
    "fp16": "tensor-core GEMMs and convolutions on fp16 operands, float32 sums, backward "
            "from a dynamically scaled loss; weights, history and update float32",
}
#: the precisions whose cuDNN operands are 16-bit copies (float32 memory in the other two)
HALF = ("bf16", "fp16")


def check(name: str, source: str = "precision") -> str:
    """``name`` as one of PRECISIONS (lower case); a CCTError naming ``source`` otherwise."""
    value = str(name).lower()
    if value not in PRECISIONS:
        raise CCTError(f"{source}: unknown precision '{name}'; known: {', '.join(PRECISIONS)}")
    return value


def round_operand(a: np.ndarray, precision: str) -> np.ndarray:
    """A float32 array as a tensor core multiplies it in ``precision``: rounded to nearest
    even to TF32's or bf16's mantissa, or to IEEE half (overflowing to inf, underflowing to
    half's subnormals and zero); float32 returned as it is."""
    if precision == "float32" or a.dtype != np.float32:
        return a
    if precision == "fp16":
        with np.errstate(over="ignore"):
            return a.astype(np.float16).astype(np.float32)
    if precision == "bf16":
        return _C.round_to_bf16(a)
    return _round_tf32(np.ascontiguousarray(a))


def _round_tf32(a: np.ndarray) -> np.ndarray:
    """To nearest even with 10 mantissa bits (13 of float32's 23 dropped)."""
    drop = 13
    bits = a.view(np.uint32)
    half = np.uint32((1 << (drop - 1)) - 1)
    odd = (bits >> np.uint32(drop)) & np.uint32(1)
    with np.errstate(over="ignore"):
        rounded = (bits + half + odd) & np.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
    nan = np.isnan(a)
    out = rounded.view(np.float32)
    if nan.any():          # a NaN stays a NaN (the carry could make it an infinity)
        out = np.where(nan, a, out)
    return out


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 values as bf16 (their upper 16 bits after rounding), uint16: the storage cuDNN's
    bf16 operands take (what :data:`BF16_KERNELS`' cast computes on a GPU)."""
    return (round_operand(np.asarray(a, np.float32), "bf16").view(np.uint32)
            >> np.uint32(16)).astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


#: The GPU's casts between float32 and bf16 storage (uint16 holding the upper half of a
#: float32), rounding to nearest even as :func:`round_operand` does; CuPy has no bfloat16 type.
BF16_KERNELS = {
    "to": ("float32 x", "uint16 y", """
        unsigned int u = __float_as_uint(x);
        if ((u & 0x7fffffffu) > 0x7f800000u) { y = (unsigned short)((u >> 16) | 0x40u); }
        else { y = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }""",
           "cct_to_bf16"),
    "from": ("uint16 x", "float32 y", "y = __uint_as_float(((unsigned int)x) << 16);",
             "cct_from_bf16"),
}
