"""Mutated Datums in a real LMDB, read through the Data layer (its set-up reads the first
record, its prefetch thread the others): every failure a CCTError, also from the thread.

A record is mutated at three depths: the encoded image inside the Datum (its bytes, or the
width and height its header claims), the Datum's fields (a varint replaced by an extreme:
channels, height, width, label, encoded), and the serialized Datum's own bytes."""
from __future__ import annotations

import itertools
import shutil
import struct
import zlib

from hypothesis import given
from hypothesis import strategies as st

from cct.proto import caffe_pb2
from tests.layers.test_data import layer_of, write_lmdb

from .conftest import datums
from .mutate import (INT_EXTREMES, apply, byte_op, fuzz, only_cct_errors, varint_op)

SEEDS = datums()
_serial = itertools.count()
TRANSFORMS = ["", "transform_param { force_color: true }", "transform_param { force_gray: true }",
              "transform_param { crop_size: 4 mirror: true }"]
_SIZES = st.sampled_from([v for v in INT_EXTREMES if 0 <= v < 2 ** 32] + [20000, 65535])

record = st.tuples(
    st.integers(0, len(SEEDS) - 1),
    st.lists(byte_op(), max_size=3),                        # the image bytes
    st.one_of(st.none(), st.tuples(_SIZES, _SIZES)),        # the size the image header claims
    st.lists(varint_op(), max_size=2),                      # the Datum's fields
    # the serialized Datum, less often: most such changes only break the protobuf
    st.one_of(st.just([]), st.just([]), st.lists(byte_op(), min_size=1, max_size=1)))


def claim_size(image: bytes, width: int, height: int) -> bytes:
    """The image with its header claiming width x height: a PNG's IHDR (CRC made right, so the
    claim is believed) or a JPEG's start-of-frame (16-bit sizes)."""
    if image.startswith(b"\x89PNG") and len(image) >= 33:
        ihdr = image[12:16] + struct.pack(">II", width, height) + image[24:29]
        return image[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + image[33:]
    sof = image.find(b"\xff\xc0")
    if sof >= 0 and len(image) >= sof + 9:
        size = struct.pack(">HH", height & 0xFFFF, width & 0xFFFF)
        return image[:sof + 5] + size + image[sof + 9:]
    return image


def mutated(rec) -> bytes:
    index, image_ops, size, field_ops, raw_ops = rec
    datum = caffe_pb2.Datum()
    datum.CopyFrom(SEEDS[index])
    if datum.encoded:
        image = apply(datum.data, ([], image_ops))
        datum.data = claim_size(image, *size) if size else image
    elif datum.data:
        datum.data = apply(datum.data, ([], image_ops))
    data = apply(datum.SerializeToString(), (field_ops, []))
    return apply(data, ([], raw_ops))


def read_batches(db, transform: str) -> None:
    layer, _, top = layer_of(db, transform, batch=2, tops=2)
    try:
        for _ in range(3):  # 6 records of 3: the first again, then the thread's
            layer.forward([], top)
    finally:
        layer.close()


@given(records=st.lists(record, min_size=1, max_size=3), transform=st.sampled_from(TRANSFORMS))
@fuzz(default_examples=550)
def test_datums_through_the_data_layer(fuzz_dir, records, transform):
    values = [mutated(r) for r in records]
    # A fresh folder each time: a handle left open by a failure must not serve the next one.
    db = write_lmdb(fuzz_dir / f"datums_lmdb_{next(_serial)}",
                    [(b"%08d" % i, v) for i, v in enumerate(values)])
    try:
        only_cct_errors(lambda: read_batches(db, transform), "LMDB Datums",
                        b"\n".join(values))
    finally:
        shutil.rmtree(db)
