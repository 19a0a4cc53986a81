"""The Data layer on Caffe's own LMDBs: records in key order, wrap-around, transforms."""
import gzip
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from cct.errors import CCTError
from cct.install import install_hint
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
    assert layer.num_records == 2000        # an epoch, for the optimizer's re-tunes


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


# ------------------------------------------------------------------------------------------------
# Databases written here with py-lmdb / plyvel
# ------------------------------------------------------------------------------------------------
def raw_datum(arr, label):
    """A Datum holding uint8 ``data`` (or ``float_data`` for a float array) of shape C x H x W."""
    arr = np.asarray(arr)
    d = caffe_pb2.Datum(channels=arr.shape[0], height=arr.shape[1], width=arr.shape[2],
                        label=int(label))
    if arr.dtype == np.uint8:
        d.data = arr.tobytes()
    else:
        d.float_data.extend(arr.ravel().tolist())
    return d


def encoded_datum(image_bytes, label):
    return caffe_pb2.Datum(data=image_bytes, label=int(label), encoded=True)


def write_lmdb(path, values):
    """``values``: Datums (keys 00000000, 00000001, ... as convert_imageset writes them) or
    (key, bytes) pairs."""
    import lmdb
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i, v in enumerate(values):
            key, value = v if isinstance(v, tuple) else (b"%08d" % i, v.SerializeToString())
            txn.put(key, value)
    env.close()
    return path


def image_bytes(hwc_rgb, fmt="PNG", **kw):
    import io
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(hwc_rgb).save(buf, fmt, **kw)
    return buf.getvalue()


def digits_db(tmp_path, n=10, shape=(1, 4, 5), name="db"):
    """n records whose pixels are all equal to the record index (label = index)."""
    return write_lmdb(tmp_path / name, [raw_datum(np.full(shape, i, np.uint8), i)
                                        for i in range(n)])


def layer_of(source, body="", batch=4, phase=caffe_pb2.TEST, tops=2, backend="LMDB", seed=1701):
    text = (f'type: "Data" data_param {{ source: "{source}" batch_size: {batch} '
            f'backend: {backend} }} {body}')
    return build_layer(text, [], num_tops=tops, phase=phase, dtype=np.float32, seed=seed)


def run(layer, top, n):
    out = []
    for _ in range(n):
        layer.forward([], top)
        out.append([t.data.copy() for t in top])
    return out


def test_records_in_key_order_wrap_around_and_log_the_restart(tmp_path, capsys):
    layer, _, top = layer_of(digits_db(tmp_path, 10), batch=4)
    labels = [b[1] for b in run(layer, top, 3)]
    layer.close()
    np.testing.assert_array_equal(np.concatenate(labels), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1])
    err = capsys.readouterr().err
    assert "db_lmdb.cpp:35] Opened lmdb" in err
    assert "data_layer.cpp:45] output data size: 4,1,4,5" in err
    assert "data_layer.cpp:73] Restarting data prefetching from start." in err


def test_keys_are_read_in_byte_order_not_insertion_order(tmp_path):
    values = [(b"b", raw_datum(np.full((1, 2, 2), 2, np.uint8), 2).SerializeToString()),
              (b"a", raw_datum(np.full((1, 2, 2), 1, np.uint8), 1).SerializeToString()),
              (b"c", raw_datum(np.full((1, 2, 2), 3, np.uint8), 3).SerializeToString())]
    layer, _, top = layer_of(write_lmdb(tmp_path / "db", values), batch=3)
    layer.forward([], top)
    layer.close()
    np.testing.assert_array_equal(top[1].data, [1, 2, 3])
    np.testing.assert_array_equal(top[0].data[:, 0, 0, 0], [1, 2, 3])


def test_float_data_datums(tmp_path):
    arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    layer, _, top = layer_of(write_lmdb(tmp_path / "db", [raw_datum(arr, 5)]),
                             "transform_param { scale: 2 }", batch=2)
    layer.forward([], top)
    layer.close()
    np.testing.assert_array_equal(top[0].data[0], arr * np.float32(2))
    np.testing.assert_array_equal(top[1].data, [5, 5])


def test_encoded_png_and_jpeg_datums_decode_to_bgr(tmp_path):
    from PIL import Image
    import io
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (6, 7, 3), dtype=np.uint8)
    jpg = image_bytes(rgb, "JPEG", quality=95)
    db = write_lmdb(tmp_path / "db", [encoded_datum(image_bytes(rgb), 1), encoded_datum(jpg, 2)])
    layer, _, top = layer_of(db, batch=2)
    layer.forward([], top)
    layer.close()
    np.testing.assert_array_equal(top[0].data[0], rgb[..., ::-1].transpose(2, 0, 1))
    jpeg_rgb = np.asarray(Image.open(io.BytesIO(jpg)).convert("RGB"))
    np.testing.assert_array_equal(top[0].data[1], jpeg_rgb[..., ::-1].transpose(2, 0, 1))
    np.testing.assert_array_equal(top[1].data, [1, 2])


@pytest.mark.parametrize("transform,data_extra,channels", [
    ("", "", 1),
    ("transform_param { force_color: true }", "", 3),
    ("", "force_encoded_color: true", 3),
])
def test_grey_encoded_datums_as_stored_or_forced_to_colour(tmp_path, transform, data_extra,
                                                          channels):
    grey = np.arange(20, dtype=np.uint8).reshape(4, 5) * 10
    db = write_lmdb(tmp_path / "db", [encoded_datum(image_bytes(grey), 0)])
    text = (f'type: "Data" data_param {{ source: "{db}" batch_size: 1 backend: LMDB '
            f'{data_extra} }} {transform}')
    layer, _, top = build_layer(text, [], num_tops=2, dtype=np.float32)
    layer.forward([], top)
    layer.close()
    assert top[0].shape == (1, channels, 4, 5)
    for c in range(channels):
        np.testing.assert_array_equal(top[0].data[0, c], grey)


def test_force_gray_uses_libpngs_integer_luma(tmp_path):
    rgb = np.random.default_rng(1).integers(0, 256, (5, 6, 3), dtype=np.uint8)
    db = write_lmdb(tmp_path / "db", [encoded_datum(image_bytes(rgb), 0)])
    layer, _, top = layer_of(db, "transform_param { force_gray: true }", batch=1)
    layer.forward([], top)
    layer.close()
    r, g, b = (rgb[..., i].astype(np.int64) for i in range(3))
    # png_set_rgb_to_gray(0.299, 0.587) in libpng's 15-bit fixed point, truncated.
    want = (9797 * r + 19234 * g + 3737 * b) >> 15
    np.testing.assert_array_equal(top[0].data[0, 0], want)


def test_rand_skip_starts_at_a_random_record_below_rand_skip(tmp_path):
    from cct.rng import get_rng, set_random_seed
    db = digits_db(tmp_path, 10)
    set_random_seed(5)
    expected = int(get_rng().integers(0, 7))
    text = (f'type: "Data" data_param {{ source: "{db}" batch_size: 3 backend: LMDB '
            f'rand_skip: 7 }}')
    layer, _, top = build_layer(text, [], num_tops=2, dtype=np.float32, seed=5)
    layer.forward([], top)
    layer.close()
    np.testing.assert_array_equal(top[1].data, (np.arange(3) + expected) % 10)


def test_a_corrupt_record_fails_the_forward_that_reads_it_naming_its_key(tmp_path):
    good = [raw_datum(np.full((1, 2, 2), i, np.uint8), i).SerializeToString() for i in range(4)]
    values = [(b"%08d" % i, v) for i, v in enumerate(good)] + [(b"00000004", b"\xff\x01junk")]
    layer, _, top = layer_of(write_lmdb(tmp_path / "db", values), batch=2)
    run(layer, top, 2)  # records 0..3 are fine
    with pytest.raises(CCTError, match=r"record b'00000004'.*not a Datum"):
        layer.forward([], top)
    with pytest.raises(CCTError, match="00000004"):  # and it stays failed
        layer.forward([], top)
    layer.close()


def test_an_undecodable_image_names_the_database_and_key(tmp_path):
    db = write_lmdb(tmp_path / "db", [encoded_datum(b"GIF89a, cut short", 0)])
    with pytest.raises(CCTError) as e:
        layer_of(db, batch=1)   # set-up reads the first record for the top shapes
    message = str(e.value)
    assert f"record b'00000000' of '{db}': cannot decode the image (17 bytes)" in message
    assert "the data start with b'GIF89a, '" in message and "BytesIO" not in message


def png_claiming(width: int, height: int) -> bytes:
    """A small PNG whose header (CRC made right) claims width x height pixels."""
    import struct
    import zlib
    png = image_bytes(np.zeros((2, 2, 3), np.uint8))
    ihdr = png[12:16] + struct.pack(">II", width, height) + png[24:29]
    return png[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + png[33:]


def test_an_image_claiming_a_huge_size_names_the_database_and_key(tmp_path):
    """Pillow's DecompressionBombError (over 179 Mpixel), before raw on the first record and
    wrapped as "the prefetch thread failed" on later ones."""
    bomb = encoded_datum(png_claiming(20000, 20000), 1)
    good = encoded_datum(image_bytes(np.zeros((2, 2, 3), np.uint8)), 0)
    db = write_lmdb(tmp_path / "first", [bomb])
    with pytest.raises(CCTError, match=rf"record b'00000000' of '{tmp_path / 'first'}': cannot "
                                       r"decode the image .*400000000 pixels"):
        layer_of(db, batch=1)
    db = write_lmdb(tmp_path / "later", [good, good, bomb])
    layer, _, top = layer_of(db, batch=2)
    layer.forward([], top)
    with pytest.raises(CCTError) as e:  # read by the prefetch thread
        layer.forward([], top)
    layer.close()
    assert f"record b'00000002' of '{db}': cannot decode the image" in str(e.value)
    assert "prefetch thread failed" not in str(e.value) and e.value.__cause__ is None


def test_any_error_pillow_raises_on_damaged_data_names_the_key(tmp_path):
    """Pillow raises what damaged data triggers, not only OSError: a TIFF whose tag type byte
    is changed gave a raw TypeError."""
    tiff = bytearray(image_bytes(np.zeros((2, 2, 3), np.uint8), "TIFF"))
    tiff[72] = 2
    db = write_lmdb(tmp_path / "db", [encoded_datum(bytes(tiff), 0)])
    with pytest.raises(CCTError, match=rf"record b'00000000' of '{db}': cannot decode the "
                                       r"image \(152 bytes\)"):
        layer_of(db, batch=1)


def test_a_damaged_lmdb_page_names_the_database(tmp_path):
    """A corrupt page reaches the prefetch thread as lmdb.CorruptedError, before reported
    through the wrapper kept for bugs. Run in a child process: liblmdb aborts on some other
    damage, which must not take the test run with it."""
    import struct
    db = write_lmdb(tmp_path / "db", [raw_datum(np.full((1, 10, 30), i, np.uint8), i)
                                      for i in range(100)])
    data = bytearray((db / "data.mdb").read_bytes())
    page = 4096
    leaves = [p for p in range(2, len(data) // page)
              if struct.unpack_from("<H", data, p * page + 10)[0] == 0x02]  # P_LEAF
    last = max(leaves, key=lambda p: data.find(b"00000099", p * page, (p + 1) * page) >= 0)
    struct.pack_into("<H", data, last * page + 10, 0x10)  # not a leaf any more
    (db / "data.mdb").write_bytes(bytes(data))
    code = (f"from tests.layers.test_data import layer_of\n"
            f"layer, _, top = layer_of({str(db)!r}, batch=10)\n"
            f"try:\n"
            f"    for _ in range(10):\n"
            f"        layer.forward([], top)\n"
            f"except Exception as e:\n"
            f"    print(type(e).__name__, e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith(f"CCTError Data layer 'under_test': LMDB '{db}' cannot be "
                                 f"read, its data.mdb is damaged: "), run.stdout
    assert "MDB_CORRUPTED" in run.stdout


def test_records_of_different_shapes_in_one_batch_are_an_error_unless_cropped(tmp_path):
    db = write_lmdb(tmp_path / "db", [raw_datum(np.zeros((1, 4, 4), np.uint8), 0),
                                      raw_datum(np.ones((1, 5, 6), np.uint8), 1)])
    layer, _, top = layer_of(db, batch=2)
    with pytest.raises(CCTError, match=r"record b'00000001'.*has shape \(1, 5, 6\)"):
        layer.forward([], top)
    layer.close()
    layer, _, top = layer_of(db, "transform_param { crop_size: 3 }", batch=2)
    layer.forward([], top)
    layer.close()
    assert top[0].shape == (2, 1, 3, 3)
    np.testing.assert_array_equal(top[0].data[:, 0, 0, 0], [0, 1])


def test_each_batch_takes_the_shape_of_its_first_record(tmp_path):
    db = write_lmdb(tmp_path / "db", [raw_datum(np.zeros((1, 4, 4), np.uint8), 0),
                                      raw_datum(np.ones((1, 5, 6), np.uint8), 1)])
    layer, _, top = layer_of(db, batch=1)
    shapes = []
    for _ in range(3):
        layer.forward([], top)
        shapes.append(top[0].shape)
    layer.close()
    assert shapes == [(1, 1, 4, 4), (1, 1, 5, 6), (1, 1, 4, 4)]


def test_backend_mismatches_are_explained(tmp_path):
    pytest.importorskip("plyvel")
    db = digits_db(tmp_path, 2)
    with pytest.raises(CCTError, match="is an LMDB, but data_param.backend is LEVELDB"):
        layer_of(db, backend="LEVELDB")


def test_leveldb_without_plyvel_says_how_to_install_it(tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "plyvel", None)
    with pytest.raises(CCTError, match=re.escape(install_hint("leveldb"))):
        layer_of(tmp_path / "some_leveldb", backend="LEVELDB")


def test_leveldb_source(tmp_path, capsys):
    plyvel = pytest.importorskip("plyvel")
    db = plyvel.DB(str(tmp_path / "ldb"), create_if_missing=True)
    for i in range(5):
        db.put(b"%08d" % i, raw_datum(np.full((1, 2, 3), i, np.uint8), i).SerializeToString())
    db.close()
    layer, _, top = layer_of(tmp_path / "ldb", batch=3, backend="LEVELDB")
    labels = np.concatenate([b[1] for b in run(layer, top, 2)])
    state = layer.data_state()
    layer.close()
    np.testing.assert_array_equal(labels, [0, 1, 2, 3, 4, 0])
    assert "db_leveldb.cpp:18] Opened leveldb" in capsys.readouterr().err
    layer2, _, top2 = layer_of(tmp_path / "ldb", batch=3, backend="LEVELDB")
    layer3, _, top3 = layer_of(tmp_path / "ldb", batch=2, backend="LEVELDB")  # opened twice
    layer2.load_data_state(state)
    layer2.forward([], top2)
    layer3.forward([], top3)
    layer2.close()
    layer3.close()
    np.testing.assert_array_equal(top2[1].data, [1, 2, 3])
    np.testing.assert_array_equal(top3[1].data, [0, 1])
    with pytest.raises(CCTError, match="is not an LMDB.*looks like a LevelDB"):
        layer_of(tmp_path / "ldb", backend="LMDB")


# ------------------------------------------------------------------------------------------------
# Exact resume, threads
# ------------------------------------------------------------------------------------------------
CROP_MIRROR = "transform_param { crop_size: 3 mirror: true }"


def noisy_db(tmp_path, n=13):
    rng = np.random.default_rng(3)
    return write_lmdb(tmp_path / "noisy", [raw_datum(rng.integers(0, 256, (2, 5, 6), np.uint8), i)
                                           for i in range(n)])


def test_data_state_counts_what_forward_returned_not_what_was_prefetched(tmp_path):
    import json
    import time
    layer, _, top = layer_of(noisy_db(tmp_path), CROP_MIRROR, batch=4, phase=caffe_pb2.TRAIN)
    assert layer.data_state()["records"] == 0
    run(layer, top, 2)
    time.sleep(0.05)  # let the prefetcher run ahead
    state = layer.data_state()
    layer.close()
    assert state["records"] == 8 and state["position"] == 8 and state["type"] == "Data"
    assert json.loads(json.dumps(state)) == state


@pytest.mark.parametrize("done", [0, 1, 3, 4])
def test_a_restored_layer_continues_with_the_batches_of_the_uninterrupted_run(tmp_path, done):
    db = noisy_db(tmp_path)
    ref, _, top = layer_of(db, CROP_MIRROR, batch=4, phase=caffe_pb2.TRAIN, seed=11)
    uninterrupted = run(ref, top, done + 4)
    ref.close()
    first, _, top = layer_of(db, CROP_MIRROR, batch=4, phase=caffe_pb2.TRAIN, seed=11)
    run(first, top, done)
    state = first.data_state()
    first.close()
    resumed, _, top = layer_of(db, CROP_MIRROR, batch=4, phase=caffe_pb2.TRAIN, seed=99)
    run(resumed, top, 1)  # wherever it was, load_data_state repositions it
    resumed.load_data_state(state)
    for want, got in zip(uninterrupted[done:], run(resumed, top, 4)):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    resumed.close()


def test_resume_finds_the_record_by_position_when_the_key_is_gone(tmp_path):
    layer, _, top = layer_of(digits_db(tmp_path, 10), batch=3)
    run(layer, top, 1)
    state = dict(layer.data_state(), key="")
    layer.load_data_state(state)
    layer.forward([], top)
    layer.close()
    np.testing.assert_array_equal(top[1].data, [3, 4, 5])


def test_a_foreign_data_state_is_refused(tmp_path):
    layer, _, top = layer_of(digits_db(tmp_path, 4), batch=2)
    with pytest.raises(CCTError, match="must come from a Data layer"):
        layer.load_data_state({"type": "ImageData", "records": 0, "position": 0})
    with pytest.raises(CCTError, match="lacks position"):
        layer.load_data_state({"type": "Data", "records": 0})
    layer.close()


def test_two_layers_on_one_database_read_identical_batches(tmp_path):
    db = noisy_db(tmp_path)
    a, _, ta = layer_of(db, CROP_MIRROR, batch=5, phase=caffe_pb2.TRAIN, seed=4)
    b, _, tb = layer_of(db, CROP_MIRROR, batch=5, phase=caffe_pb2.TRAIN, seed=4)
    for x, y in zip(run(a, ta, 6), run(b, tb, 6)):
        np.testing.assert_array_equal(x[0], y[0])
    a.close()
    b.close()


def test_close_stops_the_thread_and_later_forwards_fail_clearly(tmp_path):
    layer, _, top = layer_of(digits_db(tmp_path, 10), batch=2)
    layer.forward([], top)
    thread = layer.prefetcher._thread
    layer.close()
    assert not thread.is_alive()
    with pytest.raises(CCTError, match="closed"):
        layer.forward([], top)
    layer.close()  # closing twice is harmless


def test_an_unreferenced_layer_stops_its_thread(tmp_path):
    import gc
    layer, _, top = layer_of(digits_db(tmp_path, 10), batch=2)
    thread = layer.prefetcher._thread
    del layer, top
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_net_close_and_log_order_of_a_data_net(tmp_path, capsys):
    from cct.io.prototxt import net_from_text
    from cct.net import Net
    db = digits_db(tmp_path, 6)
    net = Net(net_from_text(f'''layer {{ name: "d" type: "Data" top: "data" top: "label"
        data_param {{ source: "{db}" batch_size: 2 backend: LMDB }} }}'''), phase=caffe_pb2.TEST)
    net.forward()
    net.close()
    assert not net.layers[0].prefetcher._thread.is_alive()
    err = capsys.readouterr().err
    order = ["Creating layer d", "Opened lmdb", "Creating Layer d", "d -> data",
             "output data size: 2,1,4,5", "Setting up d"]
    positions = [err.index(s) for s in order]
    assert positions == sorted(positions)


# ------------------------------------------------------------------------------------------------
# DataTransformer
# ------------------------------------------------------------------------------------------------
def transformer(text, phase=caffe_pb2.TEST, seed=3):
    from google.protobuf import text_format
    from cct.data_transformer import DataTransformer
    from cct.rng import set_random_seed
    set_random_seed(seed)
    p = caffe_pb2.TransformationParameter()
    text_format.Merge(text, p)
    t = DataTransformer(p, phase, "test")
    t.init_rand()
    return t


def test_transform_is_mean_then_scale_in_float32():
    x = np.random.default_rng(0).integers(0, 256, (2, 3, 4, 5), dtype=np.uint8)
    out = transformer("scale: 0.017 mean_value: 104 mean_value: 117 mean_value: 123").transform(x)
    mean = np.array([104, 117, 123], np.float32)[None, :, None, None]
    np.testing.assert_array_equal(out, (x.astype(np.float32) - mean) * np.float32(0.017))
    one = transformer("mean_value: 100").transform(x)
    np.testing.assert_array_equal(one, x.astype(np.float32) - 100)


def test_mean_file_is_subtracted_at_the_uncropped_position(tmp_path):
    from cct.io.blobproto import blob_to_proto
    mean = np.random.default_rng(1).random((1, 2, 6, 7)).astype(np.float32) * 50
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(blob_to_proto(mean, caffe_pb2.BlobProto()).SerializeToString())
    x = np.random.default_rng(2).integers(0, 256, (3, 2, 6, 7), dtype=np.uint8)
    out = transformer(f'mean_file: "{path}" crop_size: 4').transform(x)  # TEST: centre crop
    want = (x.astype(np.float32) - mean)[:, :, 1:5, 1:5]
    np.testing.assert_array_equal(out, want)
    with pytest.raises(CCTError, match="mean file is 2 x 6 x 7 but the data is 2 x 5 x 7"):
        transformer(f'mean_file: "{path}"').transform(x[:, :, :5])


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("mean", ["file", "values", "none"])
def test_crop_mirror_mean_and_scale_together_are_the_float32_formula(tmp_path, mean, dtype):
    """The one-pass kernel (numba) against the formula, to the bit, on examples of several
    shapes in TRAIN (random crops and flips: their draws read back from a twin transformer)."""
    from cct.io.blobproto import blob_to_proto
    rng = np.random.default_rng(4)
    shapes = [(3, 9, 11), (3, 10, 8), (3, 9, 9), (3, 12, 13)]
    if mean == "file":
        shapes = [(3, 9, 11)] * 4
        values = rng.random((1, 3, 9, 11)).astype(np.float32) * 50
        path = tmp_path / "mean.binaryproto"
        path.write_bytes(blob_to_proto(values, caffe_pb2.BlobProto()).SerializeToString())
        text = f'mean_file: "{path}"'
    elif mean == "values":
        values = np.array([104.5, -3, 123], np.float32)
        text = "mean_value: 104.5 mean_value: -3 mean_value: 123"
    else:
        values, text = np.zeros(3, np.float32), ""
    x = [(rng.random(s) * 255).astype(dtype) for s in shapes]
    text += " crop_size: 7 mirror: true scale: 0.017"
    out = transformer(text, caffe_pb2.TRAIN).transform(x)
    twin = transformer(text, caffe_pb2.TRAIN).rng
    flips = twin.integers(0, 2, len(x)).astype(bool)
    h_off = twin.integers(0, np.array([s[1] for s in shapes]) - 7 + 1)
    w_off = twin.integers(0, np.array([s[2] for s in shapes]) - 7 + 1)
    assert flips.any() and not flips.all()  # both of the kernel's loops ran
    for i, xi in enumerate(x):
        rows, cols = slice(h_off[i], h_off[i] + 7), slice(w_off[i], w_off[i] + 7)
        m = (values[0][:, rows, cols] if mean == "file" else values[:, None, None])
        want = (xi[:, rows, cols].astype(np.float32) - m) * np.float32(0.017)
        np.testing.assert_array_equal(out[i], want[..., ::-1] if flips[i] else want)


def test_mirror_flips_about_half_the_examples_in_test_too():
    x = np.arange(400 * 2 * 3, dtype=np.uint8).reshape(400, 1, 2, 3)
    out = transformer("mirror: true", caffe_pb2.TEST).transform(x)
    flipped = np.all(out == x[..., ::-1], axis=(1, 2, 3))
    kept = np.all(out == x, axis=(1, 2, 3))
    assert np.all(flipped | kept) and 150 < flipped.sum() < 250


def test_random_crops_in_train_cover_every_offset():
    x = np.arange(500 * 4 * 5, dtype=np.float32).reshape(500, 1, 4, 5)
    out = transformer("crop_size: 2", caffe_pb2.TRAIN).transform(x)
    offsets = {(int(o[0, 0, 0] - i * 20) // 5, int(o[0, 0, 0] - i * 20) % 5)
               for i, o in enumerate(out)}
    assert offsets == {(h, w) for h in range(3) for w in range(4)}
    for i, o in enumerate(out):
        h, w = divmod(int(o[0, 0, 0] - i * 20), 5)
        np.testing.assert_array_equal(o, x[i, :, h:h + 2, w:w + 2])


def test_transformer_setting_errors(tmp_path):
    with pytest.raises(CCTError, match="both force_color and force_gray"):
        transformer("force_color: true force_gray: true")
    with pytest.raises(CCTError, match="both mean_file and mean_value"):
        transformer('mean_file: "m" mean_value: 1')
    with pytest.raises(CCTError, match="cannot read mean_file"):
        transformer(f'mean_file: "{tmp_path}/none.binaryproto"')
    with pytest.raises(CCTError, match="2 mean_value entries for data with 3 channels"):
        transformer("mean_value: 1 mean_value: 2").transform(np.zeros((1, 3, 2, 2), np.uint8))
    with pytest.raises(CCTError, match="crop_size 5 is larger than the data"):
        transformer("crop_size: 5").transform(np.zeros((1, 1, 4, 9), np.uint8))


def test_a_failed_resume_keeps_failing_and_a_closed_layer_cannot_resume(tmp_path):
    layer, _, top = layer_of(digits_db(tmp_path, 4), batch=2)
    state = dict(layer.data_state(), key="", position=9)
    with pytest.raises(CCTError, match="cannot resume at record 9 .* holds fewer records"):
        layer.load_data_state(state)
    with pytest.raises(CCTError, match="cannot resume at record 9"):
        layer.forward([], top)
    layer.close()
    with pytest.raises(CCTError, match="was closed"):
        layer.load_data_state(dict(state, position=0))
