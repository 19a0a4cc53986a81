"""Solver state files as Caffe writes them: binary ``.solverstate`` (a SolverState message)
and ``.solverstate.h5`` (datasets iter, learned_net, current_step, group history/).

History blobs travel through ``caffe_raw.proto``'s SolverStateRaw, whose blob data are bytes
(the same wire encoding as Caffe's packed floats), so big histories move as whole buffers.
"""
from __future__ import annotations

import math
from typing import List

import numpy as np
from google.protobuf import unknown_fields

from ..errors import CCTError
from ..proto import caffe_raw_pb2
from .atomic import atomic_write
from .blobproto import blob_shape_of
from .weights import H5_ERRORS, HDF5_MAGIC, h5_array, h5_numbered

#: SolverState's iter and current_step are int32 fields (C's INT_MAX, Caffe's blob limit too).
INT_MAX = 2 ** 31 - 1


def is_hdf5(path: str) -> bool:
    if path.endswith(".h5"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(8) == HDF5_MAGIC
    except OSError:  # the reader it leads to says why
        return False


def not_a_state(path: str) -> CCTError:
    return CCTError(f"'{path}' is a model (.caffemodel: trained weights), not a solver state; "
                    f"resuming expects the .solverstate (or .solverstate.h5) written with it. "
                    f"To start training from these weights instead, use -weights {path}.")


def _history_array(bp) -> np.ndarray:
    arr = (np.frombuffer(bp.double_data, "<f8") if bp.double_data
           else np.frombuffer(bp.data, "<f4"))
    has_shape = bp.HasField("shape") or bp.num or bp.channels or bp.height or bp.width
    shape = blob_shape_of(bp) if has_shape else (arr.size,)
    if math.prod(shape) != arr.size:
        raise ValueError(f"a history blob of shape {shape} holds {arr.size} values")
    return arr.reshape(shape)


def read_solver_state(path: str) -> dict:
    """A binary ``.solverstate``: {iter, learned_net, current_step, history: [arrays], hdf5}.
    A ``.caffemodel`` given instead is recognised and refused with a message saying so."""
    if path.endswith(".caffemodel"):
        raise not_a_state(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CCTError(f"cannot read solver state '{path}': {e.strerror or e}") from None
    try:
        state = caffe_raw_pb2.SolverStateRaw.FromString(data)
        history = [_history_array(bp) for bp in state.history]
    except Exception as e:  # protobuf's DecodeError, or a blob whose size does not fit
        raise CCTError(f"solver state '{path}' is not a valid binary SolverState: it is "
                       f"truncated or not a .solverstate ({e}).") from None
    if len(unknown_fields.UnknownFieldSet(state)):
        # A NetParameter's name (field 1 as a string) and layers (field 100) land here.
        raise not_a_state(path)
    # protobuf hands back a string field that is not UTF-8 as bytes.
    learned_net = _text(state.learned_net, f"solver state '{path}': learned_net")
    return _checked({"iter": state.iter, "learned_net": learned_net,
                     "current_step": state.current_step, "history": history, "hdf5": False},
                    path)


def solver_state_bytes(iter_: int, learned_net: str, current_step: int,
                       history: List[np.ndarray]) -> bytes:
    """A serialized SolverState, byte for byte as Caffe writes it (iter, learned_net,
    history..., current_step; history blobs as shape + float data, double_data for float64)."""
    state = caffe_raw_pb2.SolverStateRaw(iter=iter_, learned_net=learned_net,
                                         current_step=current_step)
    for h in history:
        bp = state.history.add()
        bp.shape.dim.extend(h.shape)
        if h.size:
            if h.dtype == np.float64:
                bp.double_data = np.ascontiguousarray(h, "<f8").tobytes()
            else:
                bp.data = np.ascontiguousarray(h, "<f4").tobytes()
    return state.SerializeToString()


def write_solver_state(path: str, iter_: int, learned_net: str, current_step: int,
                       history: List[np.ndarray]) -> None:
    data = solver_state_bytes(iter_, learned_net, current_step, history)

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write(path, write)


def read_solver_state_hdf5(path: str) -> dict:
    """A ``.solverstate.h5`` as Caffe writes it (iter, learned_net, current_step, history/i)."""
    import h5py
    try:
        with h5py.File(path, "r") as f:
            if "iter" not in f:
                if "data" in f:
                    raise not_a_state(path)
                raise CCTError(f"HDF5 file '{path}' is not a solver state: it has no 'iter' "
                               f"dataset (expected iter, learned_net, current_step, history/).")
            out = {"iter": _h5_int(f, "iter", path), "learned_net": "", "current_step": 0,
                   "history": [], "hdf5": True}
            if "learned_net" in f:
                out["learned_net"] = _h5_string(f.get("learned_net"), path)
            if "current_step" in f:
                out["current_step"] = _h5_int(f, "current_step", path)
            if "history" not in f:
                raise CCTError(f"solver state '{path}' has no 'history' group.")
            where = f"solver state '{path}': history"
            out["history"] = [h5_array(ds, f"{where}/{i}", "history values")
                              for i, ds in enumerate(h5_numbered(f.get("history"), where))]
    except H5_ERRORS as e:
        raise CCTError(f"cannot read HDF5 solver state '{path}': it is damaged or not written "
                       f"by Caffe ({type(e).__name__}: {e})") from None
    return _checked(out, path)


def _h5_int(f, name: str, path: str) -> int:
    """Caffe's hdf5_load_int: a dataset holding one integer."""
    value = h5_array(f.get(name), f"solver state '{path}': {name}", "one integer")
    if value.size != 1 or value.dtype.kind not in "iu":
        raise CCTError(f"solver state '{path}': {name} holds {value.size} value(s) of type "
                       f"'{value.dtype}'; expected one integer")
    return int(value.reshape(-1)[0])


def _h5_string(obj, path: str) -> str:
    """Caffe's hdf5_load_string: one string, fixed length (NUL-terminated) or variable."""
    import h5py
    where = f"solver state '{path}': learned_net"
    if not (isinstance(obj, h5py.Dataset) and obj.shape is not None
            and obj.dtype.kind in "SO" and obj.size == 1):
        raise CCTError(f"{where} is not a dataset holding one string; expected the path of the "
                       f".caffemodel written with the state")
    raw = np.asarray(obj[()]).reshape(-1)[0]
    if isinstance(raw, bytes):
        raw = raw.split(b"\0")[0]
    return _text(raw, where)


def _text(raw, where: str) -> str:
    """learned_net (str, or bytes where they are not UTF-8) as text: a file name, which must
    be UTF-8 to be opened here."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CCTError(f"{where} is {raw[:80]!r}, which is not UTF-8 text; expected the path "
                       f"of the .caffemodel written with the state") from None


def _checked(state: dict, path: str) -> dict:
    """Refuse field values no solver writes: a negative iteration reaches the learning rate
    policies (a negative power of a negative number, say), and a negative step index would
    read the multistep list from its end."""
    for key in ("iter", "current_step"):
        if not 0 <= state[key] <= INT_MAX:
            raise CCTError(f"solver state '{path}': {key} is {state[key]}; expected a count "
                           f"from 0 to {INT_MAX}, as a solver writes it")
    return state


def _h5_save_string(f, name: str, value: str) -> None:
    """Caffe's H5LTmake_dataset_string: a scalar fixed-length, NUL-terminated string."""
    import h5py
    b = value.encode("utf-8") + b"\0"
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(len(b))
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    space = h5py.h5s.create(h5py.h5s.SCALAR)
    dset = h5py.h5d.create(f.id, name.encode(), tid, space)
    dset.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array(b, dtype=f"S{len(b)}"), mtype=tid)


def write_solver_state_hdf5(path: str, iter_: int, learned_net: str, current_step: int,
                            history: List[np.ndarray]) -> None:
    import h5py

    def write(tmp):
        with h5py.File(tmp, "w") as f:
            f.create_dataset("iter", data=np.array([iter_], np.int32))
            _h5_save_string(f, "learned_net", learned_net)
            f.create_dataset("current_step", data=np.array([current_step], np.int32))
            g = f.create_group("history")
            for i, h in enumerate(history):
                g.create_dataset(str(i), data=h)
    atomic_write(path, write)
