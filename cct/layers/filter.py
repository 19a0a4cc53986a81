"""Layers that pick items (rows along the first axis) of their bottoms by the values of another
bottom: BatchReindex and Filter (Caffe's batch_reindex_layer.cpp, filter_layer.cpp).

The picking bottom (the indices, the selector) is data, never differentiated: backward to it is
refused, as Caffe refuses it.
"""
from __future__ import annotations

from typing import List

from ..blob import Blob
from .base import Layer, register


def _refuse_index_gradient(layer: Layer, propagate_down: List[bool], index: int,
                           what: str) -> None:
    if propagate_down[index]:
        raise layer.error(f"cannot backpropagate to bottom[{index}] ({what}); set "
                          f"propagate_down: false for it (or do not use force_backward).")


def _check_not_in_place(layer: Layer, bottom: List[Blob], top: List[Blob]) -> None:
    if any(t is b for t in top for b in bottom):
        raise layer.error("cannot run in place (a top is one of the bottoms): the top holds "
                          "other items than the bottom; give the top its own name.")


@register("BatchReindex")
class BatchReindexLayer(Layer):
    """top[i] = bottom[0][int(bottom[1][i])]: the items of bottom[0] in the order (and with
    the repetitions) that the 1-axis bottom[1] lists; top shape (len(bottom[1]),) + bottom[0]'s
    shape after the first axis.

    Indices are floats truncated toward zero, as Caffe's ``static_cast<int>``; each must satisfy
    0 <= index < bottom[0]'s first dimension (checked on every forward pass). Backward adds the
    top diff of every pick into the picked item's diff (an item picked twice gets both, an item
    never picked gets zero)."""

    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        _check_not_in_place(self, bottom, top)

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        data, index = bottom
        if index.num_axes != 1:
            raise self.error(f"bottom[1] (the indices) must have exactly 1 axis, got shape "
                             f"{index.shape}; reshape it to ({index.count},).")
        if data.num_axes < 1:
            raise self.error("bottom[0] is a scalar; it needs a first axis of items to pick "
                             "from.")
        top[0].reshape((index.shape[0],) + data.shape[1:])

    def _indices(self, bottom: List[Blob]):
        """bottom[1] as integer item indices, checked as Caffe's check_batch_reindex does (on
        the float values: -0.5 is negative, 2.5 < 3 is in range)."""
        xp = self.xp
        num = bottom[0].shape[0]
        ridx = bottom[1].data
        bad = (ridx < 0) | (ridx >= num) | xp.isnan(ridx)
        if bool(bad.any()):
            k = int(xp.argmax(bad))
            v = float(ridx[k])
            why = ("negative" if v < 0 else
                   "not a number" if v != v else "not smaller than the batch size")
            raise self.error(f"index {k} of bottom[1] is {v!r}, {why}: indices must lie in "
                             f"[0, {num}) (bottom[0] of shape {bottom[0].shape} has {num} "
                             f"items).")
        return ridx.astype(xp.int64)

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        idx = self._indices(bottom)
        top[0].data[...] = bottom[0].data[idx]

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        _refuse_index_gradient(self, propagate_down, 1, "the indices")
        if not propagate_down[0]:
            return
        dx = bottom[0].diff
        dx[...] = 0
        self.xp.add.at(dx, self._indices(bottom), top[0].diff)


@register("Filter")
class FilterLayer(Layer):
    """Keep the items whose selector is nonzero: bottoms are data_1 ... data_k then the
    selector, tops are filtered data_1 ... data_k (k = number of bottoms - 1).

    The selector has shape (N,) or (N, 1, ...) (every axis after the first a singleton); every
    data bottom has N items. top_t = the items i of data_t with selector[i] != 0, in order, so
    its first axis is the number of such items (the whole N at setup, before any selector
    values exist, as in Caffe). Backward copies each top diff row back to the item it came from
    and zeroes the diff of the items left out."""

    min_bottom_blobs = 2
    min_top_blobs = 1

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        if len(top) != len(bottom) - 1:
            raise self.error(f"needs one top per filtered bottom, i.e. {len(bottom) - 1} "
                             f"top(s) for {len(bottom)} bottoms (the last bottom is the "
                             f"selector), but the prototxt gives {len(top)}.")
        _check_not_in_place(self, bottom, top)
        self.first_reshape = True
        self.indices = None

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        selector = bottom[-1]
        if selector.num_axes < 1 or any(d != 1 for d in selector.shape[1:]):
            raise self.error(f"the selector (bottom[{len(bottom) - 1}]) must have shape (N,) "
                             f"or (N, 1, ...): every dimension but the first a singleton (1); "
                             f"got {selector.shape}.")
        num = selector.shape[0]
        for i, b in enumerate(bottom[:-1]):
            if b.num_axes < 1 or b.shape[0] != num:
                raise self.error(f"each bottom must have the same first dimension as the "
                                 f"selector ({num}, shape {selector.shape}); bottom[{i}] has "
                                 f"shape {b.shape}.")
        xp = self.xp
        self.indices = xp.nonzero(selector.data.reshape(-1))[0]
        kept = int(self.indices.shape[0])
        if self.first_reshape:
            kept = num
            self.first_reshape = False
        for b, t in zip(bottom, top):
            t.reshape((kept,) + b.shape[1:])

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        k = int(self.indices.shape[0])
        for b, t in zip(bottom, top):
            t.data[:k] = b.data[self.indices]

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        _refuse_index_gradient(self, propagate_down, len(bottom) - 1, "the selector")
        k = int(self.indices.shape[0])
        for i, (t, b) in enumerate(zip(top, bottom)):
            if propagate_down[i]:
                dx = b.diff
                dx[...] = 0
                dx[self.indices] = t.diff[:k]
