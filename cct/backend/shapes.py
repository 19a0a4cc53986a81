"""Caffe's output-size rules and the out= convention, shared by every backend and by the tests'
NumPy oracle (cct/backend/reference.py): the lowest module of the backend floor, importing
nothing of cct, so that the kernels, the array kernels and the oracle need not import each
other for them.
"""
from __future__ import annotations


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


def store(y, out, accumulate=False):
    """y written (or, with accumulate, added) into ``out`` when given; the result."""
    if out is None:
        return y
    if accumulate:
        out += y.reshape(out.shape)
    else:
        out[...] = y.reshape(out.shape)
    return out
