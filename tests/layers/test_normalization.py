"""BatchNorm and MVN: forward and statistics updates against plain float64 references,
gradients in every mode, in-place use, defaults, bad parameters, and real Caffe's outputs."""
import numpy as np
import pytest

from cct.errors import LayerError
from cct.proto import caffe_pb2
from tests.caffe_layer_fixture import assert_matches_caffe, run_fixture_layer
from tests.gradient_check import build_layer, check_gradient, run_forward

RNG = np.random.default_rng(4)


def f32(v):
    """A prototxt float as the layer sees it (the field is a float32)."""
    return float(np.float32(v))


def bn_body(**fields):
    params = " ".join(f"{k}: {v}" for k, v in fields.items())
    return f'type: "BatchNorm" batch_norm_param {{ {params} }}'


def set_stats(layer, mean, var, factor):
    layer.blobs[0].data[...] = mean
    layer.blobs[1].data[...] = var
    layer.blobs[2].data[...] = factor


# ---- BatchNorm -------------------------------------------------------------------------------
def test_batch_statistics_forward_and_update():
    x = RNG.standard_normal((3, 4, 2, 5)) * 2 + 1
    layer, bottom, top = build_layer(bn_body(use_global_stats="false",
                                             moving_average_fraction=0.9, eps=1e-3), [x])
    mean0, var0 = RNG.standard_normal(4), RNG.uniform(0.5, 1.5, 4)
    set_stats(layer, mean0, var0, 0.7)
    run_forward(layer, bottom, top)
    mean = np.array([x[:, c].mean() for c in range(4)])
    var = np.array([((x[:, c] - mean[c]) ** 2).mean() for c in range(4)])  # biased
    ref = (x - mean[None, :, None, None]) / np.sqrt(var + f32(1e-3))[None, :, None, None]
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-12, atol=1e-12)
    maf, m = f32(0.9), 3 * 2 * 5
    np.testing.assert_allclose(layer.blobs[2].data, [0.7 * maf + 1])
    np.testing.assert_allclose(layer.blobs[0].data, mean0 * maf + mean)
    np.testing.assert_allclose(layer.blobs[1].data, var0 * maf + var * m / (m - 1))


def test_global_statistics_forward():
    x = RNG.standard_normal((2, 3, 4))
    layer, bottom, top = build_layer(bn_body(use_global_stats="true"), [x])
    mean, var = RNG.standard_normal(3), RNG.uniform(0.5, 1.5, 3)
    set_stats(layer, mean, var, 0.5)
    run_forward(layer, bottom, top)
    ref = (x - mean[:, None] / 0.5) / np.sqrt(var[:, None] / 0.5 + f32(1e-5))
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-12)
    np.testing.assert_array_equal(layer.blobs[0].data, mean)  # not updated


def test_global_statistics_with_zero_factor_use_zero_mean_and_variance():
    x = RNG.standard_normal((2, 3, 2, 2))
    layer, bottom, top = build_layer(bn_body(use_global_stats="true"), [x])
    set_stats(layer, 5.0, 5.0, 0.0)
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, x / np.sqrt(f32(1e-5)))


@pytest.mark.parametrize("phase,expect_global", [(caffe_pb2.TRAIN, False),
                                                 (caffe_pb2.TEST, True)])
def test_use_global_stats_defaults_to_the_phase(phase, expect_global):
    layer, _, _ = build_layer('type: "BatchNorm"', [np.zeros((2, 3))], phase=phase)
    assert layer.use_global_stats is expect_global


def test_defaults_and_param_blobs():
    layer, _, top = build_layer('type: "BatchNorm"', [np.zeros((2, 3, 2, 2))])
    assert layer.maf == f32(0.999) and layer.eps == f32(1e-5)
    assert [b.shape for b in layer.blobs] == [(3,), (3,), (1,)]
    assert all(np.all(b.data == 0) for b in layer.blobs)
    assert [p.lr_mult for p in layer.layer_param.param] == [0, 0, 0]
    assert top[0].shape == (2, 3, 2, 2)


def test_running_average_accumulates_over_calls():
    x1, x2 = RNG.standard_normal((4, 2, 3)), RNG.standard_normal((4, 2, 3))
    layer, bottom, top = build_layer(bn_body(use_global_stats="false"), [x1],
                                     phase=caffe_pb2.TRAIN)
    layer.forward(bottom, top)
    bottom[0].data[...] = x2
    layer.forward(bottom, top)
    maf = f32(0.999)  # a float field, as in Caffe
    np.testing.assert_allclose(layer.blobs[2].data, [maf + 1])
    np.testing.assert_allclose(layer.blobs[0].data,
                               x1.mean(axis=(0, 2)) * maf + x2.mean(axis=(0, 2)))
    # after the update, global mode normalises with mean / factor and variance / factor
    layer.use_global_stats = True
    layer.forward(bottom, top)
    mean = layer.blobs[0].data / (maf + 1)
    var = layer.blobs[1].data / (maf + 1)
    np.testing.assert_allclose(top[0].data, (x2 - mean[:, None]) / np.sqrt(var[:, None]
                                                                           + f32(1e-5)))


@pytest.mark.parametrize("use_global", ["true", "false"])
@pytest.mark.parametrize("shape", [(3, 2, 2, 3), (4, 3)])
def test_batch_norm_gradient(use_global, shape):
    x = RNG.standard_normal(shape)
    layer, bottom, top = build_layer(bn_body(use_global_stats=use_global, eps=1e-3), [x])
    set_stats(layer, RNG.standard_normal(shape[1]), RNG.uniform(0.5, 1.5, shape[1]), 0.8)
    saved = [b.data.copy() for b in layer.blobs]

    if use_global == "false":
        # the forward pass updates the stored statistics; restore them before every pass so the
        # objective stays a function of the bottom alone
        forward = layer.forward

        def restoring_forward(bottom_, top_):
            for b, s in zip(layer.blobs, saved):
                b.data[...] = s
            forward(bottom_, top_)
        layer.forward = restoring_forward
    check_gradient(layer, bottom, top, check_params=False)
    assert all(np.all(b.diff == 0) for b in layer.blobs)


@pytest.mark.parametrize("use_global", ["true", "false"])
def test_batch_norm_in_place(use_global):
    x = RNG.standard_normal((3, 2, 4))
    dy = RNG.standard_normal(x.shape)
    body = bn_body(use_global_stats=use_global)
    results = []
    for in_place in (False, True):
        layer, bottom, top = build_layer(body, [x])
        set_stats(layer, [0.1, -0.2], [1.0, 2.0], 1.0)
        if in_place:
            top = bottom
            layer.reshape(bottom, top)
        layer.forward(bottom, top)
        y = top[0].data.copy()
        top[0].diff[...] = dy
        layer.backward(top, [True], bottom)
        results.append((y, bottom[0].diff.copy()))
    np.testing.assert_allclose(results[1][0], results[0][0])
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-12)


def test_batch_norm_float32():
    x = RNG.standard_normal((4, 3, 2, 2)).astype(np.float32)
    layer, bottom, top = build_layer(bn_body(use_global_stats="false"), [x], dtype=np.float32)
    run_forward(layer, bottom, top)
    assert top[0].data.dtype == np.float32 and layer.blobs[0].data.dtype == np.float32
    xd = x.astype(np.float64)
    mean, var = xd.mean(axis=(0, 2, 3)), xd.var(axis=(0, 2, 3))
    ref = (xd - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5)
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("body,shape,match", [
    ('type: "BatchNorm" param { lr_mult: 1 }', (2, 3), "cannot be configured"),
    ('type: "BatchNorm" param { lr_mult: 0 } param { lr_mult: 0 } param { lr_mult: 2 }',
     (2, 3), "param 2 has lr_mult 2"),
])
def test_bad_parameters_name_the_layer(body, shape, match):
    with pytest.raises(LayerError, match=match) as err:
        build_layer(body, [np.zeros(shape)])
    assert "BatchNorm layer 'under_test'" in str(err.value)


def test_explicit_zero_lr_mult_params_are_accepted():
    layer, _, _ = build_layer('type: "BatchNorm" param { lr_mult: 0 } param { lr_mult: 0 }',
                              [np.zeros((2, 3))])
    assert [p.lr_mult for p in layer.layer_param.param] == [0, 0, 0]


def test_channel_change_at_reshape_is_an_error():
    layer, bottom, top = build_layer('type: "BatchNorm"', [np.zeros((2, 3, 2))])
    bottom[0].reshape(2, 4, 2)
    with pytest.raises(LayerError, match=r"4 channels.*set up for 3"):
        layer.reshape(bottom, top)


# ---- MVN -------------------------------------------------------------------------------------
def ref_mvn(x, normalize_variance=True, across_channels=False, eps=1e-9):
    n, c = x.shape[:2]
    y = np.empty_like(x)
    for i in range(n):
        groups = [slice(None)] if across_channels else [slice(j, j + 1) for j in range(c)]
        for g in groups:
            v = x[i, g]
            d = v - v.mean()
            if normalize_variance:
                d = d / (np.sqrt((d ** 2).mean()) + eps)
            y[i, g] = d
    return y


@pytest.mark.parametrize("fields,kw", [
    ("", dict()),
    ("across_channels: true", dict(across_channels=True)),
    ("normalize_variance: false", dict(normalize_variance=False)),
    ("normalize_variance: false across_channels: true",
     dict(normalize_variance=False, across_channels=True)),
    ("eps: 0.5", dict(eps=0.5)),
])
def test_mvn_forward(fields, kw):
    x = RNG.standard_normal((2, 3, 4, 5)) * 3 + 2
    layer, bottom, top = build_layer(f'type: "MVN" mvn_param {{ {fields} }}', [x])
    run_forward(layer, bottom, top)
    if "eps" in kw:
        kw["eps"] = f32(kw["eps"])
    else:
        kw["eps"] = f32(1e-9)
    np.testing.assert_allclose(top[0].data, ref_mvn(x, **kw), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fields", ["", "across_channels: true", "normalize_variance: false"])
def test_mvn_gradient(fields):
    x = RNG.standard_normal((2, 3, 2, 3))
    layer, bottom, top = build_layer(f'type: "MVN" mvn_param {{ {fields} }}', [x])
    check_gradient(layer, bottom, top)


def test_mvn_backward_is_caffes_formula_with_eps_on_the_std():
    # With a large eps Caffe's backward is not the exact gradient; check its formula.
    x = RNG.standard_normal((2, 2, 3, 3))
    dy = RNG.standard_normal(x.shape)
    layer, bottom, top = build_layer('type: "MVN" mvn_param { eps: 0.25 }', [x])
    run_forward(layer, bottom, top)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    y = top[0].data.reshape(4, 9)
    d = dy.reshape(4, 9)
    std = x.reshape(4, 9).std(axis=1, keepdims=True)
    ref = (d - d.mean(axis=1, keepdims=True) - (d * y).mean(axis=1, keepdims=True) * y) \
        / (std + 0.25)
    np.testing.assert_allclose(bottom[0].diff, ref.reshape(x.shape), rtol=1e-12)


def test_mvn_in_place():
    x = RNG.standard_normal((2, 3, 2, 2))
    dy = RNG.standard_normal(x.shape)
    layer, bottom, top = build_layer('type: "MVN"', [x])
    run_forward(layer, bottom, top)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    layer2, blobs, _ = build_layer('type: "MVN"', [x])
    layer2.reshape(blobs, blobs)
    layer2.forward(blobs, blobs)
    np.testing.assert_allclose(blobs[0].data, top[0].data)
    blobs[0].diff[...] = dy
    layer2.backward(blobs, [True], blobs)
    np.testing.assert_allclose(blobs[0].diff, bottom[0].diff, rtol=1e-12)


def test_mvn_rejects_more_than_4_axes():
    with pytest.raises(LayerError, match="at most 4 axes") as err:
        build_layer('type: "MVN"', [np.zeros((1, 2, 2, 2, 2))])
    assert "MVN layer 'under_test'" in str(err.value)


# ---- real Caffe ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["bn_batch", "bn_global"])
def test_layer_zoo_matches_caffe(caffe_fixtures, name, dtype):
    """bn_batch updates its running statistics (compared as param data); the param diffs
    are Caffe's zeros exactly."""
    d = caffe_fixtures / "numerics"
    run = run_fixture_layer(d / "layer_zoo.TEST.npz", d / "layer_zoo.prototxt", name, dtype)
    assert_matches_caffe(run, rtol=1e-6, atol=2e-8)
