"""Prefetching: the Data layer decodes in a background thread, so forward does not wait on data
when the net's compute per batch takes longer than decoding.

The checks compare two quantities measured in the same run (the time forward spent blocked on
the prefetch queue, and the time the thread spent reading, decoding and transforming), never
against a wall-clock limit. The "compute" is a sleep, which like BLAS or a GPU kernel leaves
the GIL to the decoding thread.
"""
import time

import numpy as np
import pytest

from cct.proto import caffe_pb2
from tests.gradient_check import build_layer
from tests.layers.test_data import encoded_datum, image_bytes, write_lmdb


def jpeg_db(tmp_path, n=24, size=128):
    rng = np.random.default_rng(0)
    values = []
    for i in range(n):
        coarse = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        rgb = np.kron(coarse, np.ones((8, 8, 1), np.uint8))  # blocky, so JPEG has work to do
        values.append(encoded_datum(image_bytes(rgb, "JPEG", quality=90), i % 10))
    return write_lmdb(tmp_path / "jpeg_lmdb", values)


def jpeg_layer(db, batch=4, prefetch=4):
    text = (f'type: "Data" data_param {{ source: "{db}" batch_size: {batch} backend: LMDB '
            f'prefetch: {prefetch} }} transform_param {{ crop_size: 112 mirror: true }}')
    return build_layer(text, [], num_tops=2, phase=caffe_pb2.TRAIN, dtype=np.float32)


def test_forward_does_not_wait_when_compute_outlasts_decoding(tmp_path):
    layer, _, top = jpeg_layer(jpeg_db(tmp_path))
    layer.forward([], top)  # the first batch has to be waited for
    per_batch = layer.load_seconds / layer.prefetcher.produced
    waited_before = layer.wait_seconds
    steps = 20
    for _ in range(steps):
        time.sleep(3 * per_batch)  # the net's compute: three times the decoding time
        layer.forward([], top)
    waited = layer.wait_seconds - waited_before
    decoding = layer.load_seconds
    layer.close()
    assert layer.prefetcher.produced >= steps + 1
    assert waited < 0.25 * decoding, (waited, decoding)


def test_without_compute_forward_waits_for_the_decoding(tmp_path):
    """The same instrument shows the waiting when there is nothing to hide it behind."""
    layer, _, top = jpeg_layer(jpeg_db(tmp_path))
    for _ in range(20):
        layer.forward([], top)
    waited, decoding = layer.wait_seconds, layer.load_seconds
    layer.close()
    assert waited > 0.4 * decoding, (waited, decoding)


@pytest.mark.parametrize("depth", [1, 3])
def test_the_thread_reads_at_most_prefetch_batches_ahead(tmp_path, depth):
    layer, _, top = jpeg_layer(jpeg_db(tmp_path, n=8), batch=2, prefetch=depth)
    layer.forward([], top)
    deadline = time.monotonic() + 30
    while layer.prefetcher.produced < 1 + depth + 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # let it fill the queue (bounded: it stops when the queue is full)
    time.sleep(0.05)
    produced = layer.prefetcher.produced
    layer.close()
    # one batch consumed, `depth` queued, one more made and waiting for room
    assert produced == 1 + depth + 1


def test_prefetched_batches_equal_a_synchronous_read(tmp_path):
    from cct.data_transformer import decode_datum
    db = jpeg_db(tmp_path, n=6)
    text = (f'type: "Data" data_param {{ source: "{db}" batch_size: 4 backend: LMDB '
            f'prefetch: 2 }}')
    import lmdb
    env = lmdb.open(str(db), readonly=True, lock=False)
    with env.begin() as txn:
        records = [caffe_pb2.Datum.FromString(v) for _, v in txn.cursor()]
    env.close()
    layer, _, top = build_layer(text, [], num_tops=2, dtype=np.float32)
    order = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]
    for b in range(3):
        layer.forward([], top)
        want = np.stack([decode_datum(records[i]) for i in order[4 * b:4 * b + 4]])
        np.testing.assert_array_equal(top[0].data, want)
        np.testing.assert_array_equal(top[1].data, [records[i].label
                                                    for i in order[4 * b:4 * b + 4]])
    layer.close()


def test_prefetch_zero_is_refused(tmp_path):
    from cct.errors import CCTError
    with pytest.raises(CCTError, match="prefetch must be at least 1"):
        jpeg_layer(jpeg_db(tmp_path, n=2), prefetch=0)
