"""Caffe's BlobProto: one blob's shape and floats to and from NumPy arrays, through the raw
schema (proto/caffe_raw.proto, a bytes view of BlobProto's packed floats) so that large blobs
move as whole buffers. The Net-level files (caffemodel, HDF5 weights) are cct/io/weights.py;
layers read a blob held in a prototxt (a mean file, a data layer's blobs) from here."""
from __future__ import annotations

import math

import numpy as np

from ..errors import WeightsError
from ..proto import caffe_pb2, caffe_raw_pb2


def blob_shape_of(bp: caffe_pb2.BlobProto) -> tuple:
    """A BlobProto's shape: ``shape.dim`` or, in old files, num/channels/height/width."""
    if bp.HasField("shape"):
        return tuple(int(d) for d in bp.shape.dim)
    if bp.HasField("num") or bp.HasField("channels") or bp.HasField("height") \
            or bp.HasField("width"):
        return (bp.num, bp.channels, bp.height, bp.width)
    return (len(bp.data) or len(bp.double_data),)


def blob_from_proto(bp: caffe_pb2.BlobProto, diff: bool = False) -> np.ndarray:
    """The data (or diff) of a BlobProto as an array of its shape (float32, or float64 when the
    proto stores double_data). Goes through the raw schema so large blobs copy as one buffer."""
    raw = caffe_raw_pb2.BlobProtoRaw.FromString(bp.SerializeToString())
    shape = blob_shape_of(bp)
    if diff:
        arr = (np.frombuffer(raw.double_diff, "<f8") if raw.double_diff
               else np.frombuffer(raw.diff, "<f4"))
    else:
        arr = (np.frombuffer(raw.double_data, "<f8") if raw.double_data
               else np.frombuffer(raw.data, "<f4"))
    count = math.prod(shape)
    if arr.size != count:
        raise WeightsError(f"a blob of shape {shape} holds {arr.size} values, expected {count}")
    return arr.reshape(shape).copy()


def blob_to_proto(array: np.ndarray, bp: caffe_pb2.BlobProto, diff=None) -> caffe_pb2.BlobProto:
    """Fill ``bp`` with ``array`` (float32 ``data`` and ``shape``, as Caffe's Blob::ToProto)."""
    raw = caffe_raw_pb2.BlobProtoRaw()
    raw_blob(np.asarray(array), raw, None if diff is None else np.asarray(diff))
    bp.Clear()
    bp.MergeFromString(raw.SerializeToString())
    return bp


def raw_blob(array: np.ndarray, bp, diff=None) -> None:
    """Fill a raw BlobProto with ``array`` (and ``diff``) as float32, shape first."""
    bp.shape.dim.extend(array.shape)
    if array.size:
        bp.data = np.ascontiguousarray(array, dtype="<f4").tobytes()
    if diff is not None and diff.size:
        bp.diff = np.ascontiguousarray(diff, dtype="<f4").tobytes()


def raw_array(bp) -> "np.ndarray | None":
    """A raw blob's data, or None when its floats were not stored packed (very old files)."""
    shape = blob_shape_of(bp)
    if bp.double_data:
        arr = np.frombuffer(bp.double_data, "<f8").astype(np.float32)
    else:
        arr = np.frombuffer(bp.data, "<f4")
    if arr.size != math.prod(shape):
        return None
    return arr.reshape(shape)
