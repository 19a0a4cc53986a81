"""Pooling (Caffe's pooling_layer.cpp): MAX and AVE over 2-D windows of an N x C x H x W
bottom."""
from __future__ import annotations

from typing import List, Tuple

from ..blob import INT_MAX, Blob
from ..proto import caffe_pb2
from .base import Layer, register

_PP = caffe_pb2.PoolingParameter


@register("Pooling")
class PoolingLayer(Layer):
    """Max or average over windows of kernel_h x kernel_w, moved by stride, with pad.

    Window (ph, pw) starts at (ph stride_h - pad_h, pw stride_w - pad_w).
    MAX: the maximum over the part of the window inside the bottom (padding never wins; ties go
    to the first element in row-major order). An optional second top holds the winner's flat
    index h * W + w within its H x W plane, as a float (Caffe's top mask).
    AVE: the sum over the part inside the bottom, divided by the window's area clipped to the
    padded bottom (so padding counts as zeros, what lies beyond it does not).
    Top size per axis: ceil((in + 2 pad - kernel) / stride) + 1 (round_mode CEIL, the default;
    FLOOR floors), minus one if pad > 0 and the last window would start at or beyond in + pad.
    Defaults: pool MAX, stride 1, pad 0, round_mode CEIL. global_pooling: the kernel is the
    whole H x W plane (then pad must be 0 and stride 1). STOCHASTIC pooling has no CPU
    implementation in Caffe and is rejected here too."""

    exact_num_bottom_blobs = 1
    min_top_blobs = 1
    max_top_blobs = 2

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        pp = self.layer_param.pooling_param
        if any(t is bottom[0] for t in top):
            raise self.error("cannot run in place (top and bottom are one blob): pooling "
                             "changes the shape; give the top its own name.")
        self.method = pp.pool
        self.mask = None
        if len(top) > 1 and self.method != _PP.MAX:
            raise self.error(f"{_PP.PoolMethod.Name(self.method)} pooling produces 1 top, the "
                             f"prototxt gives {len(top)} (only MAX has the optional mask top).")
        self.global_pooling = pp.global_pooling
        has_kh, has_kw = pp.HasField("kernel_h"), pp.HasField("kernel_w")
        if self.global_pooling:
            if pp.HasField("kernel_size") or has_kh or has_kw:
                raise self.error("with global_pooling: true the kernel size cannot be "
                                 "specified (it is the bottom's height and width).")
        else:
            if pp.HasField("kernel_size") and (has_kh or has_kw):
                raise self.error("the filter size is kernel_size OR kernel_h and kernel_w; "
                                 "not both.")
            if not pp.HasField("kernel_size") and not (has_kh and has_kw):
                raise self.error("the filter size is required: give kernel_size, or both "
                                 "kernel_h and kernel_w for a non-square filter.")
        self.kernel = self._pair(pp, "kernel_size", "kernel_h", "kernel_w")
        if self.global_pooling:
            self.kernel = tuple(bottom[0].shape[2:4]) if bottom[0].num_axes == 4 else (1, 1)
        if min(self.kernel) <= 0:
            raise self.error(f"kernel {self.kernel[0]} x {self.kernel[1]}: filter dimensions "
                             f"cannot be zero.")
        self.pad = self._pair(pp, "pad", "pad_h", "pad_w")
        self.stride = self._pair(pp, "stride", "stride_h", "stride_w")
        if min(self.stride) <= 0:
            raise self.error(f"stride {self.stride[0]} x {self.stride[1]} must be positive.")
        if self.global_pooling and (self.pad != (0, 0) or self.stride != (1, 1)):
            raise self.error(f"with global_pooling: true only pad = 0 and stride = 1 are "
                             f"allowed, got pad {self.pad} and stride {self.stride}.")
        if self.pad != (0, 0):
            if self.method not in (_PP.MAX, _PP.AVE):
                raise self.error("padding is implemented only for average and max pooling.")
            if self.pad[0] >= self.kernel[0] or self.pad[1] >= self.kernel[1]:
                raise self.error(f"pad {self.pad[0]} x {self.pad[1]} must be smaller than the "
                                 f"kernel {self.kernel[0]} x {self.kernel[1]}.")
        self.ceil_mode = pp.round_mode == _PP.CEIL

    def _pair(self, pp, field: str, h_field: str, w_field: str) -> Tuple[int, int]:
        """(h, w) from ``field``, or from the ``h_field``/``w_field`` pair, which must then be
        given together (Caffe's rule for pad and stride)."""
        has_h, has_w = pp.HasField(h_field), pp.HasField(w_field)
        if has_h or has_w:
            if pp.HasField(field) or not (has_h and has_w):
                raise self.error(f"{field} is given as {field} OR as both {h_field} and "
                                 f"{w_field}.")
            return self.int_params(h_field + "/" + w_field, int(getattr(pp, h_field)),
                                   int(getattr(pp, w_field)))
        v = int(getattr(pp, field))
        return self.int_params(field, v, v)

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        b = bottom[0]
        if b.num_axes != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width), got a "
                             f"bottom of shape {b.shape}.")
        n, c, h, w = b.shape
        if self.global_pooling:
            self.kernel = (h, w)
        out = []
        for size, k, s, p, what in zip((h, w), self.kernel, self.stride, self.pad,
                                       ("height", "width")):
            if size + 2 * p > INT_MAX:
                raise self.error(f"pad {p} gives a padded bottom {what} of {size + 2 * p}, "
                                 f"beyond {INT_MAX} (INT_MAX), the int arithmetic of Caffe's "
                                 f"and cct's kernels.")
            o = self.backend.pool_out_size(size, k, s, p, self.ceil_mode)
            if o <= 0:
                raise self.error(f"kernel {k} with stride {s} and pad {p} on a bottom of "
                                 f"{what} {size} (shape {b.shape}) gives an empty top; lower "
                                 f"kernel_size or add pad.")
            out.append(o)
        self.out = tuple(out)
        for t in top:
            t.reshape(n, c, out[0], out[1])

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        x = bottom[0].data
        geom = (self.kernel, self.stride, self.pad, self.out)
        if self.method == _PP.MAX:
            # The argmax array is kept between iterations (reallocated only when the shape
            # changes) for the backward pass.
            if self.mask is None or self.mask.shape != top[0].shape:
                self.mask = self.backend.xp.empty(top[0].shape, self.backend.xp.int32)
            self.backend.max_pool_forward(x, *geom, out=top[0].data, mask=self.mask)
            if len(top) > 1:
                top[1].data[...] = self.mask
        elif self.method == _PP.AVE:
            self.backend.ave_pool_forward(x, *geom, out=top[0].data)
        else:
            raise self.error("STOCHASTIC pooling is not supported on CPU, as in Caffe (which "
                             "has only a GPU implementation); use MAX or AVE.")

    def takes_relu_backward(self) -> bool:
        # MAX: the backend's max_pool_backward, plane by plane as it routes the diffs. (AVE's
        # vectorised kernels take 8 planes at a time; the zoo's AVE layers follow small ReLUs.)
        return self.method == _PP.MAX

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob],
                 relu=None) -> None:
        """``relu``: Layer.takes_relu_backward's."""
        if not propagate_down[0]:
            return
        dy = top[0].diff
        dx = bottom[0].diff
        if self.method == _PP.MAX:
            self.backend.max_pool_backward(dy, self.mask, dx.shape, out=dx,
                                           relu=None if relu is None else relu[0])
        else:
            self.backend.ave_pool_backward(dy, dx.shape, self.kernel, self.stride, self.pad,
                                           self.out, out=dx)
