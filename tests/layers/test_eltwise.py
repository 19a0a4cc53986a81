"""Eltwise SUM / PROD / MAX: forward against NumPy, Caffe's MAX tie rule, gradient checks, bad
parameters, and the real-Caffe layer zoo fixture."""
import numpy as np
import pytest

from cct.errors import LayerError
from tests.caffe_layer_fixture import assert_matches_caffe, run_fixture_layer
from tests.gradient_check import build_layer, check_gradient, run_forward

rng = np.random.default_rng(1)


def rand(*shape):
    return rng.standard_normal(shape)


@pytest.mark.parametrize("name", ["eltwise_sum", "eltwise_prod", "eltwise_max"])
def test_layer_zoo(caffe_fixtures, name):
    d = caffe_fixtures / "numerics"
    # tighter than the default: these layers only copy, add or multiply
    assert_matches_caffe(run_fixture_layer(d / "layer_zoo.TEST.npz", d / "layer_zoo.prototxt",
                                           name), atol=5e-8)


def test_sum_default_and_coeffs():
    a, b, c = rand(2, 3, 2), rand(2, 3, 2), rand(2, 3, 2)
    layer, bottom, top = build_layer('type: "Eltwise"', [a, b, c])
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, a + b + c)
    check_gradient(layer, bottom, top)

    layer, bottom, top = build_layer(
        'type: "Eltwise" eltwise_param { operation: SUM coeff: 1 coeff: -0.5 coeff: 2 }',
        [a, b, c])
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, a - 0.5 * b + 2 * c)
    check_gradient(layer, bottom, top)


@pytest.mark.parametrize("stable", ["true", "false"])
def test_prod(stable):
    a, b, c = rand(2, 3), rand(2, 3), rand(2, 3)
    layer, bottom, top = build_layer(
        f'type: "Eltwise" eltwise_param {{ operation: PROD stable_prod_grad: {stable} }}',
        [a, b, c])
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, a * b * c)
    check_gradient(layer, bottom, top)
    top[0].diff[...] = 1.0
    layer.backward(top, [True, True, True], bottom)
    np.testing.assert_allclose(bottom[1].diff, a * c)


def test_max_forward_and_gradient():
    a, b, c = rand(3, 4), rand(3, 4), rand(3, 4)
    layer, bottom, top = build_layer('type: "Eltwise" eltwise_param { operation: MAX }',
                                     [a, b, c])
    run_forward(layer, bottom, top)
    np.testing.assert_array_equal(top[0].data, np.maximum(np.maximum(a, b), c))
    check_gradient(layer, bottom, top)


def test_max_tie_rule_is_caffes():
    # Caffe: mask = 0 if a > b else 1; then bottom k >= 2 wins only if strictly greater.
    a = np.array([1.0, 1.0, 2.0, 0.0, 3.0])
    b = np.array([1.0, 0.0, 2.0, 5.0, 1.0])
    c = np.array([0.0, 1.0, 2.0, 5.0, 3.0])
    expected_winner = [1, 0, 1, 1, 0]
    layer, bottom, top = build_layer('type: "Eltwise" eltwise_param { operation: MAX }',
                                     [a, b, c])
    run_forward(layer, bottom, top)
    np.testing.assert_array_equal(top[0].data, [1.0, 1.0, 2.0, 5.0, 3.0])
    top[0].diff[...] = np.arange(1.0, 6.0)
    layer.backward(top, [True, True, True], bottom)
    for k, blob in enumerate(bottom):
        expected = np.where(np.array(expected_winner) == k, np.arange(1.0, 6.0), 0.0)
        np.testing.assert_array_equal(blob.diff, expected, err_msg=f"bottom {k}")


def test_propagate_down_only_where_asked():
    a, b = rand(2, 2), rand(2, 2)
    layer, bottom, top = build_layer('type: "Eltwise"', [a, b])
    run_forward(layer, bottom, top)
    top[0].diff[...] = 1.0
    bottom[1].diff[...] = 9.0
    layer.backward(top, [True, False], bottom)
    assert (bottom[0].diff == 1.0).all() and (bottom[1].diff == 9.0).all()


def test_errors():
    with pytest.raises(LayerError, match=r"Eltwise layer 'under_test': all bottoms must have "
                                         r"the same shape: bottom\[0\] has shape \(2, 3\), "
                                         r"bottom\[1\] has shape \(3, 2\)"):
        build_layer('type: "Eltwise"', [rand(2, 3), rand(3, 2)])
    with pytest.raises(LayerError, match="one coeff per bottom"):
        build_layer('type: "Eltwise" eltwise_param { coeff: 1 }', [rand(2), rand(2)])
    with pytest.raises(LayerError, match="only allowed with operation SUM"):
        build_layer('type: "Eltwise" eltwise_param { operation: PROD coeff: 1 coeff: 2 }',
                    [rand(2), rand(2)])
    with pytest.raises(LayerError, match="at least 2 bottom"):
        build_layer('type: "Eltwise"', [rand(2)])
