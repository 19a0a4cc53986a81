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
        # On a device, reading the label check or the count would wait for the GPU: the
        # check is left for the net to read with the loss (pending_check), the count stays.
        on_device = self.backend.is_device(label)
        bad = valid & ((label < 0) | (label >= classes))
        if on_device:
            first = label.reshape(-1)[bad.reshape(-1).astype(xp.int8).argmax()]
            self.pending_check = (xp.stack([bad.any().astype(xp.int64), first]),
                                  self._label_error)
        elif bool(bad.any()):
            raise self._label_error(int(label[bad][0]))
        valid = valid & ~bad   # what a device goes on with until the check is read
        safe = xp.where(valid, label, 0)
        true_score = xp.take_along_axis(x, safe[:, None, :], axis=1)
        # The true class itself is one of the scores >= its own.
        at_least = (x >= true_score).sum(axis=1)
        hit = valid & (at_least - 1 < self.top_k)
        # Divide in the blob dtype, as Caffe's Dtype arithmetic does.
        if on_device:
            count = valid.sum()
            top[0].data[...] = xp.where(count > 0, hit.sum().astype(self.dtype)
                                        / xp.maximum(count, 1).astype(self.dtype), 0)
        else:
            count = int(valid.sum())
            top[0].data[...] = (hit.sum().astype(self.dtype) / self.dtype.type(count)
                                if count else 0)
        if len(top) > 1:
            # per-class counts as one-hot sums: a boolean selection or bincount would read
            # sizes back from a device
            of_class = (safe[:, None, :] == xp.arange(classes)[None, :, None]) & valid[:, None, :]
            nums = of_class.sum(axis=(0, 2)).astype(self.dtype)
            hits = (of_class & hit[:, None, :]).sum(axis=(0, 2)).astype(self.dtype)
            top[1].data[...] = xp.where(nums > 0, hits / xp.maximum(nums, 1), 0)

    def _label_error(self, bad: int):
        return self.error(f"label {bad} is out of range: labels must lie in "
                          f"[0, {self.view[1] - 1}]" + (
                              f" or equal ignore_label {self.ignore_label}"
                              if self.ignore_label is not None else "") + ".")

    def backward(self, top, propagate_down, bottom):
        """Nothing to do: accuracy has no gradient (Caffe aborts if asked for one)."""
