"""The Data layer on Caffe's own LMDBs: records in key order, wrap-around, transforms."""
import gzip
import shutil

import numpy as np
import pytest

from cct.errors import CCTError
from tests.gradient_check import build_layer
from cct.proto import caffe_pb2

from ..conftest import REPO


def idx_digits():
    raw = gzip.open(REPO / "examples" / "mnist" / "data" / "t10k-images-idx3-ubyte.gz").read()
    return np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28)


def data_layer(source, extra="", batch=10, phase=caffe_pb2.TEST, tops=2):
    text = (f'type: "Data" data_param {{ source: "{source}" batch_size: {batch} '
            f'backend: LMDB }} {extra}')
    return build_layer(text, [], num_tops=tops, phase=phase, dtype=np.float32)


def test_reads_caffes_lmdb_in_key_order_and_wraps(caffe_fixtures):
    digits = idx_digits()
    layer, bottom, top = data_layer(caffe_fixtures / "mnist10k_test_lmdb",
                                    'transform_param { scale: 0.00390625 }', batch=1500)
    assert top[0].shape == (1500, 1, 28, 28) and top[1].shape == (1500,)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data[:, 0], digits[:1500] * np.float32(1 / 256))
    layer.forward(bottom, top)  # records 1500..1999, then 0..999 again
    np.testing.assert_array_equal(top[0].data[:500, 0], digits[1500:] / np.float32(256))
    np.testing.assert_array_equal(top[0].data[500:, 0], digits[:1000] / np.float32(256))


def test_center_crop_in_test_and_mean_value(caffe_fixtures):
    digits = idx_digits()
    layer, bottom, top = data_layer(caffe_fixtures / "mnist10k_test_lmdb",
                                    'transform_param { crop_size: 20 mean_value: 100 }', 4,
                                    tops=1)
    layer.forward(bottom, top)
    assert top[0].shape == (4, 1, 20, 20)
    np.testing.assert_array_equal(top[0].data[:, 0], digits[:4, 4:24, 4:24] - np.float32(100))


def test_random_crop_and_mirror_in_train_stay_within_the_image(caffe_fixtures):
    digits = idx_digits().astype(np.float32)
    layer, bottom, top = data_layer(caffe_fixtures / "mnist10k_test_lmdb",
                                    'transform_param { crop_size: 24 mirror: true }', 8,
                                    phase=caffe_pb2.TRAIN, tops=1)
    layer.forward(bottom, top)
    for i in range(8):
        found = any(np.array_equal(top[0].data[i, 0], img[h:h + 24, w:w + 24])
                    for img in (digits[i], digits[i][:, ::-1])
                    for h in range(5) for w in range(5))
        assert found


def test_missing_and_non_lmdb_sources_are_clear_errors(tmp_path):
    with pytest.raises(CCTError, match="does not exist"):
        data_layer(tmp_path / "nope")
    (tmp_path / "notdb").mkdir()
    with pytest.raises(CCTError, match="is not an LMDB"):
        data_layer(tmp_path / "notdb")


def test_labels_are_the_idx_labels(caffe_fixtures, tmp_path):
    """A copy of Caffe's train LMDB reads back the labels convert_mnist_data stored."""
    shutil.copytree(caffe_fixtures / "mnist10k_train_lmdb", tmp_path / "db")
    raw = gzip.open(REPO / "examples" / "mnist" / "data" / "train-labels-idx1-ubyte.gz").read()
    labels = np.frombuffer(raw, np.uint8, offset=8)
    layer, bottom, top = data_layer(tmp_path / "db", batch=50)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[1].data, labels[:50])
