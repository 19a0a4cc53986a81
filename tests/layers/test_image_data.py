"""ImageData: list files, BGR decoding, resizing as cv::resize, shuffling, exact resume, errors;
WindowData's refusal."""
import numpy as np
import pytest
from PIL import Image

from cct.data_transformer import decode_image, read_image, resize_linear
from cct.errors import CCTError
from cct.proto import caffe_pb2
from tests.gradient_check import build_layer


def write_images(folder, n, size=(5, 6), names=None):
    """n RGB PNGs whose pixels encode (index, row, column); returns their RGB arrays."""
    folder.mkdir(exist_ok=True)
    arrays = []
    for i in range(n):
        h, w = size
        rgb = np.zeros((h, w, 3), np.uint8)
        rgb[..., 0] = i
        rgb[..., 1] = np.arange(h)[:, None] * 10
        rgb[..., 2] = np.arange(w)[None, :] * 20
        name = names[i] if names else f"img{i}.png"
        Image.fromarray(rgb).save(folder / name)
        arrays.append(rgb)
    return arrays


def image_layer(tmp_path, lines, body="", batch=2, phase=caffe_pb2.TEST, seed=1701,
                transform=""):
    listing = tmp_path / "list.txt"
    listing.write_text("".join(line + "\n" for line in lines))
    text = (f'type: "ImageData" image_data_param {{ source: "{listing}" batch_size: {batch} '
            f'root_folder: "{tmp_path}/imgs/" {body} }} {transform}')
    return build_layer(text, [], num_tops=2, phase=phase, dtype=np.float32, seed=seed)


def run(layer, top, n):
    out = []
    for _ in range(n):
        layer.forward([], top)
        out.append((top[0].data.copy(), top[1].data.copy()))
    return out


def test_images_in_list_order_as_bgr_chw_with_labels(tmp_path, capsys):
    rgb = write_images(tmp_path / "imgs", 3)
    layer, _, top = image_layer(tmp_path, [f"img{i}.png {10 + i}" for i in range(3)], batch=2)
    batches = run(layer, top, 2)
    layer.close()
    assert top[0].shape == (2, 3, 5, 6)
    np.testing.assert_array_equal(batches[0][0][1], rgb[1][..., ::-1].transpose(2, 0, 1))
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), [10, 11, 12, 10])
    err = capsys.readouterr().err
    assert "image_data_layer.cpp:38] Opening file" in err
    assert "image_data_layer.cpp:56] A total of 3 images." in err
    assert "image_data_layer.cpp:83] output data size: 2,3,5,6" in err


def test_file_names_may_hold_spaces_the_label_follows_the_last_one(tmp_path):
    write_images(tmp_path / "imgs", 2, names=["a b.png", "c  d.png"])
    layer, _, top = image_layer(tmp_path, ["a b.png 4", "", "c  d.png 7"])
    layer.forward([], top)
    layer.close()
    np.testing.assert_array_equal(top[1].data, [4, 7])


def test_grey_reading_and_resizing(tmp_path):
    write_images(tmp_path / "imgs", 2)
    layer, _, top = image_layer(tmp_path, ["img0.png 0", "img1.png 1"],
                                "is_color: false new_height: 9 new_width: 4")
    layer.forward([], top)
    layer.close()
    assert top[0].shape == (2, 1, 9, 4)
    want = read_image(str(tmp_path / "imgs" / "img1.png"), 9, 4, False)
    np.testing.assert_array_equal(top[0].data[1], want)


def test_shuffle_draws_a_new_order_each_pass(tmp_path, capsys):
    n = 12
    write_images(tmp_path / "imgs", n)
    layer, _, top = image_layer(tmp_path, [f"img{i}.png {i}" for i in range(n)], "shuffle: true",
                                batch=4, seed=3)
    labels = np.concatenate([b[1] for b in run(layer, top, 9)]).reshape(3, n)
    layer.close()
    for epoch in labels:
        assert sorted(epoch) == list(range(n))
    assert not np.array_equal(labels[0], labels[1])
    assert not np.array_equal(labels[0], np.arange(n))
    assert "image_data_layer.cpp:51] Shuffling data" in capsys.readouterr().err
    again, _, top = image_layer(tmp_path, [f"img{i}.png {i}" for i in range(n)],
                                "shuffle: true", batch=4, seed=3)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in run(again, top, 3)]), labels[0])
    again.close()


@pytest.mark.parametrize("done", [0, 2, 3, 5])
def test_a_restored_layer_repeats_the_uninterrupted_run_across_passes(tmp_path, done):
    n = 10
    write_images(tmp_path / "imgs", n, size=(6, 7))
    lines = [f"img{i}.png {i}" for i in range(n)]
    body, tr = "shuffle: true", "transform_param { crop_size: 4 mirror: true }"
    ref, _, top = image_layer(tmp_path, lines, body, 4, caffe_pb2.TRAIN, 8, tr)
    uninterrupted = run(ref, top, done + 4)
    ref.close()
    first, _, top = image_layer(tmp_path, lines, body, 4, caffe_pb2.TRAIN, 8, tr)
    run(first, top, done)
    state = first.data_state()
    first.close()
    resumed, _, top = image_layer(tmp_path, lines, body, 4, caffe_pb2.TRAIN, 77, tr)
    resumed.load_data_state(state)
    for (want_x, want_y), (x, y) in zip(uninterrupted[done:], run(resumed, top, 4)):
        np.testing.assert_array_equal(x, want_x)
        np.testing.assert_array_equal(y, want_y)
    resumed.close()


def test_rand_skip(tmp_path):
    from cct.rng import get_rng, set_random_seed
    write_images(tmp_path / "imgs", 6)
    set_random_seed(21)
    skip = int(get_rng().integers(0, 5))
    layer, _, top = image_layer(tmp_path, [f"img{i}.png {i}" for i in range(6)],
                                "rand_skip: 5", batch=1, seed=21)
    layer.forward([], top)
    layer.close()
    assert top[1].data[0] == skip


def test_images_of_several_sizes_with_batch_one(tmp_path):
    (tmp_path / "imgs").mkdir()
    Image.fromarray(np.zeros((4, 5, 3), np.uint8)).save(tmp_path / "imgs" / "a.png")
    Image.fromarray(np.zeros((7, 3, 3), np.uint8)).save(tmp_path / "imgs" / "b.png")
    layer, _, top = image_layer(tmp_path, ["a.png 0", "b.png 1"], batch=1)
    shapes = [x.shape for x, _ in run(layer, top, 2)]
    layer.close()
    assert shapes == [(1, 3, 4, 5), (1, 3, 7, 3)]
    layer, _, top = image_layer(tmp_path, ["a.png 0", "b.png 1"], batch=2)
    with pytest.raises(CCTError, match=r"b.png' \(line 2 of .*is 7 x 3 x 3 channels"):
        layer.forward([], top)
    layer.close()


def test_a_missing_image_names_the_list_file_and_line(tmp_path):
    write_images(tmp_path / "imgs", 2)
    layer, _, top = image_layer(tmp_path, ["img0.png 0", "img1.png 1", "gone.png 2"], batch=2)
    layer.forward([], top)
    with pytest.raises(CCTError, match=r"gone.png': no such file \(line 3 of '.*list.txt'\)"):
        layer.forward([], top)
    layer.close()
    with pytest.raises(CCTError, match="line 1 of"):  # the first image is read at setup
        image_layer(tmp_path, ["gone.png 0"])


@pytest.mark.parametrize("lines,body,message", [
    (["img0.png"], "", r"line 1 of .* is 'img0.png'; expected '<image file> <integer label>'"),
    (["img0.png x"], "", "line 1 of"),
    ([], "", "names no images"),
    (["img0.png 0"], "new_height: 4", "new_height .4. and new_width .0. must be set together"),
    (["img0.png 0"], "rand_skip: 10", None),
])
def test_list_and_parameter_errors(tmp_path, lines, body, message):
    from cct.rng import get_rng, set_random_seed
    write_images(tmp_path / "imgs", 1)
    if message is None:  # rand_skip beyond the list: an error when the draw is that big
        set_random_seed(1701)  # image_layer's seed
        assert int(get_rng().integers(0, 10)) >= 1
        message = "rand_skip drew .* lists only 1 images"
    with pytest.raises(CCTError, match=message):
        image_layer(tmp_path, lines, body)


def test_a_missing_list_file(tmp_path):
    text = f'type: "ImageData" image_data_param {{ source: "{tmp_path}/none.txt" }}'
    with pytest.raises(CCTError, match="cannot open the image list"):
        build_layer(text, [], num_tops=2)


def test_window_data_is_refused_with_advice():
    text = 'type: "WindowData" window_data_param { source: "windows.txt" batch_size: 2 }'
    with pytest.raises(CCTError, match="WindowData is not supported by cct; convert the windows"):
        build_layer(text, [], num_tops=2)


# ------------------------------------------------------------------------------------------------
# cv::resize INTER_LINEAR and decoding
# ------------------------------------------------------------------------------------------------
def bilinear_reference(img, height, width):
    """Half-pixel-centre bilinear interpolation in float64 with edge clamping."""
    c, h, w = img.shape

    def taps(src, dst):
        f = np.clip((np.arange(dst) + 0.5) * src / dst - 0.5, 0, src - 1)
        i0 = np.floor(f).astype(int)
        i1 = np.minimum(i0 + 1, src - 1)
        return i0, i1, f - i0

    y0, y1, fy = taps(h, height)
    x0, x1, fx = taps(w, width)
    x = img.astype(np.float64)
    rows = x[:, :, x0] * (1 - fx) + x[:, :, x1] * fx
    return rows[:, y0] * (1 - fy)[:, None] + rows[:, y1] * fy[:, None]


@pytest.mark.parametrize("size,out", [((9, 13), (20, 7)), ((16, 16), (11, 5)),
                                      ((5, 8), (5, 8)), ((8, 12), (4, 6)), ((1, 6), (3, 2))])
def test_resize_is_bilinear_within_fixed_point_rounding(size, out):
    img = np.random.default_rng(0).integers(0, 256, (3,) + size, dtype=np.uint8)
    ours = resize_linear(img, *out)
    assert ours.shape == (3,) + out and ours.dtype == np.uint8
    assert np.abs(ours - bilinear_reference(img, *out)).max() <= 1


def test_resize_and_decoding_match_opencv_exactly():
    cv2 = pytest.importorskip("cv2")
    import io
    rng = np.random.default_rng(1)
    for trial in range(40):
        c = (1, 3)[trial % 2]
        h, w, oh, ow = (int(v) for v in rng.integers(1, 50, 4))
        img = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
        ref = cv2.resize(img if c == 3 else img[..., 0], (ow, oh)).reshape(oh, ow, c)
        np.testing.assert_array_equal(resize_linear(img.transpose(2, 0, 1), oh, ow),
                                      ref.transpose(2, 0, 1))
    rgb = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
    for fmt in ("PNG", "JPEG"):
        buf = io.BytesIO()
        Image.fromarray(rgb).save(buf, fmt)
        data = buf.getvalue()
        for flag, color in ((cv2.IMREAD_UNCHANGED, None), (cv2.IMREAD_COLOR, True),
                            (cv2.IMREAD_GRAYSCALE, False)):
            ref = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
            ref = ref[None] if ref.ndim == 2 else ref.transpose(2, 0, 1)
            np.testing.assert_array_equal(decode_image(data, color), ref)


def test_decode_errors_are_clear():
    with pytest.raises(CCTError, match="cannot decode the image"):
        decode_image(b"not an image")
    import io
    buf = io.BytesIO()
    Image.fromarray(np.zeros((2, 2), np.uint16)).save(buf, "PNG")
    with pytest.raises(CCTError, match="need 8-bit images"):
        decode_image(buf.getvalue())
