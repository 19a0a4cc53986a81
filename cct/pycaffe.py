"""The rest of pycaffe's surface (python/caffe/pycaffe.py and _caffe.cpp): batched
``Net.forward_all`` / ``Net.forward_backward_all``, the multi-GPU names of a CPU build
(``has_nccl``, ``NCCL``, solver count and rank), and ``Timer``.

As pycaffe.py does, the batched methods are attached to the net class itself, so that nets made
by a solver (``solver.net``, ``solver.test_nets``) have them too.
"""
from __future__ import annotations

import time
from itertools import zip_longest
from typing import Dict, Iterator, Optional, Sequence, Tuple

import numpy as np

from . import glog
from .errors import CCTError
from .net import Net

# -- batched forward / backward -----------------------------------------------------------------


def _batch(self: Net, blobs: Dict[str, np.ndarray]) -> Iterator[Dict[str, np.ndarray]]:
    """Split {blob name: N x ... array} into batches of the net's batch size (the first
    axis of its first blob); the last batch is padded with zeros."""
    num = len(next(iter(blobs.values())))
    batch_size = self.blobs_list[0].shape[0]
    for i in range(0, num - num % batch_size, batch_size):
        yield {name: blobs[name][i:i + batch_size] for name in blobs}
    remainder = num % batch_size
    if remainder:
        yield {name: np.concatenate([blobs[name][-remainder:],
                                     np.zeros((batch_size - remainder,) + blobs[name].shape[1:])])
               for name in blobs}


def _check_batched_inputs(what: str, kwargs: dict) -> None:
    if not kwargs:
        raise CCTError(f"Net.{what} batches the arrays given as keyword arguments "
                       f"(input_name=N x ... array) and got none; a net fed by data layers "
                       f"runs with forward()")
    sizes = {name: len(value) for name, value in kwargs.items()}
    if len(set(sizes.values())) > 1:
        raise CCTError(f"Net.{what}: the arrays must have the same number of items, got {sizes}")


def _unpad(outs: Dict[str, list], num: int) -> Dict[str, np.ndarray]:
    return {name: np.asarray(values)[:num] for name, values in outs.items()}


def forward_all(self: Net, blobs: Optional[Sequence[str]] = None,
                **kwargs) -> Dict[str, np.ndarray]:
    """pycaffe's Net.forward_all: run forward over inputs of any number N of items, one
    batch at a time; returns {output (and ``blobs``) name: N x ... array}, the padding of the
    last batch dropped."""
    _check_batched_inputs("forward_all", kwargs)
    all_outs = {out: [] for out in set(self.outputs + list(blobs or []))}
    for batch in self._batch(kwargs):
        for out, data in self.forward(blobs=blobs, **batch).items():
            all_outs[out].extend(data.copy())
    return _unpad(all_outs, len(next(iter(kwargs.values()))))


def forward_backward_all(self: Net, blobs: Optional[Sequence[str]] = None,
                         diffs: Optional[Sequence[str]] = None,
                         **kwargs) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """pycaffe's Net.forward_backward_all: forward and backward over inputs (and output
    diffs) of any number of items, batch by batch; returns ({output name: data},
    {input name: diff}), the padding dropped."""
    _check_batched_inputs("forward_backward_all", kwargs)
    all_outs = {out: [] for out in set(self.outputs + list(blobs or []))}
    all_diffs = {diff: [] for diff in set(self.inputs + list(diffs or []))}
    forward_batches = self._batch({k: kwargs[k] for k in self.inputs if k in kwargs})
    backward_batches = self._batch({k: kwargs[k] for k in self.outputs if k in kwargs})
    for fb, bb in zip_longest(forward_batches, backward_batches, fillvalue={}):
        for out, data in self.forward(blobs=blobs, **fb).items():
            all_outs[out].extend(data.copy())
        for diff, data in self.backward(diffs=diffs, **bb).items():
            all_diffs[diff].extend(data.copy())
    num = len(next(iter(kwargs.values())))
    return _unpad(all_outs, num), _unpad(all_diffs, num)


def _no_layer_callbacks(self: Net, *_args) -> None:
    raise CCTError("Net.before_forward/after_forward/before_backward/after_backward: cct's "
                   "nets take no per-layer callbacks; run the net in parts instead with "
                   "net.forward(start=..., end=...) and net.backward(start=..., end=...)")


Net._batch = _batch
Net.forward_all = forward_all
Net.forward_backward_all = forward_backward_all
Net._forward = Net.forward_from_to
Net._set_input_arrays = Net.set_input_arrays
Net._backward = Net.backward_from_to
Net._inputs = property(lambda self: list(self.input_blob_indices))
Net._outputs = property(lambda self: list(self.output_blob_indices))
Net._bottom_ids = lambda self, i: list(self.bottom_id_vecs[i])
Net._top_ids = lambda self, i: list(self.top_id_vecs[i])
Net._blob_loss_weights = property(lambda self: list(self.blob_loss_weights))
for _name in ("before_forward", "after_forward", "before_backward", "after_backward"):
    setattr(Net, _name, _no_layer_callbacks)

# -- multi-GPU names, as a CPU-only Caffe build has them ------------------------------------------

_solver_count = 1
_solver_rank = 0
_multiprocess = False


def has_nccl() -> bool:
    """False: cct has no NCCL (a CPU-only Caffe build answers the same)."""
    return False


def solver_count() -> int:
    """The value of set_solver_count (1 by default); cct's own multi-device training does not
    read it."""
    return _solver_count


def set_solver_count(count: int) -> None:
    global _solver_count
    _solver_count = int(count)


def solver_rank() -> int:
    """The value of set_solver_rank (0 by default)."""
    return _solver_rank


def set_solver_rank(rank: int) -> None:
    global _solver_rank
    _solver_rank = int(rank)


def multiprocess() -> bool:
    """The value of set_multiprocess (False by default)."""
    return _multiprocess


def set_multiprocess(value: bool) -> None:
    global _multiprocess
    _multiprocess = bool(value)


class NCCL:
    """pycaffe's ``caffe.NCCL(solver, uid)``, which cct does not have: constructing it says
    what to use instead."""

    def __init__(self, solver=None, uid: str = ""):
        raise CCTError("caffe.NCCL: cct has no NCCL (caffe.has_nccl() is False). To train on "
                       "several devices use `cct train --solver=... --devices=cpu,gpu0,...`, "
                       "solver.use_devices('gpu0,gpu1') in Python, or the driver's --groups "
                       "for asynchronous groups")

    @staticmethod
    def new_uid() -> str:
        raise CCTError("caffe.NCCL.new_uid: cct has no NCCL (caffe.has_nccl() is False); see "
                       "caffe.NCCL for what to use instead")


class Timer:
    """pycaffe's ``caffe.Timer`` (Caffe's CPU timer): ``start()``, ``stop()``, ``ms``."""

    def __init__(self):
        self._start: Optional[float] = None
        self._elapsed = 0.0
        self._running = False

    def start(self) -> None:
        if not self._running:
            self._start = time.perf_counter()
            self._running = True

    def stop(self) -> None:
        if self._running:
            self._elapsed = time.perf_counter() - self._start
            self._running = False

    @property
    def ms(self) -> float:
        """Milliseconds from start() to stop() (stopping a running timer first); 0 with a
        warning when it never ran."""
        if self._start is None:
            glog.warning("timer.cpp:0", "Timer has never been run before reading time.")
            return 0.0
        self.stop()
        return self._elapsed * 1000.0
