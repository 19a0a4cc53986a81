"""LRN: both norm regions against plain float64 references, gradients, in-place use, bad
parameters, and real Caffe's outputs."""
import numpy as np
import pytest

from cct.blob import Blob
from cct.errors import LayerError
from tests.caffe_layer_fixture import assert_matches_caffe, run_fixture_layer
from tests.gradient_check import build_layer, check_gradient, run_forward

RNG = np.random.default_rng(3)


def f32(v):
    """A prototxt float as the layer sees it (the field is a float32)."""
    return float(np.float32(v))


def ref_across(x, size, alpha, beta, k):
    c = x.shape[1]
    pre = (size - 1) // 2
    y = np.empty_like(x)
    for ch in range(c):
        lo, hi = max(0, ch - pre), min(c, ch + pre + 1)
        scale = k + alpha / size * (x[:, lo:hi] ** 2).sum(axis=1)
        y[:, ch] = x[:, ch] * scale ** -beta
    return y


def ref_within(x, size, alpha, beta):
    h, w = x.shape[2:]
    pre = (size - 1) // 2
    sq = np.pad(x ** 2, ((0, 0), (0, 0), (pre, pre), (pre, pre)))
    total = np.zeros_like(x)
    for i in range(size):
        for j in range(size):
            total += sq[:, :, i:i + h, j:j + w]
    return x * (1 + alpha * total / size ** 2) ** -beta


def lrn_body(**fields):
    params = " ".join(f"{k}: {v}" for k, v in fields.items())
    return f'type: "LRN" lrn_param {{ {params} }}'


@pytest.mark.parametrize("size,alpha,beta,k", [(5, 1.0, 0.75, 1.0), (3, 0.5, 0.75, 2.0),
                                               (1, 2.0, 0.5, 1.5), (7, 0.1, 1.25, 1.0)])
def test_across_channels_forward(size, alpha, beta, k):
    x = RNG.standard_normal((2, 6, 3, 4))
    layer, bottom, top = build_layer(lrn_body(local_size=size, alpha=alpha, beta=beta, k=k),
                                     [x])
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, ref_across(x, size, f32(alpha), f32(beta), f32(k)),
                               rtol=1e-12)


def test_defaults_are_across_channels_size_5():
    x = RNG.standard_normal((1, 7, 2, 2))
    layer, bottom, top = build_layer('type: "LRN"', [x])
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, ref_across(x, 5, 1.0, 0.75, 1.0), rtol=1e-12)


@pytest.mark.parametrize("size,alpha,beta", [(3, 0.5, 0.75), (5, 2.0, 0.6), (1, 1.0, 1.0)])
def test_within_channel_forward_ignores_k(size, alpha, beta):
    x = RNG.standard_normal((2, 3, 5, 4))
    layer, bottom, top = build_layer(
        lrn_body(local_size=size, alpha=alpha, beta=beta, k=7.0, norm_region="WITHIN_CHANNEL"),
        [x])
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, ref_within(x, size, f32(alpha), f32(beta)),
                               rtol=1e-12)


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
@pytest.mark.parametrize("size", [3, 5])
def test_gradient(region, size):
    x = RNG.standard_normal((2, 5, 3, 4))
    layer, bottom, top = build_layer(
        lrn_body(local_size=size, alpha=0.8, beta=0.75, k=1.5, norm_region=region), [x])
    check_gradient(layer, bottom, top)


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_in_place_matches_separate_top(region):
    x = RNG.standard_normal((2, 4, 3, 3))
    dy = RNG.standard_normal(x.shape)
    body = lrn_body(local_size=3, alpha=0.5, beta=0.75, norm_region=region)
    layer, bottom, top = build_layer(body, [x])
    run_forward(layer, bottom, top)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    in_place, blobs, _ = build_layer(body, [x])
    in_place.reshape(blobs, blobs)
    in_place.forward(blobs, blobs)
    np.testing.assert_allclose(blobs[0].data, top[0].data)
    blobs[0].diff[...] = dy
    in_place.backward(blobs, [True], blobs)
    np.testing.assert_allclose(blobs[0].diff, bottom[0].diff, rtol=1e-12)


def test_float32():
    x = RNG.standard_normal((2, 4, 3, 3)).astype(np.float32)
    for region, ref in (("ACROSS_CHANNELS", ref_across(x.astype(np.float64), 3, 0.5, 0.75, 2)),
                        ("WITHIN_CHANNEL", ref_within(x.astype(np.float64), 3, 0.5, 0.75))):
        layer, bottom, top = build_layer(
            lrn_body(local_size=3, alpha=0.5, beta=0.75, k=2, norm_region=region), [x],
            dtype=np.float32)
        run_forward(layer, bottom, top)
        assert top[0].data.dtype == np.float32
        np.testing.assert_allclose(top[0].data, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("body,shape,match", [
    (lrn_body(local_size=4), (1, 4, 3, 3), "odd values for local_size, got 4"),
    (lrn_body(local_size=2, norm_region="WITHIN_CHANNEL"), (1, 4, 3, 3), "odd values"),
    (lrn_body(), (4, 3, 3), "4 axes"),
])
def test_bad_parameters_name_the_layer(body, shape, match):
    with pytest.raises(LayerError, match=match) as err:
        build_layer(body, [np.zeros(shape)])
    assert "LRN layer 'under_test'" in str(err.value)


def test_blob_counts_are_checked():
    with pytest.raises(LayerError, match="exactly 1 bottom"):
        build_layer(lrn_body(), [np.zeros((1, 2, 2, 2))] * 2)
    layer, bottom, _ = build_layer(lrn_body(), [np.zeros((1, 2, 2, 2))])
    with pytest.raises(LayerError, match="exactly 1 top"):
        layer.setup(bottom, [Blob(), Blob()])


# ---- real Caffe ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["lrn_across", "lrn_within"])
def test_layer_zoo_matches_caffe(caffe_fixtures, name, dtype):
    d = caffe_fixtures / "numerics"
    assert_matches_caffe(run_fixture_layer(d / "layer_zoo.TEST.npz", d / "layer_zoo.prototxt",
                                           name, dtype))
