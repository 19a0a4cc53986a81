"""convert_imageset: Caffe's keys and Datum bytes, OpenCV's way of reading and resizing."""
import io
import os

import numpy as np
import pytest
from PIL import Image

from cct import cli
from cct.proto import caffe_pb2
from cct.tools import convert_imageset as ci
from tests.tools import records


def smooth_rgb(h, w, seed=0):
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(x * 5) % 256, (y * 7) % 256, ((x + y) * 3) % 256], -1)
    noise = np.random.default_rng(seed).integers(-20, 20, rgb.shape)
    return np.clip(rgb + noise, 0, 255).astype(np.uint8)


@pytest.fixture
def images(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    rgb = smooth_rgb(12, 17)
    Image.fromarray(rgb).save(root / "a.png")
    Image.fromarray(rgb[:, :, 1]).save(root / "sub" / "gray.png")
    Image.fromarray(rgb).save(root / "sub" / "with space.bmp")
    Image.fromarray(rgb).save(root / "c.jpg", quality=90)
    (root / "list.txt").write_text("a.png 3\nsub/gray.png 1\nsub/with space.bmp 7\n")
    return root, rgb


def run(*argv):
    return cli.main(["convert_imageset", *map(str, argv)])


def test_datums_and_keys_as_caffe(images, tmp_path):
    root, rgb = images
    assert run(f"{root}/", root / "list.txt", tmp_path / "db") == 0
    recs = records(tmp_path / "db")
    assert [k for k, _ in recs] == [b"00000000_a.png", b"00000001_sub/gray.png",
                                    b"00000002_sub/with space.bmp"]
    bgr_chw = rgb[:, :, ::-1].transpose(2, 0, 1).tobytes()
    expected = caffe_pb2.Datum(channels=3, height=12, width=17, data=bgr_chw, label=3,
                               encoded=False)
    assert recs[0][1] == expected.SerializeToString()
    # Caffe's CVMatToDatum sets encoded: false explicitly, so it is serialised (field 7)
    assert recs[0][1].endswith(b"\x28\x03\x38\x00")
    gray = caffe_pb2.Datum.FromString(recs[1][1])
    assert (gray.channels, gray.label) == (3, 1)  # a gray file read in colour: 3 channels
    planes = np.frombuffer(gray.data, np.uint8).reshape(3, 12, 17)
    assert (planes == rgb[:, :, 1]).all()
    assert recs[2][1] == caffe_pb2.Datum(channels=3, height=12, width=17, data=bgr_chw,
                                         label=7, encoded=False).SerializeToString()


def test_gray_flag(images, tmp_path):
    root, rgb = images
    assert run("--gray", f"{root}/", root / "list.txt", tmp_path / "db") == 0
    datum = caffe_pb2.Datum.FromString(records(tmp_path / "db")[0][1])
    assert (datum.channels, datum.height, datum.width) == (1, 12, 17)
    gray = np.frombuffer(datum.data, np.uint8).reshape(12, 17).astype(float)
    luma = rgb @ np.array([0.299, 0.587, 0.114])
    assert np.abs(gray - luma).max() <= 1.0
    assert (gray == np.floor(rgb.astype(np.int64) @ np.array([9797, 19234, 3737]) / 32768)).all()


def test_resize_and_halving(images, tmp_path):
    root, rgb = images
    assert run("--resize_height=5", "--resize_width=8", f"{root}/", root / "list.txt",
               tmp_path / "db") == 0
    datum = caffe_pb2.Datum.FromString(records(tmp_path / "db")[0][1])
    assert (datum.channels, datum.height, datum.width) == (3, 5, 8)
    flat = np.full((6, 10, 3), 77, np.uint8)
    assert (ci.resize(flat, 3, 7) == 77).all() and (ci.resize(flat, 13, 21) == 77).all()
    block = smooth_rgb(8, 10)
    half = ci.resize(block, 4, 5).astype(int)
    b = block.astype(int)
    assert (half == (b[0::2, 0::2] + b[1::2, 0::2] + b[0::2, 1::2] + b[1::2, 1::2] + 2) // 4
            ).all()
    assert (ci.resize(block, 8, 10) == block).all()


def test_resize_and_gray_match_opencv(tmp_path):
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(3)
    for _ in range(40):
        h, w = rng.integers(1, 60, 2)
        height, width = rng.integers(1, 90, 2)
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        assert (ci.resize(image, height, width) == cv2.resize(image, (width, height))).all()
        assert (ci.resize(image[:, :, 0], height, width)
                == cv2.resize(image[:, :, 0], (width, height))).all()
    rgb = smooth_rgb(21, 33)
    for name in ("x.png", "x.jpg", "x.bmp"):
        Image.fromarray(rgb).save(tmp_path / name)
        for flag in (ci.IMREAD_COLOR, ci.IMREAD_GRAYSCALE):
            assert (ci.imdecode(str(tmp_path / name), flag)
                    == cv2.imread(str(tmp_path / name), flag)).all()


def test_encoded_keeps_the_file_or_reencodes(images, tmp_path):
    root, rgb = images
    (root / "enc.txt").write_text("a.png 3\nc.jpg 4\n")
    assert run("--encoded", f"{root}/", root / "enc.txt", tmp_path / "db") == 0
    recs = records(tmp_path / "db")
    png = caffe_pb2.Datum.FromString(recs[0][1])
    assert png.encoded and png.data == (root / "a.png").read_bytes() and png.label == 3
    assert not png.HasField("channels")
    assert recs[0][1] == caffe_pb2.Datum(data=png.data, label=3, encoded=True) \
        .SerializeToString()
    assert caffe_pb2.Datum.FromString(recs[1][1]).data == (root / "c.jpg").read_bytes()
    # a JPEG asked for as PNG is re-encoded: same pixels, PNG bytes
    assert run("--encode_type=png", f"{root}/", root / "enc.txt", tmp_path / "db2") == 0
    jpg = caffe_pb2.Datum.FromString(records(tmp_path / "db2")[1][1])
    assert jpg.encoded and jpg.data.startswith(b"\x89PNG")
    decoded = np.asarray(Image.open(io.BytesIO(jpg.data)))
    assert (decoded == np.asarray(Image.open(root / "c.jpg"))).all()


def test_shuffle_and_blank_lines_keep_caffes_line_ids(images, tmp_path, capsys):
    root, _ = images
    (root / "blank.txt").write_text("a.png 0\n\nsub/gray.png 1\n")
    assert run(f"{root}/", root / "blank.txt", tmp_path / "db") == 0
    assert [k for k, _ in records(tmp_path / "db")] == [b"00000000_a.png",
                                                        b"00000002_sub/gray.png"]
    names = [f"n{i}.png" for i in range(30)]
    for i, name in enumerate(names):
        Image.fromarray(np.full((2, 3, 3), i, np.uint8)).save(root / name)
    (root / "many.txt").write_text("".join(f"{n} {i}\n" for i, n in enumerate(names)))
    capsys.readouterr()
    assert run("--shuffle", f"{root}/", root / "many.txt", tmp_path / "db2") == 0
    assert "Shuffling data" in capsys.readouterr().err
    recs = records(tmp_path / "db2")
    keys = sorted(k.decode() for k, _ in recs)
    assert [k[:8] for k in keys] == ["%08d" % i for i in range(30)]
    assert sorted(k[9:] for k in keys) == sorted(names)
    for key, value in recs:
        datum = caffe_pb2.Datum.FromString(value)
        assert datum.data[0] == datum.label == int(key.decode()[10:-4])
    assert [k[9:] for k in keys] != names  # 30! orders: not the file order


def error_of(capsys, *argv):
    assert run(*argv) == 1
    err = capsys.readouterr().err
    assert "cct: error: convert_imageset" in err and "Traceback" not in err
    return err


def test_errors_name_the_line_and_leave_no_database(images, tmp_path, capsys):
    root, _ = images
    db = tmp_path / "db"
    (root / "missing.txt").write_text("a.png 0\nnope.png 1\n")
    assert "missing.txt:2: image" in error_of(capsys, f"{root}/", root / "missing.txt", db)
    (root / "nolabel.txt").write_text("a.png 0\na.png x\n")
    assert "nolabel.txt:2: expected 'FILE LABEL'" in error_of(capsys, f"{root}/",
                                                               root / "nolabel.txt", db)
    (root / "bad.png").write_bytes(b"not an image")
    (root / "bad.txt").write_text("a.png 0\nbad.png 1\n")
    assert "bad.txt:2: cannot read image" in error_of(capsys, f"{root}/", root / "bad.txt", db)
    (root / "sizes.txt").write_text("a.png 0\nn.png 1\n")
    Image.fromarray(np.zeros((3, 3, 3), np.uint8)).save(root / "n.png")
    assert "Incorrect data field size" in error_of(capsys, "--check_size", f"{root}/",
                                                   root / "sizes.txt", db)
    assert "does not exist" in error_of(capsys, f"{root}/", root / "none.txt", db)
    assert "trailing '/'" in error_of(capsys, root, root / "list.txt", db)
    assert not db.exists() and not [p for p in os.listdir(tmp_path) if "tmp" in p]
    assert run(f"{root}/", root / "list.txt", db) == 0
    capsys.readouterr()
    assert "already exists" in error_of(capsys, f"{root}/", root / "list.txt", db)
