"""Convolution and Deconvolution (Caffe's base_conv_layer.cpp, conv_layer.cpp,
deconv_layer.cpp), for bottoms with two spatial axes after the channel axis."""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..blob import INT_MAX, Blob
from ..errors import LayerError
from ..filler import fill
from .base import Layer, register


class ConvolutionGeometry:
    """convolution_param's geometry, parsed and checked as Caffe's BaseConvolutionLayer does:
    ``channel_axis``, and (h, w) pairs ``kernel``, ``stride``, ``pad`` and ``dilation`` (for
    the layers that take convolution_param: Convolution, Deconvolution, Im2col)."""

    def parse_geometry(self, cp, b0: Blob, what: str) -> None:
        try:
            self.channel_axis = b0.canonical_axis(cp.axis)
        except LayerError:
            raise self.error(f"convolution_param.axis {cp.axis} is out of range for a bottom "
                             f"of shape {b0.shape}.") from None
        num_spatial = b0.num_axes - self.channel_axis - 1
        if num_spatial != 2:
            raise self.error(
                f"only 2-D {what} is supported: the bottom of shape {b0.shape} has "
                f"{num_spatial} spatial axes after the channel axis {self.channel_axis}; "
                f"give a bottom with exactly 2 (e.g. N x C x H x W).")
        self.kernel = self._pair(cp, "kernel_size", "kernel_h", "kernel_w")
        if min(self.kernel) <= 0:
            raise self.error(f"kernel size {self.kernel[0]} x {self.kernel[1]}: filter "
                             f"dimensions must be nonzero (set kernel_size, or both kernel_h "
                             f"and kernel_w).")
        self.stride = self._pair(cp, "stride", "stride_h", "stride_w", 1)
        if min(self.stride) <= 0:
            raise self.error(f"stride {self.stride[0]} x {self.stride[1]}: stride dimensions "
                             f"must be nonzero (set stride, or both stride_h and stride_w).")
        self.pad = self._pair(cp, "pad", "pad_h", "pad_w", 0)
        self.dilation = self._pair(cp, "dilation", default=1)
        if min(self.dilation) <= 0:
            raise self.error(f"dilation {self.dilation[0]} x {self.dilation[1]} must be "
                             f"nonzero.")

    def output_size(self, b0: Blob, reverse: bool = False) -> Tuple[int, int]:
        """(height, width) of the top for bottom ``b0`` (the deconvolution's with
        ``reverse``), refusing geometry outside int arithmetic and an empty top."""
        out_hw = []
        for axis in range(2):
            size = b0.shape[self.channel_axis + 1 + axis]
            k, s, p, d = (self.kernel[axis], self.stride[axis], self.pad[axis],
                          self.dilation[axis])
            extent = d * (k - 1) + 1
            if size + 2 * p > INT_MAX or extent > INT_MAX:
                raise self.error(
                    f"pad {p} and dilation {d} give a padded bottom of {size + 2 * p} and a "
                    f"kernel extent of {extent}; both must stay within {INT_MAX} (INT_MAX), "
                    f"the int arithmetic of Caffe's and cct's kernels.")
            if reverse:
                out = self.backend.deconv_out_size(size, k, s, p, d)
                empty = out <= 0
            else:
                out = self.backend.conv_out_size(size, k, s, p, d)
                # Also covers a kernel wider than the padded bottom.
                empty = out <= 0 or size + 2 * p < extent
            if empty:
                what = "height" if axis == 0 else "width"
                raise self.error(
                    f"kernel {k} (dilation {d}, extent {extent}) with pad {p} and stride {s} "
                    f"on a bottom of {what} {size} (shape {b0.shape}) gives an empty top; "
                    f"lower kernel_size/dilation or add pad.")
            out_hw.append(out)
        return tuple(out_hw)

    def _pair(self, cp, field: str, h_field: str = "", w_field: str = "",
              default: Optional[int] = None) -> Tuple[int, int]:
        """(h, w) of a spatial parameter: the repeated ``field`` given once (both axes) or once
        per axis, or the ``h_field``/``w_field`` pair; ``default`` when none is given."""
        values = list(getattr(cp, field))
        if h_field and (cp.HasField(h_field) or cp.HasField(w_field)):
            if values:
                raise self.error(f"either {field} or {h_field}/{w_field} should be specified; "
                                 f"not both.")
            return self.int_params(h_field + "/" + w_field, int(getattr(cp, h_field)),
                                   int(getattr(cp, w_field)))
        if not values and default is not None:
            return default, default
        if len(values) not in (1, 2):
            raise self.error(f"{field} must be specified once, or once per spatial dimension "
                             f"({field} specified {len(values)} times; 2 spatial dims).")
        return self.int_params(field, int(values[0]), int(values[-1]))


class _ConvolutionBase(ConvolutionGeometry, Layer):
    """Shared parameter parsing and geometry of Convolution and Deconvolution.

    ``reverse`` is False for Convolution (bottom -> conv -> top) and True for Deconvolution,
    whose forward pass is the convolution's backward-data pass."""

    min_bottom_blobs = 1
    min_top_blobs = 1
    equal_num_bottom_top_blobs = True
    reverse = False

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        cp = self.layer_param.convolution_param
        b0 = bottom[0]
        if any(t is b for t in top for b in bottom):
            raise self.error("cannot run in place (top and bottom are one blob): every top "
                             "value reads many bottom values; give the top its own name.")
        self.parse_geometry(cp, b0, "convolution")
        self.channels = b0.shape[self.channel_axis]
        self.num_output = cp.num_output
        self.group = cp.group
        self.bias_term = cp.bias_term
        # CAFFE holds the layer to Caffe's own arithmetic (the lowered GEMM, Caffe's numbers up
        # to the BLAS's blocking); DEFAULT and CUDNN let each kernel take its fastest plan.
        self.engine = cp.Engine.Name(cp.engine)
        if self.num_output <= 0:
            raise self.error("convolution_param.num_output must be given and positive.")
        if self.group <= 0:
            raise self.error(f"group {self.group} must be positive.")
        if self.channels % self.group:
            raise self.error(f"the bottom's {self.channels} channels (shape {b0.shape}) are "
                             f"not divisible by group {self.group}.")
        if self.num_output % self.group:
            raise self.error(f"num_output {self.num_output} is not divisible by group "
                             f"{self.group}.")
        # Weights map conv_in -> conv_out channels; Deconvolution stores them the other way
        # round (bottom channels first), as Caffe does.
        if self.reverse:
            conv_out, conv_in = self.channels, self.num_output
        else:
            conv_out, conv_in = self.num_output, self.channels
        weight_shape = (conv_out, conv_in // self.group) + tuple(self.kernel)
        bias_shape = (self.num_output,)
        if self.blobs:
            self.check_param_shapes([weight_shape] + ([bias_shape] if self.bias_term else []))
            return
        weight = self.new_blob(weight_shape)
        fill(weight.data, cp.weight_filler, f"{self.type} layer '{self.name}': ")
        self.blobs.append(weight)
        if self.bias_term:
            bias = self.new_blob(bias_shape)
            fill(bias.data, cp.bias_filler, f"{self.type} layer '{self.name}': ")
            self.blobs.append(bias)


    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        b0 = bottom[0]
        if b0.num_axes != self.channel_axis + 3:
            raise self.error(f"bottom num_axes may not change: the layer was set up for "
                             f"{self.channel_axis + 3} axes, the bottom now has shape "
                             f"{b0.shape}.")
        if b0.shape[self.channel_axis] != self.channels:
            raise self.error(f"input size incompatible with convolution kernel: the bottom "
                             f"of shape {b0.shape} has {b0.shape[self.channel_axis]} channels, "
                             f"the weights were made for {self.channels}.")
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != b0.shape:
                raise self.error(f"all bottoms must have the same shape: bottom 0 is "
                                 f"{b0.shape}, bottom {i} is {b.shape}.")
        in_hw = b0.shape[self.channel_axis + 1:]
        out_hw = self.output_size(b0, self.reverse)
        self.num = b0.count_range(0, self.channel_axis)
        self.in_shape4 = (self.num, self.channels) + tuple(in_hw)
        self.out_shape4 = (self.num, self.num_output) + tuple(out_hw)
        top_shape = b0.shape[:self.channel_axis] + (self.num_output,) + tuple(out_hw)
        for t in top:
            t.reshape(top_shape)

    # -- the convolution, as the backend sees it ------------------------------------------------
    # Kernels write straight into the blobs' arrays (out=) and add into the param diffs
    # (accumulate=True: Caffe accumulates them over iter_size and shared params); the 4-D views
    # of a blob are views, not copies.
    def _geom(self):
        return self.kernel, self.stride, self.pad, self.dilation, self.group

    def _conv(self, x, out):
        """conv_in-shaped x -> conv_out-shaped out."""
        return self.backend.conv_forward(x, self.blobs[0].data, None, *self._geom(), out=out,
                                         engine=self.engine)

    def _conv_t(self, y, x_shape, out):
        """conv_out-shaped y -> conv_in-shaped out (the transposed convolution)."""
        return self.backend.conv_backward_data(y, self.blobs[0].data, x_shape, *self._geom(),
                                               out=out, engine=self.engine)

    def _conv_dw(self, x, y):
        return self.backend.conv_backward_weight(x, y, *self._geom(), out=self.blobs[0].diff,
                                                 accumulate=True, engine=self.engine)

    def applies_relu(self) -> bool:
        # A Convolution (the backend's conv_forward_relu: on the CPU each C++ layout applies the
        # ReLU as it stores the top), with one top, which the ReLU then runs on.
        return not self.reverse and len(self.layer_param.top) == 1

    def forward(self, bottom: List[Blob], top: List[Blob], relu: bool = False) -> None:
        bias = self.blobs[1].data if self.bias_term else None
        for b, t in zip(bottom, top):
            x = b.data.reshape(self.in_shape4)
            y = t.data.reshape(self.out_shape4)
            if self.reverse:
                self._conv_t(x, self.out_shape4, y)
                if bias is not None:
                    y += bias.reshape(1, -1, 1, 1)
            elif relu:
                self.backend.conv_forward_relu(x, self.blobs[0].data, bias, *self._geom(),
                                               out=y, engine=self.engine)
            else:
                self.backend.conv_forward(x, self.blobs[0].data, bias, *self._geom(), out=y,
                                          engine=self.engine)

    def sibling_key(self):
        # A 1x1 Convolution (stride 1, no pad, no dilation, one group, channels on axis 1) of
        # one bottom and one top is a GEMM per image whose filters stack with its siblings'.
        pointwise = (tuple(self.kernel) == (1, 1) and tuple(self.stride) == (1, 1)
                     and tuple(self.pad) == (0, 0) and tuple(self.dilation) == (1, 1))
        if (not pointwise or self.reverse or self.group != 1 or self.channel_axis != 1
                or len(self.layer_param.bottom) != 1 or len(self.layer_param.top) != 1):
            return None
        return ("Convolution", self.engine, self.channels)

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        need_dw = self.param_propagate_down[0]
        need_db = self.bias_term and self.param_propagate_down[1]
        for i, (b, t) in enumerate(zip(bottom, top)):
            dy = t.diff.reshape(self.out_shape4)
            x = b.data.reshape(self.in_shape4)
            if need_db:
                self.backend.bias_backward(dy, out=self.blobs[1].diff, accumulate=True)
            if need_dw:
                if self.reverse:
                    self._conv_dw(dy, x)
                else:
                    self._conv_dw(x, dy)
            if propagate_down[i]:
                dx = b.diff.reshape(self.in_shape4)
                if self.reverse:
                    self._conv(dy, dx)
                else:
                    self._conv_t(dy, self.in_shape4, dx)


@register("Convolution")
class ConvolutionLayer(_ConvolutionBase):
    """2-D convolution: top[n, o] = bias[o] + sum over the C/group channels c of o's group of
    W[o, c] (cross-correlated with) bottom[n, c], with zero padding ``pad``, ``stride`` and
    ``dilation``.

    Weights (num_output, C/group, kh, kw), bias (num_output). Top size per spatial axis:
    (in + 2 pad - (dilation (k - 1) + 1)) / stride + 1 (floor). Defaults: bias_term true,
    stride 1, pad 0, dilation 1, group 1, axis 1 (axes before it are batch axes), fillers
    constant 0."""


@register("Deconvolution")
class DeconvolutionLayer(_ConvolutionBase):
    """The transpose of Convolution: forward is Convolution's backward-data pass, backward-data
    is Convolution's forward pass.

    Weights (C, num_output/group, kh, kw) (bottom channels first, as Caffe stores them), bias
    (num_output). Top size per spatial axis: stride (in - 1) + dilation (k - 1) + 1 - 2 pad.
    Same parameters and defaults as Convolution."""

    reverse = True


class SiblingScratch:
    """backward_siblings' arrays, kept between iterations and shared by a net's groups (which
    run one after another): the stacked filters, top diffs and weight gradient, each a view of
    one buffer per name grown to the largest group's (GoogLeNet b32: 3b's 288 stacked top
    diffs, 29 MB), so that no pass allocates."""

    def __init__(self):
        self.buffers = {}

    def get(self, xp, name: str, shape, dtype):
        count = 1
        for d in shape:
            count *= int(d)
        buf = self.buffers.get(name)
        if buf is None or buf.size < count or buf.dtype != dtype:
            buf = self.buffers[name] = xp.empty(count, dtype)
        return buf[:count].reshape(shape)


def backward_siblings(layers: List[_ConvolutionBase], tops: List[Blob], bottom: Blob,
                      propagate_down: bool, scratch: SiblingScratch) -> None:
    """The backward passes of 1x1 Convolutions that read one bottom (an inception module's
    1x1, 3x3_reduce and 5x5_reduce, through a Split; ``sibling_key``), run as one
    convolution whose filters are theirs stacked: one weight-gradient GEMM and one
    backward-data GEMM over their stacked top diffs instead of one each. Thin layers (16 to 48
    filters) are bound by reading the bottom and writing its diff, which this does once, and
    the bottom diffs the Split would add are summed inside the GEMM. Each layer's param diffs
    are added into as its own backward does (the bias's the same kernel on its own top diff);
    with ``propagate_down``, ``bottom.diff`` gets the sum of the layers' bottom diffs, which
    the net's Split then adds to its other tops' (Net._run_backward). The weight gradients are
    the same sums per image; the bottom diff differs from the Split's sum in rounding only (its
    terms added in another order), as another GEMM's blocking would."""
    first = layers[0]
    backend = first.backend
    xp = backend.xp
    x = bottom.data.reshape(first.in_shape4)
    dt = x.dtype
    n, _, h, w = first.out_shape4
    rows = [layer.num_output for layer in layers]
    dys = [t.diff.reshape(layer.out_shape4) for layer, t in zip(layers, tops)]
    dy = xp.concatenate(dys, axis=1, out=scratch.get(xp, "dy", (n, sum(rows), h, w), dt))
    for layer, d in zip(layers, dys):
        if layer.bias_term and layer.param_propagate_down[1]:
            backend.bias_backward(d, out=layer.blobs[1].diff, accumulate=True)
    stacked_shape = (sum(rows), first.channels, 1, 1)
    geom = first._geom()
    if any(layer.param_propagate_down[0] for layer in layers):
        dw = backend.conv_backward_weight(x, dy, *geom,
                                          out=scratch.get(xp, "dweight", stacked_shape, dt),
                                          accumulate=False, engine=first.engine)
        at = 0
        for layer, r in zip(layers, rows):
            if layer.param_propagate_down[0]:
                layer.blobs[0].diff += dw[at:at + r]
            at += r
    if propagate_down:
        weight = xp.concatenate([layer.blobs[0].data for layer in layers], axis=0,
                                out=scratch.get(xp, "weight", stacked_shape, dt))
        backend.conv_backward_data(dy, weight, first.in_shape4, *geom,
                                   out=bottom.diff.reshape(first.in_shape4), engine=first.engine)
