"""Reductions: Reduction (sum-like reductions over the tail axes) and ArgMax (Caffe's
``reduction_layer.cpp``, ``argmax_layer.cpp``)."""
from __future__ import annotations

from ..proto import caffe_pb2
from .base import Layer, register
from .structure import canonical_axis

_Op = caffe_pb2.ReductionParameter


@register("Reduction")
class ReductionLayer(Layer):
    """Reduce all axes from ``axis`` (default 0) on: the bottom, viewed as (num, dim) with
    num = count(0, axis), gives top (shape bottom.shape[:axis]; a scalar for axis 0)

    - SUM (default):  top_n = coeff * sum_d x_nd
    - ASUM:           top_n = coeff * sum_d |x_nd|
    - SUMSQ:          top_n = coeff * sum_d x_nd^2
    - MEAN:           top_n = coeff / dim * sum_d x_nd

    with ``coeff`` default 1. Gradients: coeff' * d top_n times 1, sign(x_nd) (sign(0) = 0)
    or 2 x_nd, with coeff' = coeff (coeff / dim for MEAN).
    """

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def batch_share(self, items: int, batch: int) -> float:
        # Reducing over the batch axis: MEAN averages the batch, the others sum it.
        return items / batch if self.op == _Op.MEAN else 1.0

    def layer_setup(self, bottom, top):
        self.op = self.layer_param.reduction_param.operation

    def reshape(self, bottom, top):
        p = self.layer_param.reduction_param
        b = bottom[0]
        axis = canonical_axis(self, b, p.axis)
        top[0].reshape(b.shape[:axis])
        self.num = b.count_range(0, axis)
        self.dim = b.count_range(axis)
        # Caffe keeps coeff in the blob type and divides it by dim there for MEAN.
        coeff = self.dtype.type(p.coeff)
        if self.op == _Op.MEAN:
            coeff = coeff / self.dtype.type(self.dim)
        self.coeff = self.dtype.type(coeff)

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self.num, self.dim)
        if self.op == _Op.ASUM:
            out = self.xp.abs(x).sum(axis=1)
        elif self.op == _Op.SUMSQ:
            out = (x * x).sum(axis=1)
        else:
            out = x.sum(axis=1)
        if self.coeff != 1:
            out *= self.coeff
        top[0].data[...] = out.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        g = (top[0].diff.reshape(self.num) * self.coeff)[:, None]
        diff = bottom[0].diff.reshape(self.num, self.dim)
        if self.op == _Op.ASUM:
            diff[...] = self.xp.sign(bottom[0].data.reshape(self.num, self.dim)) * g
        elif self.op == _Op.SUMSQ:
            diff[...] = (2 * g) * bottom[0].data.reshape(self.num, self.dim)
        else:
            diff[...] = g


@register("ArgMax")
class ArgMaxLayer(Layer):
    """Indices (and with ``out_max_val`` the values) of the ``top_k`` (default 1) largest
    entries.

    Without ``axis``: over each example's flattened count(1) values; top shape
    (N, 1, top_k) -- (N, 2, top_k) with out_max_val, indices in channel 0 and values in
    channel 1 -- padded with axes of size 1 to the bottom's number of axes.
    With ``axis``: along that axis, top shape = bottom shape with top_k there, holding the
    indices, or only the values if out_max_val.

    Order as Caffe's std::partial_sort with std::greater on (value, index) pairs: by value
    descending, equal values by larger index first. Indices are stored as floats. No backward.
    """

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.argmax_param
        self.out_max_val = p.out_max_val
        self.top_k = int(p.top_k)
        self.has_axis = p.HasField("axis")
        if self.top_k < 1:
            raise self.error(f"top_k must be at least 1, got {self.top_k}.")

    def reshape(self, bottom, top):
        b = bottom[0]
        if self.has_axis:
            self.axis = canonical_axis(self, b, self.layer_param.argmax_param.axis)
            dim = b.shape[self.axis]
            if self.top_k > dim:
                raise self.error(f"top_k {self.top_k} exceeds the size {dim} of axis "
                                 f"{self.axis} of the bottom of shape {b.shape}.")
            shape = list(b.shape)
            shape[self.axis] = self.top_k
        else:
            if b.num_axes < 1:
                raise self.error("needs a bottom with at least one axis (the examples), got "
                                 "a scalar.")
            dim = b.count_range(1)
            if self.top_k > dim:
                raise self.error(f"top_k {self.top_k} exceeds the {dim} values per example of "
                                 f"the bottom of shape {b.shape}.")
            shape = [1] * max(b.num_axes, 3)
            shape[0] = b.shape[0]
            shape[1] = 2 if self.out_max_val else 1
            shape[2] = self.top_k
        top[0].reshape(shape)

    def _top_k(self, rows):
        """Indices and values of the top_k largest entries of each row (last axis)."""
        xp = self.xp
        dim = rows.shape[-1]
        flipped = rows[..., ::-1]
        # On the reversed row, the first of equal values is the one with the larger index.
        if self.top_k == 1:
            order = xp.argmax(flipped, axis=-1)[..., None]
        else:
            order = xp.argsort(-flipped, axis=-1, kind="stable")[..., :self.top_k]
        idx = dim - 1 - order
        return idx, xp.take_along_axis(rows, idx, axis=-1)

    def forward(self, bottom, top):
        xp = self.xp
        x = bottom[0].data
        if self.has_axis:
            idx, val = self._top_k(xp.moveaxis(x, self.axis, -1))
            out = val if self.out_max_val else idx
            top[0].data[...] = xp.moveaxis(out, -1, self.axis)
        else:
            n = x.shape[0]
            idx, val = self._top_k(x.reshape(n, -1))
            out = top[0].data.reshape(n, -1, self.top_k)
            out[:, 0] = idx
            if self.out_max_val:
                out[:, 1] = val

    def backward(self, top, propagate_down, bottom):
        if any(propagate_down):
            raise self.error("has no gradient (argmax is not differentiable); set "
                             "propagate_down: false for its bottom.")
