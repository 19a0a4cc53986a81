"""convert_mnist_data: the same LMDB keys and Datum bytes as Caffe's converter."""
import gzip
import os

import numpy as np
import pytest

from cct import cli
from cct.errors import CCTError
from cct.proto import caffe_pb2
from cct.tools import convert_mnist_data
from tests.tools import records

from ..conftest import REPO

DATA = REPO / "examples" / "mnist" / "data"


def write_idx(path, magic, dims, payload, gz=False):
    raw = b"".join(int(x).to_bytes(4, "big") for x in (magic, *dims)) + bytes(payload)
    with open(path, "wb") as f:
        f.write(gzip.compress(raw) if gz else raw)
    return str(path)


@pytest.mark.parametrize("split,images,labels", [
    ("train", "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    ("test", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
])
def test_byte_identical_to_caffes_lmdb(caffe_fixtures, tmp_path, split, images, labels):
    out = tmp_path / "db"
    assert cli.main(["convert_mnist_data", str(DATA / images), str(DATA / labels), str(out),
                     "--backend=lmdb"]) == 0
    mine = records(out)
    caffe = records(caffe_fixtures / f"mnist10k_{split}_lmdb")
    assert len(mine) == len(caffe) == (8000 if split == "train" else 2000)
    assert [k for k, _ in mine] == [k for k, _ in caffe]
    assert mine == caffe


def test_plain_and_gzipped_files_give_the_same_records(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (5, 3, 4), dtype=np.uint8)
    labels = np.array([0, 9, 200, 7, 1], np.uint8)  # 200 is -56 as Caffe's signed char
    for gz in (False, True):
        img = write_idx(tmp_path / f"img{gz}", 2051, (5, 3, 4), pixels.tobytes(), gz)
        lab = write_idx(tmp_path / f"lab{gz}", 2049, (5,), labels.tobytes(), gz)
        assert convert_mnist_data.convert_dataset(img, lab, str(tmp_path / f"db{gz}"),
                                                  "lmdb") == 5
    plain, zipped = records(tmp_path / "dbFalse"), records(tmp_path / "dbTrue")
    assert plain == zipped
    assert [k for k, _ in plain] == [b"%08d" % i for i in range(5)]
    for i, (_, value) in enumerate(plain):
        datum = caffe_pb2.Datum.FromString(value)
        assert (datum.channels, datum.height, datum.width) == (1, 3, 4)
        assert datum.data == pixels[i].tobytes()
        assert datum.label == np.int8(labels[i].view(np.int8))
        assert not datum.HasField("encoded")
        # Caffe's field order: channels, height, width, data, label
        assert value.startswith(b"\x08\x01\x10\x03\x18\x04\x22\x0c" + pixels[i].tobytes())


def test_commits_every_thousand_and_logs_like_caffe(tmp_path, capsys):
    pixels = np.zeros((2500, 2, 2), np.uint8)
    img = write_idx(tmp_path / "img", 2051, (2500, 2, 2), pixels.tobytes())
    lab = write_idx(tmp_path / "lab", 2049, (2500,), bytes(2500))
    assert cli.main(["convert_mnist_data", img, lab, str(tmp_path / "db")]) == 0
    err = capsys.readouterr().err
    assert "convert_mnist_data.cpp:88] A total of 2500 items." in err
    assert "convert_mnist_data.cpp:89] Rows: 2 Cols: 2" in err
    assert "convert_mnist_data.cpp:108] Processed 2500 files." in err
    assert len(records(tmp_path / "db")) == 2500


def error_of(argv, capsys):
    assert cli.main(["convert_mnist_data"] + argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("cct: error: ") and "Traceback" not in err
    return err


def test_errors_are_one_clear_message_and_leave_no_database(tmp_path, capsys):
    img = write_idx(tmp_path / "img", 2051, (2, 2, 2), bytes(8))
    lab = write_idx(tmp_path / "lab", 2049, (2,), bytes(2))
    lab3 = write_idx(tmp_path / "lab3", 2049, (3,), bytes(3))
    short = write_idx(tmp_path / "short", 2051, (4, 2, 2), bytes(8))
    db = str(tmp_path / "db")
    assert "does not exist" in error_of([str(tmp_path / "nope"), lab, db], capsys)
    assert "Incorrect image file magic" in error_of([lab, img, db], capsys)
    assert "Incorrect label file magic" in error_of([img, img, db], capsys)
    assert "holds 2 images but" in error_of([img, lab3, db], capsys)
    assert "truncated" in error_of([short, lab, db], capsys)
    assert "LevelDB" in error_of([img, lab, db, "--backend=leveldb"], capsys)
    assert "expected 3 argument(s)" in error_of([img, lab], capsys)
    assert sorted(os.listdir(tmp_path)) == ["img", "lab", "lab3", "short"]
    assert cli.main(["convert_mnist_data", img, lab, db]) == 0
    capsys.readouterr()
    assert "already exists" in error_of([img, lab, db], capsys)
    assert len(records(db)) == 2


def test_read_idx_rejects_a_truncated_header(tmp_path):
    path = tmp_path / "f"
    path.write_bytes((2051).to_bytes(4, "big") + b"\x00\x00")
    with pytest.raises(CCTError, match="header"):
        convert_mnist_data.read_idx(str(path), 2051, "image file")
