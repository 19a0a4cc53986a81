"""Weights I/O: Caffe's .caffemodel and HDF5 files read, written, and copied by layer name."""
import numpy as np
import pytest

import cct as caffe
from cct.errors import CCTError, WeightsError
from cct.io.weights import load_weights, save_caffemodel
from cct.glog import set_quiet
from cct.proto import caffe_pb2

LENET_PARAMS = {"conv1": [(20, 1, 5, 5), (20,)], "conv2": [(50, 20, 5, 5), (50,)],
                "ip1": [(500, 800), (500,)], "ip2": [(10, 500), (10,)]}


@pytest.fixture
def lenet_train(caffe_fixtures, monkeypatch):
    monkeypatch.chdir(caffe_fixtures)
    set_quiet(True)
    try:
        yield caffe.Net("lenet_train_test.prototxt", caffe.TRAIN)
    finally:
        set_quiet(False)


def test_reads_caffes_caffemodel(caffe_fixtures):
    w = load_weights(str(caffe_fixtures / "lenet_iter_1000.caffemodel"))
    assert {k: [a.shape for a in v] for k, v in w.items() if v} == LENET_PARAMS
    assert [k for k, v in w.items() if not v] == ["mnist", "pool1", "pool2", "relu1", "loss"]


def test_hdf5_weights_equal_binary_weights(caffe_fixtures):
    binary = load_weights(str(caffe_fixtures / "lenet_iter_1000.caffemodel"))
    h5 = load_weights(str(caffe_fixtures / "lenet_iter_1000.caffemodel.h5"))
    for name, arrays in binary.items():
        assert len(h5[name]) == len(arrays)
        for a, b in zip(arrays, h5[name]):
            np.testing.assert_array_equal(a, b)


def test_caffes_caffemodel_written_again_is_byte_identical(lenet_train, caffe_fixtures,
                                                           tmp_path):
    """Caffe wrote lenet_iter_1000.caffemodel from the TRAIN net of lenet_train_test.prototxt;
    cct loading those weights into the same net and saving writes the same bytes."""
    src = caffe_fixtures / "lenet_iter_1000.caffemodel"
    lenet_train.copy_from(str(src))
    out = tmp_path / "again.caffemodel"
    lenet_train.save(str(out))
    assert out.read_bytes() == src.read_bytes()


def test_parse_and_serialise_is_byte_identical(caffe_fixtures):
    for name in ("lenet_iter_1000.caffemodel", "lenet_iter_2000.caffemodel"):
        data = (caffe_fixtures / name).read_bytes()
        assert caffe_pb2.NetParameter.FromString(data).SerializeToString() == data


def test_round_trip_binary_and_hdf5(lenet_train, tmp_path):
    rng = np.random.default_rng(0)
    for blobs in lenet_train.params.values():
        for b in blobs:
            b.data[...] = rng.standard_normal(b.shape)
    lenet_train.save(str(tmp_path / "m.caffemodel"))
    lenet_train.save_hdf5(str(tmp_path / "m.caffemodel.h5"))
    for path in ("m.caffemodel", "m.caffemodel.h5"):
        back = load_weights(str(tmp_path / path))
        for name, blobs in lenet_train.params.items():
            for a, b in zip(back[name], blobs):
                np.testing.assert_array_equal(a, b.data)


def test_unknown_source_layers_are_ignored(lenet_train, caffe_fixtures, tmp_path):
    param = caffe_pb2.NetParameter.FromString(
        (caffe_fixtures / "lenet_iter_1000.caffemodel").read_bytes())
    extra = param.layer.add(name="not_in_net", type="InnerProduct")
    extra.blobs.add().shape.dim.append(0)
    lenet_train.copy_trained_layers_from(param)
    want = load_weights(str(caffe_fixtures / "lenet_iter_1000.caffemodel"))
    np.testing.assert_array_equal(lenet_train.params["ip2"][0].data, want["ip2"][0])


def test_shape_mismatch_names_layer_and_both_shapes(lenet_train, tmp_path):
    param = lenet_train.to_proto()
    ip2 = [l for l in param.layer if l.name == "ip2"][0]
    ip2.blobs[0].shape.dim[:] = [5, 1000]
    path = tmp_path / "bad.caffemodel"
    path.write_bytes(param.SerializeToString())
    with pytest.raises(WeightsError) as e:
        lenet_train.copy_from(str(path))
    msg = str(e.value)
    assert "'ip2'" in msg and "5 1000 (5000)" in msg and "10 500 (5000)" in msg


@pytest.mark.parametrize("content", [b"", b"garbage that is not protobuf \xff\xfe",
                                     "truncated"])
def test_bad_caffemodel_is_a_clear_error(content, caffe_fixtures, tmp_path):
    if content == "truncated":
        content = (caffe_fixtures / "lenet_iter_1000.caffemodel").read_bytes()[:5000]
    path = tmp_path / "bad.caffemodel"
    path.write_bytes(content)
    with pytest.raises(CCTError) as e:
        load_weights(str(path))
    assert str(path) in str(e.value)


def test_missing_weights_file(tmp_path):
    with pytest.raises(WeightsError, match="does not exist"):
        load_weights(str(tmp_path / "nope.caffemodel"))


def test_save_is_atomic_on_failure(lenet_train, tmp_path, monkeypatch):
    """A failing write (e.g. a full disk) leaves the previous file untouched and no temp file."""
    path = tmp_path / "m.caffemodel"
    path.write_bytes(b"previous")
    from cct.io import weights

    class FullDisk:
        """A file whose writes fail as on a full disk (the temp file does get created)."""
        def __init__(self, name, mode="r"):
            self.f = open(name, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(28, "No space left on device")
    monkeypatch.setattr(weights, "open", FullDisk, raising=False)
    with pytest.raises(CCTError, match="No space left"):
        save_caffemodel(lenet_train, str(path))
    monkeypatch.undo()
    assert path.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["m.caffemodel"]


# ------------------------------------------------------------------------------------------------
# Damaged HDF5 weights: a WeightsError naming the file and what is wrong, whatever h5py raised
# ------------------------------------------------------------------------------------------------
def caffe_hdf5(path):
    """Caffe's HDF5 layout for one InnerProduct layer: data/ip/0 (weights), data/ip/1 (bias)."""
    import h5py
    with h5py.File(path, "w") as f:
        layer = f.create_group("data").create_group("ip")
        layer.create_dataset("0", data=np.ones((2, 3), np.float32))
        layer.create_dataset("1", data=np.zeros(2, np.float32))
    return str(path)


def _soft_link(f, name):
    import h5py
    del f[name]
    f[name] = h5py.SoftLink("/nowhere")


@pytest.mark.parametrize("damage, words", [
    # Before: ValueError from int() of a dataset name.
    (lambda f: f["data/ip"].create_dataset("w", data=[1.0]),
     ["data/ip holds 0, 1, w", "expected datasets named 0 to 2"]),
    # Before: ValueError converting strings to float.
    (lambda f: (f.__delitem__("data/ip/0"), f["data/ip"].create_dataset("0", data=b"ab")),
     ["data/ip/0 holds string data, expected float weights"]),
    # Before: AttributeError (a dataset has no keys()).
    (lambda f: (f.__delitem__("data/ip"), f["data"].create_dataset("ip", data=[1.0])),
     ["data/ip is a dataset, expected a group of datasets named 0, 1, ..."]),
    # Before: KeyError from the link's target.
    (lambda f: _soft_link(f, "data/ip/1"), ["data/ip/1 is a broken link"]),
    (lambda f: _soft_link(f, "data/ip"), ["data/ip is a broken link"]),
    (lambda f: (f.__delitem__("data"), f.create_dataset("data", data=[1])),
     ["is HDF5 but has no 'data' group"]),
])
def test_hdf5_weights_of_the_wrong_layout(tmp_path, damage, words):
    import h5py
    path = caffe_hdf5(tmp_path / "w.caffemodel.h5")
    with h5py.File(path, "r+") as f:
        damage(f)
    with pytest.raises(WeightsError) as e:
        load_weights(path)
    assert f"weights file '{path}'" in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_hdf5_weights_with_damaged_metadata(tmp_path):
    """Damaged HDF5 structures come out of h5py as RuntimeError, KeyError, ... (here: the
    'data' group's B-tree signature): reported as a damaged file."""
    path = caffe_hdf5(tmp_path / "w.caffemodel.h5")
    data = bytearray(open(path, "rb").read())
    trees = [i for i in range(len(data)) if data.startswith(b"TREE", i)]
    data[trees[1] + 1] ^= 0xFF
    open(path, "wb").write(data)
    with pytest.raises(WeightsError, match=rf"cannot read HDF5 weights file '{path}': it is "
                                           r"damaged or not written by Caffe \(RuntimeError"):
        load_weights(path)


def test_a_layer_name_holding_a_slash_is_a_broken_link(tmp_path):
    """A name a file's heap holds but h5py cannot follow (before: AttributeError on None)."""
    path = caffe_hdf5(tmp_path / "w.caffemodel.h5")
    data = open(path, "rb").read()
    open(path, "wb").write(data.replace(b"ip\0", b"i/\0"))
    with pytest.raises(WeightsError, match=rf"'{path}': data/i/ is a broken link"):
        load_weights(path)


def test_unreadable_weights_file(tmp_path, monkeypatch):
    path = caffe_hdf5(tmp_path / "w.caffemodel.h5")

    def refuse(*args, **kw):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("cct.io.weights.open", refuse, raising=False)
    with pytest.raises(WeightsError, match=rf"cannot read weights file '{path}': Permission "
                                           r"denied"):
        load_weights(path)
