"""The Layer contract and the registry keyed by Caffe's ``type`` string.

Lifecycle, as in Caffe: ``layer_setup`` once (parse parameters, create param blobs), ``reshape``
whenever bottom shapes may have changed, then ``forward`` and ``backward``. Blob counts are
declared as class attributes and checked by :meth:`Layer.check_blob_counts`, so every layer fails
the same way.
"""
from __future__ import annotations

from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple, Type

import numpy as np

from ..blob import INT_MAX, Blob, BlobShapeError
from ..errors import CCTError, LayerError, NetError, close_matches
from ..io.blobproto import blob_from_proto

LAYER_REGISTRY: Dict[str, Type["Layer"]] = {}


def register(*type_names: str) -> Callable[[Type["Layer"]], Type["Layer"]]:
    """Class decorator: make the class the implementation of the given Caffe layer types."""
    def deco(cls):
        for t in type_names:
            if t in LAYER_REGISTRY:
                raise RuntimeError(f"layer type {t!r} registered twice")
            LAYER_REGISTRY[t] = cls
        cls.type = type_names[0]
        return cls
    return deco


def layer_type_list() -> List[str]:
    return sorted(LAYER_REGISTRY)


def create_layer(layer_param, backend, dtype=np.float32) -> "Layer":
    """Instantiate the layer for ``layer_param.type`` (Caffe's LayerRegistry::CreateLayer)."""
    cls = LAYER_REGISTRY.get(layer_param.type)
    if cls is None:
        raise NetError(
            f"Layer '{layer_param.name}' has unknown type '{layer_param.type}'."
            + close_matches(layer_param.type, LAYER_REGISTRY)
            + " Run `cct layer_types` (or cct.layer_type_list()) for the supported types.")
    return cls(layer_param, backend, dtype)


class Layer:
    """Base of every layer. Subclasses set the blob-count attributes and override the hooks."""

    type: str = ""
    exact_num_bottom_blobs: int = -1
    min_bottom_blobs: int = -1
    max_bottom_blobs: int = -1
    exact_num_top_blobs: int = -1
    min_top_blobs: int = -1
    max_top_blobs: int = -1
    equal_num_bottom_top_blobs: bool = False
    #: Layers whose top may be omitted in the prototxt get anonymous tops (Caffe's AutoTopBlobs).
    auto_top_blobs: bool = False
    #: Loss layers: default loss_weight 1 on top 0 (Caffe's LossLayer).
    is_loss: bool = False
    #: A check of the last forward's inputs still on the device, left for the net to read
    #: with the loss (SoftmaxWithLoss's labels on a GPU): (device array [any bad, the first bad
    #: value], a function of that value giving the error to raise), else None.
    pending_check = None
    #: Whether the forward pass draws random numbers (Dropout's masks in TRAIN): such a layer
    #: offers ``draw(bottom)``, the next forward's draws made now into arrays of its own that
    #: its forward then reads, so that a CUDA graph's forward (cct/graphed.py) reads fresh
    #: draws each launch instead of repeating the capture's.
    draws: bool = False

    def __init__(self, layer_param, backend, dtype=np.float32):
        self.layer_param = layer_param
        self.backend = backend
        self.xp = backend.xp
        self.dtype = np.dtype(dtype)
        self.phase = layer_param.phase
        self.blobs: List[Blob] = []
        self.param_propagate_down: List[bool] = []
        self.loss_weights: List[float] = []
        # Caffe copies blobs stored in the LayerParameter (e.g. a V0 net with weights).
        for bp in layer_param.blobs:
            try:
                arr = blob_from_proto(bp)
                b = Blob(arr.shape, self.dtype, self.xp)
            except CCTError as e:
                raise self.error(f"the blobs given in the net: {e}") from None
            b.data[...] = self.xp.asarray(arr)
            self.blobs.append(b)

    # -- helpers for subclasses ----------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.layer_param.name

    def error(self, msg: str) -> LayerError:
        return LayerError(f"{self.type} layer '{self.name}': {msg}")

    def new_blob(self, shape: Sequence[int]) -> Blob:
        return Blob(shape, self.dtype, self.xp)

    def int_params(self, field: str, *values: int) -> Tuple[int, ...]:
        """Values of a uint32 prototxt field that Caffe keeps in an int (kernel, stride, pad,
        sizes): one above INT_MAX would wrap to a negative number there, and cannot reach
        the kernels here."""
        for v in values:
            if v > INT_MAX:
                raise self.error(f"{field} {v} is larger than {INT_MAX} (INT_MAX), the largest "
                                 f"value Caffe holds in it")
        return values

    # -- lifecycle -----------------------------------------------------------------------------
    def setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        self.check_blob_counts(bottom, top)
        try:
            self.layer_setup(bottom, top)
            # Every param learns unless the net says otherwise (lr_mult 0), as in Caffe.
            self.param_propagate_down = [True] * len(self.blobs)
            self.reshape(bottom, top)
        except BlobShapeError as e:
            raise self.error(str(e)) from None
        self.set_loss_weights(top)

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        """One-time setup: read parameters, create and fill param blobs."""

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        raise NotImplementedError

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        raise NotImplementedError

    def applies_relu(self) -> bool:
        """Whether this layer's ``forward(bottom, top, relu=True)`` writes its one top through
        Caffe's ReLU (negative_slope 0), the bits of an in-place ReLU layer run after it: the net
        then runs such a ReLU inside this layer's forward (Net._find_relu_fusions)."""
        return False

    def takes_relu_backward(self) -> bool:
        """Whether this layer's ``backward(top, propagate_down, bottom, relu=...)`` can run,
        as it writes each bottom diff, the backward of a ReLU in place on that bottom (relu:
        per bottom, None or the ReLU's (src, negative_slope)), the bits of that ReLU's own
        backward run after it: the net then runs such a ReLU inside this layer's backward
        (Net._find_relu_backward_fusions)."""
        return False

    def sibling_key(self) -> Optional[Hashable]:
        """For a layer whose backward the net may run together with its siblings' (the other
        layers reading the same Split, Net._find_sibling_fusions): what those layers must
        share with it to be stacked into one (conv.backward_siblings); None for any other."""
        return None

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        """Write bottom diffs (overwrite) where propagate_down; accumulate param diffs."""

    def allow_force_backward(self, bottom_index: int) -> bool:
        return True

    def batch_share(self, items: int, batch: int) -> float:
        """How this layer's loss on ``items`` of a ``batch`` counts towards the loss of the
        whole batch when the batch is split across devices (cct/scheduler.py): a mean over
        the batch, so ``items / batch``; a layer whose loss is a sum over the batch says 1."""
        return items / batch

    # -- checks --------------------------------------------------------------------------------
    def check_blob_counts(self, bottom: List[Blob], top: List[Blob]) -> None:
        nb, nt = len(bottom), len(top)

        def fail(what, rule, n):
            raise self.error(f"takes {rule} {what} blob(s), but the prototxt gives {n}.")

        if self.exact_num_bottom_blobs >= 0 and nb != self.exact_num_bottom_blobs:
            fail("bottom", f"exactly {self.exact_num_bottom_blobs}", nb)
        if self.min_bottom_blobs >= 0 and nb < self.min_bottom_blobs:
            fail("bottom", f"at least {self.min_bottom_blobs}", nb)
        if self.max_bottom_blobs >= 0 and nb > self.max_bottom_blobs:
            fail("bottom", f"at most {self.max_bottom_blobs}", nb)
        if self.exact_num_top_blobs >= 0 and nt != self.exact_num_top_blobs:
            fail("top", f"exactly {self.exact_num_top_blobs}", nt)
        if self.min_top_blobs >= 0 and nt < self.min_top_blobs:
            fail("top", f"at least {self.min_top_blobs}", nt)
        if self.max_top_blobs >= 0 and nt > self.max_top_blobs:
            fail("top", f"at most {self.max_top_blobs}", nt)
        if self.equal_num_bottom_top_blobs and nb != nt:
            raise self.error(f"needs as many tops as bottoms, got {nb} bottoms and {nt} tops.")

    def check_param_shapes(self, shapes: Sequence[Tuple[int, ...]]) -> None:
        """Check the param blobs the prototxt gave (``blobs`` inside ``layer { }``, now in
        ``self.blobs``) against the shapes the layer would make: ``shapes`` holds the weight
        shape, then the bias shape when the layer has a bias term."""
        if len(self.blobs) != len(shapes):
            raise self.error(f"has {len(self.blobs)} weight blob(s) in the prototxt, "
                             f"expected {len(shapes)} (bias_term: {len(shapes) > 1}).")
        for what, blob, shape in zip(("weight", "bias"), self.blobs, shapes):
            if blob.shape != tuple(shape):
                raise self.error(f"incorrect {what} shape: expected {tuple(shape)}, got "
                                 f"{blob.shape}.")

    def set_loss_weights(self, top: List[Blob]) -> None:
        """Caffe's SetLossWeights: top diffs hold the loss weight, used to start backward."""
        if self.is_loss and not len(self.layer_param.loss_weight):
            # Caffe's LossLayer writes the default into its LayerParameter (it shows up in
            # saved caffemodels); a second top (e.g. SoftmaxWithLoss's prob) weighs 0.
            self.layer_param.loss_weight.append(1.0)
        lw = list(self.layer_param.loss_weight)
        if self.is_loss and len(lw) == 1:
            lw += [0.0] * (len(top) - 1)
        if lw and len(lw) != len(top):
            raise self.error(f"has {len(lw)} loss_weight value(s) but {len(top)} top(s).")
        self.loss_weights = [float(w) for w in lw] + [0.0] * (len(top) - len(lw))
        for t, w in zip(top, self.loss_weights):
            if w:
                t.diff[...] = w
