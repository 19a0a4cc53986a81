"""Accuracy (Caffe's ``accuracy_layer.cpp``): the fraction of predictions whose true class is
among the top k scores."""
from __future__ import annotations

from .base import Layer, register
from .softmax import canonical_axis, split_shape


@register("Accuracy")
class AccuracyLayer(Layer):
    """Scores x viewed as (outer, C, inner) around ``accuracy_param.axis`` (default 1), one
    label per (outer, inner) position. A position counts as a hit when at most ``top_k``
    (default 1) classes, the true class included, score >= the true class's score (so ties
    count against the prediction, as in Caffe). Positions labelled ``ignore_label`` are
    skipped.

    top[0] = hits / counted positions (0 when none is counted); the optional top[1], shape
    (C,), holds the hit rate per true class (0 for a class that never occurs). No backward:
    the net never needs a gradient through it.
    """

    exact_num_bottom_blobs = 2
    min_top_blobs = 1
    max_top_blobs = 2

    def layer_setup(self, bottom, top):
        p = self.layer_param.accuracy_param
        self.top_k = int(p.top_k)
        self.ignore_label = int(p.ignore_label) if p.HasField("ignore_label") else None

    def reshape(self, bottom, top):
        if bottom[1].count == 0 or self.top_k > bottom[0].count // bottom[1].count:
            raise self.error(f"top_k {self.top_k} must be at most the number of classes "
                             f"(bottom[0] shape {bottom[0].shape}, {bottom[1].count} labels).")
        self.axis = canonical_axis(self, bottom[0], self.layer_param.accuracy_param.axis)
        self.view = split_shape(bottom[0], self.axis)
        outer, classes, inner = self.view
        if outer * inner != bottom[1].count:
            raise self.error(
                f"the label count ({bottom[1].count}, shape {bottom[1].shape}) must match the "
                f"number of predictions ({outer * inner}): with axis == 1 and predictions of "
                f"shape (N, C, H, W) there must be N*H*W labels, with integer values in "
                f"{{0, ..., C-1}}.")
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape((classes,))

    def forward(self, bottom, top):
        xp = self.xp
        outer, classes, inner = self.view
        x = bottom[0].data.reshape(self.view)
        label = bottom[1].data.reshape(outer, inner).astype(xp.int64)
        valid = (label != self.ignore_label) if self.ignore_label is not None else \
            xp.ones(label.shape, bool)
        checked = label[valid]
        out_of_range = (checked < 0) | (checked >= classes)
        if bool(out_of_range.any()):
            raise self.error(f"label {int(checked[out_of_range][0])} is out of range: labels "
                             f"must lie in [0, {classes - 1}]" + (
                                 f" or equal ignore_label {self.ignore_label}"
                                 if self.ignore_label is not None else "") + ".")
        safe = xp.where(valid, label, 0)
        true_score = xp.take_along_axis(x, safe[:, None, :], axis=1)
        # The true class itself is one of the scores >= its own.
        at_least = (x >= true_score).sum(axis=1)
        hit = valid & (at_least - 1 < self.top_k)
        count = int(valid.sum())
        # Divide in the blob dtype, as Caffe's Dtype arithmetic does.
        top[0].data[...] = hit.sum().astype(self.dtype) / self.dtype.type(count) if count else 0
        if len(top) > 1:
            nums = xp.bincount(checked, minlength=classes).astype(self.dtype)
            hits = xp.bincount(label[hit], minlength=classes).astype(self.dtype)
            top[1].data[...] = xp.where(nums > 0, hits / xp.maximum(nums, 1), 0)

    def backward(self, top, propagate_down, bottom):
        """Nothing to do: accuracy has no gradient (Caffe aborts if asked for one)."""
