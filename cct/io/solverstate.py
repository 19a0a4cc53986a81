"""Solver state files as Caffe writes them: binary ``.solverstate`` (a SolverState message)
and ``.solverstate.h5`` (datasets iter, learned_net, current_step, group history/).

History blobs travel through ``caffe_raw.proto``'s SolverStateRaw, whose blob data are bytes
(the same wire encoding as Caffe's packed floats), so big histories move as whole buffers.
"""
from __future__ import annotations

from typing import List

import numpy as np
from google.protobuf import unknown_fields

from ..errors import CCTError
from ..proto import caffe_raw_pb2
from .weights import _atomic_write, blob_shape_of

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def is_hdf5(path: str) -> bool:
    if path.endswith(".h5"):
        return True
    with open(path, "rb") as f:
        return f.read(8) == HDF5_MAGIC


def not_a_state(path: str) -> CCTError:
    return CCTError(f"'{path}' is a model (.caffemodel: trained weights), not a solver state; "
                    f"resuming expects the .solverstate (or .solverstate.h5) written with it. "
                    f"To start training from these weights instead, use -weights {path}.")


def _history_array(bp) -> np.ndarray:
    arr = (np.frombuffer(bp.double_data, "<f8") if bp.double_data
           else np.frombuffer(bp.data, "<f4"))
    has_shape = bp.HasField("shape") or bp.num or bp.channels or bp.height or bp.width
    shape = blob_shape_of(bp) if has_shape else (arr.size,)
    if int(np.prod(shape, dtype=np.int64)) != arr.size:
        raise ValueError(f"a history blob of shape {shape} holds {arr.size} values")
    return arr.reshape(shape)


def read_solver_state(path: str) -> dict:
    """A binary ``.solverstate``: {iter, learned_net, current_step, history: [arrays], hdf5}.
    A ``.caffemodel`` given instead is recognised and refused with a message saying so."""
    if path.endswith(".caffemodel"):
        raise not_a_state(path)
    with open(path, "rb") as f:
        data = f.read()
    try:
        state = caffe_raw_pb2.SolverStateRaw.FromString(data)
        history = [_history_array(bp) for bp in state.history]
    except Exception as e:  # protobuf's DecodeError, or a blob whose size does not fit
        raise CCTError(f"solver state '{path}' is not a valid binary SolverState: it is "
                       f"truncated or not a .solverstate ({e}).") from None
    if len(unknown_fields.UnknownFieldSet(state)):
        # A NetParameter's name (field 1 as a string) and layers (field 100) land here.
        raise not_a_state(path)
    return {"iter": state.iter, "learned_net": state.learned_net,
            "current_step": state.current_step, "history": history, "hdf5": False}


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
    _atomic_write(path, write)


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
            out = {"iter": int(np.asarray(f["iter"]).reshape(-1)[0]), "learned_net": "",
                   "current_step": 0, "history": [], "hdf5": True}
            if "learned_net" in f:
                raw = f["learned_net"][()]
                raw = raw.tobytes() if isinstance(raw, np.ndarray) else raw
                out["learned_net"] = (raw.split(b"\0")[0].decode("utf-8")
                                      if isinstance(raw, bytes) else str(raw))
            if "current_step" in f:
                out["current_step"] = int(np.asarray(f["current_step"]).reshape(-1)[0])
            if "history" not in f:
                raise CCTError(f"solver state '{path}' has no 'history' group.")
            group = f["history"]
            for i in range(len(group)):
                if str(i) not in group:
                    raise CCTError(f"solver state '{path}': history/{i} is missing.")
                out["history"].append(np.asarray(group[str(i)]))
    except OSError as e:
        raise CCTError(f"cannot read HDF5 solver state '{path}': {e}") from None
    return out


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
    _atomic_write(path, write)
