"""SPP, spatial pyramid pooling (Caffe's spp_layer.cpp): Pooling layers at several scales whose
tops are flattened and joined."""
from __future__ import annotations

from typing import List, Tuple

from ..blob import Blob
from ..proto import caffe_pb2
from .base import Layer, register
from .pooling import PoolingLayer

_SPP = caffe_pb2.SPPParameter
_PP = caffe_pb2.PoolingParameter


def level_geometry(level: int, size: int) -> Tuple[int, int]:
    """(kernel, pad) of pyramid level ``level`` along an axis of ``size``, Caffe's
    GetPoolingParam: 2^level bins of kernel = ceil(size / bins), the shortfall
    kernel bins - size split as pad = (shortfall + 1) / 2 on each side; stride = kernel."""
    bins = 2 ** level
    kernel = -(-size // bins)
    return kernel, (kernel * bins - size + 1) // 2


@register("SPP")
class SPPLayer(Layer):
    """Spatial pyramid pooling of an N x C x H x W bottom: level l = 0 ... pyramid_height - 1
    pools with Pooling (method ``pool``, MAX or AVE; rounding CEIL) over windows of
    kernel = ceil(H / 2^l) x ceil(W / 2^l), stride = kernel and pad = (kernel 2^l - size + 1) / 2
    per axis (see :func:`level_geometry`), which gives about 2^l x 2^l bins.

    pyramid_height 1: the top is that single level's pooling top, N x C x 1 x 1. Otherwise every
    level's top is flattened to N x (C bins_h bins_w) and the top is their concatenation along
    axis 1, level 0 first. Backward sums the levels' pooling gradients.

    pyramid_height has no usable default (Caffe's 0 builds no level) and must be given; a level
    whose pad would reach the kernel size (more bins than the bottom can fill) is refused, as
    Caffe's Pooling refuses it. STOCHASTIC pooling is not supported, as in Pooling."""

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        sp = self.layer_param.spp_param
        if top[0] is bottom[0]:
            raise self.error("cannot run in place (top and bottom are one blob): pooling "
                             "changes the shape; give the top its own name.")
        if sp.pyramid_height < 1:
            raise self.error(f"spp_param.pyramid_height must be given and at least 1 (the "
                             f"number of pyramid levels), got {sp.pyramid_height}.")
        if sp.pool not in (_SPP.MAX, _SPP.AVE):
            raise self.error(f"{_SPP.PoolMethod.Name(sp.pool)} pooling is not supported (Caffe "
                             f"has no CPU implementation of it); use pool: MAX or AVE.")
        self.pyramid_height = int(sp.pyramid_height)
        self.pool = _PP.MAX if sp.pool == _SPP.MAX else _PP.AVE
        self.bottom_shape = None
        self.levels: List[PoolingLayer] = []
        self.level_tops: List[Blob] = []
        # Each level's backward overwrites a bottom diff; levels after the first write here
        # and are summed into the bottom's (Caffe's Split layer in front of the levels).
        self.scratch = self.new_blob(())

    def _pooling_param(self, level: int, h: int, w: int) -> caffe_pb2.LayerParameter:
        (kh, ph), (kw, pw) = level_geometry(level, h), level_geometry(level, w)
        if ph >= kh or pw >= kw:
            raise self.error(
                f"pyramid level {level} ({2 ** level} bins per axis) on a {h} x {w} bottom "
                f"needs kernel {kh} x {kw} with pad {ph} x {pw}, and Pooling needs the pad "
                f"smaller than the kernel; lower pyramid_height (to {level} or less) or "
                f"enlarge the bottom.")
        lp = caffe_pb2.LayerParameter(name=f"{self.name}/level{level}", type="Pooling",
                                      phase=self.phase)
        pp = lp.pooling_param
        pp.pool = self.pool
        pp.kernel_h, pp.kernel_w = kh, kw
        pp.stride_h, pp.stride_w = kh, kw
        pp.pad_h, pp.pad_w = ph, pw
        return lp

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        b = bottom[0]
        if b.num_axes != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width), got a "
                             f"bottom of shape {b.shape}.")
        n, c, h, w = b.shape
        if h <= 0 or w <= 0:
            raise self.error(f"input dimensions cannot be zero: the bottom has shape "
                             f"{b.shape}.")
        if b.shape != self.bottom_shape:
            # Caffe rebuilds the levels whenever the bottom shape changes.
            params = [self._pooling_param(i, h, w) for i in range(self.pyramid_height)]
            self.levels = [PoolingLayer(lp, self.backend, self.dtype) for lp in params]
            self.level_tops = [self.new_blob(()) for _ in params]
            for layer, t in zip(self.levels, self.level_tops):
                layer.setup([b], [t])
            self.bottom_shape = b.shape
        else:
            for layer, t in zip(self.levels, self.level_tops):
                layer.reshape([b], [t])
        self.widths = [t.count_range(1) for t in self.level_tops]
        if self.pyramid_height == 1:
            top[0].reshape(self.level_tops[0].shape)
        else:
            top[0].reshape(n, sum(self.widths))

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        if self.pyramid_height == 1:
            self.levels[0].forward(bottom, top)
            return
        y = top[0].data
        start = 0
        for layer, t, width in zip(self.levels, self.level_tops, self.widths):
            layer.forward(bottom, [t])
            y[:, start:start + width] = t.data.reshape(t.shape[0], width)
            start += width

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        if not propagate_down[0]:
            return
        if self.pyramid_height == 1:
            self.levels[0].backward(top, propagate_down, bottom)
            return
        dy = top[0].diff
        scratch = self.scratch
        scratch.reshape(bottom[0].shape)
        start = 0
        for i, (layer, t, width) in enumerate(zip(self.levels, self.level_tops, self.widths)):
            t.diff[...] = dy[:, start:start + width].reshape(t.shape)
            start += width
            if i == 0:
                layer.backward([t], [True], bottom)
            else:
                scratch.share_data(bottom[0])
                layer.backward([t], [True], [scratch])
                bottom[0].diff[...] += scratch.diff
