"""Softmax over one axis (Caffe's ``softmax_layer.cpp``; the backend's ``softmax_forward`` and
``softmax_backward``), plus the helpers that the softmax-based loss and the accuracy layers share:
the canonical axis and the (outer, channels, inner) view."""
from __future__ import annotations

from ..blob import Blob
from .base import Layer, register


def canonical_axis(layer: Layer, blob: Blob, axis: int, field: str = "axis") -> int:
    """Caffe's ``Blob::CanonicalAxisIndex``: -num_axes <= axis < num_axes, negative counting
    from the end; a layer error naming the field and the shape otherwise."""
    n = blob.num_axes
    if not -n <= axis < n:
        raise layer.error(f"{field} {axis} is out of range for a bottom of shape {blob.shape} "
                          f"({n} axes); use -{n} <= {field} < {n}." if n else
                          f"{field} {axis} needs a bottom with axes, got a scalar bottom.")
    return axis + n if axis < 0 else axis


def split_shape(blob: Blob, axis: int):
    """(outer, channels, inner): the counts before, on and after ``axis``."""
    return blob.count_range(0, axis), blob.shape[axis], blob.count_range(axis + 1)


@register("Softmax")
class SoftmaxLayer(Layer):
    """y_k = exp(x_k - max_j x_j) / sum_j exp(x_j - max_j x_j) over ``softmax_param.axis``
    (default 1; negative counts from the end), independently for every other index.

    dL/dx_k = (dL/dy_k - sum_j dL/dy_j y_j) y_k."""

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def reshape(self, bottom, top):
        self.axis = canonical_axis(self, bottom[0], self.layer_param.softmax_param.axis)
        self.view = split_shape(bottom[0], self.axis)
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        self.backend.softmax_forward(bottom[0].data.reshape(self.view),
                                     out=top[0].data.reshape(self.view))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        self.backend.softmax_backward(top[0].data.reshape(self.view),
                                      top[0].diff.reshape(self.view),
                                      out=bottom[0].diff.reshape(self.view))
