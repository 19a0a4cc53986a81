"""``cct extract_features WEIGHTS MODEL BLOB[,BLOB...] DB[,DB...] NUM_MINI_BATCHES [DB_TYPE]
[CPU|GPU] [DEVICE_ID]``: Caffe's tools/extract_features.

Builds MODEL in the TEST phase with the trained WEIGHTS, runs NUM_MINI_BATCHES forward passes
(the net's own data layers feed it) and stores, for each named blob, one Datum per image in its
own database: key ``%010d`` (the image's index, counted over all batches), value a Datum with
``channels``/``height``/``width`` = the blob's legacy axes 1..3 (1 where the blob has fewer) and
``float_data`` = that image's values, as Caffe writes them. DB_TYPE is ``lmdb`` (also given as
``--backend=lmdb``; the default). Records are committed every 1000 per database.
"""
from __future__ import annotations

from typing import List

import numpy as np

from ..errors import CCTError
from ..flags import Flags
from ..glog import info, warning
from ..proto import caffe_pb2
from . import format_int, log_error, open_lmdb_writer

TOOL = "extract_features"
USAGE = ("usage: cct extract_features pretrained_net_param feature_extraction_proto_file "
         "extract_feature_blob_name1[,name2,...] save_feature_dataset_name1[,name2,...] "
         "num_mini_batches [db_type] [CPU/GPU] [DEVICE_ID=0]")


def extract(weights: str, model: str, blob_names: List[str], db_names: List[str],
            num_mini_batches: int, backend: str = "lmdb") -> List[int]:
    """Write the feature databases; returns the number of records written to each."""
    from ..api import Net
    from ..net import TEST

    if len(blob_names) != len(db_names):
        raise CCTError(f"{TOOL}: the number of blob names ({len(blob_names)}: "
                       f"{','.join(blob_names)}) and dataset names ({len(db_names)}: "
                       f"{','.join(db_names)}) must be equal")
    net = Net(model, TEST, weights=weights)
    blobs = net.blobs
    for name in blob_names:
        if name not in blobs:
            raise CCTError(f"{TOOL}: Unknown feature blob name '{name}' in the network {model}; "
                           f"its blobs are {', '.join(blobs)}")
    writers = []
    try:
        for name in db_names:
            info("extract_features.cpp:124", f"Opening dataset {name}")
            writers.append(open_lmdb_writer(TOOL, name, backend))
        log_error("extract_features.cpp:132", "Extracting Features")
        counts = [0] * len(blob_names)
        datum = caffe_pb2.Datum()
        for _ in range(num_mini_batches):
            net.forward_prefilled()
            for i, name in enumerate(blob_names):
                blob = blobs[name]
                batch_size = blob.num
                features = np.asarray(blob.data, np.float32).reshape(batch_size, -1)
                for n in range(batch_size):
                    datum.height = blob.height
                    datum.width = blob.width
                    datum.channels = blob.channels
                    datum.ClearField("data")
                    datum.ClearField("float_data")
                    datum.float_data.extend(features[n].tolist())
                    writers[i].put(format_int(counts[i], 10).encode(),
                                   datum.SerializeToString())
                    counts[i] += 1
                    if counts[i] % 1000 == 0:
                        writers[i].commit()
                        log_error("extract_features.cpp:167", f"Extracted features of "
                                  f"{counts[i]} query images for feature blob {name}")
        for i, name in enumerate(blob_names):
            writers[i].close()
            log_error("extract_features.cpp:178", f"Extracted features of {counts[i]} query "
                      f"images for feature blob {name}")
        writers = []
    finally:
        for writer in writers:
            writer.abort()
    log_error("extract_features.cpp:185", "Successfully extracted the features!")
    return counts


def main(argv: List[str]) -> int:
    flags = Flags(TOOL, argv, {"backend": ""})
    args = flags.positional
    if not 5 <= len(args) <= 8:
        raise CCTError(f"{TOOL}: expected 5 to 8 arguments, got {len(args)}.\n{USAGE}")
    weights, model, blob_list, db_list, batches = args[:5]
    backend = args[5] if len(args) > 5 else (flags.get("backend") or "lmdb")
    if len(args) > 5 and flags.get("backend") and flags.get("backend") != backend:
        raise CCTError(f"{TOOL}: the database type is given twice and differently: "
                       f"'{backend}' and --backend={flags.get('backend')}")
    mode = args[6].upper() if len(args) > 6 else "CPU"
    if mode == "GPU":
        warning("extract_features.cpp:70", "GPU mode is not available to extract_features; "
                "using the CPU")
    elif mode != "CPU":
        raise CCTError(f"{TOOL}: the 7th argument must be CPU or GPU, got '{args[6]}'")
    log_error("extract_features.cpp:70", "Using CPU")
    try:
        num_mini_batches = int(batches)
    except ValueError:
        raise CCTError(f"{TOOL}: num_mini_batches must be an integer, got '{batches}'") from None
    if num_mini_batches < 0:
        raise CCTError(f"{TOOL}: num_mini_batches must be >= 0, got {num_mini_batches}")
    extract(weights, model, blob_list.split(","), db_list.split(","), num_mini_batches,
            backend)
    return 0
