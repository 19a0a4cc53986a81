"""Reduction and ArgMax: forward against NumPy, gradient checks, tie order, shape rules and bad
parameters."""
import numpy as np
import pytest

from cct.errors import LayerError
from tests.gradient_check import build_layer, check_gradient, run_forward

rng = np.random.default_rng(2)


def rand(*shape):
    return rng.standard_normal(shape)


# ------------------------------------------------------------------------------------------
# Reduction
# ------------------------------------------------------------------------------------------
def reference(x, op, axis, coeff):
    rows = x.reshape(int(np.prod(x.shape[:axis])), -1)
    if op == "SUM":
        out = rows.sum(axis=1)
    elif op == "ASUM":
        out = np.abs(rows).sum(axis=1)
    elif op == "SUMSQ":
        out = (rows ** 2).sum(axis=1)
    else:
        out = rows.mean(axis=1)
    return (coeff * out).reshape(x.shape[:axis])


@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
@pytest.mark.parametrize("axis, coeff", [(0, 1.0), (1, -2.5), (2, 0.5)])
def test_reduction(op, axis, coeff):
    x = rand(2, 3, 4)
    layer, bottom, top = build_layer(
        f'type: "Reduction" reduction_param {{ operation: {op} axis: {axis} coeff: {coeff} }}',
        [x])
    run_forward(layer, bottom, top)
    assert top[0].shape == x.shape[:axis]
    np.testing.assert_allclose(top[0].data, reference(x, op, axis, coeff), rtol=1e-12)
    check_gradient(layer, bottom, top, kink=0.0, kink_range=1e-3)


def test_reduction_defaults_sum_everything_to_a_scalar():
    x = rand(2, 3)
    layer, bottom, top = build_layer('type: "Reduction"', [x])
    run_forward(layer, bottom, top)
    assert top[0].shape == ()
    np.testing.assert_allclose(top[0].data, x.sum())


def test_reduction_negative_axis_and_asum_sign_of_zero():
    x = np.array([[0.0, -2.0, 3.0], [1.0, 0.0, -1.0]])
    layer, bottom, top = build_layer(
        'type: "Reduction" reduction_param { operation: ASUM axis: -1 }', [x])
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, [5.0, 2.0])
    top[0].diff[...] = [1.0, 2.0]
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, [[0.0, -1.0, 1.0], [2.0, 0.0, -2.0]])


def test_reduction_bad_axis():
    with pytest.raises(LayerError, match="Reduction layer 'under_test': axis 3 is out of "
                                         "range for a bottom of shape \\(2, 3\\)"):
        build_layer('type: "Reduction" reduction_param { axis: 3 }', [rand(2, 3)])


# ------------------------------------------------------------------------------------------
# ArgMax
# ------------------------------------------------------------------------------------------
def reference_topk(rows, k):
    """Caffe's order, written out: sort (value, index) pairs descending and keep k."""
    out_idx, out_val = [], []
    for row in rows:
        pairs = sorted(((v, j) for j, v in enumerate(row)), reverse=True)[:k]
        out_idx.append([j for _, j in pairs])
        out_val.append([v for v, _ in pairs])
    return np.array(out_idx, float), np.array(out_val)


@pytest.mark.parametrize("top_k", [1, 3])
def test_argmax_per_example(top_k):
    x = rand(4, 2, 3)
    layer, bottom, top = build_layer(f'type: "ArgMax" argmax_param {{ top_k: {top_k} }}', [x])
    run_forward(layer, bottom, top)
    idx, _ = reference_topk(x.reshape(4, -1), top_k)
    assert top[0].shape == (4, 1, top_k)
    np.testing.assert_array_equal(top[0].data[:, 0], idx)


def test_argmax_out_max_val_and_padding_axes():
    x = rand(3, 2, 2, 2)
    layer, bottom, top = build_layer(
        'type: "ArgMax" argmax_param { out_max_val: true top_k: 2 }', [x])
    run_forward(layer, bottom, top)
    assert top[0].shape == (3, 2, 2, 1)
    idx, val = reference_topk(x.reshape(3, -1), 2)
    np.testing.assert_array_equal(top[0].data[:, 0, :, 0], idx)
    np.testing.assert_array_equal(top[0].data[:, 1, :, 0], val)


def test_argmax_ties_take_the_larger_index_first():
    x = np.array([[1.0, 5.0, 5.0, 2.0, 5.0]])
    layer, bottom, top = build_layer('type: "ArgMax" argmax_param { top_k: 4 }', [x])
    run_forward(layer, bottom, top)
    np.testing.assert_array_equal(top[0].data.ravel(), [4.0, 2.0, 1.0, 3.0])
    layer, bottom, top = build_layer('type: "ArgMax"', [x])
    run_forward(layer, bottom, top)
    assert top[0].data.ravel().tolist() == [4.0]


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("out_max_val", ["false", "true"])
def test_argmax_along_axis(axis, out_max_val):
    x = rand(3, 4, 5)
    layer, bottom, top = build_layer(
        f'type: "ArgMax" argmax_param {{ axis: {axis} top_k: 2 out_max_val: {out_max_val} }}',
        [x])
    run_forward(layer, bottom, top)
    moved = np.moveaxis(x, axis, -1)
    idx, val = reference_topk(moved.reshape(-1, moved.shape[-1]), 2)
    want = val if out_max_val == "true" else idx
    want = np.moveaxis(want.reshape(moved.shape[:-1] + (2,)), -1, axis)
    expected_shape = list(x.shape)
    expected_shape[axis] = 2
    assert top[0].shape == tuple(expected_shape)
    np.testing.assert_array_equal(top[0].data, want)


def test_argmax_errors():
    with pytest.raises(LayerError, match="ArgMax layer 'under_test': top_k 7 exceeds the 6 "
                                         "values per example"):
        build_layer('type: "ArgMax" argmax_param { top_k: 7 }', [rand(2, 2, 3)])
    with pytest.raises(LayerError, match="top_k 4 exceeds the size 3 of axis 2"):
        build_layer('type: "ArgMax" argmax_param { top_k: 4 axis: 2 }', [rand(2, 2, 3)])
    with pytest.raises(LayerError, match="top_k must be at least 1"):
        build_layer('type: "ArgMax" argmax_param { top_k: 0 }', [rand(2, 2)])
    layer, bottom, top = build_layer('type: "ArgMax"', [rand(2, 2)])
    with pytest.raises(LayerError, match="has no gradient"):
        layer.backward(top, [True], bottom)
