"""Neuron layers: one bottom, one top of the same shape, computed element by element (Caffe's
``NeuronLayer`` family: ReLU, PReLU, ELU, Sigmoid, TanH, AbsVal, BNLL, Power, Exp, Log,
Threshold, Clip, Swish, Dropout).

Every neuron layer except AbsVal may run in place (top named as its bottom). Where the backward
pass reads the bottom data, an in-place forward first keeps a copy of it, as Caffe's PReLU does.
Caffe itself keeps no copy for BNLL, Power, Log, Clip (and ReLU/ELU with a negative slope or
alpha), so in place it differentiates at the top value instead; cct computes the true gradient.
Scalar parameters are rounded to the blob dtype first, as Caffe's ``Dtype`` members are.
"""
from __future__ import annotations

from typing import List

import numpy as np

from ..blob import Blob
from ..filler import fill
from ..proto import caffe_pb2
from ..rng import get_rng
from .base import Layer, register


class NeuronLayer(Layer):
    """Shared shape rule and in-place handling. A subclass computes ``neuron_forward(x)`` and
    ``neuron_backward(x, y, dy)``; ``x`` in backward is the bottom data before the forward pass
    only when ``backward_needs_bottom`` is true (otherwise, in place, it is already the top)."""

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1
    backward_needs_bottom = False
    _bottom_copy = None

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        top[0].reshape(bottom[0].shape)

    def scalar(self, value: float):
        """A parameter as a scalar of the blob dtype (Caffe's ``Dtype`` member)."""
        return self.dtype.type(value)

    def forward(self, bottom, top):
        x = bottom[0].data
        in_place = top[0] is bottom[0]
        self._bottom_copy = x.copy() if in_place and self.backward_needs_bottom else None
        top[0].data[...] = self.neuron_forward(x)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = self._bottom_copy if self._bottom_copy is not None else bottom[0].data
        bottom[0].diff[...] = self.neuron_backward(x, top[0].data, top[0].diff)

    def neuron_forward(self, x):
        raise NotImplementedError

    def neuron_backward(self, x, y, dy):
        raise NotImplementedError


def _sigmoid(xp, x):
    """Caffe's overflow-free ``0.5 * tanh(0.5 x) + 0.5``."""
    return 0.5 * xp.tanh(0.5 * x) + 0.5


@register("ReLU")
class ReLULayer(NeuronLayer):
    """y = max(x, 0) + negative_slope * min(x, 0)  (``relu_param.negative_slope``, default 0);
    dy/dx = 1 where x > 0, negative_slope where x <= 0. Both passes are the backend's
    ``relu_forward``/``relu_backward``, written straight into the top data / bottom diff."""

    def layer_setup(self, bottom, top):
        self.negative_slope = self.scalar(self.layer_param.relu_param.negative_slope)
        # With a slope >= 0 the top has the sign of the bottom, so the top serves in place.
        self.backward_needs_bottom = bool(self.negative_slope < 0)

    def forward(self, bottom, top):
        x = bottom[0].data
        in_place = top[0] is bottom[0]
        self._bottom_copy = x.copy() if in_place and self.backward_needs_bottom else None
        self.backend.relu_forward(x, self.negative_slope, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if not self.backward_needs_bottom:
            src = top[0].data
        else:
            src = self._bottom_copy if self._bottom_copy is not None else bottom[0].data
        self.backend.relu_backward(src, top[0].diff, self.negative_slope, out=bottom[0].diff)


@register("PReLU")
class PReLULayer(NeuronLayer):
    """y = max(x, 0) + a_c * min(x, 0), one learned slope a_c per channel (axis 1), or a single
    slope when ``prelu_param.channel_shared`` (default false). The slopes are filled by
    ``prelu_param.filler`` (default constant 0.25). The bottom needs at least 2 axes.

    dL/da_c = sum over the items of channel c of dL/dy * x * [x <= 0];
    dL/dx = dL/dy * ([x > 0] + a_c [x <= 0])."""

    backward_needs_bottom = True

    def layer_setup(self, bottom, top):
        self._check_axes(bottom[0])
        p = self.layer_param.prelu_param
        self.channel_shared = p.channel_shared
        channels = bottom[0].shape[1]
        if not self.blobs:
            slope = self.new_blob(() if self.channel_shared else (channels,))
            filler = p.filler if p.HasField("filler") else caffe_pb2.FillerParameter(
                type="constant", value=0.25)
            fill(slope.data, filler, f"{self.type} layer '{self.name}': ")
            self.blobs.append(slope)
        want = 1 if self.channel_shared else channels
        if self.blobs[0].count != want:
            what = "channel_shared: one slope" if self.channel_shared else \
                f"one slope per channel ({channels})"
            raise self.error(f"the slope blob holds {self.blobs[0].count} value(s) but the "
                             f"prototxt asks for {what}.")

    def _check_axes(self, b: Blob) -> None:
        if b.num_axes < 2:
            raise self.error(f"the bottom needs at least 2 axes (num, channels, ...), got "
                             f"shape {b.shape}.")

    def reshape(self, bottom, top):
        self._check_axes(bottom[0])
        if not self.channel_shared and bottom[0].shape[1] != self.blobs[0].count:
            raise self.error(f"bottom shape {bottom[0].shape} has {bottom[0].shape[1]} "
                             f"channels but the layer has {self.blobs[0].count} slopes.")
        top[0].reshape(bottom[0].shape)

    def _slope(self, ndim: int):
        a = self.blobs[0].data
        return a if self.channel_shared else a.reshape((1, -1) + (1,) * (ndim - 2))

    def neuron_forward(self, x):
        xp = self.xp
        return xp.maximum(x, 0) + self._slope(x.ndim) * xp.minimum(x, 0)

    def backward(self, top, propagate_down, bottom):
        x = self._bottom_copy if self._bottom_copy is not None else bottom[0].data
        dy = top[0].diff
        nonpositive = x <= 0
        # The slope diff first: in place, writing the bottom diff overwrites the top diff.
        if self.param_propagate_down[0]:
            g = dy * x * nonpositive
            if self.channel_shared:
                self.blobs[0].diff[...] += g.sum()
            else:
                n, c = x.shape[:2]
                self.blobs[0].diff[...] += g.reshape(n, c, -1).sum(axis=(0, 2))
        if propagate_down[0]:
            bottom[0].diff[...] = dy * ((x > 0) + self._slope(x.ndim) * nonpositive)


@register("ELU")
class ELULayer(NeuronLayer):
    """y = max(x, 0) + alpha * (exp(min(x, 0)) - 1)  (``elu_param.alpha``, default 1);
    dy/dx = 1 where x > 0, alpha + y where x <= 0."""

    def layer_setup(self, bottom, top):
        self.alpha = self.scalar(self.layer_param.elu_param.alpha)
        # With alpha >= 0 the top is positive exactly where the bottom is.
        self.backward_needs_bottom = bool(self.alpha < 0)

    def neuron_forward(self, x):
        xp = self.xp
        return xp.maximum(x, 0) + self.alpha * (xp.exp(xp.minimum(x, 0)) - 1)

    def neuron_backward(self, x, y, dy):
        src = x if self.backward_needs_bottom else y
        return dy * ((src > 0) + (self.alpha + y) * (src <= 0))


@register("Sigmoid")
class SigmoidLayer(NeuronLayer):
    """y = 1 / (1 + exp(-x)), computed as 0.5 tanh(0.5 x) + 0.5 like Caffe;
    dy/dx = y (1 - y)."""

    def neuron_forward(self, x):
        return _sigmoid(self.xp, x)

    def neuron_backward(self, x, y, dy):
        return dy * y * (1 - y)


@register("TanH")
class TanHLayer(NeuronLayer):
    """y = tanh(x); dy/dx = 1 - y^2."""

    def neuron_forward(self, x):
        return self.xp.tanh(x)

    def neuron_backward(self, x, y, dy):
        return dy * (1 - y * y)


@register("AbsVal")
class AbsValLayer(NeuronLayer):
    """y = |x|; dy/dx = sign(x) (0 at 0). Not in place, as in Caffe."""

    backward_needs_bottom = True

    def layer_setup(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("does not allow in-place computation; give the top its own name.")

    def neuron_forward(self, x):
        return self.xp.abs(x)

    def neuron_backward(self, x, y, dy):
        return ((x > 0).astype(self.dtype) - (x < 0)) * dy


@register("BNLL")
class BNLLLayer(NeuronLayer):
    """Binomial normal log likelihood, y = log(1 + exp(x)), evaluated as
    max(x, 0) + log(1 + exp(-|x|)) (Caffe's two branches, x > 0 and x <= 0, in one);
    dy/dx = e / (1 + e) with e = exp(min(x, 50)) (Caffe's BNLL_THRESHOLD)."""

    backward_needs_bottom = True
    threshold = 50.0

    def neuron_forward(self, x):
        xp = self.xp
        return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))

    def neuron_backward(self, x, y, dy):
        e = self.xp.exp(self.xp.minimum(x, self.threshold))
        return dy * e / (e + 1)


@register("Power")
class PowerLayer(NeuronLayer):
    """y = (shift + scale * x) ^ power  (``power_param``: power 1, scale 1, shift 0);
    dy/dx = scale * power * (shift + scale * x) ^ (power - 1).

    Caffe's special cases are kept, since they decide the result at singular points: with
    power * scale == 0 the top is the constant 1 (power 0) or shift^power and the gradient
    is 0; with power 1 the gradient is the constant scale; with power 2 it is
    2 scale (shift + scale x); with shift 0 it is power * y / x; otherwise
    power * scale * y / (shift + scale * x)."""

    def layer_setup(self, bottom, top):
        p = self.layer_param.power_param
        self.power = self.scalar(p.power)
        self.scale = self.scalar(p.scale)
        self.shift = self.scalar(p.shift)
        self.diff_scale = self.power * self.scale
        self.backward_needs_bottom = not (self.diff_scale == 0 or self.power == 1)

    def neuron_forward(self, x):
        xp = self.xp
        if self.diff_scale == 0:
            value = 1 if self.power == 0 else self.shift ** self.power
            return xp.full(x.shape, value, self.dtype)
        y = x
        if self.scale != 1:
            y = y * self.scale
        if self.shift != 0:
            y = y + self.shift
        if self.power != 1:
            y = y ** self.power
        return y

    def neuron_backward(self, x, y, dy):
        if self.diff_scale == 0:
            return self.xp.zeros_like(dy)
        if self.power == 1:
            return dy * self.diff_scale
        if self.power == 2:
            d = (self.diff_scale * self.scale) * x
            if self.shift != 0:
                d = d + self.diff_scale * self.shift
        elif self.shift == 0:
            d = y / x * self.power
        else:
            base = x * self.scale if self.scale != 1 else x
            d = y / (base + self.shift)
            if self.diff_scale != 1:
                d = d * self.diff_scale
        return dy * d


def _log_of_base(layer: Layer, base: float, scalar):
    """ln(base) as a host scalar of the blob dtype, with base -1 meaning e (exactly 1), as
    Caffe's Exp and Log layers do."""
    if base == -1:
        return scalar(1)
    if not base > 0:
        raise layer.error(f"base {base:g} must be strictly positive (or -1 for e).")
    log_base = np.log(scalar(base))
    if not np.isfinite(log_base):
        raise layer.error(f"log(base) = log({base:g}) is not finite.")
    return log_base


@register("Exp")
class ExpLayer(NeuronLayer):
    """y = base ^ (shift + scale * x)  (``exp_param``: base -1 meaning e, scale 1, shift 0),
    computed as base^shift * exp(ln(base) * scale * x); dy/dx = ln(base) * scale * y."""

    def layer_setup(self, bottom, top):
        p = self.layer_param.exp_param
        s = self.scalar
        log_base = _log_of_base(self, p.base, s)
        self.inner_scale = log_base * s(p.scale)
        if p.shift == 0:
            self.outer_scale = s(1)
        elif p.base == -1:
            self.outer_scale = np.exp(s(p.shift))
        else:
            self.outer_scale = s(p.base) ** s(p.shift)

    def neuron_forward(self, x):
        xp = self.xp
        y = xp.exp(x) if self.inner_scale == 1 else xp.exp(x * self.inner_scale)
        return y * self.outer_scale if self.outer_scale != 1 else y

    def neuron_backward(self, x, y, dy):
        d = y * dy
        return d * self.inner_scale if self.inner_scale != 1 else d


@register("Log")
class LogLayer(NeuronLayer):
    """y = log_base(shift + scale * x)  (``log_param``: base -1 meaning e, scale 1, shift 0);
    dy/dx = scale / (ln(base) * (shift + scale * x))."""

    backward_needs_bottom = True

    def layer_setup(self, bottom, top):
        p = self.layer_param.log_param
        s = self.scalar
        log_base = _log_of_base(self, p.base, s)
        if log_base == 0:
            raise self.error(f"base {p.base:g} has logarithm 0; use a base other than 1.")
        self.base_scale = s(1) / log_base
        self.input_scale = s(p.scale)
        self.input_shift = s(p.shift)
        self.backward_num_scale = self.input_scale / log_base

    def _inner(self, x):
        if self.input_scale != 1:
            x = x * self.input_scale
        if self.input_shift != 0:
            x = x + self.input_shift
        return x

    def neuron_forward(self, x):
        y = self.xp.log(self._inner(x))
        return y * self.base_scale if self.base_scale != 1 else y

    def neuron_backward(self, x, y, dy):
        d = self._inner(x) ** -1
        if self.backward_num_scale != 1:
            d = d * self.backward_num_scale
        return dy * d


@register("Threshold")
class ThresholdLayer(NeuronLayer):
    """y = 1 where x > threshold, else 0  (``threshold_param.threshold``, default 0). No
    backward pass (Caffe: NOT_IMPLEMENTED)."""

    def layer_setup(self, bottom, top):
        self.threshold = self.scalar(self.layer_param.threshold_param.threshold)

    def neuron_forward(self, x):
        return (x > self.threshold).astype(self.dtype)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("has no backward pass (it is a step function); the net asked for "
                             "a gradient through it, e.g. because of force_backward.")


@register("Clip")
class ClipLayer(NeuronLayer):
    """y = max(min, min(x, max))  (``clip_param.min`` and ``max``, both required);
    dy/dx = 1 where min <= x <= max, else 0."""

    backward_needs_bottom = True

    def layer_setup(self, bottom, top):
        p = self.layer_param.clip_param
        missing = [f for f in ("min", "max") if not p.HasField(f)]
        if missing:
            raise self.error(f"clip_param needs {' and '.join(missing)} (required fields).")
        self.min = self.scalar(p.min)
        self.max = self.scalar(p.max)

    def neuron_forward(self, x):
        xp = self.xp
        # std::max(min, std::min(x, max)) written with the same comparisons, so that NaN maps
        # to min as in Caffe. The array stands on the left: a NumPy scalar on the left turns
        # itself into a host array, which CuPy refuses to compare with a device array.
        t = xp.where(x > self.max, self.max, x)
        return xp.where(t > self.min, t, self.min)

    def neuron_backward(self, x, y, dy):
        return dy * ((x >= self.min) & (x <= self.max))


@register("Swish")
class SwishLayer(NeuronLayer):
    """y = x * sigmoid(beta * x)  (``swish_param.beta``, default 1);
    dy/dx = beta y + sigmoid(beta x) (1 - beta y)."""

    def layer_setup(self, bottom, top):
        self.beta = self.scalar(self.layer_param.swish_param.beta)

    def neuron_forward(self, x):
        self.sigmoid = _sigmoid(self.xp, x * self.beta)
        return x * self.sigmoid

    def neuron_backward(self, x, y, dy):
        by = self.beta * y
        return dy * (by + self.sigmoid * (1 - by))


@register("Dropout")
class DropoutLayer(NeuronLayer):
    """TRAIN: y = x * m / (1 - p) with m ~ Bernoulli(1 - p) drawn afresh every forward pass,
    p = ``dropout_param.dropout_ratio`` (default 0.5); dy/dx = m / (1 - p).
    TEST: y = x, dy/dx = 1."""

    def layer_setup(self, bottom, top):
        ratio = self.layer_param.dropout_param.dropout_ratio
        if not 0 <= ratio < 1:
            raise self.error(f"dropout_ratio {ratio:g} must lie in [0, 1).")
        self.ratio = self.scalar(ratio)
        self.scale = self.scalar(1) / (1 - self.ratio)
        self.train = self.phase == caffe_pb2.TRAIN
        self.draws = self.train
        self.mask = None
        self.drawn_outside = False     # draw() makes the masks: a CUDA graph's forward

    def _draw(self, shape, dtype):
        # The mask holds 1/(1-p) where kept: x * mask is Caffe's x * m * scale to the bit.
        # A GPU draws it on the device (Caffe's GPU path draws with cuRAND, so its masks differ
        # from the CPU's as here); the CPU and the stand-in draw from the run's generator.
        return self.backend.dropout_mask(shape, 1 - float(self.ratio), self.scale, dtype,
                                         get_rng())

    def draw(self, bottom) -> None:
        """The next forward's mask, drawn now (the same draw the forward would make, in the
        same order) into the layer's own array, which the forward then reads; from the first
        call on, the forward draws no more."""
        mask = self._draw(bottom[0].shape, bottom[0].data.dtype)
        if self.mask is None or self.mask.shape != mask.shape or not self.drawn_outside:
            self.mask = mask
        else:
            self.mask[...] = mask        # in place: a graph reads this very array
        self.drawn_outside = True

    def neuron_forward(self, x):
        if not self.train:
            return x
        if not self.drawn_outside:
            self.mask = self._draw(x.shape, x.dtype)
        return x * self.mask

    def neuron_backward(self, x, y, dy):
        if not self.train:
            return dy
        return dy * self.mask
