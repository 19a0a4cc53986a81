"""InnerProduct: forward against a plain float64 reference (axis, transpose, bias_term),
gradients, shape rules and bad parameters, and real Caffe's outputs."""
import numpy as np
import pytest

from cct import backend as backends
from cct.blob import Blob
from cct.errors import LayerError
from cct.layers import create_layer
from tests.caffe_layer_fixture import assert_matches_caffe, run_fixture_layer
from tests.gradient_check import (assert_param_diffs_accumulate, build_layer, check_gradient,
                                  make_layer_param, run_forward)

RNG = np.random.default_rng(2)


def ip_body(**fields):
    params = " ".join(f"{k}: {v}" for k, v in fields.items())
    return (f'type: "InnerProduct" inner_product_param {{ {params} '
            f'weight_filler {{ type: "gaussian" std: 0.5 }} '
            f'bias_filler {{ type: "gaussian" std: 0.5 }} }}')


def ref_ip(x, w, b, axis, transpose):
    m = int(np.prod(x.shape[:axis]))
    x2 = x.reshape(m, -1)
    y = np.zeros((m, w.shape[1] if transpose else w.shape[0]))
    for i in range(m):  # one item at a time, as Caffe's formula reads
        y[i] = (x2[i] @ w) if transpose else (w @ x2[i])
        if b is not None:
            y[i] += b
    return y.reshape(x.shape[:axis] + (y.shape[1],))


@pytest.mark.parametrize("fields,axis,transpose", [
    (dict(num_output=4), 1, False),
    (dict(num_output=3, axis=2), 2, False),
    (dict(num_output=3, axis=-1), 3, False),
    (dict(num_output=4, transpose="true"), 1, True),
    (dict(num_output=2, bias_term="false"), 1, False),
])
def test_forward_matches_reference(fields, axis, transpose):
    x = RNG.standard_normal((2, 3, 2, 4))
    layer, bottom, top = build_layer(ip_body(**fields), [x])
    run_forward(layer, bottom, top)
    k = int(np.prod(x.shape[axis:]))
    n = fields["num_output"]
    assert layer.blobs[0].shape == ((k, n) if transpose else (n, k))
    b = layer.blobs[1].data if len(layer.blobs) > 1 else None
    ref = ref_ip(x, layer.blobs[0].data, b, axis, transpose)
    assert top[0].shape == ref.shape
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fields", [
    dict(num_output=3), dict(num_output=3, axis=2), dict(num_output=2, transpose="true"),
    dict(num_output=2, bias_term="false")])
def test_gradient(fields):
    x = RNG.standard_normal((2, 3, 2, 2))
    layer, bottom, top = build_layer(ip_body(**fields), [x])
    check_gradient(layer, bottom, top)


def test_float32():
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    layer, bottom, top = build_layer(ip_body(num_output=4), [x], dtype=np.float32)
    run_forward(layer, bottom, top)
    assert top[0].data.dtype == np.float32
    ref = ref_ip(x.astype(np.float64), layer.blobs[0].data.astype(np.float64),
                 layer.blobs[1].data.astype(np.float64), 1, False)
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-5, atol=1e-6)


def test_param_diffs_accumulate_and_bottom_diff_is_overwritten():
    x = RNG.standard_normal((2, 5))
    layer, bottom, top = build_layer(ip_body(num_output=3), [x])
    once = assert_param_diffs_accumulate(layer, bottom, top)
    layer.param_propagate_down = [False, False]
    layer.backward(top, [False], bottom)
    for b, d in zip(layer.blobs, once):
        np.testing.assert_allclose(b.diff, 2 * d)


@pytest.mark.parametrize("fields", [dict(num_output=3, transpose="true"),
                                    dict(num_output=3, bias_term="false")])
def test_param_diffs_accumulate_transposed_and_without_bias(fields):
    x = RNG.standard_normal((4, 2, 3))
    layer, bottom, top = build_layer(ip_body(**fields), [x])
    assert_param_diffs_accumulate(layer, bottom, top)


def test_in_place_is_refused():
    b = Blob((2, 5), np.float64)
    layer = create_layer(make_layer_param(ip_body(num_output=5)), backends.get("cpu"),
                         np.float64)
    with pytest.raises(LayerError, match="cannot run in place") as err:
        layer.setup([b], [b])
    assert "InnerProduct layer 'under_test'" in str(err.value)


def test_batch_size_may_change_but_k_may_not():
    layer, bottom, top = build_layer(ip_body(num_output=3), [np.zeros((2, 2, 3))])
    bottom[0].reshape(5, 6)
    layer.reshape(bottom, top)
    assert top[0].shape == (5, 3)
    bottom[0].reshape(5, 7)
    with pytest.raises(LayerError, match=r"\(5, 7\) has K = 7.*made for K = 6") as err:
        layer.reshape(bottom, top)
    assert "InnerProduct layer 'under_test'" in str(err.value)


@pytest.mark.parametrize("body,match", [
    ('type: "InnerProduct" inner_product_param { }', "num_output"),
    (ip_body(num_output=2, axis=3), "axis 3 is out of range"),
    (ip_body(num_output=2) + ' blobs { shape { dim: 2 dim: 5 } ' + 'data: 0 ' * 10 + '}'
     + ' blobs { shape { dim: 2 } data: 0 data: 0 }', r"expected \(2, 6\)"),
])
def test_bad_parameters_name_the_layer(body, match):
    with pytest.raises(LayerError, match=match) as err:
        build_layer(body, [np.zeros((2, 2, 3))])
    assert "InnerProduct layer 'under_test'" in str(err.value)


def test_prototxt_blobs_are_kept():
    body = (ip_body(num_output=2) + ' blobs { shape { dim: 2 dim: 3 } '
            + ' '.join(f"data: {v}" for v in range(6)) + '} blobs { shape { dim: 2 } '
            'data: 1 data: -1 }')
    layer, bottom, top = build_layer(body, [np.ones((1, 3))])
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, [[0 + 1 + 2 + 1, 3 + 4 + 5 - 1]])


# ---- real Caffe ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["ip_axis", "fc"])
def test_layer_zoo_matches_caffe(caffe_fixtures, name, dtype):
    d = caffe_fixtures / "numerics"
    run = run_fixture_layer(d / "layer_zoo.TEST.npz", d / "layer_zoo.prototxt", name, dtype)
    assert_matches_caffe(run, rtol=1e-5)


@pytest.mark.parametrize("name", ["ip1", "ip2"])
def test_lenet_matches_caffe(caffe_fixtures, name):
    """ip1 writes and ip2 reads a blob that an in-place ReLU rewrites."""
    d = caffe_fixtures / "numerics"
    run = run_fixture_layer(d / "lenet_train_test_b8.TRAIN.npz",
                            d / "lenet_train_test_b8.prototxt", name)
    assert_matches_caffe(run, rtol=1e-5, atol=5e-7)
