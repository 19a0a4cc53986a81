"""``cct compute_image_mean [--backend=lmdb] INPUT_DB [OUTPUT_FILE]``: Caffe's
tools/compute_image_mean.

The mean of every Datum in the database, pixel by pixel, written as Caffe writes it: a
BlobProto with the legacy shape fields ``num: 1``, ``channels``, ``height``, ``width`` (no
``shape``) and ``data`` = the mean in C x H x W order. The sum is accumulated in float32, one
Datum after another, then divided by the count in float32, as Caffe's loop over the proto's
float field does, so the file is byte-identical to Caffe's. Encoded Datums are decoded first
(Caffe's DecodeDatumNative). The per-channel means are logged as Caffe logs them.
"""
from __future__ import annotations

from typing import List

import numpy as np

from ..errors import CCTError
from ..flags import Flags
from ..glog import info
from ..io.atomic import atomic_write
from ..io.db import LMDBCursor
from ..proto import caffe_pb2
from . import check_backend
from .convert_imageset import decode_datum_native

TOOL = "compute_image_mean"


def _values(datum: caffe_pb2.Datum) -> np.ndarray:
    if len(datum.data):
        return np.frombuffer(datum.data, np.uint8)
    return np.asarray(datum.float_data, np.float32)


def _decode(datum: caffe_pb2.Datum, key: bytes, db_path: str) -> bool:
    """decode_datum_native, its error naming the record."""
    try:
        return decode_datum_native(datum)
    except CCTError as e:
        raise CCTError(f"{TOOL}: record '{key.decode(errors='replace')}' of '{db_path}': "
                       f"{e}") from None


def compute_mean(db_path: str) -> caffe_pb2.BlobProto:
    """The mean image of the LMDB ``db_path`` as Caffe's BlobProto."""
    cursor = LMDBCursor(db_path)
    try:
        datum = caffe_pb2.Datum()
        datum.ParseFromString(cursor.value())
        if _decode(datum, cursor.key(), db_path):
            info("compute_image_mean.cpp:57", "Decoding Datum")
        shape = (datum.channels, datum.height, datum.width)
        data_size = datum.channels * datum.height * datum.width
        size_in_datum = max(len(datum.data), len(datum.float_data))
        total = np.zeros(size_in_datum, np.float32)
        info("compute_image_mean.cpp:70", "Starting iteration")
        count = 0
        for key, value in cursor.txn.cursor():
            record = caffe_pb2.Datum()
            record.ParseFromString(value)
            _decode(record, key, db_path)
            values = _values(record)
            if values.size != data_size:
                raise CCTError(f"{TOOL}: Incorrect data field size {values.size} in record "
                               f"'{key.decode(errors='replace')}' of '{db_path}': the first "
                               f"record holds {data_size} values and every record must hold "
                               f"as many (a mean needs images of one size)")
            total += values
            count += 1
            if count % 10000 == 0:
                info("compute_image_mean.cpp:95", f"Processed {count} files.")
    finally:
        cursor.close()
    if count % 10000 != 0:
        info("compute_image_mean.cpp:101", f"Processed {count} files.")
    blob = caffe_pb2.BlobProto()
    blob.num = 1
    blob.channels, blob.height, blob.width = shape
    mean = total / np.float32(count)
    blob.data.extend(mean.tolist())
    return blob


def log_channel_means(blob: caffe_pb2.BlobProto) -> None:
    """Caffe's closing lines: the mean of each channel, summed in float32 in pixel order."""
    channels = blob.channels
    dim = blob.height * blob.width
    info("compute_image_mean.cpp:114", f"Number of channels: {channels}")
    data = np.asarray(blob.data, np.float32)
    for c in range(channels):
        plane = data[c * dim:(c + 1) * dim]
        total = np.cumsum(plane, dtype=np.float32)[-1] if dim else np.float32(0)
        info("compute_image_mean.cpp:119",
             f"mean_value channel [{c}]: {'%g' % (total / np.float32(dim))}")


def main(argv: List[str]) -> int:
    flags = Flags(TOOL, argv, {"backend": "lmdb"})
    if not 1 <= len(flags.positional) <= 2:
        raise CCTError(f"{TOOL}: usage: cct {TOOL} [--backend=lmdb] INPUT_DB [OUTPUT_FILE] "
                       f"(got {len(flags.positional)} arguments)")
    check_backend(TOOL, flags.get("backend"))
    blob = compute_mean(flags.positional[0])
    if len(flags.positional) == 2:
        out = flags.positional[1]
        info("compute_image_mean.cpp:108", f"Write to {out}")
        data = blob.SerializeToString()

        def write(path: str) -> None:
            with open(path, "wb") as f:
                f.write(data)
        atomic_write(out, write)
    log_channel_means(blob)
    return 0
