"""BatchNorm and MVN (Caffe's batch_norm_layer.cpp and mvn_layer.cpp)."""
from __future__ import annotations

from typing import List

from ..blob import Blob
from ..proto import caffe_pb2
from .base import Layer, register

@register("BatchNorm")
class BatchNormLayer(Layer):
    """Normalise each channel c of an N x C x ... bottom to zero mean and unit variance:
    top = (bottom - mean_c) / sqrt(var_c + eps).

    Batch statistics (use_global_stats false; the default in TRAIN): mean_c and the biased
    var_c over the N x spatial values of channel c; the forward pass also updates the stored
    statistics, with m = N x spatial:
    factor = factor * maf + 1, mean = mean * maf + mean_c,
    variance = variance * maf + var_c * m / (m - 1) (1 when m = 1).
    Stored statistics (use_global_stats true; the default in TEST): mean_c = mean / factor,
    var_c = variance / factor (both 0 when factor is 0).
    Param blobs: mean (C), variance (C), factor (1), zero at first; they are never learned:
    missing param specs are added with lr_mult 0, as Caffe does, and backward leaves their
    diffs alone. Backward, y = top, dy = top diff, means over the N x spatial values:
    batch: dx = (dy - mean(dy) - mean(dy * y) * y) / sqrt(var_c + eps);
    global: dx = dy / sqrt(var_c + eps).
    Defaults: moving_average_fraction (maf) 0.999, eps 1e-5."""

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        bp = self.layer_param.batch_norm_param
        self.maf = bp.moving_average_fraction
        self.use_global_stats = (bp.use_global_stats if bp.HasField("use_global_stats")
                                 else self.phase == caffe_pb2.TEST)
        self.eps = bp.eps
        b = bottom[0]
        self.channels = 1 if b.num_axes == 1 else b.shape[1]
        if self.blobs:
            expected = [(self.channels,), (self.channels,), (1,)]
            got = [p.shape for p in self.blobs]
            if got != expected:
                raise self.error(f"the prototxt gives param blobs of shapes {got}, expected "
                                 f"{expected} (mean, variance, moving-average factor).")
        else:
            self.blobs = [self.new_blob(s) for s in
                          ((self.channels,), (self.channels,), (1,))]
        specs = self.layer_param.param
        for i in range(len(self.blobs)):
            if i == len(specs):
                specs.add(lr_mult=0.0)
            elif specs[i].lr_mult != 0:
                raise self.error(f"param {i} has lr_mult {specs[i].lr_mult:g}; batch "
                                 f"normalization statistics cannot be configured as layer "
                                 f"parameters (use lr_mult 0 or omit the param blocks).")

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        b = bottom[0]
        if b.num_axes > 1 and b.shape[1] != self.channels:
            raise self.error(f"the bottom of shape {b.shape} has {b.shape[1]} channels, the "
                             f"layer was set up for {self.channels}.")
        top[0].reshape(b.shape)

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        x = bottom[0].data.reshape(bottom[0].shape[0], self.channels, -1)
        if self.use_global_stats:
            factor = self.blobs[2].data[0]
            scale = 0 if factor == 0 else 1 / factor
            mean = self.blobs[0].data * scale
            var = self.blobs[1].data * scale
        else:
            mean, var = self.backend.batch_norm_statistics(x)
            self.blobs[2].data[...] = self.blobs[2].data * self.maf + 1
            self.blobs[0].data[...] = self.blobs[0].data * self.maf + mean
            m = x.size // self.channels
            correction = m / (m - 1) if m > 1 else 1
            self.blobs[1].data[...] = self.blobs[1].data * self.maf + var * correction
        self.std = self.xp.sqrt(var + self.eps)
        # Kept because a later in-place layer may overwrite the top; reused across passes.
        if getattr(self, "x_norm", None) is None or self.x_norm.shape != x.shape:
            self.x_norm = self.xp.empty_like(x)
        self.backend.batch_norm_normalize(x, mean, self.std, out=self.x_norm)
        top[0].data[...] = self.x_norm.reshape(top[0].shape)

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        if not propagate_down[0]:
            return
        dy = top[0].diff.reshape(self.x_norm.shape)
        self.backend.batch_norm_backward(dy, self.x_norm, self.std, self.use_global_stats,
                                         out=bottom[0].diff.reshape(self.x_norm.shape))


@register("MVN")
class MVNLayer(Layer):
    """Mean-variance normalisation of each N x C x H x W bottom item (across_channels: over
    C x H x W) or of each channel of each item (default: over H x W):
    top = (bottom - mean) / (std + eps), std the biased standard deviation; without
    normalize_variance top = bottom - mean. eps is added to the std, not the variance.
    Backward, y = top, dy = top diff, means over the same values:
    dx = (dy - mean(dy) - mean(dy * y) * y) / (std + eps), or dx = dy - mean(dy).
    Defaults: normalize_variance true, across_channels false, eps 1e-9."""

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        mp = self.layer_param.mvn_param
        self.normalize_variance = mp.normalize_variance
        self.across_channels = mp.across_channels
        self.eps = mp.eps

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        b = bottom[0]
        if b.num_axes > 4:
            raise self.error(f"the bottom must have at most 4 axes (num, channels, height, "
                             f"width), got shape {b.shape}.")
        top[0].reshape(b.shape)
        rows = b.num if self.across_channels else b.num * b.channels
        self.rows_shape = (rows, b.count // rows if rows else 0)

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        x = bottom[0].data.reshape(self.rows_shape)
        y = x - x.mean(axis=1, keepdims=True)
        if self.normalize_variance:
            self.std_eps = self.xp.sqrt((y * y).mean(axis=1, keepdims=True)) + self.eps
            y = y / self.std_eps
        top[0].data[...] = y.reshape(top[0].shape)

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        if not propagate_down[0]:
            return
        dy = top[0].diff.reshape(self.rows_shape)
        dx = dy - dy.mean(axis=1, keepdims=True)
        if self.normalize_variance:
            y = top[0].data.reshape(self.rows_shape)
            dx = (dx - (dy * y).mean(axis=1, keepdims=True) * y) / self.std_eps
        bottom[0].diff[...] = dx.reshape(bottom[0].shape)
