"""Im2col (Caffe's im2col_layer.cpp): the convolution's lowering as a layer of its own, with
``convolution_param``'s geometry, for bottoms with two spatial axes after the channel axis."""
from __future__ import annotations

from typing import List

from ..blob import Blob
from .base import Layer, register
from .conv import ConvolutionGeometry


def _taps(kernel, stride, pad, dilation, in_hw, out_hw):
    """Per kernel tap (i, j): the output rows and columns that read inside the bottom, and the
    bottom slices they read (padding is never materialised: a huge pad costs nothing)."""
    def span(k, s, p, d, size, out):
        offset = k * d - p
        lo = max(0, -(offset // s))
        hi = min(out, (size - 1 - offset) // s + 1)
        start = lo * s + offset
        return slice(lo, hi), slice(start, start + s * (hi - lo - 1) + 1, s), hi > lo

    for i in range(kernel[0]):
        ys, hs, ok_h = span(i, stride[0], pad[0], dilation[0], in_hw[0], out_hw[0])
        for j in range(kernel[1]):
            zs, ws, ok_w = span(j, stride[1], pad[1], dilation[1], in_hw[1], out_hw[1])
            if ok_h and ok_w:
                yield i, j, (ys, zs), (hs, ws)


def im2col(x, kernel, stride, pad, dilation, out_hw, out):
    """Caffe's im2col for a batch: x (N, C, H, W) -> out (N, C kh kw, Ho, Wo) with
    out[n, (c kh + i) kw + j, y, z] = x[n, c, y sh - ph + i dh, z sw - pw + j dw] (zero
    outside x)."""
    n, c = x.shape[:2]
    cols = out.reshape((n, c) + tuple(kernel) + tuple(out_hw))
    if any(pad):
        cols[...] = 0
    for i, j, (ys, zs), (hs, ws) in _taps(kernel, stride, pad, dilation, x.shape[2:], out_hw):
        cols[:, :, i, j, ys, zs] = x[:, :, hs, ws]
    return out


def col2im(cols, kernel, stride, pad, dilation, out_hw, out):
    """The transpose of :func:`im2col` (Caffe's col2im): every column value is added back
    into the bottom element it was copied from, in Caffe's order (kernel row, kernel column,
    then output position), into ``out`` (N, C, H, W; overwritten)."""
    n, c = out.shape[:2]
    cols = cols.reshape((n, c) + tuple(kernel) + tuple(out_hw))
    out[...] = 0
    for i, j, (ys, zs), (hs, ws) in _taps(kernel, stride, pad, dilation, out.shape[2:],
                                          out_hw):
        out[:, :, hs, ws] += cols[:, :, i, j, ys, zs]
    return out


@register("Im2col")
class Im2colLayer(ConvolutionGeometry, Layer):
    """top = the columns Convolution multiplies its weights with: for a bottom
    (N, C, H, W), top (N, C kh kw, Ho, Wo) with
    top[n, (c kh + i) kw + j, y, z] = bottom[n, c, y sh - ph + i dh, z sw - pw + j dw]
    (zero where that falls in the padding), Caffe's im2col layout. Backward is col2im: each
    bottom element's diff is the sum of the top diffs of its copies.

    Parameters from convolution_param: kernel_size (or kernel_h/kernel_w; required), stride
    (default 1), pad (default 0), dilation (default 1), axis (default 1: the channel axis; axes
    before it are batch axes). Ho = (H + 2 ph - (dh (kh - 1) + 1)) / sh + 1 (floor), Wo alike.
    force_nd_im2col gives the same result for two spatial axes; other numbers of spatial axes
    are not supported."""

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        cp = self.layer_param.convolution_param
        b0 = bottom[0]
        if top[0] is b0:
            raise self.error("cannot run in place (top and bottom are one blob): the top has "
                             "another shape; give the top its own name.")
        self.parse_geometry(cp, b0, "im2col")

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        b0 = bottom[0]
        ca = self.channel_axis
        if b0.num_axes != ca + 3:
            raise self.error(f"bottom num_axes may not change: the layer was set up for "
                             f"{ca + 3} axes, the bottom now has shape {b0.shape}.")
        in_hw = b0.shape[ca + 1:]
        out_hw = self.output_size(b0)
        self.out_hw = tuple(out_hw)
        channels = b0.shape[ca]
        self.in_shape4 = (b0.count_range(0, ca), channels) + tuple(in_hw)
        self.out_shape4 = self.in_shape4[:1] + (channels * self.kernel[0] * self.kernel[1],) \
            + self.out_hw
        top[0].reshape(b0.shape[:ca] + self.out_shape4[1:])

    def _geom(self):
        return self.kernel, self.stride, self.pad, self.dilation, self.out_hw

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        im2col(bottom[0].data.reshape(self.in_shape4), *self._geom(),
               out=top[0].data.reshape(self.out_shape4))

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        if not propagate_down[0]:
            return
        col2im(top[0].diff.reshape(self.out_shape4), *self._geom(),
               out=bottom[0].diff.reshape(self.in_shape4))
