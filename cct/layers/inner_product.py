"""InnerProduct, the fully connected layer (Caffe's inner_product_layer.cpp)."""
from __future__ import annotations

from typing import List

from ..blob import Blob
from ..errors import LayerError
from ..filler import fill
from .base import Layer, register


@register("InnerProduct")
class InnerProductLayer(Layer):
    """top = bottom W^T + b, one GEMM over the whole batch.

    The bottom is viewed as M x K with M = product of the axes before ``axis`` and K = product
    of the axes from ``axis`` on; the top has shape bottom.shape[:axis] + (num_output,).
    Weights W: (num_output, K), or (K, num_output) with ``transpose: true`` (then
    top = bottom W + b); bias b: (num_output). Defaults: bias_term true, axis 1,
    transpose false, fillers constant 0."""

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def _axis(self, bottom: Blob) -> int:
        axis = self.layer_param.inner_product_param.axis
        try:
            return bottom.canonical_axis(axis)
        except LayerError:
            raise self.error(f"inner_product_param.axis {axis} is out of range for a bottom "
                             f"of shape {bottom.shape}.") from None

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        ip = self.layer_param.inner_product_param
        if top[0] is bottom[0]:
            raise self.error("cannot run in place (top and bottom are one blob): every top "
                             "value reads the whole bottom; give the top its own name.")
        self.num_output = ip.num_output
        if self.num_output <= 0:
            raise self.error("inner_product_param.num_output must be given and positive.")
        self.bias_term = ip.bias_term
        self.transpose = ip.transpose
        self.k = bottom[0].count_range(self._axis(bottom[0]))
        n, k = self.num_output, self.k
        weight_shape = (k, n) if self.transpose else (n, k)
        if self.blobs:
            self.check_param_shapes([weight_shape] + ([(n,)] if self.bias_term else []))
            return
        weight = self.new_blob(weight_shape)
        fill(weight.data, ip.weight_filler, f"{self.type} layer '{self.name}': ")
        self.blobs.append(weight)
        if self.bias_term:
            bias = self.new_blob((n,))
            fill(bias.data, ip.bias_filler, f"{self.type} layer '{self.name}': ")
            self.blobs.append(bias)

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        b = bottom[0]
        axis = self._axis(b)
        k = b.count_range(axis)
        if k != self.k:
            raise self.error(f"input size incompatible with inner product parameters: the "
                             f"bottom of shape {b.shape} has K = {k} values per item from axis "
                             f"{axis} on, the weights were made for K = {self.k}.")
        self.m = b.count_range(0, axis)
        top[0].reshape(b.shape[:axis] + (self.num_output,))

    def _weight_nk(self):
        """The weights as (num_output, K), a view."""
        w = self.blobs[0].data
        return w.T if self.transpose else w

    # The GEMMs write straight into the top and bottom diff and add into the param diffs (beta =
    # 1: Caffe accumulates them over iter_size and shared params).
    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        x = bottom[0].data.reshape(self.m, self.k)
        y = top[0].data.reshape(self.m, self.num_output)
        if self.bias_term:
            y[...] = self.blobs[1].data
            self.backend.matmul(x, self._weight_nk().T, out=y, accumulate=True)
        else:
            self.backend.matmul(x, self._weight_nk().T, out=y)

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        dy = top[0].diff.reshape(self.m, self.num_output)
        if self.param_propagate_down[0]:
            x = bottom[0].data.reshape(self.m, self.k)
            dw = self.blobs[0].diff
            if self.transpose:
                self.backend.matmul(x.T, dy, out=dw, accumulate=True)
            else:
                self.backend.matmul(dy.T, x, out=dw, accumulate=True)
        if self.bias_term and self.param_propagate_down[1]:
            self.backend.bias_backward(dy, out=self.blobs[1].diff, accumulate=True)
        if propagate_down[0]:
            self.backend.matmul(dy, self._weight_nk(),
                                out=bottom[0].diff.reshape(self.m, self.k))
