"""Loss layers (Caffe's ``LossLayer`` family): SoftmaxWithLoss, EuclideanLoss,
SigmoidCrossEntropyLoss, HingeLoss, InfogainLoss, MultinomialLogisticLoss, ContrastiveLoss.

Common rules, as in Caffe's ``loss_layer.cpp``: the top is a scalar (a blob of no axes), top 0
has loss_weight 1 unless the prototxt says otherwise, bottom[0] and bottom[1] have the same first
axis, and the backward pass multiplies by the top diff, which holds the loss weight. Labels are
class indices stored as floats and truncated towards zero (``static_cast<int>``); they never get
a gradient.

Normalisation (``loss_param.normalization``) divides the summed loss by max(1, n) where n is, for
FULL, every prediction (outer * inner); VALID, the predictions whose label is not
``ignore_label``; BATCH_SIZE, the outer count; NONE, 1.
"""
from __future__ import annotations

from google.protobuf.message import DecodeError

from ..errors import WeightsError
from ..io.blobproto import blob_from_proto
from ..proto import caffe_pb2
from .base import Layer, register
from .softmax import canonical_axis, split_shape

LossParameter = caffe_pb2.LossParameter
FULL, VALID, BATCH_SIZE, NONE = (LossParameter.FULL, LossParameter.VALID,
                                 LossParameter.BATCH_SIZE, LossParameter.NONE)

#: Caffe's floor under probabilities before the log in InfogainLoss and MultinomialLogisticLoss
#: (kLOG_THRESHOLD; SoftmaxWithLoss floors at FLT_MIN, in the backend's softmax_loss_forward).
LOG_THRESHOLD = 1e-20


def normalization_mode(loss_param, default: int) -> int:
    """``normalization`` if given; else the legacy ``normalize`` (true: VALID, false:
    BATCH_SIZE); else ``default``."""
    if loss_param.HasField("normalization"):
        return loss_param.normalization
    if loss_param.HasField("normalize"):
        return VALID if loss_param.normalize else BATCH_SIZE
    return default


def normalizer(mode: int, outer: int, inner: int, valid_count: int) -> float:
    """Caffe's ``get_normalizer``; the floor of 1 keeps a batch with every label ignored at 0."""
    n = {FULL: outer * inner, VALID: valid_count, BATCH_SIZE: outer, NONE: 1}[mode]
    return float(max(1, n))


class LossLayer(Layer):
    """Blob counts, the first-axis check and the scalar top shared by every loss layer."""

    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1
    auto_top_blobs = True
    is_loss = True

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def batch_share(self, items: int, batch: int) -> float:
        # normalization NONE sums over the batch; every other normaliser averages.
        if getattr(self, "mode", None) == NONE:
            return 1.0
        return items / batch

    def reshape(self, bottom, top):
        b0, b1 = bottom[0], bottom[1]
        if b0.num_axes == 0 or b1.num_axes == 0 or b0.shape[0] != b1.shape[0]:
            raise self.error(f"bottom[0] (shape {b0.shape}) and bottom[1] (shape {b1.shape}) "
                             f"should have the same first dimension (the number of items).")
        top[0].reshape(())

    def no_label_gradient(self, propagate_down, index: int = 1, what: str = "label") -> None:
        if len(propagate_down) > index and propagate_down[index]:
            raise self.error(f"cannot backpropagate to {what} inputs (bottom[{index}]); the "
                             f"blob feeding it must not need a gradient.")

    def label_error(self, bad: int, num_classes: int, ignore_label=None):
        return self.error(f"label {bad} is out of range: labels must lie in "
                          f"[0, {num_classes - 1}]" + (
                              f" or equal ignore_label {ignore_label}" if ignore_label
                              is not None else "") + ".")

    def int_labels(self, label, num_classes: int, ignore_label=None):
        """Labels as integers, the mask of the ones that count, and those labels with ignored
        entries replaced by 0 (safe to index with). Out-of-range labels are an error."""
        xp = self.xp
        label = label.astype(xp.int64)
        valid = label != ignore_label if ignore_label is not None else None
        checked = label if valid is None else label[valid]
        if checked.size and bool(((checked < 0) | (checked >= num_classes)).any()):
            bad = int(checked[(checked < 0) | (checked >= num_classes)][0])
            raise self.label_error(bad, num_classes, ignore_label)
        safe = label if valid is None else xp.where(valid, label, 0)
        return label, valid, safe


def _ignore_label(loss_param):
    return int(loss_param.ignore_label) if loss_param.HasField("ignore_label") else None


def _label_count_check(layer: Layer, outer: int, inner: int, label, axis_name: str) -> None:
    if outer * inner != label.count:
        raise layer.error(
            f"the label count ({label.count}, shape {label.shape}) must match the number of "
            f"predictions ({outer * inner}): with {axis_name} == 1 and predictions of shape "
            f"(N, C, H, W) there must be N*H*W labels, with integer values in {{0, ..., C-1}}.")


@register("SoftmaxWithLoss")
class SoftmaxWithLossLayer(LossLayer):
    """p = softmax(x) over ``softmax_param.axis`` (default 1);
    loss = -sum over the non-ignored positions of log(max(p[label], FLT_MIN)) / normalizer,
    with ``loss_param``: ignore_label (unset: none), normalization (default VALID; the legacy
    ``normalize`` means VALID if true, BATCH_SIZE if false). An optional second top receives p.

    dL/dx = (p - onehot(label)) * top_diff / normalizer, 0 at ignored positions."""

    exact_num_top_blobs = -1
    min_top_blobs = 1
    max_top_blobs = 2

    def layer_setup(self, bottom, top):
        lp = self.layer_param.loss_param
        self.ignore_label = _ignore_label(lp)
        self.mode = normalization_mode(lp, VALID)
        self.prob = None

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.axis = canonical_axis(self, bottom[0], self.layer_param.softmax_param.axis)
        self.view = split_shape(bottom[0], self.axis)
        outer, _, inner = self.view
        _label_count_check(self, outer, inner, bottom[1], "softmax axis")
        if len(top) > 1:
            top[1].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        outer, channels, inner = self.view
        if self.prob is None or self.prob.shape != self.view:
            self.prob = self.xp.empty(self.view, self.dtype)
        self.label = bottom[1].data.reshape(outer, inner)
        # deferred: on a device the loss, the count and the label check stay there, so that
        # nothing waits for the GPU; the net reads the check with the loss (Net.forward_from_to)
        _, loss, count, bad = self.backend.softmax_loss_forward(
            bottom[0].data.reshape(self.view), self.label, self.ignore_label, prob=self.prob,
            deferred=True)
        if bad is None or isinstance(bad, int):
            if bad is not None:
                raise self.label_error(bad, channels, self.ignore_label)
        else:
            self.pending_check = (bad, lambda label: self.label_error(label, channels,
                                                                      self.ignore_label))
        if isinstance(count, int):
            self.norm = self.dtype.type(normalizer(self.mode, outer, inner, count))
        elif self.mode == VALID:  # the count is on the device: so is the normalizer
            self.norm = self.xp.maximum(count, 1).astype(self.dtype)
        else:
            self.norm = self.dtype.type(normalizer(self.mode, outer, inner, 0))
        top[0].data[...] = loss / self.norm
        if len(top) > 1:
            top[1].data[...] = self.prob.reshape(top[1].shape)

    def backward(self, top, propagate_down, bottom):
        self.no_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        self.backend.softmax_loss_backward(self.prob, self.label, self.ignore_label,
                                           top[0].diff / self.norm,
                                           out=bottom[0].diff.reshape(self.view))


@register("EuclideanLoss")
class EuclideanLossLayer(LossLayer):
    """loss = sum((x0 - x1)^2) / (2 N), N the first axis; both bottoms may get a gradient:
    dL/dx0 = (x0 - x1) * top_diff / N, dL/dx1 = -(x0 - x1) * top_diff / N."""

    def allow_force_backward(self, bottom_index: int) -> bool:
        return True

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].count_range(1) != bottom[1].count_range(1):
            raise self.error(f"bottom[0] (shape {bottom[0].shape}) and bottom[1] (shape "
                             f"{bottom[1].shape}) must have the same dimension: the same "
                             f"count per item.")

    def forward(self, bottom, top):
        self.diff = bottom[0].data - bottom[1].data.reshape(bottom[0].shape)
        d = self.diff.reshape(-1)
        top[0].data[...] = self.backend.dot(d, d) / bottom[0].shape[0] / 2

    def backward(self, top, propagate_down, bottom):
        for i, sign in ((0, 1), (1, -1)):
            if propagate_down[i]:
                alpha = sign * top[0].diff / bottom[i].shape[0]
                bottom[i].diff[...] = (alpha * self.diff).reshape(bottom[i].shape)


@register("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(LossLayer):
    """Cross entropy of targets t in [0, 1] against p = sigmoid(x), element by element, in
    Caffe's overflow-free form
    loss = -sum(x (t - [x >= 0]) - log(1 + exp(x - 2 x [x >= 0]))) / normalizer.
    ``loss_param``: ignore_label drops elements whose int(t) equals it; normalization
    defaults to BATCH_SIZE here (legacy ``normalize`` true: VALID), with n counted over
    elements, outer = the first axis. dL/dx = (p - t) * top_diff / normalizer."""

    def layer_setup(self, bottom, top):
        lp = self.layer_param.loss_param
        self.ignore_label = _ignore_label(lp)
        self.mode = normalization_mode(lp, BATCH_SIZE)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].count != bottom[1].count:
            raise self.error(f"bottom[0] (shape {bottom[0].shape}) and bottom[1] (shape "
                             f"{bottom[1].shape}) must have the same count.")

    def forward(self, bottom, top):
        xp = self.xp
        x = bottom[0].data
        t = bottom[1].data.reshape(x.shape)
        self.sigmoid = 0.5 * xp.tanh(0.5 * x) + 0.5
        pos = (x >= 0).astype(self.dtype)
        loss = x * (t - pos) - xp.log(1 + xp.exp(x - 2 * x * pos))
        self.valid = None
        count = x.size
        if self.ignore_label is not None:
            self.valid = t.astype(xp.int64) != self.ignore_label
            loss = loss * self.valid
            count = int(self.valid.sum())
        self.norm = normalizer(self.mode, x.shape[0], bottom[0].count_range(1), count)
        top[0].data[...] = -loss.sum() / self.norm

    def backward(self, top, propagate_down, bottom):
        self.no_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        d = self.sigmoid - bottom[1].data.reshape(self.sigmoid.shape)
        if self.valid is not None:
            d = d * self.valid
        bottom[0].diff[...] = d * (top[0].diff / self.norm)


@register("HingeLoss")
class HingeLossLayer(LossLayer):
    """One-versus-all hinge loss over the C = count/N scores of each item:
    m_k = max(0, 1 + s_k x_k), s_k = -1 for the true class, +1 otherwise;
    loss = sum(m) / N for ``hinge_loss_param.norm`` L1 (default), sum(m^2) / N for L2.
    dL/dx_k = s_k sign(m_k) top_diff / N (L1), 2 s_k m_k top_diff / N (L2)."""

    def layer_setup(self, bottom, top):
        self.norm_type = self.layer_param.hinge_loss_param.norm

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[1].count != bottom[0].shape[0]:
            raise self.error(f"needs one label per item: bottom[1] has shape "
                             f"{bottom[1].shape} for {bottom[0].shape[0]} items.")

    def forward(self, bottom, top):
        xp = self.xp
        n = bottom[0].shape[0]
        x = bottom[0].data.reshape(n, -1)
        label, _, _ = self.int_labels(bottom[1].data.reshape(n), x.shape[1])
        self.sign = xp.where(xp.arange(x.shape[1])[None, :] == label[:, None], -1, 1).astype(
            self.dtype)
        self.margin = xp.maximum(0, 1 + x * self.sign)
        m = self.margin.reshape(-1)
        loss = m.sum() if self.norm_type == caffe_pb2.HingeLossParameter.L1 else \
            self.backend.dot(m, m)
        top[0].data[...] = loss / n

    def backward(self, top, propagate_down, bottom):
        self.no_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        n = bottom[0].shape[0]
        d = self.margin * self.sign
        if self.norm_type == caffe_pb2.HingeLossParameter.L1:
            d = ((d > 0).astype(self.dtype) - (d < 0)) * (top[0].diff / n)
        else:
            d = d * (top[0].diff * 2 / n)
        bottom[0].diff[...] = d.reshape(bottom[0].shape)


@register("InfogainLoss")
class InfogainLossLayer(LossLayer):
    """p = softmax(x) over ``infogain_loss_param.axis`` (default 1), L classes on that axis;
    with the L x L infogain matrix H (third bottom, else the BlobProto file
    ``infogain_loss_param.source``),
    loss = -sum over non-ignored positions of sum_l H[label, l] log(max(p_l, 1e-20))
    / normalizer (``loss_param``: ignore_label, normalization default VALID; the legacy
    ``normalize`` is rejected as in Caffe). An optional second top receives p.
    dL/dx_l = (p_l * sum_k H[label, k] - H[label, l]) * top_diff / normalizer."""

    exact_num_bottom_blobs = -1
    min_bottom_blobs = 2
    max_bottom_blobs = 3
    exact_num_top_blobs = -1
    min_top_blobs = 1
    max_top_blobs = 2

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index == 0

    def layer_setup(self, bottom, top):
        lp = self.layer_param.loss_param
        if lp.HasField("normalize"):
            raise self.error('loss_param.normalize is deprecated here; use "normalization".')
        self.ignore_label = _ignore_label(lp)
        self.mode = lp.normalization
        self.infogain = None
        if len(bottom) < 3:
            self.infogain = self._read_matrix(self.layer_param.infogain_loss_param)

    def _read_matrix(self, p):
        if not p.HasField("source"):
            raise self.error("needs the infogain matrix: set infogain_loss_param.source to a "
                             ".binaryproto file or give it as a third bottom.")
        try:
            with open(p.source, "rb") as f:
                proto = caffe_pb2.BlobProto.FromString(f.read())
            arr = blob_from_proto(proto)
        except OSError as e:
            raise self.error(f"cannot read infogain matrix source '{p.source}': "
                             f"{e.strerror or e}.") from None
        except (WeightsError, DecodeError) as e:
            raise self.error(f"infogain matrix source '{p.source}' is not a valid BlobProto "
                             f"file: {e}") from None
        return self.xp.asarray(arr, dtype=self.dtype)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.axis = canonical_axis(self, bottom[0], self.layer_param.infogain_loss_param.axis)
        self.view = split_shape(bottom[0], self.axis)
        outer, labels, inner = self.view
        _label_count_check(self, outer, inner, bottom[1], "infogain axis")
        count = bottom[2].count if len(bottom) > 2 else int(self.infogain.size)
        if count != labels * labels:
            source = self.layer_param.infogain_loss_param.source
            where = "bottom[2]" if len(bottom) > 2 else f"'{source}'"
            raise self.error(f"the infogain matrix ({where}) holds {count} values but must be "
                             f"{labels}x{labels} for {labels} classes on axis {self.axis} of "
                             f"bottom shape {bottom[0].shape}.")
        if len(top) > 1:
            top[1].reshape(bottom[0].shape)

    def _matrix(self, bottom):
        labels = self.view[1]
        h = bottom[2].data if len(bottom) > 2 else self.infogain
        return h.reshape(labels, labels)

    def forward(self, bottom, top):
        xp = self.xp
        outer, labels, inner = self.view
        self.prob = self.backend.softmax_forward(bottom[0].data.reshape(self.view))
        _, self.valid, self.safe = self.int_labels(bottom[1].data.reshape(outer, inner),
                                                   labels, self.ignore_label)
        h_rows = self._matrix(bottom)[self.safe]                    # (outer, inner, labels)
        logp = xp.log(xp.maximum(self.prob, LOG_THRESHOLD)).transpose(0, 2, 1)
        per_item = (h_rows * logp).sum(axis=2)
        if self.valid is None:
            count = outer * inner
        else:
            per_item = per_item * self.valid
            count = int(self.valid.sum())
        self.norm = normalizer(self.mode, outer, inner, count)
        top[0].data[...] = -per_item.sum() / self.norm
        if len(top) > 1:
            top[1].data[...] = self.prob.reshape(top[1].shape)

    def backward(self, top, propagate_down, bottom):
        self.no_label_gradient(propagate_down)
        self.no_label_gradient(propagate_down, 2, "infogain matrix")
        if not propagate_down[0]:
            return
        h = self._matrix(bottom)
        row_sums = h.sum(axis=1)[self.safe]                          # (outer, inner)
        d = self.prob * row_sums[:, None, :] - h[self.safe].transpose(0, 2, 1)
        if self.valid is not None:
            d = d * self.valid[:, None, :]
        d = d * (top[0].diff / self.norm)
        bottom[0].diff[...] = d.reshape(bottom[0].shape)


@register("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(LossLayer):
    """bottom[0] holds probabilities p, viewed as (N, count/N); one label per item:
    loss = -sum_n log(max(p[n, label_n], 1e-20)) / N;
    dL/dp[n, label_n] = -top_diff / (N max(p[n, label_n], 1e-20)), 0 elsewhere."""

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[1].count_range(1) != 1:
            raise self.error(f"needs one label per item: bottom[1] has shape "
                             f"{bottom[1].shape}; expected (N,) or (N, 1, 1, 1).")

    def forward(self, bottom, top):
        xp = self.xp
        n = bottom[0].shape[0]
        p = bottom[0].data.reshape(n, -1)
        label, _, _ = self.int_labels(bottom[1].data.reshape(n), p.shape[1])
        self.label = label
        self.p = xp.maximum(xp.take_along_axis(p, label[:, None], axis=1)[:, 0], LOG_THRESHOLD)
        top[0].data[...] = -xp.log(self.p).sum() / n

    def backward(self, top, propagate_down, bottom):
        self.no_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        xp = self.xp
        n = bottom[0].shape[0]
        scale = -top[0].diff / n
        dim = bottom[0].count // n
        onehot = xp.arange(dim)[None, :] == self.label[:, None]
        d = onehot * (scale / self.p)[:, None]
        bottom[0].diff[...] = d.reshape(bottom[0].shape)


@register("ContrastiveLoss")
class ContrastiveLossLayer(LossLayer):
    """Bottoms a, b (N, C) or (N, C, 1, 1) and a similarity flag y (N); d = ||a - b||.
    loss = sum_n (y_n d_n^2 + (1 - y_n) max(margin - d_n, 0)^2) / (2 N), or with
    ``contrastive_loss_param.legacy_version`` max(margin - d_n^2, 0) for dissimilar pairs
    (``margin`` default 1). y is truncated to an integer; non-zero means similar.
    Gradient as in Caffe, which divides by d + 1e-4 for dissimilar pairs (non-legacy), so it
    is the exact derivative only up to that 1e-4."""

    exact_num_bottom_blobs = 3

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 2

    def layer_setup(self, bottom, top):
        p = self.layer_param.contrastive_loss_param
        self.margin = self.dtype.type(p.margin)
        self.legacy = p.legacy_version

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        a, b, y = bottom
        if a.count != b.count or a.count_range(2) != 1 or b.count_range(2) != 1:
            raise self.error(f"bottom[0] and bottom[1] must both have shape (N, C) or "
                             f"(N, C, 1, 1) with the same N and C; got {a.shape} and {b.shape}.")
        if y.count != a.shape[0] or y.count_range(1) != 1:
            raise self.error(f"bottom[2] must hold one similarity label per pair: shape (N,) "
                             f"or (N, 1, 1, 1) with N = {a.shape[0]}, got {y.shape}.")

    def forward(self, bottom, top):
        xp = self.xp
        n = bottom[0].shape[0]
        self.diff = bottom[0].data.reshape(n, -1) - bottom[1].data.reshape(n, -1)
        self.dist_sq = (self.diff * self.diff).sum(axis=1)
        self.similar = bottom[2].data.reshape(n).astype(xp.int64) != 0
        if self.legacy:
            dissimilar = xp.maximum(self.margin - self.dist_sq, 0)
        else:
            dissimilar = xp.maximum(self.margin - xp.sqrt(self.dist_sq), 0) ** 2
        loss = xp.where(self.similar, self.dist_sq, dissimilar).sum()
        top[0].data[...] = loss / n / 2

    def backward(self, top, propagate_down, bottom):
        xp = self.xp
        for i, sign in ((0, 1), (1, -1)):
            if not propagate_down[i]:
                continue
            alpha = sign * top[0].diff / bottom[i].shape[0]
            if self.legacy:
                mdist = self.margin - self.dist_sq
                beta = -alpha
            else:
                dist = xp.sqrt(self.dist_sq)
                mdist = self.margin - dist
                beta = -alpha * mdist / (dist + 1e-4)
            coef = xp.where(self.similar, alpha, xp.where(mdist > 0, beta, 0))
            d = coef.astype(self.dtype, copy=False)[:, None] * self.diff
            bottom[i].diff[...] = d.reshape(bottom[i].shape)
