"""Snapshots (Caffe's Solver::Snapshot and Restore, with SGDSolver's state files): the train
net's weights, the ``.solverstate`` that Caffe reads and writes, and cct's side file beside it
(the random generator, the data layers' positions, the kernel plans, the drivers' extras) for
a resume that repeats the interrupted run bit for bit; and in-memory captures of the same.

A :class:`Checkpoints` is given the solver's nets, history and side-state table; the solver
keeps ``iter`` and ``current_step`` and hands them over to write, and takes them back on
restore.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from .. import rng
from ..backend import host as _host, plans
from ..errors import CCTError, WeightsError
from ..glog import info, logger
from ..io import weights
from ..io.atomic import atomic_write, remove_stale_temp_files
from ..io.solverstate import (is_hdf5, read_solver_state, read_solver_state_hdf5,
                              write_solver_state, write_solver_state_hdf5)
from ..net import Net
from ..proto import caffe_pb2
from ..solver_rules import UpdateRule

BINARYPROTO = caffe_pb2.SolverParameter.BINARYPROTO
HDF5 = caffe_pb2.SolverParameter.HDF5
SIDE_SUFFIX = ".cct.json"   # cct's own resume extras beside a solver state (rng, data cursors)

#: name -> (save(state path) -> JSON, load(JSON, state path)): what drivers keep beside a state
SideState = Dict[str, Tuple[Callable[[str], object], Callable[[object, str], None]]]


def snapshot_filename(param: caffe_pb2.SolverParameter, extension: str, iter_: int) -> str:
    return f"{param.snapshot_prefix}_iter_{iter_}{extension}"


def check_snapshot_write_permissions(param: caffe_pb2.SolverParameter, source: str) -> None:
    """Caffe's CheckSnapshotWritePermissions: a probe file written and removed under the
    prefix, so that a bad prefix fails now rather than at the first snapshot."""
    if not param.snapshot:
        return
    if not param.HasField("snapshot_prefix"):
        raise CCTError(f"{source}: snapshot is specified ({param.snapshot}) but "
                       f"snapshot_prefix is not; set snapshot_prefix (e.g. "
                       f"\"snapshots/mynet\").")
    probe = snapshot_filename(param, ".tempfile", 0)
    try:
        with open(probe, "w"):
            pass
        os.remove(probe)
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the prefix
        raise CCTError(f"{source}: Cannot write to snapshot prefix "
                       f"'{param.snapshot_prefix}' ({getattr(e, 'strerror', None) or e}). Make "
                       f"sure that the directory exists and is writable.") from None


class _SnapshotFiles(NamedTuple):
    """One snapshot_format's files: extensions, writers, and Caffe's log tags and wording."""
    model: str
    state: str
    what: str
    save_model: Callable
    save_state: Callable
    model_tag: str
    state_tag: str


_BINARY_FILES = _SnapshotFiles(".caffemodel", ".solverstate", "binary proto",
                               weights.save_caffemodel, write_solver_state,
                               "solver.cpp:464", "sgd_solver.cpp:284")
_HDF5_FILES = _SnapshotFiles(".caffemodel.h5", ".solverstate.h5", "HDF5", weights.save_hdf5,
                             write_solver_state_hdf5, "solver.cpp:474", "sgd_solver.cpp:296")


class Checkpoints:
    """Snapshots of a solver's train net ``net`` and ``history`` (the update's state, restored
    in place), the data layers of ``net`` and ``test_nets``, and ``side_state`` (the drivers'
    extras, read at each write and restore). ``rule`` names the history's layout in messages,
    ``source`` the solver."""

    def __init__(self, param: caffe_pb2.SolverParameter, source: str, net: Net,
                 test_nets: List[Net], history: List, rule: UpdateRule, side_state: SideState):
        self.param = param
        self.source = source
        self.net = net
        self.test_nets = test_nets
        self.history = history
        self.rule = rule
        self.side_state = side_state

    # -- writing -----------------------------------------------------------------------------
    def write(self, iter_: int, current_step: int) -> Tuple[str, str]:
        """Write the train net's weights and the solver state at ``iter_``; (model, state).
        Each file is written to a temporary name and renamed, in the order model, side file,
        state: wherever the writing stops, a new state (what a resume starts from) exists only
        with the model and side file written with it, and a side file without its state is
        never read. (Overwriting another run's snapshot of the same name can still pair its
        old state with the new model, as in Caffe, and with the new side file.)"""
        p = self.param
        self._remove_stale_temp_files()
        f = _HDF5_FILES if p.snapshot_format == HDF5 else _BINARY_FILES
        model = snapshot_filename(p, f.model, iter_)
        info(f.model_tag, f"Snapshotting to {f.what} file {model}")
        f.save_model(self.net, model, p.snapshot_diff)
        state = snapshot_filename(p, f.state, iter_)
        self._write_side_file(state, model, iter_)
        info(f.state_tag, f"Snapshotting solver state to {f.what} file {state}")
        f.save_state(state, iter_, model, current_step, [_host(h) for h in self.history])
        return model, state

    def _remove_stale_temp_files(self) -> None:
        """Temporary snapshot files left by a process killed while writing (any
        ``<prefix>_iter_*.tmp-<pid>`` whose writer is gone)."""
        prefix = self.param.snapshot_prefix
        for path in remove_stale_temp_files(os.path.dirname(prefix),
                                            os.path.basename(prefix) + "_iter_"):
            info("solver.cpp:0", f"Removed {path}, left by an interrupted snapshot")

    def data_layers(self, test_data: bool = True):
        """(net key, layer name, layer) of every layer that can save its data position (the
        test nets' too unless ``test_data`` is False)."""
        nets = [("train", self.net)] + [(f"test{i}", n) for i, n in enumerate(self.test_nets)
                                        if test_data]
        for key, net in nets:
            for name, layer in zip(net.layer_names, net.layers):
                if callable(getattr(layer, "data_state", None)):
                    yield key, name, layer

    def _write_side_file(self, state: str, model: str, iter_: int) -> None:
        """cct's extras for an exact resume, beside the state (Caffe's files stay pure)."""
        side = {"format": 1, "iter": iter_, "learned_net": model,
                "rng": rng.get_rng().bit_generator.state, "data": {}, "plans": plans.table()}
        for key, name, layer in self.data_layers():
            side["data"].setdefault(key, {})[name] = layer.data_state()
        for key, (save, _) in self.side_state.items():
            side[key] = save(state)
        try:
            text = json.dumps(side, default=_json_default)
        except TypeError as e:
            raise CCTError(f"cannot save the data layers' positions beside '{state}': {e} "
                           f"(data_state() must return JSON-compatible values).") from None
        atomic_write(state + SIDE_SUFFIX, lambda tmp: _write_bytes(tmp, text.encode()))

    # -- restoring ---------------------------------------------------------------------------
    def read_state(self, state_file: str) -> dict:
        """A ``.solverstate`` (binary) or ``.solverstate.h5`` written by Caffe or cct, checked
        against this solver's history, with ``model``: its ``learned_net`` found (or '')."""
        if not os.path.isfile(state_file):
            raise CCTError(f"solver state '{state_file}' does not exist.")
        state = read_solver_state_hdf5(state_file) if is_hdf5(state_file) \
            else read_solver_state(state_file)
        history = state["history"]
        if len(history) != len(self.history):
            raise CCTError(f"solver state '{state_file}' holds {len(history)} history blobs; "
                           f"this {self.rule.type} solver keeps {len(self.history)} ("
                           f"{self.rule.history_sets} per learnable param x "
                           f"{len(self.net.learnable_params)} params). Was it written by another "
                           f"solver type or for another net? (Incorrect length of history "
                           f"blobs.)")
        for i, (h, mine) in enumerate(zip(history, self.history)):
            if h.size != mine.size:
                raise CCTError(f"solver state '{state_file}': history blob {i} has shape "
                               f"{h.shape} but the net needs {tuple(mine.shape)} there; the "
                               f"state belongs to another net.")
        state["model"] = state["learned_net"] and _find_learned_net(state["learned_net"],
                                                                    state_file)
        state["file"] = state_file
        return state

    def load_learned_net(self, state: dict) -> None:
        """The weights the state names into the train net."""
        model = state["model"]
        if not model:
            return
        try:
            self.net.copy_trained_layers_from(model)
        except CCTError as e:
            raise WeightsError(f"solver state '{state['file']}' names the weights file "
                               f"'{model}' (learned_net), which cannot be used: {e}") from None

    def load_history(self, state: dict) -> None:
        """The state's history into the solver's, in place."""
        if not state["hdf5"]:
            info("sgd_solver.cpp:336", "SGDSolver: restoring history")
        for h, mine in zip(state["history"], self.history):
            mine[...] = self.net.backend.xp.asarray(h.reshape(mine.shape), dtype=mine.dtype)

    def read_side_file(self, state: dict) -> None:
        """Restore what cct's side file keeps beside the state: the random generator, the
        data layers' positions, the kernel plans, the drivers' extras. A missing, damaged or
        mismatched side file is logged and never fatal: the run resumes as from a Caffe
        state, only not bit for bit."""
        path = state["file"] + SIDE_SUFFIX
        side = _load_side_file(path, state)
        if side is None:
            return
        if side.get("rng") is not None:
            generator = rng.get_rng().bit_generator
            before = generator.state
            try:
                generator.state = side["rng"]
            except Exception as e:  # NumPy refuses a damaged state with various errors
                generator.state = before
                _side_warning(path, f"its random generator state is unusable "
                                    f"({type(e).__name__}: {e})")
        if "plans" in side:
            # The kernels' plans round differently: the interrupted run's plans, not this
            # machine's, make the resumed run repeat it to the bit.
            try:
                plans.install(side["plans"])
            except ValueError as e:
                _side_warning(path, f"its kernel plans are unusable ({e})")
        for key, (_, load) in self.side_state.items():
            if key in side:
                try:
                    load(side[key], state["file"])
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    _side_warning(path, f"its '{key}' entry is unusable ({type(e).__name__}: "
                                        f"{e})")
        self._load_data_positions(path, side.get("data", {}))

    def _load_data_positions(self, path: str, saved: dict) -> None:
        for key, name, layer in self.data_layers():
            d = saved.get(key, {}).get(name)
            if d is None or not callable(getattr(layer, "load_data_state", None)):
                continue
            before = layer.data_state()
            try:
                layer.load_data_state(d)
            except Exception as e:  # the saved values may be damaged in any way
                layer.load_data_state(before)
                _side_warning(path, f"the data position of layer '{name}' ({key} net) is "
                                    f"unusable ({type(e).__name__}: {e}); it goes on from "
                                    f"where it is")

    # -- in memory ---------------------------------------------------------------------------
    def capture(self) -> dict:
        """Copies of every train net param (learnable or not, BatchNorm's statistics too), the
        history, the random generator and the data layers' positions."""
        return {"params": [np.array(_host(p.data), copy=True) for p in self.net.params_list],
                "history": [np.array(_host(h), copy=True) for h in self.history],
                "rng": rng.get_rng().bit_generator.state,
                "data": {(k, n): layer.data_state() for k, n, layer in self.data_layers()}}

    def restore_capture(self, captured: dict, test_data: bool = True) -> None:
        """Back to a :meth:`capture`: params and history bit for bit, the random generator and
        the data layers' positions (their prefetch restarts there); with ``test_data`` False
        the test nets' data layers stay where they are."""
        xp = self.net.backend.xp
        for p, a in zip(self.net.params_list, captured["params"]):
            p.data[...] = xp.asarray(a)
        for h, a in zip(self.history, captured["history"]):
            h[...] = xp.asarray(a)
        rng.get_rng().bit_generator.state = captured["rng"]
        for key, name, layer in self.data_layers(test_data):
            state = captured["data"].get((key, name))
            if state is not None and callable(getattr(layer, "load_data_state", None)):
                layer.load_data_state(state)


def _load_side_file(path: str, state: dict) -> Optional[dict]:
    """The side file's contents when they belong to ``state`` and have the layout
    :meth:`Checkpoints._write_side_file` writes (other keys are ignored); otherwise None,
    logged."""
    if not os.path.isfile(path):
        logger.info(f"{path} is absent (a state written by Caffe, or by cct before side "
                    f"files): the random generator and the data layers start afresh, so the "
                    f"resumed run will not repeat an uninterrupted one bit for bit.")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            side = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        _side_warning(path, f"it cannot be read ({e})")
        return None
    if not isinstance(side, dict):
        _side_warning(path, f"it holds a JSON {type(side).__name__}, not cct's object of "
                            f"format 1")
        return None
    if side.get("format") != 1:
        _side_warning(path, f"its format is {side.get('format')!r}; this cct reads format 1")
        return None
    learned_net = side.get("learned_net")
    if side.get("iter") != state["iter"] or not isinstance(learned_net, str) or \
            os.path.basename(learned_net) != os.path.basename(state["learned_net"]):
        _side_warning(path, f"it was written for iteration {side.get('iter')!r} and weights "
                            f"{learned_net!r}, the state is at iteration {state['iter']} with "
                            f"weights '{state['learned_net']}' (left over from another run?)")
        return None
    data = side.get("data", {})
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        _side_warning(path, "its 'data' entry is not an object of {net: {layer: position}}")
        return None
    return side


def _side_warning(path: str, why: str) -> None:
    logger.warning(f"{path}: {why}; the resumed run will not repeat the interrupted one bit "
                   f"for bit.")


def _find_learned_net(model: str, state_file: str) -> str:
    """The learned_net path as Caffe takes it (relative to the current directory), else
    beside the state file."""
    folder = os.path.dirname(state_file)
    candidates = [model]
    if not os.path.isabs(model):
        candidates += [os.path.join(folder, model), os.path.join(folder, os.path.basename(model))]
    for c in candidates:
        if os.path.isfile(c):
            return c
    raise WeightsError(f"solver state '{state_file}' names the weights file '{model}' "
                       f"(learned_net), which does not exist (looked in the current directory "
                       f"and beside the state: {', '.join(dict.fromkeys(candidates))}).")


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _json_default(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, bytes):
        return o.decode("latin-1")
    raise TypeError(f"cannot save {type(o).__name__} in {SIDE_SUFFIX}")
