"""Loss layers: forward against plainly written float64 references of Caffe's formulas,
gradients by finite differences (which also checks the scaling by the top diff, the loss
weight), normalisation modes, ignore_label, shape and label errors, and Caffe's float32 outputs
from the layer zoo and LeNet fixtures."""
import numpy as np
import pytest

from cct.errors import LayerError
from cct.proto import caffe_pb2
from tests.caffe_layer_fixture import assert_matches_caffe, run_fixture_layer
from tests.gradient_check import build_layer, check_gradient, run_forward

RNG = np.random.default_rng(22)
FLT_MIN = float(np.finfo(np.float32).tiny)


def loss_of(text, bottoms, num_tops=1, dtype=np.float64):
    layer, bottom, top = build_layer(text, bottoms, num_tops=num_tops, dtype=dtype)
    run_forward(layer, bottom, top)
    return float(top[0].data), layer, bottom, top


def grads(layer, bottom, top, weight=1.0):
    """Bottom diffs after one backward pass with top diff ``weight`` (propagating to every
    bottom the net could ask for)."""
    top[0].diff[...] = weight
    for b in bottom:
        b.diff[...] = np.nan
    layer.backward(top, [layer.allow_force_backward(i) for i in range(len(bottom))], bottom)
    return [b.diff.copy() for b in bottom]


def labels(shape, classes):
    return RNG.integers(0, classes, shape).astype(np.float64)


def normalize_ref(mode, outer, inner, valid):
    n = {"FULL": outer * inner, "VALID": valid, "BATCH_SIZE": outer, "NONE": 1}[mode]
    return max(1, n)


# ------------------------------------------------------------------------------------------
# Caffe's fixtures
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["loss_softmax", "loss_euclid", "loss_sigmoid_xent"])
def test_matches_caffe_layer_zoo(caffe_fixtures, name):
    d = caffe_fixtures / "numerics"
    assert_matches_caffe(run_fixture_layer(d / "layer_zoo.TEST.npz", d / "layer_zoo.prototxt",
                                           name))


@pytest.mark.parametrize("net", ["lenet_train_test_b8", "cifar10_quick_train_test_b4"])
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_softmax_loss_matches_caffe_nets(caffe_fixtures, net, phase):
    d = caffe_fixtures / "numerics"
    assert_matches_caffe(run_fixture_layer(d / f"{net}.{phase}.npz", d / f"{net}.prototxt",
                                           "loss"))


# ------------------------------------------------------------------------------------------
# Common LossLayer rules
# ------------------------------------------------------------------------------------------
BASIC = {
    "SoftmaxWithLoss": lambda: [RNG.standard_normal((3, 4)), labels(3, 4)],
    "EuclideanLoss": lambda: [RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))],
    "SigmoidCrossEntropyLoss": lambda: [RNG.standard_normal((3, 4)), RNG.uniform(0, 1, (3, 4))],
    "HingeLoss": lambda: [RNG.standard_normal((3, 4)), labels(3, 4)],
    "InfogainLoss": lambda: [RNG.standard_normal((3, 4)), labels(3, 4),
                             RNG.uniform(0, 1, (4, 4))],
    "MultinomialLogisticLoss": lambda: [RNG.uniform(0.1, 1, (3, 4)), labels(3, 4)],
    "ContrastiveLoss": lambda: [RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4)),
                                labels(3, 2)],
}


@pytest.mark.parametrize("type_", sorted(BASIC))
def test_scalar_top_and_default_loss_weight(type_):
    layer, bottom, top = build_layer(f'type: "{type_}"', BASIC[type_]())
    assert top[0].shape == () and top[0].count == 1
    assert layer.loss_weights == [1.0]
    assert float(top[0].diff) == 1.0


@pytest.mark.parametrize("type_", sorted(BASIC))
def test_backward_scales_by_the_top_diff(type_):
    value, layer, bottom, top = loss_of(f'type: "{type_}"', BASIC[type_]())
    g1 = grads(layer, bottom, top, 1.0)
    g3 = grads(layer, bottom, top, -3.0)
    for a, b in zip(g1, g3):
        if not np.isnan(a).all():
            np.testing.assert_allclose(b, -3.0 * a, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("type_", sorted(BASIC))
def test_first_dimension_mismatch_is_an_error(type_):
    b = BASIC[type_]()
    b[1] = np.concatenate([b[1], b[1][:1]])
    with pytest.raises(LayerError, match=rf"{type_} layer 'under_test'.*same first dimension"):
        build_layer(f'type: "{type_}"', b)


@pytest.mark.parametrize("type_", ["SoftmaxWithLoss", "SigmoidCrossEntropyLoss", "HingeLoss",
                                   "InfogainLoss", "MultinomialLogisticLoss"])
def test_label_gets_no_gradient(type_):
    _, layer, bottom, top = loss_of(f'type: "{type_}"', BASIC[type_]())
    assert not layer.allow_force_backward(1)
    with pytest.raises(LayerError, match=rf"{type_} layer 'under_test': cannot backpropagate "
                                         r"to label inputs \(bottom\[1\]\)"):
        layer.backward(top, [True, True] + [False] * (len(bottom) - 2), bottom)


@pytest.mark.parametrize("type_", ["SoftmaxWithLoss", "HingeLoss", "InfogainLoss",
                                   "MultinomialLogisticLoss"])
@pytest.mark.parametrize("bad", [4, -1])
def test_label_out_of_range_is_an_error(type_, bad):
    b = BASIC[type_]()
    b[1][1] = bad
    with pytest.raises(LayerError, match=rf"{type_} layer 'under_test': label {bad} is out "
                                         r"of range"):
        loss_of(f'type: "{type_}"', b)


# ------------------------------------------------------------------------------------------
# SoftmaxWithLoss
# ------------------------------------------------------------------------------------------
def outer_channels_inner(x, axis):
    axis %= x.ndim
    outer = int(np.prod(x.shape[:axis]))
    return x.reshape(outer, x.shape[axis], -1), outer, x.size // outer // x.shape[axis]


def softmax_loss_ref(x, label, axis=1, ignore=None, mode="VALID"):
    x, outer, inner = outer_channels_inner(x, axis)
    lab = label.reshape(outer, inner)
    loss, count = 0.0, 0
    for i in range(outer):
        for j in range(inner):
            k = int(lab[i, j])
            if ignore is not None and k == ignore:
                continue
            z = x[i, :, j] - x[i, :, j].max()
            p = np.exp(z) / np.exp(z).sum()
            loss -= np.log(max(p[k], FLT_MIN))
            count += 1
    return loss / normalize_ref(mode, outer, inner, count)


@pytest.mark.parametrize("shape,axis", [((4, 5), 1), ((2, 3, 2, 2), 1), ((2, 3, 4), 2),
                                        ((2, 3, 4), -1), ((2, 2, 3), 0)])
def test_softmax_loss_forward_and_gradient(shape, axis):
    x = RNG.standard_normal(shape) * 2
    label_shape = shape[:axis % len(shape)] + shape[axis % len(shape) + 1:]
    label = labels(label_shape, shape[axis])
    text = f'type: "SoftmaxWithLoss" softmax_param {{ axis: {axis} }}'
    value, layer, bottom, top = loss_of(text, [x, label])
    assert value == pytest.approx(softmax_loss_ref(x, label, axis), rel=1e-12)
    check_gradient(layer, bottom, top, check_bottom=[0])


@pytest.mark.parametrize("mode", ["FULL", "VALID", "BATCH_SIZE", "NONE"])
def test_softmax_loss_normalization_with_ignore_label(mode):
    x = RNG.standard_normal((3, 4, 2))
    label = labels((3, 2), 4)
    label[0, 1] = label[2, 0] = 7
    text = (f'type: "SoftmaxWithLoss" loss_param {{ ignore_label: 7 normalization: {mode} }}')
    value, layer, bottom, top = loss_of(text, [x, label])
    assert value == pytest.approx(softmax_loss_ref(x, label, ignore=7, mode=mode), rel=1e-12)
    check_gradient(layer, bottom, top, check_bottom=[0])
    g = grads(layer, bottom, top)[0]
    np.testing.assert_array_equal(g[0, :, 1], 0)
    np.testing.assert_array_equal(g[2, :, 0], 0)


@pytest.mark.parametrize("normalize,mode", [("true", "VALID"), ("false", "BATCH_SIZE")])
def test_softmax_loss_legacy_normalize(normalize, mode):
    x = RNG.standard_normal((2, 3, 3))
    label = labels((2, 3), 3)
    text = f'type: "SoftmaxWithLoss" loss_param {{ normalize: {normalize} }}'
    value, _, _, _ = loss_of(text, [x, label])
    assert value == pytest.approx(softmax_loss_ref(x, label, mode=mode), rel=1e-12)
    text = (f'type: "SoftmaxWithLoss" loss_param {{ normalize: {normalize} '
            f'normalization: FULL }}')
    value, _, _, _ = loss_of(text, [x, label])
    assert value == pytest.approx(softmax_loss_ref(x, label, mode="FULL"), rel=1e-12)


def test_softmax_loss_all_ignored_gives_zero():
    x = RNG.standard_normal((2, 3))
    value, layer, bottom, top = loss_of(
        'type: "SoftmaxWithLoss" loss_param { ignore_label: 1 }', [x, np.ones(2)])
    assert value == 0.0
    np.testing.assert_array_equal(grads(layer, bottom, top)[0], 0)


def test_softmax_loss_floors_the_probability_at_flt_min():
    x = np.array([[0.0, 2000.0]])
    value, _, _, _ = loss_of('type: "SoftmaxWithLoss"', [x, np.zeros(1)])
    assert value == pytest.approx(-np.log(FLT_MIN))


def test_softmax_loss_second_top_is_the_probability_and_its_diff_is_ignored():
    x = RNG.standard_normal((3, 4))
    label = labels(3, 4)
    value, layer, bottom, top = loss_of('type: "SoftmaxWithLoss"', [x, label], num_tops=2)
    assert layer.loss_weights == [1.0, 0.0]
    assert top[1].shape == (3, 4)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(top[1].data, e / e.sum(1, keepdims=True), rtol=1e-13)
    before = grads(layer, bottom, top)[0]
    top[1].diff[...] = 5.0
    np.testing.assert_array_equal(grads(layer, bottom, top)[0], before)


def test_softmax_loss_label_count_mismatch():
    with pytest.raises(LayerError, match=r"SoftmaxWithLoss layer 'under_test': the label "
                                         r"count \(6, shape \(2, 3\)\) must match .* \(4\)"):
        build_layer('type: "SoftmaxWithLoss"', [np.ones((2, 5, 2)), np.zeros((2, 3))])


def test_softmax_loss_truncates_labels_like_static_cast():
    x = RNG.standard_normal((2, 3))
    a, _, _, _ = loss_of('type: "SoftmaxWithLoss"', [x, np.array([1.9, 2.2])])
    b, _, _, _ = loss_of('type: "SoftmaxWithLoss"', [x, np.array([1.0, 2.0])])
    assert a == b


def test_softmax_loss_float32():
    x = RNG.standard_normal((4, 10)).astype(np.float32)
    label = labels(4, 10).astype(np.float32)
    value, layer, bottom, top = loss_of('type: "SoftmaxWithLoss"', [x, label],
                                        dtype=np.float32)
    assert top[0].data.dtype == np.float32
    assert value == pytest.approx(softmax_loss_ref(x.astype(np.float64), label), rel=1e-6)
    assert grads(layer, bottom, top)[0].dtype == np.float32


# ------------------------------------------------------------------------------------------
# EuclideanLoss
# ------------------------------------------------------------------------------------------
def test_euclidean_forward_and_gradient_to_both_bottoms():
    a = RNG.standard_normal((3, 2, 2))
    b = RNG.standard_normal((3, 4))
    value, layer, bottom, top = loss_of('type: "EuclideanLoss"', [a, b])
    assert value == pytest.approx(((a.reshape(3, 4) - b) ** 2).sum() / 3 / 2, rel=1e-13)
    assert layer.allow_force_backward(0) and layer.allow_force_backward(1)
    check_gradient(layer, bottom, top)
    ga, gb = grads(layer, bottom, top, 0.5)
    np.testing.assert_allclose(ga.reshape(3, 4), 0.5 * (a.reshape(3, 4) - b) / 3, rtol=1e-13)
    np.testing.assert_allclose(gb, -0.5 * (a.reshape(3, 4) - b) / 3, rtol=1e-13)


def test_euclidean_dimension_mismatch():
    with pytest.raises(LayerError, match=r"EuclideanLoss layer 'under_test': .*same dimension"):
        build_layer('type: "EuclideanLoss"', [np.ones((3, 4)), np.ones((3, 5))])


# ------------------------------------------------------------------------------------------
# SigmoidCrossEntropyLoss
# ------------------------------------------------------------------------------------------
def sigmoid_xent_ref(x, t, ignore=None, mode="BATCH_SIZE"):
    loss, count = 0.0, 0
    for xi, ti in zip(x.ravel(), t.ravel()):
        if ignore is not None and int(ti) == ignore:
            continue
        p = 1 / (1 + np.exp(-xi))
        loss -= ti * np.log(p) + (1 - ti) * np.log(1 - p)
        count += 1
    return loss / normalize_ref(mode, x.shape[0], x[0].size, count)


@pytest.mark.parametrize("mode", [None, "FULL", "VALID", "BATCH_SIZE", "NONE"])
def test_sigmoid_xent_forward_and_gradient(mode):
    x = RNG.standard_normal((3, 2, 2)) * 3
    t = RNG.uniform(0, 1, (3, 4))
    text = 'type: "SigmoidCrossEntropyLoss"'
    if mode:
        text += f" loss_param {{ normalization: {mode} }}"
    value, layer, bottom, top = loss_of(text, [x, t])
    assert value == pytest.approx(sigmoid_xent_ref(x, t, mode=mode or "BATCH_SIZE"), rel=1e-12)
    check_gradient(layer, bottom, top, check_bottom=[0])


def test_sigmoid_xent_ignore_label():
    x = RNG.standard_normal((2, 5))
    t = RNG.integers(0, 2, (2, 5)).astype(float)
    t[0, 1] = t[1, 3] = -1
    text = 'type: "SigmoidCrossEntropyLoss" loss_param { ignore_label: -1 normalize: true }'
    value, layer, bottom, top = loss_of(text, [x, t])
    assert value == pytest.approx(sigmoid_xent_ref(x, t, ignore=-1, mode="VALID"), rel=1e-12)
    check_gradient(layer, bottom, top, check_bottom=[0])
    g = grads(layer, bottom, top)[0]
    assert g[0, 1] == 0 and g[1, 3] == 0


def test_sigmoid_xent_is_stable_for_large_inputs():
    x = np.array([[-200.0, 200.0, 50.0]])
    t = np.array([[1.0, 0.0, 1.0]])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        value, _, _, _ = loss_of('type: "SigmoidCrossEntropyLoss"', [x, t])
    assert value == pytest.approx(400.0 + np.log1p(np.exp(-50.0)))


def test_sigmoid_xent_count_mismatch():
    with pytest.raises(LayerError, match=r"SigmoidCrossEntropyLoss layer 'under_test'.*same "
                                         r"count"):
        build_layer('type: "SigmoidCrossEntropyLoss"', [np.ones((2, 3)), np.ones((2, 4))])


# ------------------------------------------------------------------------------------------
# HingeLoss
# ------------------------------------------------------------------------------------------
def hinge_ref(x, label, norm):
    n = x.shape[0]
    x = x.reshape(n, -1)
    total = 0.0
    for i in range(n):
        for k in range(x.shape[1]):
            s = -1.0 if k == int(label[i]) else 1.0
            m = max(0.0, 1 + s * x[i, k])
            total += m if norm == "L1" else m * m
    return total / n


@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge_forward_and_gradient(norm):
    x = RNG.standard_normal((4, 3, 1, 1)) * 2
    label = labels(4, 3)
    x = np.where(np.abs(np.abs(x) - 1) < 0.05, x * 1.2, x)  # away from the hinge kink
    value, layer, bottom, top = loss_of(
        f'type: "HingeLoss" hinge_loss_param {{ norm: {norm} }}', [x, label])
    assert value == pytest.approx(hinge_ref(x, label, norm), rel=1e-12)
    check_gradient(layer, bottom, top, check_bottom=[0])


def test_hinge_needs_one_label_per_item():
    with pytest.raises(LayerError, match=r"HingeLoss layer 'under_test': needs one label"):
        build_layer('type: "HingeLoss"', [np.ones((2, 3)), np.zeros((2, 2))])


# ------------------------------------------------------------------------------------------
# InfogainLoss
# ------------------------------------------------------------------------------------------
def infogain_ref(x, label, h, axis=1, ignore=None, mode="VALID"):
    x, outer, inner = outer_channels_inner(x, axis)
    lab = label.reshape(outer, inner)
    loss, count = 0.0, 0
    for i in range(outer):
        for j in range(inner):
            k = int(lab[i, j])
            if ignore is not None and k == ignore:
                continue
            z = np.exp(x[i, :, j] - x[i, :, j].max())
            p = z / z.sum()
            loss -= (h[k] * np.log(np.maximum(p, 1e-20))).sum()
            count += 1
    return loss / normalize_ref(mode, outer, inner, count)


def write_matrix(path, h):
    bp = caffe_pb2.BlobProto()
    bp.shape.dim.extend([1, 1] + list(h.shape))
    bp.data.extend(h.ravel().tolist())
    path.write_bytes(bp.SerializeToString())
    return h.astype(np.float32).astype(np.float64)


def test_infogain_matrix_as_third_bottom():
    x = RNG.standard_normal((3, 4))
    label = labels(3, 4)
    h = RNG.uniform(0, 1, (4, 4))
    value, layer, bottom, top = loss_of('type: "InfogainLoss"', [x, label, h])
    assert value == pytest.approx(infogain_ref(x, label, h), rel=1e-12)
    assert not layer.allow_force_backward(2)
    check_gradient(layer, bottom, top, check_bottom=[0])
    with pytest.raises(LayerError, match=r"cannot backpropagate to infogain matrix inputs"):
        layer.backward(top, [True, False, True], bottom)


def test_infogain_identity_matrix_is_softmax_loss():
    x = RNG.standard_normal((3, 5, 2))
    label = labels((3, 2), 5)
    a, _, _, _ = loss_of('type: "InfogainLoss"', [x, label, np.eye(5)])
    b, _, _, _ = loss_of('type: "SoftmaxWithLoss"', [x, label])
    assert a == pytest.approx(b, rel=1e-12)


@pytest.mark.parametrize("mode", ["FULL", "VALID", "BATCH_SIZE", "NONE"])
def test_infogain_from_file_with_axis_and_ignore_label(tmp_path, mode):
    x = RNG.standard_normal((2, 2, 3))
    label = labels((2, 2), 3)
    label[1, 0] = 9
    h = write_matrix(tmp_path / "H.binaryproto", RNG.uniform(0, 1, (3, 3)))
    text = (f'type: "InfogainLoss" infogain_loss_param {{ source: "{tmp_path}/H.binaryproto" '
            f'axis: -1 }} loss_param {{ ignore_label: 9 normalization: {mode} }}')
    value, layer, bottom, top = loss_of(text, [x, label], num_tops=2)
    assert value == pytest.approx(infogain_ref(x, label, h, axis=2, ignore=9, mode=mode),
                                  rel=1e-12)
    assert top[1].shape == x.shape
    np.testing.assert_allclose(top[1].data.sum(axis=2), 1.0)
    check_gradient(layer, bottom, top, check_bottom=[0], top_weights=[0])
    np.testing.assert_array_equal(grads(layer, bottom, top)[0][1, 0], 0)


@pytest.mark.parametrize("text,message", [
    ('type: "InfogainLoss"', r"needs the infogain matrix: set infogain_loss_param.source"),
    ('type: "InfogainLoss" infogain_loss_param { source: "/nonexistent/H.binaryproto" }',
     r"cannot read infogain matrix source '/nonexistent/H.binaryproto'"),
    ('type: "InfogainLoss" loss_param { normalize: true }', r"loss_param.normalize is deprecated"),
])
def test_infogain_setup_errors(text, message):
    with pytest.raises(LayerError, match=rf"InfogainLoss layer 'under_test': {message}"):
        build_layer(text, [np.ones((2, 3)), np.zeros(2)])


def test_infogain_matrix_of_the_wrong_size(tmp_path):
    write_matrix(tmp_path / "H.binaryproto", np.ones((2, 2)))
    text = f'type: "InfogainLoss" infogain_loss_param {{ source: "{tmp_path}/H.binaryproto" }}'
    with pytest.raises(LayerError, match=r"holds 4 values but must be 3x3"):
        build_layer(text, [np.ones((2, 3)), np.zeros(2)])
    with pytest.raises(LayerError, match=r"\(bottom\[2\]\) holds 4 values but must be 3x3"):
        build_layer('type: "InfogainLoss"', [np.ones((2, 3)), np.zeros(2), np.ones((2, 2))])


def test_infogain_garbage_file(tmp_path):
    (tmp_path / "H.binaryproto").write_bytes(b"\xff\xff\xff")
    text = f'type: "InfogainLoss" infogain_loss_param {{ source: "{tmp_path}/H.binaryproto" }}'
    with pytest.raises(LayerError, match=r"not a valid BlobProto"):
        build_layer(text, [np.ones((2, 3)), np.zeros(2)])


# ------------------------------------------------------------------------------------------
# MultinomialLogisticLoss
# ------------------------------------------------------------------------------------------
def test_multinomial_logistic_forward_and_gradient():
    p = RNG.uniform(0.05, 1, (4, 3, 1, 1))
    label = labels(4, 3)
    value, layer, bottom, top = loss_of('type: "MultinomialLogisticLoss"', [p, label])
    ref = -sum(np.log(p.reshape(4, 3)[i, int(label[i])]) for i in range(4)) / 4
    assert value == pytest.approx(ref, rel=1e-13)
    check_gradient(layer, bottom, top, check_bottom=[0])


def test_multinomial_logistic_floors_at_1e_20():
    p = np.array([[0.0, 1.0]])
    value, layer, bottom, top = loss_of('type: "MultinomialLogisticLoss"', [p, np.zeros(1)])
    assert value == pytest.approx(-np.log(1e-20))
    np.testing.assert_allclose(grads(layer, bottom, top)[0], [[-1e20, 0]])


def test_multinomial_logistic_needs_one_label_per_item():
    with pytest.raises(LayerError, match=r"MultinomialLogisticLoss layer 'under_test': needs "
                                         r"one label per item"):
        build_layer('type: "MultinomialLogisticLoss"', [np.ones((2, 3)), np.zeros((2, 3))])


# ------------------------------------------------------------------------------------------
# ContrastiveLoss
# ------------------------------------------------------------------------------------------
def contrastive_ref(a, b, y, margin=1.0, legacy=False):
    n = a.shape[0]
    total = 0.0
    for i in range(n):
        d2 = ((a[i] - b[i]) ** 2).sum()
        if int(y[i]):
            total += d2
        elif legacy:
            total += max(margin - d2, 0.0)
        else:
            total += max(margin - np.sqrt(d2), 0.0) ** 2
    return total / n / 2


def contrastive_bottoms():
    a = RNG.standard_normal((6, 3)) * 0.5
    b = RNG.standard_normal((6, 3, 1, 1)) * 0.5
    y = np.array([1, 0, 0, 1, 0, 0], float)
    return a, b, y


@pytest.mark.parametrize("legacy", [False, True])
def test_contrastive_forward(legacy):
    a, b, y = contrastive_bottoms()
    text = (f'type: "ContrastiveLoss" contrastive_loss_param {{ margin: 2 '
            f'legacy_version: {str(legacy).lower()} }}')
    value, _, _, _ = loss_of(text, [a, b, y])
    assert value == pytest.approx(contrastive_ref(a, b.reshape(6, 3), y, 2.0, legacy),
                                  rel=1e-13)


def test_contrastive_legacy_gradient():
    a, b, y = contrastive_bottoms()
    layer, bottom, top = build_layer(
        'type: "ContrastiveLoss" contrastive_loss_param { margin: 2 legacy_version: true }',
        [a, b, y])
    assert not layer.allow_force_backward(2)
    check_gradient(layer, bottom, top, check_bottom=[0, 1])


def test_contrastive_gradient_has_caffes_epsilon():
    a, b, y = contrastive_bottoms()
    value, layer, bottom, top = loss_of(
        'type: "ContrastiveLoss" contrastive_loss_param { margin: 2 }', [a, b, y])
    ga, gb = grads(layer, bottom, top, 0.7)[:2]
    n = 6
    expected = np.zeros((n, 3))
    for i in range(n):
        diff = a[i] - b[i].ravel()
        alpha = 0.7 / n
        if y[i]:
            expected[i] = alpha * diff
        else:
            dist = np.sqrt((diff ** 2).sum())
            mdist = 2 - dist
            expected[i] = -alpha * mdist / (dist + 1e-4) * diff if mdist > 0 else 0
    np.testing.assert_allclose(ga, expected, rtol=1e-13)
    np.testing.assert_allclose(gb.reshape(n, 3), -expected, rtol=1e-13)
    check_gradient(layer, bottom, top, check_bottom=[0, 1], rtol=1e-3)


@pytest.mark.parametrize("shapes,message", [
    (((3, 4), (3, 5), (3,)), r"bottom\[0\] and bottom\[1\] must both have shape"),
    (((3, 4, 2), (3, 4, 2), (3,)), r"bottom\[0\] and bottom\[1\] must both have shape"),
    (((3, 4), (3, 4), (3, 2)), r"bottom\[2\] must hold one similarity label per pair"),
])
def test_contrastive_shape_errors(shapes, message):
    with pytest.raises(LayerError, match=rf"ContrastiveLoss layer 'under_test': {message}"):
        build_layer('type: "ContrastiveLoss"', [np.ones(s) for s in shapes])
