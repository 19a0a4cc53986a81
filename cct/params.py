"""A parameter set: Caffe's learnable params as the update sees them (``Net::learnable_params_``
with ``params_lr_`` and ``params_weight_decay_``).

The update pipeline (:mod:`cct.solver_rules`) acts on one of these, not on a Net, so that the
same rule updates a net's own blobs (the solver), a parameter store's copy shared by
asynchronous groups (:mod:`cct.driver`), or a shard of it. A ParamSet holds the blobs
themselves (their ``data`` and ``diff`` arrays, in the net's order) and each one's
``lr_mult`` and ``decay_mult``; copying in and out goes through preallocated arrays, since on
these machines first-touch of fresh memory costs about 20x a copy.
"""
from __future__ import annotations

from typing import Collection, List, Protocol, Sequence

import numpy as np

from .backend import alongside, copy as _copy, get as get_backend, host as _host


def statistics_positions(net) -> List[int]:
    """Positions in ``net.learnable_params`` of what a forward pass changes rather than an
    update: BatchNorm's running mean, variance and factor (Caffe masks them with lr_mult 0).
    Replicas of a net each keep their own, as each of Caffe's multi-GPU solvers does; the train
    net takes the first replica's for tests and snapshots."""
    running = {id(b) for layer in net.layers if layer.layer_param.type == "BatchNorm"
               for b in layer.blobs}
    return [k for k, b in enumerate(net.learnable_params) if id(b) in running]


class ParamSet:
    """The learnable blobs with their multipliers. ``blobs[i]`` has ``data``, ``diff``,
    ``shape``, ``dtype`` and ``xp`` (a Blob or a :class:`StoreBlob`)."""

    def __init__(self, blobs: Sequence, lr_mult: Sequence[float], decay_mult: Sequence[float],
                 backend=None):
        if not len(blobs) == len(lr_mult) == len(decay_mult):
            raise ValueError("a ParamSet needs one lr_mult and one decay_mult per blob")
        self.blobs = list(blobs)
        self.lr_mult = [float(m) for m in lr_mult]
        self.decay_mult = [float(m) for m in decay_mult]
        self.backend = backend if backend is not None else get_backend("cpu")

    @classmethod
    def of_net(cls, net) -> "ParamSet":
        """The net's learnable params themselves (an update changes the net), with the
        multipliers of its :meth:`~cct.net.Net.param_table`."""
        table = net.param_table()
        return cls(net.learnable_params, [row.lr_mult for row in table],
                   [row.decay_mult for row in table], net.backend)

    @classmethod
    def copy_of(cls, params: "ParamSet") -> "ParamSet":
        """Host arrays of the same shapes holding a copy of ``params``' weights and zero
        gradients (a parameter store's own copy)."""
        blobs = [StoreBlob(np.array(_host(b.data), copy=True)) for b in params.blobs]
        return cls(blobs, params.lr_mult, params.decay_mult, get_backend("cpu"))

    def __len__(self) -> int:
        return len(self.blobs)

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(b.shape)) * np.dtype(b.dtype).itemsize for b in self.blobs)

    def weights(self) -> List:
        return [b.data for b in self.blobs]

    def gradients(self) -> List:
        return [b.diff for b in self.blobs]

    def copy_weights_to(self, other: "ParamSet", skip: Collection[int] = ()) -> None:
        for k, (mine, theirs) in enumerate(zip(self.blobs, other.blobs)):
            if k not in skip:
                _copy(theirs.data, mine.data)

    def set_weights(self, arrays: Sequence) -> None:
        for b, a in zip(self.blobs, arrays):
            _copy(b.data, a)

    def set_gradients(self, arrays: Sequence) -> None:
        for b, a in zip(self.blobs, arrays):
            _copy(b.diff, a)

    def add_gradients(self, arrays: Sequence) -> None:
        for b, a in zip(self.blobs, arrays):
            b.diff += alongside(b.diff, a)

    def clear_gradients(self) -> None:
        for b in self.blobs:
            b.diff[...] = 0

    def with_gradients_of(self, other: "ParamSet") -> "ParamSet":
        """These weights with ``other``'s gradients, neither copied: an update through it
        changes these weights and reads (and scales in place) ``other``'s diffs."""
        return ParamSet([StoreBlob.pair(b.data, o.diff, b.xp)
                         for b, o in zip(self.blobs, other.blobs)],
                        self.lr_mult, self.decay_mult, self.backend)


class GradientSource(Protocol):
    """What computes a solver's gradients: "forward/backward the next batch with the current
    weights and leave the summed gradient in the param diffs". The train net itself
    (:class:`NetSource`) or a HybridScheduler over devices (cct/scheduler.py)."""

    def compute_gradients(self) -> float:
        """Forward and backward one batch; the param diffs gain its gradient; its loss."""

    def compute_loss(self) -> float:
        """Forward one batch only; its loss."""

    def pull_statistics(self) -> None:
        """Bring back into the train net what only the source's copies hold (BatchNorm's
        running averages), before a test or a snapshot."""

    def refresh(self) -> None:
        """The train net's params were replaced (a restored snapshot): copies follow."""

    def close(self) -> None:
        """Release threads and copies (not the train net itself)."""


class NetSource:
    """The train net computing its own gradients: the plain one-device path. With ``defer``
    a device net's losses come back still on the device (cct.net.PendingLoss), for a solver
    that reads them when it shows them."""

    def __init__(self, net, defer: bool = False):
        self.net = net
        self.defer = defer

    def compute_gradients(self):
        return self.net.forward_backward(self.defer)

    def compute_loss(self):
        return self.net.forward_prefilled(self.defer)

    def pull_statistics(self) -> None:
        """Nothing is held elsewhere."""

    def refresh(self) -> None:
        """The params are the net's own."""

    def close(self) -> None:
        """The solver closes its nets."""


class StoreBlob:
    """A learnable array and its gradient outside any net (host memory unless paired with
    device arrays)."""

    xp = np

    def __init__(self, data: np.ndarray):
        self.data = data
        self.diff = np.zeros_like(data)

    @classmethod
    def pair(cls, data, diff, xp=np) -> "StoreBlob":
        """A data array and a diff array that live elsewhere (``xp``: their array module)."""
        blob = cls.__new__(cls)
        blob.data, blob.diff, blob.xp = data, diff, xp
        return blob

    @property
    def shape(self):
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype
