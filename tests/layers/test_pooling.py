"""Pooling: forward against Caffe's loops written plainly in float64, gradients, the top mask,
size rules (ceil, floor, clip, global) and bad parameters, and real Caffe's outputs."""
import math

import numpy as np
import pytest

from cct import backend as backends
from cct.blob import Blob
from cct.errors import LayerError
from cct.layers import create_layer
from tests.caffe_layer_fixture import assert_matches_caffe, run_fixture_layer
from tests.gradient_check import build_layer, check_gradient, make_layer_param, run_forward

RNG = np.random.default_rng(1)


def ref_pool(x, method, kernel, stride, pad, ceil_mode=True):
    """Caffe's Forward_cpu loops: returns (top, mask); mask is -1 for AVE."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pad
    rnd = math.ceil if ceil_mode else math.floor
    ho = int(rnd((h + 2 * ph - kh) / sh)) + 1
    wo = int(rnd((w + 2 * pw - kw) / sw)) + 1
    if ph or pw:
        if (ho - 1) * sh >= h + ph:
            ho -= 1
        if (wo - 1) * sw >= w + pw:
            wo -= 1
    y = np.zeros((n, c, ho, wo))
    mask = -np.ones((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            hs, ws = i * sh - ph, j * sw - pw
            he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
            size = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            win = x[:, :, hs:he, ws:we].reshape(n, c, -1)
            if method == "MAX":
                arg = win.argmax(axis=2)
                y[:, :, i, j] = win.max(axis=2)
                mask[:, :, i, j] = (hs + arg // (we - ws)) * w + ws + arg % (we - ws)
            else:
                y[:, :, i, j] = win.sum(axis=2) / size
    return y, mask


def pool_body(pool="MAX", **fields):
    params = " ".join(f"{k}: {v}" for k, v in fields.items())
    return f'type: "Pooling" pooling_param {{ pool: {pool} {params} }}'


CASES = [
    (dict(kernel_size=2, stride=2), ((2, 2), (2, 2), (0, 0))),
    (dict(kernel_size=3, stride=2), ((3, 3), (2, 2), (0, 0))),           # ceil: partial window
    (dict(kernel_size=3, stride=2, pad=1), ((3, 3), (2, 2), (1, 1))),
    (dict(kernel_size=2, stride=2, pad=1), ((2, 2), (2, 2), (1, 1))),    # clip rule
    (dict(kernel_size=3), ((3, 3), (1, 1), (0, 0))),                     # default stride 1
    (dict(kernel_h=3, kernel_w=2, stride_h=2, stride_w=1, pad_h=1, pad_w=0),
     ((3, 2), (2, 1), (1, 0))),
]


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("fields,geom", CASES)
def test_forward_matches_caffe_loops(method, fields, geom):
    x = RNG.standard_normal((2, 3, 7, 6))
    layer, bottom, top = build_layer(pool_body(method, **fields), [x])
    run_forward(layer, bottom, top)
    ref, _ = ref_pool(x, method, *geom)
    assert top[0].shape == ref.shape
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-13, atol=1e-13)


def test_sizes_ceil_floor_and_clip():
    x = np.zeros((1, 1, 9, 9))
    sizes = {}
    for label, fields in {"clip": dict(kernel_size=2, stride=2, pad=1),
                          "ceil": dict(kernel_size=2, stride=2),
                          "floor": dict(kernel_size=2, stride=2, round_mode="FLOOR")}.items():
        _, _, top = build_layer(pool_body("MAX", **fields), [x])
        sizes[label] = top[0].shape[2:]
    # clip: ceil((9 + 2 - 2) / 2) + 1 = 6, but window 5 would start in the padding -> 5
    assert sizes == {"clip": (5, 5), "ceil": (5, 5), "floor": (4, 4)}


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_floor_round_mode(method):
    x = RNG.standard_normal((1, 2, 8, 7))
    layer, bottom, top = build_layer(
        pool_body(method, kernel_size=3, stride=2, pad=1, round_mode="FLOOR"), [x])
    run_forward(layer, bottom, top)
    ref, _ = ref_pool(x, method, (3, 3), (2, 2), (1, 1), ceil_mode=False)
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-13, atol=1e-13)


def test_ave_divisor_counts_padding_but_not_beyond():
    x = np.ones((1, 1, 3, 3))
    layer, bottom, top = build_layer(pool_body("AVE", kernel_size=2, stride=2, pad=1), [x])
    run_forward(layer, bottom, top)
    # windows rows [-1,1), [1,3): the first covers one padding row, so 2 of 4 cells are real
    np.testing.assert_allclose(top[0].data[0, 0], [[0.25, 0.5], [0.5, 1.0]])


def test_max_mask_top():
    x = RNG.standard_normal((2, 3, 7, 6))
    layer, bottom, top = build_layer(pool_body("MAX", kernel_size=3, stride=2, pad=1), [x],
                                     num_tops=2)
    run_forward(layer, bottom, top)
    _, mask = ref_pool(x, "MAX", (3, 3), (2, 2), (1, 1))
    assert top[1].shape == top[0].shape
    np.testing.assert_array_equal(top[1].data, mask)


def test_max_mask_follows_a_reshape():
    """The argmax array is kept between forwards and remade when the bottom changes shape."""
    layer, bottom, top = build_layer(pool_body("MAX", kernel_size=2, stride=2), [
        RNG.standard_normal((2, 3, 6, 6))], num_tops=2)
    for shape in [(2, 3, 6, 6), (1, 3, 9, 7), (1, 3, 9, 7)]:
        x = RNG.standard_normal(shape)
        bottom[0].reshape(*shape)
        bottom[0].data[...] = x
        run_forward(layer, bottom, top)
        want, mask = ref_pool(x, "MAX", (2, 2), (2, 2), (0, 0))
        np.testing.assert_array_equal(top[0].data, want)
        np.testing.assert_array_equal(top[1].data, mask)
        top[0].diff[...] = 1.0
        layer.backward(top, [True], bottom)
        assert bottom[0].diff.sum() == top[0].count


def test_in_place_is_refused():
    b = Blob((1, 2, 5, 5), np.float64)
    layer = create_layer(make_layer_param(pool_body("MAX", kernel_size=2)), backends.get("cpu"),
                         np.float64)
    with pytest.raises(LayerError, match="cannot run in place") as err:
        layer.setup([b], [b])
    assert "Pooling layer 'under_test'" in str(err.value)


def test_max_ties_go_to_the_first_element():
    x = np.zeros((1, 1, 2, 2))
    layer, bottom, top = build_layer(pool_body("MAX", kernel_size=2), [x], num_tops=2)
    run_forward(layer, bottom, top)
    assert top[1].data.ravel().tolist() == [0.0]
    top[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff[0, 0], [[1, 0], [0, 0]])


def test_global_pooling():
    x = RNG.standard_normal((2, 3, 4, 5))
    for method, fn in (("MAX", np.max), ("AVE", np.mean)):
        layer, bottom, top = build_layer(pool_body(method, global_pooling="true"), [x])
        run_forward(layer, bottom, top)
        assert top[0].shape == (2, 3, 1, 1)
        np.testing.assert_allclose(top[0].data[:, :, 0, 0], fn(x, axis=(2, 3)))
    bottom[0].reshape(2, 3, 6, 6)
    layer.reshape(bottom, top)  # the kernel follows the bottom's size
    assert layer.kernel == (6, 6) and top[0].shape == (2, 3, 1, 1)


@pytest.mark.parametrize("method,fields", [
    ("MAX", dict(kernel_size=3, stride=2, pad=1)),
    ("MAX", dict(kernel_size=2, stride=1)),
    ("AVE", dict(kernel_size=3, stride=2, pad=1)),
    ("AVE", dict(kernel_h=2, kernel_w=3, stride=2)),
])
def test_gradient(method, fields):
    # A permutation keeps the maxima far apart, so finite differences do not change winners.
    x = RNG.permutation(2 * 2 * 5 * 5).reshape(2, 2, 5, 5) * 0.1
    layer, bottom, top = build_layer(pool_body(method, **fields), [x])
    check_gradient(layer, bottom, top, step=1e-4)


def test_float32():
    x = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
    for method in ("MAX", "AVE"):
        layer, bottom, top = build_layer(pool_body(method, kernel_size=3, stride=2), [x],
                                         dtype=np.float32)
        run_forward(layer, bottom, top)
        assert top[0].data.dtype == np.float32
        ref, _ = ref_pool(x.astype(np.float64), method, (3, 3), (2, 2), (0, 0))
        np.testing.assert_allclose(top[0].data, ref, rtol=1e-6, atol=1e-6)


def test_stochastic_is_rejected_on_cpu():
    layer, bottom, top = build_layer(pool_body("STOCHASTIC", kernel_size=2), [np.zeros(
        (1, 1, 4, 4))])
    with pytest.raises(LayerError, match="STOCHASTIC pooling is not supported on CPU"):
        layer.forward(bottom, top)


@pytest.mark.parametrize("body,shape,num_tops,match", [
    (pool_body("MAX", kernel_size=2, pad=2), (1, 1, 5, 5), 1, "smaller than the kernel"),
    (pool_body("MAX", global_pooling="true", kernel_size=2), (1, 1, 5, 5), 1,
     "cannot be specified"),
    (pool_body("AVE", global_pooling="true", stride=2), (1, 1, 5, 5), 1, "only pad = 0"),
    (pool_body("MAX", kernel_size=2, kernel_h=2, kernel_w=2), (1, 1, 5, 5), 1, "not both"),
    (pool_body("MAX", kernel_h=2), (1, 1, 5, 5), 1, "filter size is required"),
    (pool_body("MAX"), (1, 1, 5, 5), 1, "filter size is required"),
    (pool_body("MAX", kernel_size=2, pad=1, pad_h=1), (1, 1, 5, 5), 1, "pad is given"),
    (pool_body("MAX", kernel_size=2, stride_h=2), (1, 1, 5, 5), 1, "stride is given"),
    (pool_body("AVE", kernel_size=2), (1, 1, 5, 5), 2, "produces 1 top"),
    (pool_body("STOCHASTIC", kernel_size=3, pad=1), (1, 1, 5, 5), 1, "only for average"),
    (pool_body("MAX", kernel_size=2), (1, 5, 5), 1, "4 axes"),
    (pool_body("MAX", kernel_size=4), (1, 1, 2, 5), 1, "empty top"),
    (pool_body("MAX", kernel_size=2, stride=0), (1, 1, 5, 5), 1, "stride 0"),
])
def test_bad_parameters_name_the_layer(body, shape, num_tops, match):
    with pytest.raises(LayerError, match=match) as err:
        build_layer(body, [np.zeros(shape)], num_tops=num_tops)
    assert "Pooling layer 'under_test'" in str(err.value)


# ---- real Caffe ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["pool_max", "pool_ave", "pool_max_clip", "pool_ave_ceil"])
def test_layer_zoo_matches_caffe(caffe_fixtures, name, dtype):
    d = caffe_fixtures / "numerics"
    assert_matches_caffe(run_fixture_layer(d / "layer_zoo.TEST.npz", d / "layer_zoo.prototxt",
                                           name, dtype))


@pytest.mark.parametrize("name", ["pool1", "pool2", "pool3"])
def test_cifar10_quick_matches_caffe(caffe_fixtures, name):
    """pool1 writes and pool2 and pool3 read blobs that an in-place ReLU rewrites."""
    d = caffe_fixtures / "numerics"
    assert_matches_caffe(run_fixture_layer(d / "cifar10_quick_train_test_b4.TRAIN.npz",
                                           d / "cifar10_quick_train_test_b4.prototxt", name))
