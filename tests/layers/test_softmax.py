"""Softmax: forward against a float64 reference over several axes, stability, gradients,
in-place use, bad axes, and Caffe's float32 outputs from the layer zoo fixture."""
import numpy as np
import pytest

from cct import backend as backends
from cct.blob import Blob
from cct.errors import LayerError
from cct.layers import create_layer
from tests.caffe_layer_fixture import assert_matches_caffe, run_fixture_layer
from tests.gradient_check import build_layer, check_gradient, make_layer_param, run_forward

RNG = np.random.default_rng(21)


def reference(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("name", ["softmax", "softmax_ch"])
def test_matches_caffe_layer_zoo(caffe_fixtures, name):
    d = caffe_fixtures / "numerics"
    assert_matches_caffe(run_fixture_layer(d / "layer_zoo.TEST.npz", d / "layer_zoo.prototxt",
                                           name))


@pytest.mark.parametrize("shape,axis", [((2, 5), 1), ((2, 3, 4, 2), 1), ((2, 3, 4, 2), 2),
                                        ((2, 3, 4), -1), ((3, 4), 0), ((2, 3, 4, 2), -3)])
def test_forward_matches_reference(shape, axis):
    x = RNG.standard_normal(shape) * 3
    text = 'type: "Softmax"' + (f" softmax_param {{ axis: {axis} }}" if axis != 1 else "")
    layer, bottom, top = build_layer(text, [x])
    run_forward(layer, bottom, top)
    assert top[0].shape == shape
    np.testing.assert_allclose(top[0].data, reference(x, axis), rtol=1e-13)


def test_large_inputs_do_not_overflow():
    x = np.array([[1000.0, 1001.0, 999.0], [-1e4, 0.0, 1e4]])
    with np.errstate(over="raise", invalid="raise"):
        layer, bottom, top = build_layer('type: "Softmax"', [x])
        run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data[0], reference(np.array([1.0, 2.0, 0.0]), 0))
    np.testing.assert_allclose(top[0].data[1], [0, 0, 1])


@pytest.mark.parametrize("shape,axis", [((2, 4), 1), ((2, 3, 2, 2), 1), ((2, 3, 4), 2)])
def test_gradient(shape, axis):
    x = RNG.standard_normal(shape)
    layer, bottom, top = build_layer(f'type: "Softmax" softmax_param {{ axis: {axis} }}', [x])
    check_gradient(layer, bottom, top)


def test_in_place_equals_out_of_place():
    x = RNG.standard_normal((2, 3, 2))
    dy = RNG.standard_normal((2, 3, 2))
    results = []
    for in_place in (False, True):
        layer = create_layer(make_layer_param('type: "Softmax"'), backends.get("cpu"),
                             np.float64)
        b = Blob(x.shape, np.float64)
        b.data[...] = x
        t = b if in_place else Blob((), np.float64)
        layer.setup([b], [t])
        layer.forward([b], [t])
        y = t.data.copy()
        t.diff[...] = dy
        layer.backward([t], [True], [b])
        results.append((y, b.diff.copy()))
    for e, g in zip(*results):
        np.testing.assert_array_equal(g, e)


def test_float32():
    x = RNG.standard_normal((3, 7)).astype(np.float32)
    layer, bottom, top = build_layer('type: "Softmax"', [x], dtype=np.float32)
    run_forward(layer, bottom, top)
    assert top[0].data.dtype == np.float32
    np.testing.assert_allclose(top[0].data, reference(x.astype(np.float64), 1), rtol=1e-6)


@pytest.mark.parametrize("axis,shape", [(2, (2, 3)), (-3, (2, 3)), (0, ())])
def test_bad_axis_names_the_layer_and_shape(axis, shape):
    with pytest.raises(LayerError, match=r"Softmax layer 'under_test': axis .* out of range|"
                                         r"Softmax layer 'under_test': axis .* scalar"):
        build_layer(f'type: "Softmax" softmax_param {{ axis: {axis} }}', [np.ones(shape)])


def test_reshape_follows_the_bottom():
    layer, bottom, top = build_layer('type: "Softmax"', [np.ones((2, 3))])
    bottom[0].reshape((4, 5, 6))
    layer.reshape(bottom, top)
    run_forward(layer, bottom, top)
    assert top[0].shape == (4, 5, 6)
    np.testing.assert_allclose(top[0].data, 0.2)
