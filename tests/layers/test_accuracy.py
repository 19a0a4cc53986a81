"""Accuracy: top-k hits against a plainly written reference of Caffe's counting rule (ties
count against the prediction), ignore_label, the per-class top, axes, shape errors, and Caffe's
outputs from the LeNet and CIFAR-10 fixtures."""
import numpy as np
import pytest

from cct.errors import LayerError
from tests.caffe_layer_fixture import assert_matches_caffe, run_fixture_layer
from tests.gradient_check import build_layer, run_forward

RNG = np.random.default_rng(23)


def accuracy_ref(x, label, top_k=1, axis=1, ignore=None):
    """Caffe's loop: a hit when fewer than top_k other classes score >= the true class."""
    axis %= x.ndim
    outer = int(np.prod(x.shape[:axis]))
    c = x.shape[axis]
    x = x.reshape(outer, c, -1)
    lab = label.reshape(outer, -1)
    hits, count = 0, 0
    per_hit, per_num = np.zeros(c), np.zeros(c)
    for i in range(outer):
        for j in range(x.shape[2]):
            k = int(lab[i, j])
            if ignore is not None and k == ignore:
                continue
            per_num[k] += 1
            better = -1
            for m in range(c):
                if x[i, m, j] >= x[i, k, j]:
                    better += 1
            if better < top_k:
                hits += 1
                per_hit[k] += 1
            count += 1
    per_class = np.where(per_num > 0, per_hit / np.maximum(per_num, 1), 0)
    return (hits / count if count else 0.0), per_class


def run(text, x, label, num_tops=1, dtype=np.float64):
    layer, bottom, top = build_layer(text, [x, label], num_tops=num_tops, dtype=dtype)
    run_forward(layer, bottom, top)
    return layer, top


@pytest.mark.parametrize("net", ["lenet_train_test_b8", "cifar10_quick_train_test_b4"])
def test_matches_caffe_nets(caffe_fixtures, net):
    d = caffe_fixtures / "numerics"
    assert_matches_caffe(run_fixture_layer(d / f"{net}.TEST.npz", d / f"{net}.prototxt",
                                           "accuracy"))


@pytest.mark.parametrize("top_k", [1, 2, 5])
def test_top_k_matches_reference(top_k):
    x = RNG.standard_normal((50, 5))
    label = RNG.integers(0, 5, 50).astype(float)
    layer, top = run(f'type: "Accuracy" accuracy_param {{ top_k: {top_k} }}', x, label, 2)
    acc, per_class = accuracy_ref(x, label, top_k)
    assert top[0].shape == () and top[1].shape == (5,)
    assert float(top[0].data) == pytest.approx(acc, rel=1e-15)
    np.testing.assert_allclose(top[1].data, per_class, rtol=1e-15)
    if top_k == 5:
        assert float(top[0].data) == 1.0


def test_ties_count_against_the_prediction():
    x = np.array([[1.0, 1.0, 0.0],
                  [2.0, 1.0, 1.0],
                  [0.0, 3.0, 3.0],
                  [5.0, 5.0, 5.0]])
    label = np.array([0, 0, 2, 1], float)
    _, top = run('type: "Accuracy"', x, label)
    assert float(top[0].data) == 0.25
    _, top = run('type: "Accuracy" accuracy_param { top_k: 2 }', x, label)
    assert float(top[0].data) == 0.75
    np.testing.assert_allclose(accuracy_ref(x, label, 2)[0], 0.75)


def test_ignore_label_and_per_class_with_absent_classes():
    x = RNG.standard_normal((6, 4))
    label = np.array([0, 1, 1, -1, 0, -1], float)
    layer, top = run('type: "Accuracy" accuracy_param { ignore_label: -1 }', x, label, 2)
    acc, per_class = accuracy_ref(x, label, ignore=-1)
    assert float(top[0].data) == pytest.approx(acc)
    np.testing.assert_allclose(top[1].data, per_class)
    assert top[1].data[2] == 0 and top[1].data[3] == 0


def test_all_ignored_gives_zero():
    _, top = run('type: "Accuracy" accuracy_param { ignore_label: 3 }', np.ones((2, 4)),
                 np.full(2, 3.0), 2)
    assert float(top[0].data) == 0.0
    np.testing.assert_array_equal(top[1].data, 0)


@pytest.mark.parametrize("shape,axis", [((2, 4, 3, 2), 1), ((2, 3, 5), 2), ((2, 3, 5), -1)])
def test_axis(shape, axis):
    x = RNG.standard_normal(shape)
    label_shape = tuple(s for i, s in enumerate(shape) if i != axis % len(shape))
    label = RNG.integers(0, shape[axis], label_shape).astype(float)
    _, top = run(f'type: "Accuracy" accuracy_param {{ axis: {axis} top_k: 2 }}', x, label, 2)
    acc, per_class = accuracy_ref(x, label, 2, axis)
    assert float(top[0].data) == pytest.approx(acc)
    np.testing.assert_allclose(top[1].data, per_class)


def test_float32():
    x = RNG.standard_normal((7, 3)).astype(np.float32)
    label = RNG.integers(0, 3, 7).astype(np.float32)
    _, top = run('type: "Accuracy"', x, label, dtype=np.float32)
    assert top[0].data.dtype == np.float32
    assert float(top[0].data) == np.float32(accuracy_ref(x, label)[0])


def test_backward_does_nothing():
    x = RNG.standard_normal((3, 4))
    layer, bottom, top = build_layer('type: "Accuracy"', [x, np.zeros(3)])
    bottom[0].diff[...] = 7
    layer.backward(top, [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 7)


@pytest.mark.parametrize("text,shapes,message", [
    ('type: "Accuracy" accuracy_param { top_k: 5 }', ((3, 4), (3,)),
     r"top_k 5 must be at most the number of classes"),
    ('type: "Accuracy"', ((3, 4, 2), (3,)), r"the label count \(3, shape \(3,\)\) must match"),
    ('type: "Accuracy" accuracy_param { axis: 3 }', ((3, 4), (3,)), r"axis 3 is out of range"),
])
def test_shape_errors_name_the_layer(text, shapes, message):
    with pytest.raises(LayerError, match=rf"Accuracy layer 'under_test': {message}"):
        build_layer(text, [np.ones(s) for s in shapes])


@pytest.mark.parametrize("bad", [4, -2])
def test_label_out_of_range(bad):
    with pytest.raises(LayerError, match=rf"Accuracy layer 'under_test': label {bad} is out "
                                         r"of range: labels must lie in \[0, 3\] or equal "
                                         r"ignore_label -1"):
        run('type: "Accuracy" accuracy_param { ignore_label: -1 }', np.ones((2, 4)),
            np.array([0.0, bad]))


def test_blob_counts():
    with pytest.raises(LayerError, match=r"takes at most 2 top"):
        build_layer('type: "Accuracy"', [np.ones((2, 3)), np.zeros(2)], num_tops=3)
