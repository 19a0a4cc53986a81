"""Local response normalisation (Caffe's lrn_layer.cpp)."""
from __future__ import annotations

from typing import List

from ..blob import Blob
from ..proto import caffe_pb2
from .base import Layer, register

_LRN = caffe_pb2.LRNParameter


@register("LRN")
class LRNLayer(Layer):
    """Local response normalisation of an N x C x H x W bottom; n = local_size (odd).

    ACROSS_CHANNELS (default): top = bottom * scale^-beta with
    scale = k + alpha/n * sum of bottom^2 over the n channels centred on each channel (zero
    beyond the first and last channel).
    WITHIN_CHANNEL: top = bottom * (1 + alpha * avg)^-beta, avg = AVE pooling of bottom^2 over
    an n x n window with pad (n-1)/2 and stride 1, which always divides by n^2 (Caffe builds it
    from Power, Pooling, Power and Eltwise layers); k is not used.
    Defaults: local_size 5, alpha 1, beta 0.75, k 1."""

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        lp = self.layer_param.lrn_param
        (self.size,) = self.int_params("local_size", lp.local_size)
        if self.size % 2 != 1:
            raise self.error(f"LRN only supports odd values for local_size, got "
                             f"{self.size}.")
        self.alpha, self.beta, self.k = lp.alpha, lp.beta, lp.k
        self.region = lp.norm_region
        pre_pad = (self.size - 1) // 2
        self.pool_geom = ((self.size, self.size), (1, 1), (pre_pad, pre_pad))
        self.scale = None

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        b = bottom[0]
        if b.num_axes != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width), got a "
                             f"bottom of shape {b.shape}.")
        top[0].reshape(b.shape)

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        x = bottom[0].data
        # Backward needs the bottom data, which an in-place top overwrites.
        self.x = x.copy() if top[0] is bottom[0] else x
        if self.region == _LRN.ACROSS_CHANNELS:
            if self.scale is None or self.scale.shape != x.shape:
                self.scale = self.xp.empty_like(x)
            self.backend.lrn_across_forward(self.x, self.size, self.alpha, self.beta, self.k,
                                            out=top[0].data, scale=self.scale)
        else:
            avg = self.backend.ave_pool_forward(x * x, *self.pool_geom, x.shape[2:])
            self.scale = 1 + self.alpha * avg
            self.power = self.scale ** -self.beta
            top[0].data[...] = x * self.power

    def takes_relu_backward(self) -> bool:
        # ACROSS_CHANNELS: the backend's lrn_across_backward, on each dx as it is stored
        return self.region == _LRN.ACROSS_CHANNELS

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob],
                 relu=None) -> None:
        """``relu``: Layer.takes_relu_backward's."""
        if not propagate_down[0]:
            return
        x, y, dy = self.x, top[0].data, top[0].diff
        if self.region == _LRN.ACROSS_CHANNELS:
            self.backend.lrn_across_backward(x, y, self.scale, dy, self.size, self.alpha,
                                             self.beta, out=bottom[0].diff,
                                             relu=None if relu is None else relu[0])
        else:
            # d/d(avg) of (1 + alpha avg)^-beta is -beta alpha power / scale.
            d_avg = (dy * x) * (-self.beta * self.alpha) * self.power / self.scale
            d_sq = self.backend.ave_pool_backward(d_avg, x.shape, *self.pool_geom, x.shape[2:])
            bottom[0].diff[...] = dy * self.power + 2 * x * d_sq
