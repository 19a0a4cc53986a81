"""Weights I/O speed: write and read a CaffeNet-sized .caffemodel (61M params, ~244 MB).

Prints seconds for cct's save / load / copy into a net, and the ratio to a plain write / read
of the same number of bytes (the disk's own speed), measured in the same run.
Usage: python bench/bench_weights_io.py [path/to/deploy.prototxt]
"""
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

import cct as caffe
from cct.io.weights import load_weights

ZOO = pathlib.Path(os.environ.get("CCT_SHARED", pathlib.Path(__file__).resolve().parents[2]
                                  / "shared")) / "caffe-zoo"


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(prototxt: str) -> None:
    caffe.init_log(1)
    net = caffe.Net(prototxt, caffe.TEST)
    rng = np.random.default_rng(0)
    for blobs in net.params.values():
        for b in blobs:
            b.data[...] = rng.standard_normal(b.shape, dtype=np.float32)
    n_params = sum(b.count for blobs in net.params.values() for b in blobs)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "net.caffemodel")
        t_save = timed(lambda: net.save(path))
        size = os.path.getsize(path)
        t_load = timed(lambda: load_weights(path))
        t_copy = timed(lambda: net.copy_from(path))
        payload = os.urandom(1024) * (size // 1024)
        raw = os.path.join(d, "raw.bin")

        def raw_write():
            with open(raw, "wb") as f:
                f.write(payload)

        def raw_read():
            with open(raw, "rb") as f:
                f.read()
        t_raw_w = timed(raw_write)
        t_raw_r = timed(raw_read)
    print(f"params {n_params / 1e6:.1f} M, file {size / 1e6:.1f} MB")
    print(f"save {t_save:.2f} s ({t_save / t_raw_w:.1f}x a raw write of {t_raw_w:.2f} s)")
    print(f"load {t_load:.2f} s ({t_load / t_raw_r:.1f}x a raw read of {t_raw_r:.2f} s)")
    print(f"copy_from {t_copy:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else
         str(ZOO / "models" / "bvlc_reference_caffenet" / "deploy.prototxt"))
