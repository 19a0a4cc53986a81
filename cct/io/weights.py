"""Weights: ``.caffemodel`` (binary NetParameter) and Caffe's HDF5 layout, read and written
without per-element Python loops (blob data moves as whole NumPy arrays)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Union

import numpy as np

from ..errors import WeightsError
from ..glog import info
from ..proto import caffe_pb2, caffe_raw_pb2
from . import upgrade
from .atomic import atomic_write
from .blobproto import blob_from_proto, raw_array, raw_blob
from .prototxt import read_net_binary

if TYPE_CHECKING:
    from ..net import Net

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def net_to_proto(net: "Net", write_diff: bool = False) -> caffe_pb2.NetParameter:
    """Caffe's Net::ToProto as a regular NetParameter (every layer, Splits included, with its
    blobs). For files use :func:`save_caffemodel`, which writes the same bytes faster."""
    return caffe_pb2.NetParameter.FromString(_net_to_raw(net, write_diff).SerializeToString())


def _net_to_raw(net: "Net", write_diff: bool) -> "caffe_raw_pb2.NetParameterRaw":
    out = caffe_raw_pb2.NetParameterRaw(name=net.name)
    for layer in net.layers:
        head = caffe_pb2.LayerParameter()
        head.CopyFrom(layer.layer_param)
        del head.blobs[:]
        lr = out.layer.add()
        # Fields 1..11 parse as known fields, the *_param messages (100+) as unknown fields
        # kept in order: re-serialised, the layer has Caffe's field order.
        lr.MergeFromString(head.SerializeToString())
        for b in layer.blobs:
            raw_blob(b.cpu_data(), lr.blobs.add(), b.cpu_diff() if write_diff else None)
    return out


def save_caffemodel(net: "Net", path: str, write_diff: bool = False) -> None:
    """Write the net's params as a binary NetParameter (Caffe's .caffemodel), atomically."""
    data = _net_to_raw(net, write_diff).SerializeToString()

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write(path, write)


def save_hdf5(net: "Net", path: str, write_diff: bool = False) -> None:
    """Caffe's Net::ToHDF5: group ``data`` (and ``diff``) with one group per layer holding
    datasets ``0``, ``1``, ... of the layer's params."""
    import h5py

    def write(tmp):
        with h5py.File(tmp, "w") as f:
            groups = [f.create_group("data")] + ([f.create_group("diff")] if write_diff else [])
            for name, layer in zip(net.layer_names, net.layers):
                g_data = groups[0].create_group(name)
                g_diff = groups[1].create_group(name) if write_diff else None
                for i, b in enumerate(layer.blobs):
                    g_data.create_dataset(str(i), data=np.asarray(b.cpu_data(), np.float32))
                    if g_diff is not None:
                        g_diff.create_dataset(str(i), data=np.asarray(b.cpu_diff(), np.float32))
    atomic_write(path, write)


def load_weights(path: str) -> "dict[str, list[np.ndarray]]":
    """{layer name: [param arrays]} from a .caffemodel (current, V1 or V0 layout) or Caffe's
    HDF5 weights file."""
    if not os.path.isfile(path):
        raise WeightsError(f"weights file '{path}' does not exist")
    try:
        with open(path, "rb") as f:
            data = f.read(len(HDF5_MAGIC))
            if data != HDF5_MAGIC:
                data += f.read()
    except OSError as e:
        raise WeightsError(f"cannot read weights file '{path}': {e.strerror or e}") from None
    if data == HDF5_MAGIC:
        return _load_hdf5(path)
    try:
        raw = caffe_raw_pb2.NetParameterRaw.FromString(data)
    except Exception:
        raise WeightsError(f"weights file '{path}' is not a valid .caffemodel: it is truncated "
                           f"or not a binary NetParameter") from None
    out = {}
    for lp in raw.layer:
        out[lp.name] = [raw_array(bp) for bp in lp.blobs]
    for v1 in raw.layers:
        name = v1.name or v1.layer.name
        out[name] = [raw_array(bp) for bp in (v1.blobs or v1.layer.blobs)]
    if any(a is None for arrays in out.values() for a in arrays):
        param = read_net_binary(path)
        out = {}
        for lp in param.layer:
            try:
                out[lp.name] = [blob_from_proto(bp) for bp in lp.blobs]
            except WeightsError as e:
                raise WeightsError(f"weights file '{path}', layer '{lp.name}': {e}") from None
    if not out:
        raise WeightsError(f"weights file '{path}' holds no layers: not a .caffemodel "
                           f"(a binary NetParameter with trained blobs)")
    return out


# What h5py raises when an HDF5 file's own structures (object headers, B-trees, heaps,
# datatypes) are damaged: the library's errors come out as any of these.
H5_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError, AttributeError, IndexError,
             UnicodeDecodeError, OverflowError)


def h5_array(obj, where: str, what: str) -> np.ndarray:
    """The values of an HDF5 dataset that Caffe's ``hdf5_load_nd_dataset`` reads (integer or
    floating-point data); anything else is a WeightsError naming ``where`` (the file and the
    object)."""
    import h5py
    if not isinstance(obj, h5py.Dataset):
        raise WeightsError(f"{where} is a {_h5_kind(obj)}, expected a dataset of {what}")
    if obj.shape is None or obj.dtype.kind not in "iuf":
        raise WeightsError(f"{where} holds {_h5_dtype(obj)} data, expected {what} (integer or "
                           f"floating-point numbers)")
    return np.asarray(obj[()])


def h5_numbered(group, where: str) -> list:
    """The members of an HDF5 group Caffe reads by index: named 0, 1, ..., n-1, in order."""
    import h5py
    if not isinstance(group, h5py.Group):
        raise WeightsError(f"{where} is a {_h5_kind(group)}, expected a group of datasets "
                           f"named 0, 1, ...")
    names = list(group.keys())
    expected = [str(i) for i in range(len(names))]
    if sorted(names) != sorted(expected):
        shown = ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
        raise WeightsError(f"{where} holds {shown}; expected datasets named 0 to "
                           f"{len(names) - 1} (one per blob, as Caffe writes them)")
    return [group.get(k) for k in expected]  # None for a broken link


def _h5_kind(obj) -> str:
    import h5py
    if isinstance(obj, h5py.Group):
        return "group"
    if isinstance(obj, h5py.Dataset):
        return "dataset"
    return "broken link" if obj is None else type(obj).__name__


def _h5_dtype(ds) -> str:
    if ds.shape is None:
        return "no (empty dataspace)"
    kind = {"S": "string", "O": "string", "V": "compound", "b": "boolean"}.get(ds.dtype.kind)
    return kind or f"'{ds.dtype}'"


def _load_hdf5(path: str) -> "dict[str, list[np.ndarray]]":
    import h5py
    out = {}
    try:
        with h5py.File(path, "r") as f:
            data = f.get("data")
            if not isinstance(data, h5py.Group):
                raise WeightsError(f"weights file '{path}' is HDF5 but has no 'data' group; "
                                   f"expected Caffe's layout data/<layer>/<index>")
            for name in data.keys():
                where = f"weights file '{path}': data/{name}"
                out[name] = [h5_array(ds, f"{where}/{i}", "float weights").astype(np.float32)
                             for i, ds in enumerate(h5_numbered(data.get(name), where))]
    except H5_ERRORS as e:
        raise WeightsError(f"cannot read HDF5 weights file '{path}': it is damaged or not "
                           f"written by Caffe ({type(e).__name__}: {e})") from None
    return out


def copy_trained_layers(net: "Net", source: Union[str, caffe_pb2.NetParameter]) -> None:
    """Caffe's CopyTrainedLayersFrom: copy each source layer's blobs into the net's layer of the
    same name; source layers the net lacks are ignored."""
    if isinstance(source, caffe_pb2.NetParameter):
        source = upgrade.upgrade_net(source)
        layers = {lp.name: [blob_from_proto(bp) for bp in lp.blobs] for lp in source.layer}
        where = "the given NetParameter"
    else:
        layers = load_weights(source)
        where = f"'{source}'"
    for name, arrays in layers.items():
        layer_id = net.layer_id(name)
        if layer_id is None:
            info("net.cpp:811", f"Ignoring source layer {name}")
            continue
        target = net.layers[layer_id].blobs
        if len(arrays) != len(target):
            raise WeightsError(f"Incompatible number of blobs for layer '{name}': {where} has "
                               f"{len(arrays)}, the net's layer has {len(target)}.")
        for i, (arr, blob) in enumerate(zip(arrays, target)):
            if arr.shape != blob.shape:
                if arr.size == blob.count and not _strict_shape(arr, blob):
                    arr = arr.reshape(blob.shape)
                else:
                    raise WeightsError(
                        f"Cannot copy param {i} weights from layer '{name}'; shape mismatch. "
                        f"Source param shape is {_shape_str(arr.shape)}; target param shape is "
                        f"{blob.shape_string()}. To learn this layer's parameters from scratch "
                        f"rather than copying from a saved net, rename the layer.")
            blob.data[...] = blob.xp.asarray(arr)


def _strict_shape(arr: np.ndarray, blob) -> bool:
    """Legacy (num, channels, height, width) blobs match a shaped blob by count (Caffe's
    ShapeEquals on legacy 4-D protos); anything else must match exactly."""
    legacy = len(arr.shape) == 4 and len(blob.shape) <= 4
    if not legacy:
        return True
    padded = (1,) * (4 - len(blob.shape)) + tuple(blob.shape)
    return tuple(arr.shape) != padded


def _shape_str(shape) -> str:
    return " ".join(str(s) for s in shape) + " (" + str(int(np.prod(shape))) + ")"
