"""Embed: lookup against NumPy, scatter-add weight gradient with repeated indices, gradient
checks of the params, and bad parameters / indices."""
import numpy as np
import pytest

from cct.errors import LayerError
from tests.gradient_check import build_layer, check_gradient, run_forward

rng = np.random.default_rng(4)

FILLED = ('weight_filler { type: "gaussian" } bias_filler { type: "gaussian" }')


def indices(*shape, input_dim=5):
    return rng.integers(0, input_dim, shape).astype(float)


@pytest.mark.parametrize("bias", ["true", "false"])
def test_embed_forward_and_param_gradients(bias):
    x = indices(2, 3)
    layer, bottom, top = build_layer(
        f'type: "Embed" embed_param {{ num_output: 4 input_dim: 5 bias_term: {bias} {FILLED} }}',
        [x])
    w = layer.blobs[0].data
    assert w.shape == (5, 4)
    assert len(layer.blobs) == (2 if bias == "true" else 1)
    run_forward(layer, bottom, top)
    assert top[0].shape == (2, 3, 4)
    expected = np.empty((2, 3, 4))
    for i in range(2):
        for j in range(3):
            expected[i, j] = w[int(x[i, j])]
    if bias == "true":
        expected += layer.blobs[1].data
    np.testing.assert_array_equal(top[0].data, expected)
    check_gradient(layer, bottom, top, check_bottom=[])


def test_embed_repeated_indices_accumulate():
    x = np.array([1.0, 3.0, 1.0, 1.0])
    layer, bottom, top = build_layer(
        f'type: "Embed" embed_param {{ num_output: 2 input_dim: 4 {FILLED} }}', [x])
    run_forward(layer, bottom, top)
    dy = np.arange(8.0).reshape(4, 2)
    top[0].diff[...] = dy
    layer.blobs[0].diff[...] = 1.0
    layer.backward(top, [False], bottom)
    expected = np.ones((4, 2))
    expected[1] += dy[0] + dy[2] + dy[3]
    expected[3] += dy[1]
    np.testing.assert_array_equal(layer.blobs[0].diff, expected)
    np.testing.assert_array_equal(layer.blobs[1].diff, dy.sum(axis=0))


def test_embed_default_fillers_are_zero():
    layer, _, _ = build_layer('type: "Embed" embed_param { num_output: 2 input_dim: 3 }',
                              [indices(2, input_dim=3)])
    assert not layer.blobs[0].data.any() and not layer.blobs[1].data.any()


@pytest.mark.parametrize("bad", [5.0, -1.0, 1.5])
def test_embed_rejects_bad_indices(bad):
    layer, bottom, top = build_layer('type: "Embed" embed_param { num_output: 2 input_dim: 5 }',
                                     [np.array([0.0, bad])])
    with pytest.raises(LayerError, match=r"Embed layer 'under_test': bottom element 1 is "
                                         r".*indices must be whole numbers in \[0, input_dim\)"):
        run_forward(layer, bottom, top)


def test_embed_errors():
    with pytest.raises(LayerError, match="num_output must be positive"):
        build_layer('type: "Embed" embed_param { input_dim: 5 }', [indices(2)])
    with pytest.raises(LayerError, match="input_dim must be positive"):
        build_layer('type: "Embed" embed_param { num_output: 5 }', [indices(2)])
    layer, bottom, top = build_layer('type: "Embed" embed_param { num_output: 2 input_dim: 5 }',
                                     [indices(3)])
    run_forward(layer, bottom, top)
    with pytest.raises(LayerError, match="cannot backpropagate to its bottom"):
        layer.backward(top, [True], bottom)


@pytest.mark.parametrize("blobs,match", [
    ('blobs { shape { dim: 5 dim: 2 } ' + 'data: 0 ' * 10 + '}',
     r"has 1 weight blob\(s\) in the prototxt, expected 2 \(bias_term: True\)"),
    ('blobs { shape { dim: 2 dim: 5 } ' + 'data: 0 ' * 10 + '} blobs { shape { dim: 2 } '
     'data: 0 data: 0 }', r"incorrect weight shape: expected \(5, 2\), got \(2, 5\)"),
    ('blobs { shape { dim: 5 dim: 2 } ' + 'data: 0 ' * 10 + '} blobs { shape { dim: 5 } '
     + 'data: 0 ' * 5 + '}', r"incorrect bias shape: expected \(2,\), got \(5,\)"),
])
def test_embed_checks_prototxt_blobs(blobs, match):
    with pytest.raises(LayerError, match=r"Embed layer 'under_test': " + match):
        build_layer('type: "Embed" embed_param { num_output: 2 input_dim: 5 } ' + blobs,
                    [indices(3)])
