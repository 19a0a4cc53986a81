"""Broadcast multiply and add: Scale and Bias (Caffe's ``scale_layer.cpp``,
``bias_layer.cpp``).

Both apply a blob p (a learned param, or bottom[1]) along the axes [axis, axis + p.num_axes)
of bottom[0]: bottom[0] is viewed as (outer, dim, inner) with dim = p.count, and p broadcasts
over outer and inner.
"""
from __future__ import annotations

from typing import List, Tuple

from ..blob import Blob
from ..filler import fill
from ..proto import caffe_pb2
from .base import Layer, register
from .structure import canonical_axis


def _param_shape(layer: Layer, bottom: Blob, axis: int, num_axes: int, what: str) -> List[int]:
    """Shape of a learned scale/bias: bottom.shape[axis:axis + num_axes] (-1: to the end)."""
    axis = canonical_axis(layer, bottom, axis)
    if num_axes < -1:
        raise layer.error(f"num_axes must be non-negative, or -1 to extend to the end of "
                          f"bottom[0]; got {num_axes}.")
    if num_axes >= 0 and axis + num_axes > bottom.num_axes:
        raise layer.error(f"the {what} blob's shape extends past bottom[0]'s shape "
                          f"{bottom.shape} when applied from axis {axis} with num_axes "
                          f"{num_axes}.")
    end = bottom.num_axes if num_axes == -1 else axis + num_axes
    return list(bottom.shape[axis:end])


def _broadcast_dims(layer: Layer, bottom: Blob, param: Blob, axis: int,
                    what: str) -> Tuple[int, int, int]:
    """(outer, dim, inner) of bottom for a ``param`` applied from ``axis``; a scalar param is
    applied at axis 0, as in Caffe."""
    axis = 0 if param.num_axes == 0 else canonical_axis(layer, bottom, axis)
    k = param.num_axes
    if bottom.shape[axis:axis + k] != param.shape:
        raise layer.error(f"{what} of shape {param.shape} does not fit bottom[0] of shape "
                          f"{bottom.shape} from axis {axis}: it must equal bottom[0]'s shape "
                          f"on axes {axis}..{axis + k - 1}, {bottom.shape[axis:axis + k]}.")
    return bottom.count_range(0, axis), param.count, bottom.count_range(axis + k)


def _operand(p, dims):
    """A scale/bias array shaped to broadcast over an (outer, dim, inner) view."""
    return p.reshape(1, dims[1], 1)


def _sum_outer_inner(a):
    """Sum an (outer, dim, inner) array over outer and inner."""
    return a.sum(axis=2).sum(axis=0)


@register("Scale")
class ScaleLayer(Layer):
    """top = bottom[0] * s (+ b), s broadcast as described in the module docstring.

    s is bottom[1] if given, else a learned param of shape
    bottom[0].shape[axis:axis + num_axes] (``axis`` default 1, ``num_axes`` default 1, -1: all
    remaining axes, 0: a scalar) filled by ``filler`` (default constant 1). With ``bias_term``
    (default false) a learned bias b of s's shape, filled by ``bias_filler`` (default constant
    0), is added and stored after s.

    Gradients: d bottom[0] = d top * s; d s = sum over outer and inner of d top * bottom[0];
    d b = sum over outer and inner of d top. Learned params accumulate their diff, bottom[1]'s
    diff is overwritten. In place, the bottom is saved before being overwritten.
    """

    min_bottom_blobs = 1
    max_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.scale_param
        self.bias_term = p.bias_term
        from_bottom = len(bottom) > 1
        if not from_bottom and not self.blobs:
            shape = _param_shape(self, bottom[0], p.axis, p.num_axes, "scale")
            self.blobs.append(self.new_blob(shape))
            filler = p.filler if p.HasField("filler") else caffe_pb2.FillerParameter(
                type="constant", value=1)
            fill(self.blobs[0].data, filler, f"{self.type} layer '{self.name}': ")
        if self.bias_term:
            # As Caffe's inner Bias layer: the bias covers bottom[1]'s axes or num_axes from
            # axis, and is always filled (drawing from the RNG) but kept only when not loaded.
            num_axes = bottom[1].num_axes if from_bottom else p.num_axes
            bias = self.new_blob(_param_shape(self, bottom[0], p.axis, num_axes, "bias"))
            fill(bias.data, p.bias_filler, f"{self.type} layer '{self.name}': ")
            if len(self.blobs) + len(bottom) < 3:
                self.blobs.append(bias)
        expected = (0 if from_bottom else 1) + (1 if self.bias_term else 0)
        if len(self.blobs) != expected:
            raise self.error(f"has {len(self.blobs)} param blob(s) but expects {expected} "
                             f"({'bottom[1] as scale' if from_bottom else 'a learned scale'}"
                             f"{', plus a bias' if self.bias_term else ''}).")

    def _scale(self, bottom) -> Blob:
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        axis = self.layer_param.scale_param.axis
        self.dims = _broadcast_dims(self, bottom[0], self._scale(bottom), axis, "the scale")
        if self.bias_term:
            self.bias_dims = _broadcast_dims(self, bottom[0], self.blobs[-1], axis, "the bias")
        if top[0] is not bottom[0]:
            top[0].reshape_like(bottom[0])

    def forward(self, bottom, top):
        x = bottom[0].data
        if top[0] is bottom[0]:
            # Backward needs the bottom, which the in-place top overwrites.
            self.saved_bottom = x.copy()
        out = x.reshape(self.dims) * _operand(self._scale(bottom).data, self.dims)
        if self.bias_term:
            out = out.reshape(self.bias_dims)
            out += _operand(self.blobs[-1].data, self.bias_dims)
        top[0].data[...] = out.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        from_bottom = len(bottom) > 1
        top_diff = top[0].diff
        if self.bias_term and self.param_propagate_down[-1]:
            bias = self.blobs[-1]
            bias.diff[...] += _sum_outer_inner(top_diff.reshape(self.bias_dims)).reshape(
                bias.shape)
        scale = self._scale(bottom)
        if (from_bottom and propagate_down[1]) or (not from_bottom
                                                   and self.param_propagate_down[0]):
            x = self.saved_bottom if top[0] is bottom[0] else bottom[0].data
            grad = _sum_outer_inner((top_diff * x).reshape(self.dims)).reshape(scale.shape)
            if from_bottom:
                scale.diff[...] = grad
            else:
                scale.diff[...] += grad
        if propagate_down[0]:
            bottom[0].diff[...] = (top_diff.reshape(self.dims) * _operand(scale.data, self.dims)
                                   ).reshape(bottom[0].shape)


@register("Bias")
class BiasLayer(Layer):
    """top = bottom[0] + b, b broadcast as described in the module docstring.

    b is bottom[1] if given, else a learned param of shape bottom[0].shape[axis:axis + num_axes]
    (``axis`` default 1, ``num_axes`` default 1, -1: all remaining axes, 0: a scalar) filled by
    ``filler`` (default constant 0).

    Gradients: d bottom[0] = d top; d b = sum over outer and inner of d top (accumulated into a
    learned param's diff, overwriting bottom[1]'s).
    """

    min_bottom_blobs = 1
    max_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.bias_param
        if len(bottom) == 1 and not self.blobs:
            shape = _param_shape(self, bottom[0], p.axis, p.num_axes, "bias")
            self.blobs.append(self.new_blob(shape))
            fill(self.blobs[0].data, p.filler, f"{self.type} layer '{self.name}': ")

    def _bias(self, bottom) -> Blob:
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        self.dims = _broadcast_dims(self, bottom[0], self._bias(bottom),
                                    self.layer_param.bias_param.axis, "the bias")
        if top[0] is not bottom[0]:
            top[0].reshape_like(bottom[0])

    def forward(self, bottom, top):
        b = _operand(self._bias(bottom).data, self.dims)
        if top[0] is bottom[0]:
            top[0].data.reshape(self.dims)[...] += b
        else:
            top[0].data[...] = (bottom[0].data.reshape(self.dims) + b).reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0] and top[0] is not bottom[0]:
            bottom[0].diff[...] = top[0].diff
        from_bottom = len(bottom) > 1
        if (from_bottom and propagate_down[1]) or (not from_bottom
                                                   and self.param_propagate_down[0]):
            bias = self._bias(bottom)
            grad = _sum_outer_inner(top[0].diff.reshape(self.dims)).reshape(bias.shape)
            if from_bottom:
                bias.diff[...] = grad
            else:
                bias.diff[...] += grad
