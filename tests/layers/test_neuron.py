"""Neuron layers: forward against plain float64 NumPy versions of Caffe's formulas, gradients by
finite differences, in-place runs equal to out-of-place ones, parameter errors, and Caffe's own
float32 outputs from the layer zoo fixture."""
import numpy as np
import pytest

from cct import backend as backends
from cct.blob import Blob
from cct.errors import LayerError
from cct.layers import create_layer
from cct.proto import caffe_pb2
from cct.rng import set_random_seed
from tests.caffe_layer_fixture import assert_matches_caffe, run_fixture_layer
from tests.gradient_check import build_layer, check_gradient, make_layer_param, run_forward

RNG = np.random.default_rng(20)
SHAPE = (2, 3, 2, 2)


def away_from(x, points, gap=0.05):
    """Move values closer than ``gap`` to any of ``points`` (kinks) out of the way."""
    x = x.copy()
    for p in points:
        near = np.abs(x - p) < gap
        x[near] = p + gap * np.where(x[near] >= p, 1.0, -1.0) * 2
    return x


def forward(text, x, phase=caffe_pb2.TEST, dtype=np.float64):
    layer, bottom, top = build_layer(text, [x], phase=phase, dtype=dtype)
    run_forward(layer, bottom, top)
    return layer, bottom, top


# ------------------------------------------------------------------------------------------
# Caffe's fixture: each layer run alone on the blobs Caffe saw, in float32
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sigmoid", "tanh", "relu", "dropout", "prelu", "elu",
                                  "absval", "power", "log", "exp", "exp2"])
def test_matches_caffe_layer_zoo(caffe_fixtures, name):
    d = caffe_fixtures / "numerics"
    assert_matches_caffe(run_fixture_layer(d / "layer_zoo.TEST.npz", d / "layer_zoo.prototxt",
                                           name))


# ------------------------------------------------------------------------------------------
# Forward values against the formulas
# ------------------------------------------------------------------------------------------
def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def f32(v):
    """A prototxt float as the layer sees it (proto floats are single precision)."""
    return float(np.float32(v))


FORWARD_CASES = [
    ('type: "ReLU"', lambda x: np.where(x > 0, x, 0)),
    ('type: "ReLU" relu_param { negative_slope: 0.25 }', lambda x: np.where(x > 0, x, 0.25 * x)),
    ('type: "ELU"', lambda x: np.where(x > 0, x, np.exp(x) - 1)),
    ('type: "ELU" elu_param { alpha: 0.5 }', lambda x: np.where(x > 0, x, 0.5 * (np.exp(x) - 1))),
    ('type: "Sigmoid"', sigmoid),
    ('type: "TanH"', np.tanh),
    ('type: "AbsVal"', np.abs),
    ('type: "BNLL"', lambda x: np.log(1 + np.exp(x))),
    ('type: "Swish"', lambda x: x * sigmoid(x)),
    ('type: "Swish" swish_param { beta: 2.5 }', lambda x: x * sigmoid(2.5 * x)),
    ('type: "Power" power_param { power: 2 scale: 0.5 shift: -1 }',
     lambda x: (0.5 * x - 1) ** 2),
    ('type: "Power" power_param { power: 3 scale: -2 }', lambda x: (-2 * x) ** 3),
    ('type: "Power" power_param { scale: 3 shift: 1 }', lambda x: 3 * x + 1),
    ('type: "Power" power_param { power: 0 scale: 3 shift: 1 }', lambda x: np.ones_like(x)),
    ('type: "Power" power_param { power: 2 scale: 0 shift: 3 }', lambda x: np.full_like(x, 9)),
    ('type: "Exp"', np.exp),
    ('type: "Exp" exp_param { base: 2 scale: 0.5 shift: 1 }', lambda x: 2 ** (1 + 0.5 * x)),
    ('type: "Exp" exp_param { scale: -1 shift: 0.3 }', lambda x: np.exp(f32(0.3) - x)),
    ('type: "Threshold"', lambda x: (x > 0).astype(float)),
    ('type: "Threshold" threshold_param { threshold: 0.4 }', lambda x: (x > f32(0.4)) * 1.0),
    ('type: "Clip" clip_param { min: -0.5 max: 0.7 }', lambda x: np.clip(x, -0.5, f32(0.7))),
    ('type: "Dropout"', lambda x: x),
]


@pytest.mark.parametrize("text,ref", FORWARD_CASES, ids=[c[0] for c in FORWARD_CASES])
def test_forward_matches_formula(text, ref):
    x = RNG.standard_normal(SHAPE)
    _, _, top = forward(text, x)
    assert top[0].shape == SHAPE
    np.testing.assert_allclose(top[0].data, ref(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("text,ref", [
    ('type: "Log"', np.log),
    ('type: "Log" log_param { base: 10 scale: 2 shift: 0.5 }', lambda x: np.log10(2 * x + 0.5)),
    ('type: "Log" log_param { base: 2 }', np.log2),
    ('type: "Power" power_param { power: 1.5 scale: 0.8 shift: 0.3 }',
     lambda x: (f32(0.8) * x + f32(0.3)) ** 1.5),
    ('type: "Power" power_param { power: -0.5 scale: 2 }', lambda x: (2 * x) ** -0.5),
])
def test_forward_positive_domain(text, ref):
    x = RNG.uniform(0.2, 3.0, SHAPE)
    _, _, top = forward(text, x)
    np.testing.assert_allclose(top[0].data, ref(x), rtol=1e-12)


def test_prelu_forward_per_channel_and_shared():
    x = RNG.standard_normal(SHAPE)
    layer, bottom, top = forward('type: "PReLU"', x)
    assert layer.blobs[0].shape == (3,)
    np.testing.assert_array_equal(layer.blobs[0].data, 0.25)
    slopes = np.array([0.1, -0.3, 2.0])
    layer.blobs[0].data[...] = slopes
    run_forward(layer, bottom, top)
    a = slopes.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(top[0].data, np.where(x > 0, x, a * x), rtol=1e-12)

    layer, bottom, top = forward('type: "PReLU" prelu_param { channel_shared: true '
                                 'filler { type: "constant" value: -0.7 } }', x)
    assert layer.blobs[0].shape == ()
    np.testing.assert_allclose(top[0].data, np.where(x > 0, x, f32(-0.7) * x), rtol=1e-12)


def test_prelu_accepts_any_number_of_axes_from_two():
    x = RNG.standard_normal((4, 5))
    _, _, top = forward('type: "PReLU"', x)
    np.testing.assert_allclose(top[0].data, np.where(x > 0, x, 0.25 * x))
    x = RNG.standard_normal((2, 3, 2, 2, 2))
    _, _, top = forward('type: "PReLU"', x)
    assert top[0].shape == x.shape


def test_bnll_is_stable_for_large_inputs():
    x = np.array([-1000.0, -60.0, 0.0, 60.0, 1000.0])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        layer, bottom, top = forward('type: "BNLL"', x)
        np.testing.assert_allclose(top[0].data, [0, np.exp(-60), np.log(2), 60, 1000],
                                   rtol=1e-12)
        top[0].diff[...] = 1
        layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, [0, sigmoid(-60), 0.5, sigmoid(50), sigmoid(50)],
                               rtol=1e-12, atol=1e-300)


def test_sigmoid_saturates_without_overflow():
    x = np.array([-1e4, -30.0, 0.0, 30.0, 1e4])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        _, _, top = forward('type: "Sigmoid"', x)
    np.testing.assert_allclose(top[0].data, sigmoid(np.clip(x, -700, 700)), atol=1e-15)
    assert top[0].data[0] == 0 and top[0].data[-1] == 1


def test_clip_keeps_the_gradient_at_the_bounds_and_maps_nan_to_min():
    x = np.array([-2.0, -0.5, 0.0, f32(0.7), 2.0, np.nan])
    layer, bottom, top = forward('type: "Clip" clip_param { min: -0.5 max: 0.7 }', x)
    np.testing.assert_allclose(top[0].data, [-0.5, -0.5, 0, f32(0.7), f32(0.7),
                                             -0.5])
    top[0].diff[...] = 3
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, [0, 3, 3, 3, 0, 0])


def test_relu_gradient_at_zero_is_the_negative_slope():
    x = np.array([-1.0, 0.0, 1.0])
    layer, bottom, top = forward('type: "ReLU" relu_param { negative_slope: 0.5 }', x)
    top[0].diff[...] = 2
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, [1, 1, 2])


def test_absval_gradient_at_zero_is_zero():
    x = np.array([-2.0, 0.0, 3.0])
    layer, bottom, top = forward('type: "AbsVal"', x)
    top[0].diff[...] = 5
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, [-5, 0, 5])


@pytest.mark.parametrize("text,grad", [
    ('power: 0 scale: 2 shift: 1', 0.0),
    ('power: 3 scale: 0 shift: 1', 0.0),
    ('power: 1 scale: -2 shift: 4', -2.0),
])
def test_power_constant_gradients(text, grad):
    x = RNG.standard_normal(SHAPE)
    layer, bottom, top = forward(f'type: "Power" power_param {{ {text} }}', x)
    top[0].diff[...] = 1.5
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 1.5 * grad)


def test_power_with_shift_zero_uses_y_over_x_like_caffe():
    """dy/dx = power * y / x: Caffe's shortcut, NaN at x = 0 even where the true derivative
    exists."""
    x = np.array([0.0, 2.0])
    layer, bottom, top = forward('type: "Power" power_param { power: 3 }', x)
    top[0].diff[...] = 1
    with np.errstate(invalid="ignore"):
        layer.backward(top, [True], bottom)
    assert np.isnan(bottom[0].diff[0])
    assert bottom[0].diff[1] == pytest.approx(12.0)


# ------------------------------------------------------------------------------------------
# Gradients by finite differences
# ------------------------------------------------------------------------------------------
GRAD_CASES = [
    ('type: "ReLU"', [0.0]),
    ('type: "ReLU" relu_param { negative_slope: -0.3 }', [0.0]),
    ('type: "PReLU"', [0.0]),
    ('type: "PReLU" prelu_param { channel_shared: true }', [0.0]),
    ('type: "PReLU" prelu_param { filler { type: "uniform" min: -1 max: 1 } }', [0.0]),
    ('type: "ELU" elu_param { alpha: 0.7 }', [0.0]),
    ('type: "ELU" elu_param { alpha: -0.4 }', [0.0]),
    ('type: "Sigmoid"', []),
    ('type: "TanH"', []),
    ('type: "AbsVal"', [0.0]),
    ('type: "BNLL"', []),
    ('type: "Swish" swish_param { beta: 1.7 }', []),
    ('type: "Power" power_param { power: 2 scale: 0.5 shift: -1 }', []),
    ('type: "Power" power_param { power: 3 scale: -2 }', []),
    ('type: "Power" power_param { power: 1 scale: 3 shift: 1 }', []),
    ('type: "Exp" exp_param { base: 2 scale: 0.5 shift: 1 }', []),
    ('type: "Exp"', []),
    ('type: "Clip" clip_param { min: -0.5 max: 0.7 }', [-0.5, 0.7]),
    ('type: "Dropout"', []),
]


@pytest.mark.parametrize("text,kinks", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradient(text, kinks):
    x = away_from(RNG.standard_normal(SHAPE), kinks)
    layer, bottom, top = build_layer(text, [x])
    check_gradient(layer, bottom, top)


@pytest.mark.parametrize("text", [
    'type: "Log" log_param { base: 3 scale: 2 shift: 0.5 }',
    'type: "Log"',
    'type: "Power" power_param { power: 1.5 scale: 0.8 shift: 0.3 }',
    'type: "Power" power_param { power: -0.5 scale: 2 }',
])
def test_gradient_positive_domain(text):
    x = RNG.uniform(0.3, 2.0, SHAPE)
    layer, bottom, top = build_layer(text, [x])
    check_gradient(layer, bottom, top)


def test_dropout_train_gradient_uses_the_same_mask():
    x = RNG.standard_normal(SHAPE)
    layer, bottom, top = build_layer('type: "Dropout" dropout_param { dropout_ratio: 0.3 }',
                                     [x], phase=caffe_pb2.TRAIN)
    check_gradient(layer, bottom, top)


def test_prelu_param_diff_accumulates():
    x = away_from(RNG.standard_normal(SHAPE), [0.0])
    layer, bottom, top = forward('type: "PReLU"', x)
    dy = RNG.standard_normal(SHAPE)
    top[0].diff[...] = dy
    layer.blobs[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    expected = 1.0 + (dy * x * (x <= 0)).sum(axis=(0, 2, 3))
    np.testing.assert_allclose(layer.blobs[0].diff, expected, rtol=1e-12)
    layer.param_propagate_down = [False]
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(layer.blobs[0].diff, expected, rtol=1e-12)


# ------------------------------------------------------------------------------------------
# Dropout
# ------------------------------------------------------------------------------------------
def test_dropout_train_scales_kept_units_and_drops_the_ratio():
    x = np.ones((100, 100))
    layer, bottom, top = forward('type: "Dropout" dropout_param { dropout_ratio: 0.25 }', x,
                                 phase=caffe_pb2.TRAIN)
    y = top[0].data
    np.testing.assert_allclose(np.unique(y), [0, 1 / 0.75], rtol=1e-15)
    assert abs((y == 0).mean() - 0.25) < 0.03
    top[0].diff[...] = 2.0
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, 2.0 * y)


def test_dropout_draws_a_new_mask_every_forward_from_the_seeded_rng():
    x = np.ones((20, 20))
    layer, bottom, top = build_layer('type: "Dropout"', [x], phase=caffe_pb2.TRAIN)
    set_random_seed(3)
    layer.forward(bottom, top)
    first = top[0].data.copy()
    layer.forward(bottom, top)
    assert not np.array_equal(first, top[0].data)
    set_random_seed(3)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(first, top[0].data)


def test_dropout_test_phase_is_identity_both_ways():
    x = RNG.standard_normal(SHAPE)
    layer, bottom, top = forward('type: "Dropout" dropout_param { dropout_ratio: 0.9 }', x)
    np.testing.assert_array_equal(top[0].data, x)
    dy = RNG.standard_normal(SHAPE)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, dy)


# ------------------------------------------------------------------------------------------
# In place
# ------------------------------------------------------------------------------------------
def run_layer(text, x, dy, in_place, phase=caffe_pb2.TEST, dtype=np.float64):
    layer = create_layer(make_layer_param(text, phase), backends.get("cpu"), dtype)
    bottom = Blob(x.shape, dtype)
    bottom.data[...] = x
    top = bottom if in_place else Blob((), dtype)
    set_random_seed(7)
    layer.setup([bottom], [top])
    set_random_seed(8)
    layer.forward([bottom], [top])
    y = top.data.copy()
    top.diff[...] = dy
    layer.backward([top], [True], [bottom])
    return y, bottom.diff.copy(), [p.diff.copy() for p in layer.blobs]


IN_PLACE_CASES = [c[0] for c in GRAD_CASES if "AbsVal" not in c[0]] + [
    'type: "Log" log_param { base: 3 scale: 2 shift: 9 }',
    'type: "Power" power_param { power: 1.5 scale: 0.8 shift: 3 }',
    'type: "Power" power_param { power: 3 }',
    'type: "Threshold" threshold_param { threshold: 0.1 }',
    'type: "ReLU" relu_param { negative_slope: 0.1 }',
]


@pytest.mark.parametrize("phase", [caffe_pb2.TEST, caffe_pb2.TRAIN])
@pytest.mark.parametrize("text", IN_PLACE_CASES)
def test_in_place_equals_out_of_place(text, phase):
    x = RNG.standard_normal(SHAPE)
    dy = RNG.standard_normal(SHAPE)
    if "Threshold" in text:
        layer = create_layer(make_layer_param(text), backends.get("cpu"), np.float64)
        b = Blob(SHAPE, np.float64)
        b.data[...] = x
        layer.setup([b], [b])
        layer.forward([b], [b])
        np.testing.assert_array_equal(b.data, x > 0.1)
        return
    expected = run_layer(text, x, dy, False, phase)
    got = run_layer(text, x, dy, True, phase)
    for e, g in zip(expected[:2] + tuple(expected[2]), got[:2] + tuple(got[2])):
        np.testing.assert_array_equal(g, e)


def test_absval_refuses_in_place():
    with pytest.raises(LayerError, match=r"AbsVal layer 'under_test'.*in-place"):
        run_layer('type: "AbsVal"', np.ones(3), np.ones(3), True)


# ------------------------------------------------------------------------------------------
# Errors and dtypes
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,shape,message", [
    ('type: "Exp" exp_param { base: -2 }', SHAPE, "base -2 must be strictly positive"),
    ('type: "Exp" exp_param { base: 0 }', SHAPE, "base 0 must be strictly positive"),
    ('type: "Log" log_param { base: 1 }', SHAPE, "base 1 has logarithm 0"),
    ('type: "Log" log_param { base: -0.5 }', SHAPE, "strictly positive"),
    ('type: "Clip" clip_param { min: 0 }', SHAPE, "needs max"),
    ('type: "Clip"', SHAPE, "needs min and max"),
    ('type: "Dropout" dropout_param { dropout_ratio: 1 }', SHAPE, r"dropout_ratio 1 must lie"),
    ('type: "Dropout" dropout_param { dropout_ratio: -0.1 }', SHAPE, "must lie in"),
    ('type: "PReLU"', (5,), r"at least 2 axes .* \(5,\)"),
    ('name: "p" type: "PReLU" prelu_param { channel_shared: true } '
     'blobs { shape { dim: 3 } data: [1, 2, 3] }', SHAPE, "holds 3 value.*channel_shared"),
])
def test_bad_parameters_name_the_layer(text, shape, message):
    with pytest.raises(LayerError, match=message) as info:
        build_layer(text, [np.ones(shape)])
    assert "layer '" in str(info.value)


def test_prelu_channel_change_on_reshape_is_an_error():
    layer, bottom, top = forward('type: "PReLU"', np.ones(SHAPE))
    bottom[0].reshape((2, 4, 2, 2))
    with pytest.raises(LayerError, match=r"4 channels but the layer has 3 slopes"):
        layer.reshape(bottom, top)


def test_prelu_uses_slopes_loaded_from_the_prototxt():
    text = 'type: "PReLU" blobs { shape { dim: 3 } data: [0.5, -1, 2] }'
    x = -np.ones(SHAPE)
    _, _, top = forward(text, x)
    np.testing.assert_array_equal(top[0].data[0, :, 0, 0], [-0.5, 1, -2])


def test_threshold_has_no_backward():
    layer, bottom, top = forward('type: "Threshold"', np.ones(SHAPE))
    layer.backward(top, [False], bottom)
    with pytest.raises(LayerError, match="Threshold layer 'under_test': has no backward"):
        layer.backward(top, [True], bottom)


@pytest.mark.parametrize("text", [c[0] for c in GRAD_CASES] + [
    'type: "Log"', 'type: "Threshold"', 'type: "Power" power_param { power: 0.5 }'])
def test_float32_stays_float32(text):
    x = RNG.uniform(0.5, 2.0, SHAPE).astype(np.float32)
    layer, bottom, top = build_layer(text, [x], dtype=np.float32, phase=caffe_pb2.TRAIN)
    run_forward(layer, bottom, top)
    assert top[0].data.dtype == np.float32
    top[0].diff[...] = 1
    if "Threshold" not in text:
        layer.backward(top, [True], bottom)
        assert bottom[0].diff.dtype == np.float32
        assert np.isfinite(bottom[0].diff).all()
    assert np.isfinite(top[0].data).all()


def test_reshape_follows_the_bottom():
    layer, bottom, top = forward('type: "TanH"', np.ones(SHAPE))
    bottom[0].reshape((5, 7))
    layer.reshape(bottom, top)
    assert top[0].shape == (5, 7)
