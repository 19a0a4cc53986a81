"""compute_image_mean: Caffe's BlobProto (legacy 1 x C x H x W fields, float32 arithmetic)."""
import lmdb
import numpy as np
import pytest
from PIL import Image

from cct import cli
from cct.errors import CCTError
from cct.io.blobproto import blob_from_proto
from cct.proto import caffe_pb2
from cct.tools.compute_image_mean import compute_mean


def read_blob(path):
    return caffe_pb2.BlobProto.FromString(path.read_bytes())


def caffe_mean(values):
    """Caffe's loop: a float32 running sum, record after record, divided in float32."""
    total = np.zeros(values.shape[1], np.float32)
    for v in values:
        total = (total + v.astype(np.float32)).astype(np.float32)
    return total / np.float32(len(values))


def test_mnist_mean_file(caffe_fixtures, tmp_path, capsys):
    db = caffe_fixtures / "mnist10k_test_lmdb"
    out = tmp_path / "mean.binaryproto"
    assert cli.main(["compute_image_mean", "--backend=lmdb", str(db), str(out)]) == 0
    blob = read_blob(out)
    assert (blob.num, blob.channels, blob.height, blob.width) == (1, 1, 28, 28)
    assert not blob.HasField("shape") and len(blob.diff) == 0
    env = lmdb.open(str(db), readonly=True, lock=False)
    with env.begin() as txn:
        pixels = np.stack([np.frombuffer(caffe_pb2.Datum.FromString(v).data, np.uint8)
                           for _, v in txn.cursor()])
    env.close()
    mean = caffe_mean(pixels)
    assert (np.asarray(blob.data, np.float32) == mean).all()
    assert out.read_bytes() == caffe_pb2.BlobProto(num=1, channels=1, height=28, width=28,
                                                   data=mean.tolist()).SerializeToString()
    assert blob_from_proto(blob).shape == (1, 1, 28, 28)
    err = capsys.readouterr().err
    assert "compute_image_mean.cpp:101] Processed 2000 files." in err
    assert "compute_image_mean.cpp:114] Number of channels: 1" in err
    expected = np.cumsum(mean, dtype=np.float32)[-1] / np.float32(784)
    assert f"mean_value channel [0]: {'%g' % expected}" in err


def make_db(tmp_path, encoded):
    root = tmp_path / "imgs"
    root.mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    lines = []
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)).save(root / f"{i}.png")
        lines.append(f"{i}.png {i}\n")
    (root / "list.txt").write_text("".join(lines))
    db = tmp_path / ("enc" if encoded else "raw")
    argv = ["convert_imageset", f"{root}/", str(root / "list.txt"), str(db)]
    assert cli.main(argv + (["--encoded"] if encoded else [])) == 0
    return db


def test_encoded_database_gives_the_same_mean(tmp_path):
    raw = compute_mean(str(make_db(tmp_path, False)))
    enc = compute_mean(str(make_db(tmp_path, True)))
    assert (raw.channels, raw.height, raw.width) == (3, 4, 6)
    assert raw.SerializeToString() == enc.SerializeToString()


def test_float_data_datums(tmp_path):
    env = lmdb.open(str(tmp_path / "f"), map_size=1 << 20)
    values = np.array([[0.5, -1.0, 2.0], [1.5, 3.0, 0.25]], np.float32)
    with env.begin(write=True) as txn:
        for i, v in enumerate(values):
            d = caffe_pb2.Datum(channels=3, height=1, width=1, float_data=v.tolist())
            txn.put(b"%010d" % i, d.SerializeToString())
    env.close()
    blob = compute_mean(str(tmp_path / "f"))
    assert list(blob.data) == [1.0, 1.0, 1.125]


def test_errors(tmp_path, capsys):
    for argv, message in [([str(tmp_path / "none")], "does not exist"),
                          ([], "usage"), (["a", "b", "c"], "usage"),
                          (["--backend=leveldb", "x"], "LevelDB")]:
        assert cli.main(["compute_image_mean"] + argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("cct: error:") and message in err
    env = lmdb.open(str(tmp_path / "mixed"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"0", caffe_pb2.Datum(channels=1, height=2, width=2, data=bytes(4))
                .SerializeToString())
        txn.put(b"1", caffe_pb2.Datum(channels=1, height=3, width=2, data=bytes(6))
                .SerializeToString())
    env.close()
    with pytest.raises(CCTError, match="Incorrect data field size 6 in record '1'"):
        compute_mean(str(tmp_path / "mixed"))


def test_an_undecodable_record_names_the_database_and_key(tmp_path):
    db = tmp_path / "db"
    env = lmdb.open(str(db), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"00000000", caffe_pb2.Datum(data=b"not an image", encoded=True)
                .SerializeToString())
    env.close()
    with pytest.raises(CCTError, match=f"record '00000000' of '{db}': Could not decode datum"):
        compute_mean(str(db))
