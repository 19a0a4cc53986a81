"""Eltwise: element-wise SUM, PROD or MAX of bottoms of one shape (Caffe's
``eltwise_layer.cpp``)."""
from __future__ import annotations

from ..proto import caffe_pb2
from .base import Layer, register

_Op = caffe_pb2.EltwiseParameter


@register("Eltwise")
class EltwiseLayer(Layer):
    """Element-wise combination of two or more bottoms of identical shape.

    ``operation`` (default SUM):

    - SUM: top = sum_i coeff_i * bottom_i, ``coeff`` one per bottom (default all 1);
      d bottom_i = coeff_i * d top.
    - PROD: top = prod_i bottom_i (no coeff allowed). With ``stable_prod_grad`` (default true)
      d bottom_i = d top * prod_{j != i} bottom_j; otherwise d top * top / bottom_i.
    - MAX: top = max_i bottom_i. The winner is Caffe's: bottom 1 unless bottom 0 is strictly
      greater, then each later bottom k only if strictly greater than the running max (so a
      tie between bottoms 0 and 1 goes to 1, a tie with a later bottom to the earlier one).
      Only the winner gets d top.
    """

    min_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.eltwise_param
        self.op = p.operation
        if len(p.coeff) not in (0, len(bottom)):
            raise self.error(f"takes one coeff per bottom blob: {len(p.coeff)} coeff value(s) "
                             f"for {len(bottom)} bottoms.")
        if self.op == _Op.PROD and len(p.coeff):
            raise self.error("coeff is only allowed with operation SUM, not PROD.")
        self.coeffs = [self.dtype.type(c) for c in p.coeff] or [self.dtype.type(1)] * len(bottom)
        self.stable_prod_grad = p.stable_prod_grad
        self.mask = None  # MAX: the winning bottom per element

    def reshape(self, bottom, top):
        for i, b in enumerate(bottom[1:], start=1):
            if b.shape != bottom[0].shape:
                raise self.error(f"all bottoms must have the same shape: bottom[0] has shape "
                                 f"{bottom[0].shape}, bottom[{i}] has shape {b.shape}.")
        top[0].reshape_like(bottom[0])

    def forward(self, bottom, top):
        datas = [b.data for b in bottom]
        out = top[0].data
        if self.op == _Op.SUM:
            self.backend.eltwise_sum(datas, self.coeffs, out=out)
        elif self.op == _Op.PROD:
            self.backend.eltwise_prod(datas, out=out)
        else:
            # the mask's array is kept across iterations while the shape is
            reuse = self.mask if self.mask is not None and self.mask.shape == out.shape else None
            _, self.mask = self.backend.eltwise_max(datas, out=out, mask=reuse)

    def backward(self, top, propagate_down, bottom):
        top_diff = top[0].diff
        for i, b in enumerate(bottom):
            if not propagate_down[i]:
                continue
            if self.op == _Op.SUM:
                if self.coeffs[i] == 1:
                    b.diff[...] = top_diff
                else:
                    self.xp.multiply(top_diff, self.coeffs[i], out=b.diff)
            elif self.op == _Op.PROD:
                if self.stable_prod_grad:
                    others = [o.data for j, o in enumerate(bottom) if j != i]
                    self.backend.eltwise_prod(others + [top_diff], out=b.diff)
                else:
                    b.diff[...] = top[0].data / b.data * top_diff
            else:
                self.backend.eltwise_max_backward(top_diff, self.mask, i, out=b.diff)
