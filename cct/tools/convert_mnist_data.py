"""``cct convert_mnist_data [--backend=lmdb] IMAGES LABELS DB``: Caffe's
examples/mnist/convert_mnist_data.

Reads the MNIST IDX files (plain or gzipped; gzip is recognised by its magic bytes) and writes
one Datum per digit: key ``%08d`` (the record index), value a Datum with ``channels: 1``,
``height``/``width`` from the image file, ``data`` = the raw pixel bytes and ``label`` = the
label byte (a signed char in Caffe). Records are committed every 1000, as Caffe does. The
database holds exactly the keys and value bytes that Caffe's tool writes from the same files.
"""
from __future__ import annotations

import gzip
from typing import List, Tuple

import numpy as np

from ..errors import CCTError
from ..flags import Flags
from ..glog import info
from ..proto import caffe_pb2
from . import format_int, need_file, open_lmdb_writer

TOOL = "convert_mnist_data"
IMAGE_MAGIC = 2051
LABEL_MAGIC = 2049


def read_idx(path: str, magic: int, what: str) -> Tuple[Tuple[int, ...], np.ndarray]:
    """An IDX file's dimensions and its bytes (uint8, flat). ``magic`` is 2051 for images
    (count, rows, cols follow) and 2049 for labels (count follows)."""
    need_file(TOOL, path, what)
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:
        raise CCTError(f"{TOOL}: cannot read {what} '{path}': {e}") from None
    n_dims = 3 if magic == IMAGE_MAGIC else 1
    header = 4 * (1 + n_dims)
    if len(raw) < 4:
        raise CCTError(f"{TOOL}: {what} '{path}' is empty or truncated")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        kind, example = (("image", "train-images-idx3-ubyte") if magic == IMAGE_MAGIC
                         else ("label", "train-labels-idx1-ubyte"))
        raise CCTError(f"{TOOL}: Incorrect {kind} file magic in '{path}': {found}, expected "
                       f"{magic} (an MNIST {kind} file in IDX format, e.g. {example}[.gz])")
    if len(raw) < header:
        raise CCTError(f"{TOOL}: {what} '{path}' is truncated inside its header")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", n_dims, 4))
    need = int(np.prod(dims, dtype=np.int64))
    data = np.frombuffer(raw, np.uint8, offset=header)
    if data.size < need:
        raise CCTError(f"{TOOL}: {what} '{path}' is truncated: its header announces "
                       f"{' x '.join(map(str, dims))} = {need} bytes, the file holds "
                       f"{data.size}")
    return dims, data[:need]


def convert_dataset(image_file: str, label_file: str, db_path: str, backend: str) -> int:
    """Write the database; returns the number of records."""
    (num_items, rows, cols), pixels = read_idx(image_file, IMAGE_MAGIC, "image file")
    (num_labels,), labels = read_idx(label_file, LABEL_MAGIC, "label file")
    if num_items != num_labels:
        raise CCTError(f"{TOOL}: the image file '{image_file}' holds {num_items} images but the "
                       f"label file '{label_file}' holds {num_labels} labels")
    images = pixels.reshape(num_items, rows * cols)
    labels = labels.view(np.int8)  # Caffe reads the label into a (signed) char
    with open_lmdb_writer(TOOL, db_path, backend) as db:
        datum = caffe_pb2.Datum()
        datum.channels = 1
        datum.height = rows
        datum.width = cols
        info("convert_mnist_data.cpp:88", f"A total of {num_items} items.")
        info("convert_mnist_data.cpp:89", f"Rows: {rows} Cols: {cols}")
        count = 0
        for item_id in range(num_items):
            datum.data = images[item_id].tobytes()
            datum.label = int(labels[item_id])
            db.put(format_int(item_id, 8).encode(), datum.SerializeToString())
            count += 1
            if count % 1000 == 0:
                db.commit()
    info("convert_mnist_data.cpp:108", f"Processed {count} files.")
    return count


def main(argv: List[str]) -> int:
    flags = Flags(TOOL, argv, {"backend": "lmdb"},
                  positional=("input_image_file", "input_label_file", "output_db_file"))
    image_file, label_file, db_path = flags.positional
    convert_dataset(image_file, label_file, db_path, flags.get("backend"))
    return 0
