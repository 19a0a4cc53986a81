"""Data prefetching: does forward wait on JPEG decoding when the net computes longer than that?

Builds an LMDB of encoded 256x256 JPEG Datums (ImageNet-like records), reads it with a Data
layer (batch 32, crop 227, mirror, mean values: CaffeNet's input pipeline) and consumes each
batch with a stand-in for the net's compute:
  - "device": a sleep of 2x the decode time (a GPU kernel: the CPU is free for decoding);
  - "gemm": float32 matrix products sized to take about 4x the (idle) decode time on the CPU
    (BLAS releases the GIL but competes with decoding for the cores).
For each it prints the decode time per batch (prefetch thread), the compute time, the time
forward spent blocked on the queue, and the wall time against decode + compute done serially.
Usage: python bench/bench_prefetch.py [records=96] [batches=30]
"""
import io
import pathlib
import sys
import tempfile
import time

import lmdb
import numpy as np
from PIL import Image

import cct as caffe
from cct.io.prototxt import net_from_text
from cct.net import Net
from cct.proto import caffe_pb2


def make_lmdb(path: pathlib.Path, n: int) -> None:
    rng = np.random.default_rng(0)
    env = lmdb.open(str(path), map_size=1 << 30)
    with env.begin(write=True) as txn:
        for i in range(n):
            coarse = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
            img = Image.fromarray(coarse).resize((256, 256), Image.BICUBIC)
            noisy = np.asarray(img).astype(np.int16) + rng.integers(-20, 21, (256, 256, 3))
            buf = io.BytesIO()
            Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buf, "JPEG",
                                                                          quality=90)
            datum = caffe_pb2.Datum(data=buf.getvalue(), label=i % 1000, encoded=True)
            txn.put(b"%08d" % i, datum.SerializeToString())
    env.close()


def data_net(db: pathlib.Path) -> Net:
    return Net(net_from_text(f'''layer {{ name: "data" type: "Data" top: "data" top: "label"
        transform_param {{ crop_size: 227 mirror: true
                          mean_value: 104 mean_value: 117 mean_value: 123 }}
        data_param {{ source: "{db}" batch_size: 32 backend: LMDB prefetch: 4 }} }}'''),
        phase=caffe.TRAIN)


def run(db: pathlib.Path, batches: int, consumer: str) -> None:
    net = data_net(db)
    layer = net.layers[0]
    net.forward()  # the first batch is always waited for
    decode = layer.load_seconds / layer.prefetcher.produced
    work, gemm_n = 2 * decode, 0
    a = np.random.default_rng(1).random((512, 512), dtype=np.float32)
    if consumer == "gemm":
        t = time.perf_counter()
        for _ in range(5):
            a @ a
        # 4x the idle decode time: decoding slows down while BLAS takes the cores
        gemm_n = max(1, int(round(2 * work / ((time.perf_counter() - t) / 5))))
    waited0, loaded0, made0 = layer.wait_seconds, layer.load_seconds, layer.prefetcher.produced
    compute = 0.0
    t_all = time.perf_counter()
    for _ in range(batches):
        t = time.perf_counter()
        if consumer == "gemm":
            for _ in range(gemm_n):
                a @ a
        else:
            time.sleep(work)
        compute += time.perf_counter() - t
        net.forward()
    wall = time.perf_counter() - t_all
    waited = layer.wait_seconds - waited0
    made = layer.prefetcher.produced - made0
    decode_run = (layer.load_seconds - loaded0) / max(made, 1)
    net.close()
    serial = batches * decode_run + compute
    print(f"{consumer:6s}  decode {1e3 * decode_run:6.1f} ms/batch   compute "
          f"{1e3 * compute / batches:6.1f} ms/batch   forward waited "
          f"{1e3 * waited / batches:5.2f} ms/batch ({100 * waited / (batches * decode_run):.1f}% "
          f"of decoding)   wall {wall:5.2f} s vs serial {serial:5.2f} s "
          f"({serial / wall:.2f}x)")


def main(records: int, batches: int) -> None:
    caffe.init_log(1)
    with tempfile.TemporaryDirectory() as d:
        db = pathlib.Path(d) / "jpeg_lmdb"
        make_lmdb(db, records)
        print(f"{records} JPEG records of 256x256, batch 32, crop 227 + mirror + mean, "
              f"{batches} batches")
        for consumer in ("device", "gemm"):
            run(db, batches, consumer)


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    main(*(args + [96, 30][len(args):]))
