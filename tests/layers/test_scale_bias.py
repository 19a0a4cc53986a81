"""Scale and Bias: broadcast rules, learned params and bottom[1] operands, gradients w.r.t.
bottom, scale and bias, in-place use, accumulation, bad shapes, and the layer zoo fixture."""
import numpy as np
import pytest

from cct import backend
from cct.blob import Blob
from cct.errors import LayerError
from cct.layers import create_layer
from tests.caffe_layer_fixture import assert_matches_caffe, run_fixture_layer
from tests.gradient_check import build_layer, check_gradient, make_layer_param, run_forward

rng = np.random.default_rng(3)


def rand(*shape):
    return rng.standard_normal(shape)


def broadcast(p, x_shape, axis):
    """p placed on axes [axis, axis + p.ndim) of an array of x_shape."""
    return p.reshape((1,) * axis + p.shape + (1,) * (len(x_shape) - axis - p.ndim))


@pytest.mark.parametrize("name", ["scale_batch", "scale_global"])
def test_layer_zoo(caffe_fixtures, name):
    d = caffe_fixtures / "numerics"
    # tighter than the default: these layers only copy, add or multiply
    assert_matches_caffe(run_fixture_layer(d / "layer_zoo.TEST.npz", d / "layer_zoo.prototxt",
                                           name), atol=5e-8)


# ------------------------------------------------------------------------------------------
# Scale
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("param, axis, shape", [
    ("", 1, (3,)),
    ("axis: 0 num_axes: 2", 0, (2, 3)),
    ("axis: -2 num_axes: -1", 2, (4, 2)),
    ("num_axes: 0", 0, ()),
    ("axis: 3", 3, (2,)),
])
@pytest.mark.parametrize("bias", ["false", "true"])
def test_scale_learned(param, axis, shape, bias):
    x = rand(2, 3, 4, 2)
    layer, bottom, top = build_layer(
        f'type: "Scale" scale_param {{ {param} bias_term: {bias} '
        f'filler {{ type: "gaussian" }} bias_filler {{ type: "gaussian" }} }}', [x])
    assert layer.blobs[0].shape == shape
    assert len(layer.blobs) == (2 if bias == "true" else 1)
    run_forward(layer, bottom, top)
    s = broadcast(layer.blobs[0].data, x.shape, axis)
    expected = x * s
    if bias == "true":
        assert layer.blobs[1].shape == shape
        expected = expected + broadcast(layer.blobs[1].data, x.shape, axis)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12)
    check_gradient(layer, bottom, top)


def test_scale_default_fillers_give_identity():
    x = rand(2, 3, 2)
    layer, bottom, top = build_layer('type: "Scale" scale_param { bias_term: true }', [x])
    assert (layer.blobs[0].data == 1).all() and (layer.blobs[1].data == 0).all()
    run_forward(layer, bottom, top)
    np.testing.assert_array_equal(top[0].data, x)


@pytest.mark.parametrize("s_shape, param, axis", [
    ((3,), "", 1), ((3, 4), "", 1), ((2, 3), "axis: 0", 0), ((), "", 0),
    ((2, 3, 4), "axis: 0", 0)])
@pytest.mark.parametrize("bias", ["false", "true"])
def test_scale_from_second_bottom(s_shape, param, axis, bias):
    x, s = rand(2, 3, 4), rand(*s_shape)
    layer, bottom, top = build_layer(
        f'type: "Scale" scale_param {{ {param} bias_term: {bias} '
        f'bias_filler {{ type: "gaussian" }} }}', [x, s])
    run_forward(layer, bottom, top)
    expected = x * broadcast(s, x.shape, axis)
    if bias == "true":
        assert len(layer.blobs) == 1 and layer.blobs[0].shape == s_shape
        expected = expected + broadcast(layer.blobs[0].data, x.shape, axis)
    else:
        assert not layer.blobs
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12)
    check_gradient(layer, bottom, top)


def in_place(text, x, s=None):
    layer = create_layer(make_layer_param(text), backend.get("cpu"), np.float64)
    b = Blob(x.shape, np.float64)
    b.data[...] = x
    bottom = [b]
    if s is not None:
        sb = Blob(s.shape, np.float64)
        sb.data[...] = s
        bottom.append(sb)
    layer.setup(bottom, [b])
    return layer, bottom


@pytest.mark.parametrize("with_bottom_scale", [False, True])
def test_scale_in_place_matches_out_of_place(with_bottom_scale):
    x, s, dy = rand(2, 3, 2), rand(3), rand(2, 3, 2)
    text = ('type: "Scale" scale_param { bias_term: true filler { type: "gaussian" } '
            'bias_filler { type: "gaussian" } }')
    operands = [x, s] if with_bottom_scale else [x]
    ref, rb, rt = build_layer(text, operands)
    run_forward(ref, rb, rt)
    rt[0].diff[...] = dy
    ref.backward(rt, [True] * len(rb), rb)

    layer, bottom = in_place(text, x, s if with_bottom_scale else None)
    for p, q in zip(layer.blobs, ref.blobs):
        p.data[...] = q.data
    layer.forward(bottom, [bottom[0]])
    np.testing.assert_allclose(bottom[0].data, rt[0].data)
    bottom[0].diff[...] = dy
    layer.backward([bottom[0]], [True] * len(bottom), bottom)
    np.testing.assert_allclose(bottom[0].diff, rb[0].diff)
    for got, want in zip(bottom[1:] + [p for p in layer.blobs],
                         rb[1:] + [p for p in ref.blobs]):
        np.testing.assert_allclose(got.diff, want.diff)


def test_scale_param_diffs_accumulate_and_bottom_scale_diff_is_overwritten():
    x, s = rand(2, 3), rand(3)
    layer, bottom, top = build_layer('type: "Scale" scale_param { bias_term: true }', [x, s])
    run_forward(layer, bottom, top)
    top[0].diff[...] = 1.0
    layer.backward(top, [True, True], bottom)
    first_s, first_b = bottom[1].diff.copy(), layer.blobs[0].diff.copy()
    layer.backward(top, [True, True], bottom)
    np.testing.assert_allclose(bottom[1].diff, first_s)
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * first_b)
    np.testing.assert_allclose(first_s, x.sum(axis=0))


def test_scale_lr_mult_zero_leaves_param_diff():
    layer, bottom, top = build_layer('type: "Scale"', [rand(2, 3)])
    layer.param_propagate_down = [False]
    run_forward(layer, bottom, top)
    top[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    assert not layer.blobs[0].diff.any()


def test_scale_errors():
    with pytest.raises(LayerError, match=r"Scale layer 'under_test': the scale of shape "
                                         r"\(4,\) does not fit bottom\[0\] of shape \(2, 3\)"):
        build_layer('type: "Scale"', [rand(2, 3), rand(4)])
    with pytest.raises(LayerError, match="extends past bottom\\[0\\]'s shape"):
        build_layer('type: "Scale" scale_param { axis: 1 num_axes: 2 }', [rand(2, 3)])
    with pytest.raises(LayerError, match="num_axes must be non-negative"):
        build_layer('type: "Scale" scale_param { num_axes: -2 }', [rand(2, 3)])
    with pytest.raises(LayerError, match="axis 2 is out of range"):
        build_layer('type: "Scale" scale_param { axis: 2 }', [rand(2, 3)])
    with pytest.raises(LayerError, match="at most 2 bottom"):
        build_layer('type: "Scale"', [rand(2, 3), rand(3), rand(3)])


# ------------------------------------------------------------------------------------------
# Bias
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("param, axis, shape", [
    ("", 1, (3,)), ("axis: 0 num_axes: -1", 0, (2, 3, 4)), ("num_axes: 0", 0, ()),
    ("axis: -1", 2, (4,))])
def test_bias_learned(param, axis, shape):
    x = rand(2, 3, 4)
    layer, bottom, top = build_layer(
        f'type: "Bias" bias_param {{ {param} filler {{ type: "gaussian" }} }}', [x])
    assert layer.blobs[0].shape == shape
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, x + broadcast(layer.blobs[0].data, x.shape, axis))
    check_gradient(layer, bottom, top)


def test_bias_default_filler_is_zero():
    layer, _, _ = build_layer('type: "Bias"', [rand(2, 3)])
    assert not layer.blobs[0].data.any()


@pytest.mark.parametrize("b_shape, param, axis", [((3,), "", 1), ((3, 4), "", 1),
                                                  ((), "", 0), ((2,), "axis: 0", 0)])
def test_bias_from_second_bottom(b_shape, param, axis):
    x, b = rand(2, 3, 4), rand(*b_shape)
    layer, bottom, top = build_layer(f'type: "Bias" bias_param {{ {param} }}', [x, b])
    assert not layer.blobs
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, x + broadcast(b, x.shape, axis))
    check_gradient(layer, bottom, top)


def test_bias_in_place():
    x, dy = rand(2, 3), rand(2, 3)
    layer, bottom = in_place('type: "Bias" bias_param { filler { type: "gaussian" } }', x)
    layer.forward(bottom, [bottom[0]])
    np.testing.assert_allclose(bottom[0].data, x + layer.blobs[0].data)
    bottom[0].diff[...] = dy
    layer.backward([bottom[0]], [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, dy)
    np.testing.assert_allclose(layer.blobs[0].diff, dy.sum(axis=0))


def test_bias_errors():
    with pytest.raises(LayerError, match=r"Bias layer 'under_test': the bias of shape \(2,\) "
                                         r"does not fit"):
        build_layer('type: "Bias"', [rand(2, 3), rand(2)])
    with pytest.raises(LayerError, match="extends past"):
        build_layer('type: "Bias" bias_param { num_axes: 3 }', [rand(2, 3)])
