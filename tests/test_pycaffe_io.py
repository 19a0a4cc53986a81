"""pycaffe's caffe.io (cct.io.pycaffe_io, re-exported as cct.io.<name>)."""
import importlib
import io as std_io
import sys

import numpy as np
import pytest
from PIL import Image

import cct
import cct.io
from cct.errors import CCTError
from cct.io import pycaffe_io
from cct.proto import caffe_pb2


def test_pycaffe_names_are_reachable_from_cct_io():
    for name in ("Transformer", "load_image", "resize_image", "oversample", "array_to_datum",
                 "datum_to_array", "blobproto_to_array", "array_to_blobproto",
                 "arraylist_to_blobprotovector_str", "blobprotovector_str_to_arraylist"):
        assert getattr(cct.io, name) is getattr(pycaffe_io, name)
    assert cct.io.caffe_pb2.Datum is caffe_pb2.Datum
    # the file readers stay where they were
    weights = importlib.import_module("cct.io.weights")
    assert cct.io.weights is weights and callable(cct.io.prototxt.net_from_text)


# -- Transformer ----------------------------------------------------------------------------------

def make_transformer(shape=(1, 3, 4, 5)):
    t = cct.io.Transformer({"data": shape})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255.0)
    t.set_input_scale("data", 0.5)
    return t


def test_preprocess_matches_hand_computation_with_channel_mean():
    rng = np.random.default_rng(0)
    img = rng.random((4, 5, 3))
    t = make_transformer()
    t.set_mean("data", np.array([104.0, 117.0, 123.0]))
    out = t.preprocess("data", img)
    expected = np.empty((3, 4, 5))
    for c, src in enumerate((2, 1, 0)):
        expected[c] = (img[:, :, src] * 255.0 - [104.0, 117.0, 123.0][c]) * 0.5
    assert out.dtype == np.float32 and out.shape == (3, 4, 5)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


def test_preprocess_with_elementwise_mean_and_round_trip():
    rng = np.random.default_rng(1)
    img = rng.random((4, 5, 3)).astype(np.float32)
    kept = img.copy()
    mean = rng.random((3, 4, 5)) * 100
    t = make_transformer()
    t.set_mean("data", mean)
    out = t.preprocess("data", img)
    expected = (img.transpose(2, 0, 1)[[2, 1, 0]] * 255.0 - mean) * 0.5
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(img, kept)  # the caller's image is left alone
    back = t.deprocess("data", out[np.newaxis])  # a 1 x K x H x W blob is squeezed
    assert back.shape == (4, 5, 3)
    np.testing.assert_allclose(back, img, atol=1e-5)


def test_preprocess_resizes_to_the_input_size():
    img = np.linspace(0, 1, 8 * 10 * 3).reshape(8, 10, 3)
    t = cct.io.Transformer({"data": (2, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    out = t.preprocess("data", img)
    assert out.shape == (3, 4, 5)
    np.testing.assert_allclose(out, cct.io.resize_image(img.astype(np.float32), (4, 5))
                               .transpose(2, 0, 1))


def test_gray_mean_of_hw_shape():
    t = cct.io.Transformer({"data": (1, 1, 2, 3)})
    t.set_transpose("data", (2, 0, 1))
    t.set_mean("data", np.arange(6.0).reshape(2, 3))
    img = np.full((2, 3, 1), 10.0)
    np.testing.assert_allclose(t.preprocess("data", img)[0], 10.0 - np.arange(6).reshape(2, 3))


def test_transformer_checks():
    t = cct.io.Transformer({"data": (1, 3, 4, 5)})
    with pytest.raises(CCTError, match=r"label is not one of the net inputs"):
        t.set_raw_scale("label", 2)
    with pytest.raises(CCTError, match=r"Transpose order .* got \(1, 0\) for input 'data' of "
                                       r"shape \(1, 3, 4, 5\), expected 3 axes"):
        t.set_transpose("data", (1, 0))
    with pytest.raises(CCTError, match=r"Channel swap .* got \(1, 0\) .* 3 channels"):
        t.set_channel_swap("data", (1, 0))
    with pytest.raises(ValueError, match=r"Mean channels incompatible with input: the mean has "
                                         r"2 values, input 'data' has 3 channels"):
        t.set_mean("data", np.zeros(2))
    with pytest.raises(ValueError, match=r"Mean shape invalid"):
        t.set_mean("data", np.zeros((1, 3, 4, 5)))
    with pytest.raises(ValueError, match=r"Mean shape incompatible with input shape: the mean is "
                                         r"\(2, 5, 4\), input 'data' needs \(3, 4, 5\); .* "
                                         r"the channels must match"):
        t.set_mean("data", np.zeros((2, 5, 4)))
    with pytest.raises(CCTError, match=r"is not one of the net inputs"):
        t.preprocess("x", np.zeros((4, 5, 3)))


def test_set_mean_of_another_size_is_resized_as_caffe_master():
    """BVLC/caffe#5719: an elementwise mean of another H x W is scaled to [0, 1], resized to
    the input's H x W and scaled back, instead of refused."""
    rng = np.random.default_rng(6)
    mean = rng.random((3, 8, 10)) * 100 + 50
    t = cct.io.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_mean("data", mean)
    lo, hi = mean.min(), mean.max()
    expected = cct.io.resize_image(((mean - lo) / (hi - lo)).transpose(1, 2, 0),
                                   (4, 5)).transpose(2, 0, 1) * (hi - lo) + lo
    assert t.mean["data"].shape == (3, 4, 5)
    np.testing.assert_allclose(t.mean["data"], expected, rtol=1e-6)
    img = rng.random((4, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(t.preprocess("data", img), img.transpose(2, 0, 1) - expected,
                               rtol=1e-5, atol=1e-4)
    # an H x W mean of a grey input, and a constant mean (Caffe's scaling would give NaN)
    g = cct.io.Transformer({"data": (1, 1, 4, 5)})
    g.set_mean("data", np.arange(16.0).reshape(2, 8))
    assert g.mean["data"].shape == (1, 4, 5)
    g.set_mean("data", np.full((1, 7, 7), 3.0))
    np.testing.assert_array_equal(g.mean["data"], np.full((1, 4, 5), 3.0))


# -- images ---------------------------------------------------------------------------------------

def test_load_image_color_and_gray(tmp_path):
    rng = np.random.default_rng(2)
    rgb = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    Image.fromarray(rgb, "RGB").save(tmp_path / "rgb.png")
    gray = rng.integers(0, 256, (5, 7), dtype=np.uint8)
    Image.fromarray(gray, "L").save(tmp_path / "gray.png")
    rgba = np.concatenate([rgb, np.full((5, 7, 1), 7, np.uint8)], axis=2)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")

    img = cct.io.load_image(str(tmp_path / "rgb.png"))
    assert img.dtype == np.float32 and img.shape == (5, 7, 3)
    np.testing.assert_allclose(img, rgb / 255.0, rtol=1e-6)

    img = cct.io.load_image(tmp_path / "gray.png")
    assert img.shape == (5, 7, 3)
    for c in range(3):
        np.testing.assert_allclose(img[:, :, c], gray / 255.0, rtol=1e-6)
    img = cct.io.load_image(tmp_path / "gray.png", color=False)
    assert img.shape == (5, 7, 1)
    np.testing.assert_allclose(img[:, :, 0], gray / 255.0, rtol=1e-6)

    img = cct.io.load_image(tmp_path / "rgb.png", color=False)
    luma = (0.2125 * rgb[:, :, 0] + 0.7154 * rgb[:, :, 1] + 0.0721 * rgb[:, :, 2]) / 255.0
    assert img.shape == (5, 7, 1)
    np.testing.assert_allclose(img[:, :, 0], luma, rtol=1e-6)

    img = cct.io.load_image(tmp_path / "rgba.png")
    assert img.shape == (5, 7, 3)
    np.testing.assert_allclose(img, rgb / 255.0, rtol=1e-6)


def test_load_image_16_bit_and_missing(tmp_path):
    deep = np.array([[0, 1000], [40000, 65535]], dtype=np.uint16)
    Image.fromarray(deep).save(tmp_path / "deep.png")
    img = cct.io.load_image(tmp_path / "deep.png", color=False)
    np.testing.assert_allclose(img[:, :, 0], deep / 65535.0, rtol=1e-6)
    with pytest.raises(CCTError, match="does not exist"):
        cct.io.load_image(str(tmp_path / "nope.png"))
    (tmp_path / "junk.png").write_bytes(b"not an image")
    with pytest.raises(CCTError, match="cannot read"):
        cct.io.load_image(str(tmp_path / "junk.png"))


def pixel_reference(im, out_h, out_w, align_corners, order=1):
    """Nearest or linear interpolation written out pixel by pixel: pixel-centre aligned with 0
    beyond the edges (scikit-image's mode='constant'), or corner aligned (ndimage.zoom)."""
    h, w, k = im.shape

    def taps(i, n_in, n_out):
        if align_corners:
            s = i * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            s = (i + 0.5) * n_in / n_out - 0.5
        if order == 0:
            return [(int(np.floor(s + 0.5)), 1.0)]
        i0 = int(np.floor(s))
        return [(i0, 1 - (s - i0)), (i0 + 1, s - i0)]

    def at(y, x):
        return im[y, x] if 0 <= y < h and 0 <= x < w else np.zeros(k)

    out = np.zeros((out_h, out_w, k))
    for y in range(out_h):
        for x in range(out_w):
            out[y, x] = sum(wy * wx * at(yy, xx) for yy, wy in taps(y, h, out_h)
                            for xx, wx in taps(x, w, out_w))
    return out


def without(monkeypatch, *modules):
    """Make ``import`` of these modules fail, as where they are not installed."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("order", [0, 1])
@pytest.mark.parametrize("new_dims", [(9, 12), (10, 13), (5, 6)])
def test_resize_image_upsampling_blends_edges_with_zero(monkeypatch, k, order, new_dims):
    without(monkeypatch, "skimage", "skimage.transform", "scipy", "scipy.ndimage")
    rng = np.random.default_rng(3)
    im = (rng.random((5, 6, k)) * 200 - 50).astype(np.float32)
    out = cct.io.resize_image(im, new_dims, interp_order=order)
    assert out.dtype == np.float32 and out.shape == new_dims + (k,)
    lo, hi = im.min(), im.max()
    std = (im.astype(np.float64) - lo) / (hi - lo)
    expected = np.clip(pixel_reference(std, *new_dims, False, order), 0, 1) * (hi - lo) + lo
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)
    if order == 1 and new_dims == (10, 13):
        # the first row samples in[-0.25]: 3/4 of row 0 and 1/4 of the zero beyond it
        np.testing.assert_allclose(out[0, 1:-1], expected[0, 1:-1], rtol=1e-5, atol=1e-4)
        assert not np.allclose(out[0], out[1])


def test_resize_image_downsampling_blurs_first(monkeypatch):
    without(monkeypatch, "skimage", "skimage.transform", "scipy", "scipy.ndimage")
    im = np.zeros((8, 8, 1), np.float32)
    im[::2, ::2] = 1.0  # a grid that plain sampling would alias to all ones
    out = cct.io.resize_image(im, (4, 4))
    # sigma = (8 / 4 - 1) / 2 = 0.5 on both axes, radius int(4 x 0.5 + 0.5) = 2
    x = np.arange(-2, 3)
    g = np.exp(-0.5 * x ** 2 / 0.25)
    g /= g.sum()
    blurred = np.zeros((8, 8))
    padded = np.pad(im[:, :, 0].astype(np.float64), 2)
    for i in range(8):
        for j in range(8):
            blurred[i, j] = g @ padded[i:i + 5, j:j + 5] @ g
    expected = np.array([[(blurred[2 * i, 2 * j] + blurred[2 * i + 1, 2 * j]
                           + blurred[2 * i, 2 * j + 1] + blurred[2 * i + 1, 2 * j + 1]) / 4
                          for j in range(4)] for i in range(4)])
    np.testing.assert_allclose(out[:, :, 0], expected, rtol=1e-5, atol=1e-6)
    assert out.max() < 0.5


CASES = [((5, 6), (9, 4)), ((5, 6), (3, 13)), ((37, 23), (227, 227)), ((100, 75), (16, 16)),
         ((8, 8), (2, 1)), ((5, 6), (5, 6))]


@pytest.mark.parametrize("order", range(6))
@pytest.mark.parametrize("k", [1, 3])
def test_resize_image_matches_scikit_image(monkeypatch, order, k):
    """pycaffe's own call, skimage.transform.resize(mode='constant'), where scikit-image is
    installed; cct's computation without it must agree."""
    resize = pytest.importorskip("skimage.transform").resize
    if order > 1:
        pytest.importorskip("scipy.ndimage")
    rng = np.random.default_rng(order)
    for shape, new_dims in CASES:
        for dtype in (np.float32, np.float64):
            im = (rng.random(shape + (k,)) * 255).astype(dtype)
            lo, hi = im.min(), im.max()
            std = (im - lo) / (hi - lo)
            caffe = (resize(std, new_dims, order=order, mode="constant") * (hi - lo)
                     + lo).astype(np.float32)
            np.testing.assert_array_equal(cct.io.resize_image(im, new_dims, order), caffe)
            with monkeypatch.context() as m:
                without(m, "skimage", "skimage.transform")
                np.testing.assert_allclose(cct.io.resize_image(im, new_dims, order), caffe,
                                           rtol=0, atol=255 * 2e-6)


@pytest.mark.parametrize("order", [0, 1])
def test_resize_image_without_scipy_matches_ndimage(monkeypatch, order):
    """The NumPy computation of orders 0 and 1 against SciPy's, which scikit-image calls."""
    ndimage = pytest.importorskip("scipy.ndimage")
    rng = np.random.default_rng(10 + order)
    for shape, new_dims in CASES:
        im = rng.random(shape + (3,))
        std = (im - im.min()) / (im.max() - im.min())
        factors = np.array(shape, float) / new_dims
        sigma = np.maximum(0, (factors - 1) / 2) if (factors > 1).any() else np.zeros(2)
        blurred = ndimage.gaussian_filter(std, tuple(sigma) + (0,), mode="grid-constant")
        ref = np.clip(ndimage.zoom(blurred, tuple(1 / factors) + (1,), order=order,
                                   mode="grid-constant", grid_mode=True), 0, 1)
        ref = ref * (im.max() - im.min()) + im.min()
        with monkeypatch.context() as m:
            without(m, "skimage", "skimage.transform", "scipy", "scipy.ndimage")
            out = cct.io.resize_image(im, new_dims, order)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_resize_image_same_size_and_constant():
    im = np.random.default_rng(4).random((4, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(cct.io.resize_image(im, (4, 3)), im, rtol=1e-6)
    const = np.full((4, 3, 1), 0.25, np.float32)
    out = cct.io.resize_image(const, (7, 2))
    assert out.shape == (7, 2, 1) and np.all(out == np.float32(0.25))


@pytest.mark.parametrize("order", [0, 1])
def test_resize_image_other_channel_counts_follow_ndimage_zoom(monkeypatch, order):
    rng = np.random.default_rng(5)
    im = rng.random((5, 6, 2)).astype(np.float32)
    with monkeypatch.context() as m:
        without(m, "scipy", "scipy.ndimage")
        out = cct.io.resize_image(im, (8, 4), order)
    assert out.shape == (8, 4, 2)
    np.testing.assert_allclose(out, pixel_reference(im.astype(np.float64), 8, 4, True, order),
                               rtol=1e-5, atol=1e-6)
    zoom = pytest.importorskip("scipy.ndimage").zoom
    caffe = zoom(im, (8 / 5, 4 / 6, 1), order=order)
    np.testing.assert_array_equal(cct.io.resize_image(im, (8, 4), order), caffe)
    np.testing.assert_allclose(out, caffe, rtol=1e-5, atol=1e-6)


def test_resize_image_nearest():
    im = np.arange(4.0).reshape(1, 4, 1)
    out = cct.io.resize_image(im, (1, 8), interp_order=0)
    np.testing.assert_array_equal(out[0, :, 0], [0, 0, 1, 1, 2, 2, 3, 3])


def test_resize_image_spline_orders_need_scipy(monkeypatch):
    without(monkeypatch, "skimage", "skimage.transform", "scipy", "scipy.ndimage")
    with pytest.raises(CCTError, match=r"interp_order=3 needs SciPy .*pip install scipy"):
        cct.io.resize_image(np.random.default_rng(0).random((4, 4, 3)), (8, 8), 3)
    with pytest.raises(CCTError, match=r"interp_order must be 0 to 5, got 6"):
        cct.io.resize_image(np.zeros((4, 4, 3)), (8, 8), 6)


def test_resize_image_bad_shape():
    with pytest.raises(CCTError, match=r"H x W x K image, got shape \(4, 5\)"):
        cct.io.resize_image(np.zeros((4, 5)), (2, 2))


def test_oversample_ten_crops():
    rng = np.random.default_rng(6)
    images = [rng.random((7, 8, 2)).astype(np.float32) for _ in range(2)]
    crops = cct.io.oversample(images, (4, 5))
    assert crops.shape == (20, 4, 5, 2) and crops.dtype == np.float32
    # corners then the centre; pycaffe truncates the centre's float corner (7/2 - 4/2 = 1.5)
    starts = [(0, 0), (0, 3), (3, 0), (3, 3), (1, 1)]
    for n, im in enumerate(images):
        for k, (i, j) in enumerate(starts):
            np.testing.assert_array_equal(crops[10 * n + k], im[i:i + 4, j:j + 5])
            np.testing.assert_array_equal(crops[10 * n + 5 + k], im[i:i + 4, j:j + 5][:, ::-1])
    with pytest.raises(CCTError, match="larger than the image"):
        cct.io.oversample(images, (8, 5))


# -- datum ----------------------------------------------------------------------------------------

def test_datum_uint8_round_trip():
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(4, 3, 2).transpose(2, 1, 0)
    datum = cct.io.array_to_datum(arr, label=7)
    assert (datum.channels, datum.height, datum.width) == (2, 3, 4)
    assert datum.data == np.ascontiguousarray(arr).tobytes() and not datum.float_data
    assert datum.label == 7
    back = cct.io.datum_to_array(caffe_pb2.Datum.FromString(datum.SerializeToString()))
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, arr)
    back[0, 0, 0] = 99  # writable, like pycaffe's copy


def test_datum_float_round_trip():
    arr = np.random.default_rng(7).standard_normal((3, 2, 2))
    datum = cct.io.array_to_datum(arr)
    assert not datum.HasField("label") and not datum.data
    back = cct.io.datum_to_array(datum)
    assert back.dtype == np.float64
    np.testing.assert_allclose(back, arr.astype(np.float32))
    with pytest.raises(ValueError, match=r"Incorrect array shape.*got shape \(2, 2\)"):
        cct.io.array_to_datum(arr[0])
    datum.channels = 5
    with pytest.raises(CCTError, match="holds 12 values, which do not fill its shape"):
        cct.io.datum_to_array(datum)


def test_encoded_datum_decodes_to_bgr():
    rgb = np.random.default_rng(8).integers(0, 256, (3, 4, 3), dtype=np.uint8)
    buf = std_io.BytesIO()
    Image.fromarray(rgb, "RGB").save(buf, format="PNG")
    datum = caffe_pb2.Datum(data=buf.getvalue(), encoded=True, channels=3, height=3, width=4)
    np.testing.assert_array_equal(cct.io.datum_to_array(datum),
                                  rgb[:, :, ::-1].transpose(2, 0, 1))


def test_an_undecodable_encoded_datum_says_what_it_holds():
    datum = caffe_pb2.Datum(data=b"\x00\x01 not an image", encoded=True)
    with pytest.raises(CCTError) as e:
        cct.io.datum_to_array(datum)
    assert str(e.value) == ("cannot read the encoded Datum (15 bytes) as an image: not an image "
                            "Pillow can identify (the data start with b'\\x00\\x01 not a')")


# -- blob protos ----------------------------------------------------------------------------------

def test_blobproto_round_trip_with_diff():
    rng = np.random.default_rng(9)
    arr, diff = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    blob = cct.io.array_to_blobproto(arr, diff)
    assert list(blob.shape.dim) == [2, 3, 4] and not blob.HasField("num")
    blob = caffe_pb2.BlobProto.FromString(blob.SerializeToString())
    data = cct.io.blobproto_to_array(blob)
    assert data.dtype == np.float64
    np.testing.assert_allclose(data, arr.astype(np.float32))
    np.testing.assert_allclose(cct.io.blobproto_to_array(blob, return_diff=True),
                               diff.astype(np.float32))
    with pytest.raises(CCTError, match=r"diff has shape \(3,\), the data \(2, 3, 4\)"):
        cct.io.array_to_blobproto(arr, np.zeros(3))


def test_blobproto_legacy_shape_and_double_data():
    legacy = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=3, data=range(6))
    legacy.shape.dim.extend([6])  # num/channels/height/width win, as in pycaffe
    out = cct.io.blobproto_to_array(legacy)
    assert out.shape == (1, 2, 1, 3)
    np.testing.assert_array_equal(out.ravel(), np.arange(6))
    double = caffe_pb2.BlobProto(double_data=[0.1, 0.2], double_diff=[1.0, 2.0])
    double.shape.dim.extend([2])
    np.testing.assert_array_equal(cct.io.blobproto_to_array(double), [0.1, 0.2])
    np.testing.assert_array_equal(cct.io.blobproto_to_array(double, return_diff=True), [1, 2])
    bad = caffe_pb2.BlobProto(data=[1.0, 2.0, 3.0])
    bad.shape.dim.extend([2, 2])
    with pytest.raises(CCTError, match=r"holds 3 data values, which do not fill its shape "
                                       r"\(2, 2\)"):
        cct.io.blobproto_to_array(bad)


def test_blobprotovector_round_trip():
    arrays = [np.arange(6.0).reshape(1, 2, 3), np.full((2, 2), 0.5)]
    s = cct.io.arraylist_to_blobprotovector_str(arrays)
    assert isinstance(s, bytes)
    back = cct.io.blobprotovector_str_to_arraylist(s)
    assert [a.shape for a in back] == [(1, 2, 3), (2, 2)]
    for a, b in zip(arrays, back):
        np.testing.assert_array_equal(a, b)
