"""pycaffe's Net facade and the rest of its surface (python/caffe/pycaffe.py and _caffe.cpp):
``net.blobs``/``net.params`` and the other views by name, ``forward``/``backward`` with keyword
arrays, ``set_input_arrays``, the weight files under pycaffe's names (``copy_from``, ``save``,
``save_hdf5``, ``load_hdf5``, ``share_with``), batched ``forward_all`` /
``forward_backward_all``, the multi-GPU names of a CPU build (``has_nccl``, ``NCCL``, solver
count and rank), and ``Timer``.

As pycaffe.py does with _caffe's Net, the facade is attached to the net class itself, so that
nets made by a solver (``solver.net``, ``solver.test_nets``) have it too; cct/net.py keeps the
net's own work (building, running layer ranges, Caffe's accessors) and knows nothing of it.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from itertools import zip_longest
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from . import glog
from .blob import Blob
from .errors import CCTError, NetError
from .io import weights
from .layers.base import Layer
from .net import Net

# -- views by name (pycaffe's Net.blobs, Net.params ...) ---------------------------------------
# On a device backend, pycaffe code gets host views whose .data/.diff are NumPy arrays kept in
# step with the device lazily (cct/blob.py); the layers keep using the device blobs.


def _Net_blobs(self: Net) -> "OrderedDict[str, Blob]":
    """{blob name: blob}, in the net's order."""
    return OrderedDict((n, b.host_view()) for n, b in zip(self.blob_names, self.blobs_list))


def _Net_params(self: Net) -> "OrderedDict[str, List[Blob]]":
    """{layer name: its param blobs}, for the layers that have params."""
    return OrderedDict((n, [b.host_view() for b in l.blobs])
                       for n, l in zip(self.layer_names, self.layers) if l.blobs)


def _Net_layer_dict(self: Net) -> "OrderedDict[str, Layer]":
    return OrderedDict(zip(self.layer_names, self.layers))


def _Net_inputs(self: Net) -> List[str]:
    return [self.blob_names[i] for i in self.input_ids()]


def _Net_outputs(self: Net) -> List[str]:
    return [self.blob_names[i] for i in self.output_ids()]


def _Net_top_names(self: Net) -> "OrderedDict[str, List[str]]":
    return OrderedDict((n, [self.blob_names[b] for b in self.top_ids(i)])
                       for i, n in enumerate(self.layer_names))


def _Net_bottom_names(self: Net) -> "OrderedDict[str, List[str]]":
    return OrderedDict((n, [self.blob_names[b] for b in self.bottom_ids(i)])
                       for i, n in enumerate(self.layer_names))


# -- forward / backward by layer name, with keyword arrays ----------------------------------------


def _layer_index(net: Net, name: str, what: str) -> int:
    i = net.layer_id(name)
    if i is None:
        raise NetError(f"{what}: no layer named '{name}' in net '{net.name}'")
    return i


def _set_blobs(net: Net, arrays: dict, field: str, what: str) -> None:
    for name, value in arrays.items():
        if not net.has_blob(name):
            raise NetError(f"{what}: no blob named '{name}' in net '{net.name}'")
        blob = net.blob_by_name(name)
        value = np.asarray(value)
        if value.shape != blob.shape and value.size != blob.count:
            raise NetError(f"{what}: blob '{name}' has shape {blob.shape}, the given "
                           f"array has shape {value.shape}")
        setattr(blob.host_view(), field, value.reshape(blob.shape))


def _Net_forward(self: Net, blobs: Optional[Sequence[str]] = None, start: Optional[str] = None,
                 end: Optional[str] = None, **kwargs) -> Dict[str, np.ndarray]:
    """pycaffe's Net.forward: set input blobs from keyword arrays, run from layer ``start``
    to ``end`` (names), return {output blob name: data} (the tops of ``end`` if given)."""
    _set_blobs(self, kwargs, "data", "forward")
    start_ind = _layer_index(self, start, "forward start") if start is not None else 0
    if end is not None:
        end_ind = _layer_index(self, end, "forward end")
        outputs = set(self.top_names[end] + list(blobs or []))
    else:
        end_ind = len(self.layers) - 1
        outputs = set(self.outputs + list(blobs or []))
    self.forward_from_to(start_ind, end_ind)
    return {name: self.blob_by_name(name).host_view().data for name in outputs}


def _Net_backward(self: Net, diffs: Optional[Sequence[str]] = None, start: Optional[str] = None,
                  end: Optional[str] = None, **kwargs) -> Dict[str, np.ndarray]:
    """pycaffe's Net.backward: set top diffs from keyword arrays, run backward from layer
    ``start`` down to ``end``, return {input blob name: diff} (the bottoms of ``end``)."""
    _set_blobs(self, kwargs, "diff", "backward")
    start_ind = (_layer_index(self, start, "backward start") if start is not None
                 else len(self.layers) - 1)
    if end is not None:
        end_ind = _layer_index(self, end, "backward end")
        outputs = set(self.bottom_names[end] + list(diffs or []))
    else:
        end_ind = 0
        outputs = set(self.inputs + list(diffs or []))
    self.backward_from_to(start_ind, end_ind)
    return {name: self.blob_by_name(name).host_view().diff for name in outputs}


def _Net_set_input_arrays(self: Net, data, labels, layer: Optional[str] = None) -> None:
    """pycaffe's Net.set_input_arrays: serve ``data`` (N x C x H x W float32, C-contiguous)
    and ``labels`` (N float32) through the net's first MemoryData layer, or the one named
    ``layer``; N must be a multiple of its batch_size."""
    if layer is not None:
        idx = _layer_index(self, layer, "set_input_arrays")
        if self.layers[idx].type != "MemoryData":
            raise NetError(f"set_input_arrays: layer '{layer}' is of type "
                           f"{self.layers[idx].type}, not MemoryData")
    else:
        idx = next((i for i, l in enumerate(self.layers) if l.type == "MemoryData"), None)
        if idx is None:
            raise NetError(f"set_input_arrays needs a MemoryData layer, and net "
                           f"'{self.name}' has none")
    self.layers[idx].reset(data, labels)


# -- weight files under pycaffe's names ------------------------------------------------------------


def _Net_copy_from(self: Net, weights_path: str) -> None:
    """Copy params by layer name from a ``.caffemodel`` or ``.h5`` file."""
    self.copy_trained_layers_from(weights_path)


def _Net_save(self: Net, path: str) -> None:
    """Write the params as a binary ``.caffemodel`` (atomically)."""
    weights.save_caffemodel(self, path)


def _Net_save_hdf5(self: Net, path: str) -> None:
    weights.save_hdf5(self, path)


def _Net_share_with(self: Net, other: Net) -> None:
    self.share_trained_layers_with(other)


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


Net.blobs = property(_Net_blobs)
Net.params = property(_Net_params)
Net.layer_dict = property(_Net_layer_dict)
Net.inputs = property(_Net_inputs)
Net.outputs = property(_Net_outputs)
Net.top_names = property(_Net_top_names)
Net.bottom_names = property(_Net_bottom_names)
Net._blobs = property(lambda self: [b.host_view() for b in self.blobs_list])
Net._blob_names = property(lambda self: self.blob_names)
Net._layer_names = property(lambda self: self.layer_names)
Net.forward = _Net_forward
Net.backward = _Net_backward
Net.set_input_arrays = _Net_set_input_arrays
Net.copy_from = _Net_copy_from
Net.save = _Net_save
Net.save_hdf5 = _Net_save_hdf5
Net.load_hdf5 = _Net_copy_from     # pycaffe's load_hdf5 is CopyTrainedLayersFromHDF5
Net.share_with = _Net_share_with
Net._batch = _batch
Net.forward_all = forward_all
Net.forward_backward_all = forward_backward_all
Net._forward = Net.forward_from_to
Net._set_input_arrays = _Net_set_input_arrays
Net._backward = Net.backward_from_to
Net._inputs = property(lambda self: self.input_ids())
Net._outputs = property(lambda self: self.output_ids())
Net._bottom_ids = Net.bottom_ids
Net._top_ids = Net.top_ids
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
