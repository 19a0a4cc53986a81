"""Caffe's output-size rules and the kernels' argument conventions (out=, the float dtypes, (h, w)
pairs), shared by every backend and by the tests' NumPy oracle (cct/backend/reference.py): the
lowest module of the backend floor, importing nothing of cct, so that the kernels, the array
kernels and the oracle need not import each other for them.

The out= convention: a kernel writes into ``out`` when given (a blob's array: no copy) and
returns it, else into a new array; with ``accumulate`` it adds into ``out``, which must then be
given; an ``out`` that shares memory with an input is refused, since the kernels read their
inputs while they write. The helpers that take ``xp`` serve any array module (NumPy for the CPU
kernels, CuPy or the stand-in for the array kernels). They run on every kernel call, so they
allocate nothing but the output they are asked for.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def conv_out_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """Caffe's ``(in + 2 pad - (dilation (k - 1) + 1)) / stride + 1`` (floor)."""
    extent = dilation * (kernel - 1) + 1
    return (size + 2 * pad - extent) // stride + 1


def deconv_out_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """Deconvolution's ``stride (in - 1) + dilation (k - 1) + 1 - 2 pad``: the input size of
    the convolution whose output size is ``size``."""
    extent = dilation * (kernel - 1) + 1
    return stride * (size - 1) + extent - 2 * pad


def pool_out_size(size: int, kernel: int, stride: int, pad: int, ceil_mode: bool) -> int:
    """Caffe's pooled size: ceil (or floor) rounding, then drop a last window that would start
    inside the bottom/right padding."""
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def concat_shape(shapes: Sequence[Sequence[int]], axis: int) -> Tuple[int, ...]:
    """The shape of arrays of ``shapes`` joined along ``axis`` (Concat's top); ValueError
    unless they have the same axes and agree on every one but ``axis``."""
    first = tuple(shapes[0])
    if not 0 <= axis < len(first):
        raise ValueError(f"concat: axis {axis} is out of range for shape {first}")
    lead, rest, total = first[:axis], first[axis + 1:], 0
    for k, shape in enumerate(shapes):
        if len(shape) != len(first) or shape[:axis] != lead or shape[axis + 1:] != rest:
            raise ValueError(f"concat: array {k} has shape {tuple(shape)} but array 0 has "
                             f"{first}; they must agree on every axis but {axis}")
        total += shape[axis]
    return lead + (total,) + rest


def concat_runs(shape: Sequence[int], axis: int) -> Tuple[int, int]:
    """(runs, elements per unit of ``axis`` in a run) of an array of ``shape`` cut along
    ``axis``: a C-contiguous array is ``runs`` blocks, one per index of the axes before
    ``axis``, each of shape[axis] * the second number contiguous elements."""
    return math.prod(shape[:axis]), math.prod(shape[axis + 1:])  # not np.prod: 10 us a call


def pair(v: Sequence[int]) -> Tuple[int, int]:
    """A kernel's (h, w) geometry argument as two Python ints."""
    return int(v[0]), int(v[1])


def float_dtype(a, kernels: str) -> np.dtype:
    """``a``'s dtype, refused unless float32 or float64; ``kernels`` names the refusing family
    ("cpu kernels", "array kernels") in the message. NumPy's, CuPy's and the stand-in's arrays
    all carry a NumPy dtype, returned as it is."""
    dt = a.dtype
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"{kernels} take float32 or float64 arrays, not {dt}")
    return dt


def accumulating(kernel: str, out, accumulate: bool) -> None:
    """Refuses ``accumulate`` without an ``out`` to add into."""
    if accumulate and out is None:
        raise ValueError(f"{kernel}: accumulate=True adds into out, so out must be given")


def disjoint(xp, kernel: str, out, **inputs) -> None:
    """Refuses an ``out`` that shares memory with one of the named ``inputs`` (None skipped)."""
    if out is None:
        return
    for what, a in inputs.items():
        if a is not None and xp.may_share_memory(out, a):
            raise ValueError(f"{kernel}: out overlaps {what}; give a separate output array")


def target(xp, out, shape, dtype, keep: bool = False):
    """(array the kernel writes, array to copy it into afterwards or None): ``out`` itself when
    it is C-contiguous, writeable and of ``dtype`` (the kernel may write it through
    ``reshape(shape)``, a view), else a new ``xp`` array of ``shape``. ``keep``: the kernel
    adds into its output, so such a temporary starts as a copy of ``out``."""
    if out is None:
        return xp.empty(shape, dtype), None
    flags = out.flags
    # CuPy's flags have no ``writeable``: its arrays always are
    if out.dtype == dtype and flags.c_contiguous and getattr(flags, "writeable", True):
        return out, None
    if keep:
        return xp.ascontiguousarray(out, dtype).reshape(shape), out
    return xp.empty(shape, dtype), out


def result(buf, dest):
    """What a kernel returns after writing ``buf`` from :func:`target`: ``buf``, or ``dest``
    with ``buf`` copied in."""
    if dest is None:
        return buf
    dest[...] = buf.reshape(dest.shape)
    return dest


def store(y, out, accumulate=False):
    """y written (or, with accumulate, added) into ``out`` when given; the result."""
    if out is None:
        return y
    if accumulate:
        out += y.reshape(out.shape)
    else:
        out[...] = y.reshape(out.shape)
    return out
