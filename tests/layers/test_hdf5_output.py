"""HDF5Output: the file Caffe writes (created at set-up, datasets "data" and "label" in legacy
4-axis shape and the layer's dtype), one batch per file, atomic writes, refusals, and a net."""
import os

import h5py
import numpy as np
import pytest

import cct as caffe
from cct.errors import LayerError
from cct.io.prototxt import net_from_text
from cct.net import Net
from tests.gradient_check import build_layer, run_forward

RNG = np.random.default_rng(3)


def body(path):
    return f'type: "HDF5Output" hdf5_output_param {{ file_name: "{path}" }}'


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_writes_data_and_label_like_caffe(tmp_path, dtype):
    path = tmp_path / "out.h5"
    data = RNG.standard_normal((2, 3, 4, 5)).astype(dtype)
    label = RNG.standard_normal((2, 3)).astype(dtype)
    layer, bottom, top = build_layer(body(path), [data, label], num_tops=0, dtype=dtype)
    # Caffe creates (truncates) the file at set-up.
    with h5py.File(path, "r") as f:
        assert list(f) == []
    run_forward(layer, bottom, top)
    with h5py.File(path, "r") as f:
        assert sorted(f) == ["data", "label"]
        assert f["data"].dtype == dtype and f["label"].dtype == dtype
        np.testing.assert_array_equal(f["data"][...], data)
        # legacy accessors: (num, channels, height, width)
        assert f["label"].shape == (2, 3, 1, 1)
        np.testing.assert_array_equal(f["label"][...].reshape(2, 3), label)
    assert os.listdir(tmp_path) == ["out.h5"]
    layer.backward(top, [True, True], bottom)  # a sink: nothing to do, nothing refused


def test_one_batch_per_file_as_in_caffe(tmp_path):
    path = tmp_path / "out.h5"
    layer, bottom, top = build_layer(body(path), [np.ones((2, 3)), np.ones(2)], num_tops=0)
    run_forward(layer, bottom, top)
    with pytest.raises(LayerError, match=r"^HDF5Output layer 'under_test': '.*out\.h5' "
                                         r"already holds the datasets \"data\" and \"label\" "
                                         r"of an earlier forward pass"):
        run_forward(layer, bottom, top)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["data"][...], np.ones((2, 3, 1, 1)))


def test_a_failed_write_leaves_the_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "out.h5"
    layer, bottom, top = build_layer(body(path), [np.ones((2, 3)), np.ones(2)], num_tops=0)

    def broken(self, name, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(h5py.Group, "create_dataset", broken)
    with pytest.raises(LayerError, match=r"^HDF5Output layer 'under_test': failed to write "
                                         r"HDF5 file: cannot write '.*out\.h5': No space left"):
        run_forward(layer, bottom, top)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["out.h5"]
    with h5py.File(path, "r") as f:
        assert list(f) == []


@pytest.mark.parametrize("bottoms,match", [
    ([np.ones((2, 3)), np.ones(3)], r"data blob and label blob must have the same batch size: "
                                    r"bottom\[0\] has shape \(2, 3\), bottom\[1\] \(3,\)"),
    ([np.ones((2, 1, 1, 1, 3)), np.ones(2)], r"bottom\[0\] has shape \(2, 1, 1, 1, 3\); .* "
                                             r"at most 4 axes"),
])
def test_refused_bottoms(tmp_path, bottoms, match):
    layer, bottom, top = build_layer(body(tmp_path / "o.h5"), bottoms, num_tops=0)
    with pytest.raises(LayerError, match=r"^HDF5Output layer 'under_test': " + match):
        run_forward(layer, bottom, top)


def test_refused_set_ups(tmp_path):
    with pytest.raises(LayerError, match=r"hdf5_output_param.file_name \(the HDF5 file to "
                                         r"write\) must be given"):
        build_layer('type: "HDF5Output"', [np.ones(2), np.ones(2)], num_tops=0)
    with pytest.raises(LayerError, match=r"^HDF5Output layer 'under_test': failed to write "
                                         r"HDF5 file: cannot write '.*no/such/dir/o\.h5'"):
        build_layer(body(tmp_path / "no" / "such" / "dir" / "o.h5"), [np.ones(2), np.ones(2)],
                    num_tops=0)
    with pytest.raises(LayerError, match=r"takes exactly 0 top blob\(s\), but the prototxt "
                                         r"gives 1"):
        build_layer(body(tmp_path / "o.h5"), [np.ones(2), np.ones(2)], num_tops=1)


def test_in_a_net(tmp_path):
    path = tmp_path / "net_out.h5"
    net = Net(net_from_text(f'''
layer {{ name: "in" type: "Input" top: "data" top: "label"
  input_param {{ shape {{ dim: 3 dim: 2 dim: 2 }} shape {{ dim: 3 }} }} }}
layer {{ name: "out" type: "HDF5Output" bottom: "data" bottom: "label"
  hdf5_output_param {{ file_name: "{path}" }} }}'''), phase=caffe.TEST)
    data = RNG.standard_normal((3, 2, 2)).astype(np.float32)
    net.blobs["data"].data[...] = data
    net.blobs["label"].data[...] = [0, 1, 2]
    net.forward()
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["data"][...], data.reshape(3, 2, 2, 1))
        np.testing.assert_array_equal(f["label"][...].ravel(), [0, 1, 2])
