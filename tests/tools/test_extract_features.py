"""extract_features: one Datum of float_data per image and blob, keyed %010d, as Caffe."""
import os

import numpy as np
import pytest

from cct import cli
from cct.api import Net
from cct.net import TEST
from cct.proto import caffe_pb2
from tests.tools import records

NET = """
name: "features"
layer { name: "data" type: "DummyData" top: "data"
        dummy_data_param { shape { dim: 4 dim: 3 } data_filler { type: "constant" value: 0.5 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 2 } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
"""


@pytest.fixture
def model(tmp_path):
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET)
    net = Net(str(proto), TEST)
    weights, bias = net.params["ip"]
    weights.data[...] = [[1.0, 2.0, -1.0], [-3.0, 0.0, 1.0]]
    bias.data[...] = [0.25, 0.5]
    net.save(str(tmp_path / "net.caffemodel"))
    return str(tmp_path / "net.caffemodel"), str(proto)


def test_features_of_two_blobs(model, tmp_path):
    weights, proto = model
    dbs = f"{tmp_path}/ip_db,{tmp_path}/data_db"
    assert cli.main(["extract_features", weights, proto, "ip,data", dbs, "3", "lmdb"]) == 0
    ip = records(tmp_path / "ip_db")
    assert [k for k, _ in ip] == [b"%010d" % i for i in range(12)]
    # ReLU(0.5 * row sums + bias), in place on ip: [1.25, 0] for every image
    expected = caffe_pb2.Datum(channels=2, height=1, width=1, float_data=[1.25, 0.0])
    assert all(v == expected.SerializeToString() for _, v in ip)
    data = records(tmp_path / "data_db")
    assert len(data) == 12
    assert caffe_pb2.Datum.FromString(data[0][1]) == caffe_pb2.Datum(
        channels=3, height=1, width=1, float_data=[0.5, 0.5, 0.5])


def test_lenet_features_classify_the_test_digits(caffe_fixtures, tmp_path, monkeypatch,
                                                 capsys):
    monkeypatch.chdir(caffe_fixtures)  # the prototxt names its LMDBs relative to the folder
    out = f"{tmp_path}/ip2,{tmp_path}/label"
    assert cli.main(["extract_features", "lenet_iter_2000.caffemodel",
                     "lenet_train_test.prototxt", "ip2,label", out, "2",
                     "--backend=lmdb"]) == 0
    err = capsys.readouterr().err
    assert "Extracted features of 200 query images for feature blob ip2" in err
    assert "Successfully extracted the features!" in err
    scores = [caffe_pb2.Datum.FromString(v) for _, v in records(tmp_path / "ip2")]
    labels = [caffe_pb2.Datum.FromString(v).float_data[0] for _, v in records(tmp_path / "label")]
    assert (scores[0].channels, scores[0].height, scores[0].width) == (10, 1, 1)
    predicted = np.argmax([list(d.float_data) for d in scores], axis=1)
    assert (predicted == np.array(labels)).mean() > 0.95


def test_errors(model, tmp_path, capsys):
    weights, proto = model
    db = str(tmp_path / "db")
    for argv, message in [
            (["ip", db, "1", "lmdb", "CPU", "0", "x"], "expected 5 to 8"),
            (["nope", db, "1"], "Unknown feature blob name 'nope'"),
            (["ip,data", db, "1"], "must be equal"),
            (["ip", db, "x"], "must be an integer"),
            (["ip", db, "1", "leveldb"], "LevelDB"),
            (["ip", db, "1", "lmdb", "TPU"], "CPU or GPU")]:
        assert cli.main(["extract_features", weights, proto] + argv) == 1
        err = capsys.readouterr().err
        assert "cct: error: extract_features" in err and message in err
    os.mkdir(db)
    assert cli.main(["extract_features", weights, proto, "ip,data", f"{db}2,{db}", "1"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["db", "net.caffemodel", "net.prototxt"]
