"""Convolution and Deconvolution: forward against a plain float64 reference, gradients by
finite differences, shape rules, bad parameters, and real Caffe's outputs."""
import numpy as np
import pytest

from cct import backend as backends
from cct.blob import Blob
from cct.errors import LayerError
from cct.layers import create_layer
from tests.caffe_layer_fixture import assert_matches_caffe, run_fixture_layer
from tests.gradient_check import (assert_param_diffs_accumulate, build_layer, check_gradient,
                                  make_layer_param, run_forward)

RNG = np.random.default_rng(0)


def ref_conv(x, w, b, stride=(1, 1), pad=(0, 0), dilation=(1, 1), group=1):
    """Caffe's convolution written plainly: zero-pad, then for each kernel offset add the
    strided input slice times that weight tap."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    ho = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    wo = (wd + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    xpad = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    y = np.zeros((n, o, ho, wo))
    og = o // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                patch = xpad[:, g * cg:(g + 1) * cg, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                             j * dw:j * dw + sw * (wo - 1) + 1:sw]
                y[:, g * og:(g + 1) * og] += np.einsum("ncij,oc->noij", patch,
                                                       w[g * og:(g + 1) * og, :, i, j])
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def ref_deconv(x, w, b, stride=(1, 1), pad=(0, 0), dilation=(1, 1), group=1):
    """Deconvolution as a scatter: each bottom value adds value x weight into the top window
    it would have come from."""
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    hfull = sh * (h - 1) + dh * (kh - 1) + 1
    wfull = sw * (wd - 1) + dw * (kw - 1) + 1
    y = np.zeros((n, og * group, hfull, wfull))
    cg = c // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                contrib = np.einsum("nchw,co->nohw", x[:, g * cg:(g + 1) * cg],
                                    w[g * cg:(g + 1) * cg, :, i, j])
                y[:, g * og:(g + 1) * og, i * dh:i * dh + sh * (h - 1) + 1:sh,
                  j * dw:j * dw + sw * (wd - 1) + 1:sw] += contrib
    y = y[:, :, ph:hfull - ph, pw:wfull - pw]
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def conv_body(type_="Convolution", **fields):
    params = " ".join(f"{k}: {v}" for k, v in fields.items())
    return (f'type: "{type_}" convolution_param {{ {params} '
            f'weight_filler {{ type: "gaussian" std: 0.5 }} '
            f'bias_filler {{ type: "gaussian" std: 0.5 }} }}')


CONV_CASES = [
    (dict(num_output=3, kernel_size=3), dict()),
    (dict(num_output=2, kernel_size=3, pad=1, stride=2), dict(stride=(2, 2), pad=(1, 1))),
    (dict(num_output=4, kernel_size=2, dilation=2, group=2), dict(dilation=(2, 2), group=2)),
    (dict(num_output=2, kernel_h=3, kernel_w=2, stride_h=2, stride_w=1, pad_h=1, pad_w=0),
     dict(stride=(2, 1), pad=(1, 0))),
]


@pytest.mark.parametrize("fields,geom", CONV_CASES)
def test_convolution_forward_matches_reference(fields, geom):
    x = RNG.standard_normal((2, 4, 7, 6))
    layer, bottom, top = build_layer(conv_body(**fields), [x])
    run_forward(layer, bottom, top)
    w, b = layer.blobs[0].data, layer.blobs[1].data
    np.testing.assert_allclose(top[0].data, ref_conv(x, w, b, **geom), rtol=1e-12, atol=1e-12)


def test_repeated_fields_give_one_value_per_axis():
    x = RNG.standard_normal((1, 2, 8, 7))
    body = ('type: "Convolution" convolution_param { num_output: 2 kernel_size: 3 '
            'kernel_size: 2 stride: 2 stride: 1 pad: 1 pad: 0 dilation: 1 dilation: 2 '
            'weight_filler { type: "gaussian" } }')
    layer, bottom, top = build_layer(body, [x])
    run_forward(layer, bottom, top)
    assert layer.blobs[0].shape == (2, 2, 3, 2)
    ref = ref_conv(x, layer.blobs[0].data, layer.blobs[1].data, stride=(2, 1), pad=(1, 0),
                   dilation=(1, 2))
    assert top[0].shape == ref.shape
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-12, atol=1e-12)


def test_convolution_float32():
    x = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
    layer, bottom, top = build_layer(conv_body(num_output=2, kernel_size=3, pad=1), [x],
                                     dtype=np.float32)
    run_forward(layer, bottom, top)
    assert top[0].data.dtype == np.float32 and layer.blobs[0].data.dtype == np.float32
    ref = ref_conv(x.astype(np.float64), layer.blobs[0].data.astype(np.float64),
                   layer.blobs[1].data.astype(np.float64), pad=(1, 1))
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fields", [
    dict(num_output=2, kernel_size=3, pad=1, stride=2),
    dict(num_output=4, kernel_size=2, dilation=2, group=2),
])
def test_convolution_gradient(fields):
    x = RNG.standard_normal((2, 4, 5, 5))
    layer, bottom, top = build_layer(conv_body(**fields), [x])
    check_gradient(layer, bottom, top)


def test_convolution_two_bottoms_share_weights():
    x0, x1 = RNG.standard_normal((2, 2, 4, 4)), RNG.standard_normal((2, 2, 4, 4))
    layer, bottom, top = build_layer(conv_body(num_output=2, kernel_size=3, pad=1),
                                     [x0, x1], num_tops=2)
    run_forward(layer, bottom, top)
    w, b = layer.blobs[0].data, layer.blobs[1].data
    np.testing.assert_allclose(top[1].data, ref_conv(x1, w, b, pad=(1, 1)), atol=1e-12)
    check_gradient(layer, bottom, top)


def test_convolution_axis_2_treats_leading_axes_as_batch():
    x = RNG.standard_normal((2, 3, 2, 5, 5))
    body = conv_body(num_output=3, kernel_size=3, axis=2)
    layer, bottom, top = build_layer(body, [x])
    run_forward(layer, bottom, top)
    assert top[0].shape == (2, 3, 3, 3, 3)
    ref = ref_conv(x.reshape(6, 2, 5, 5), layer.blobs[0].data, layer.blobs[1].data)
    np.testing.assert_allclose(top[0].data, ref.reshape(2, 3, 3, 3, 3), atol=1e-12)
    check_gradient(layer, bottom, top)


def test_param_shapes_and_bias_term():
    x = np.zeros((1, 6, 5, 5))
    conv, _, _ = build_layer(conv_body(num_output=4, kernel_size=3, group=2), [x])
    assert [b.shape for b in conv.blobs] == [(4, 3, 3, 3), (4,)]
    deconv, _, _ = build_layer(conv_body("Deconvolution", num_output=4, kernel_size=3,
                                         group=2), [x])
    assert [b.shape for b in deconv.blobs] == [(6, 2, 3, 3), (4,)]
    nobias, _, _ = build_layer(conv_body(num_output=4, kernel_size=3, bias_term="false"), [x])
    assert [b.shape for b in nobias.blobs] == [(4, 6, 3, 3)]


def test_fillers_and_default_constant_zero():
    x = np.zeros((1, 2, 4, 4))
    body = ('type: "Convolution" convolution_param { num_output: 3 kernel_size: 2 '
            'bias_filler { type: "constant" value: 0.25 } }')
    layer, _, _ = build_layer(body, [x])
    assert np.all(layer.blobs[0].data == 0)
    assert np.all(layer.blobs[1].data == 0.25)


def test_param_diffs_accumulate():
    x = RNG.standard_normal((2, 2, 4, 4))
    layer, bottom, top = build_layer(conv_body(num_output=2, kernel_size=3), [x])
    assert_param_diffs_accumulate(layer, bottom, top)


@pytest.mark.parametrize("type_", ["Convolution", "Deconvolution"])
def test_pointwise_param_diffs_accumulate(type_):
    """1x1 convolutions with stride 1 and no pad may run without lowering (csrc/conv.cpp's
    pointwise layout); their gradients and accumulation hold either way."""
    x = RNG.standard_normal((3, 4, 3, 5))
    layer, bottom, top = build_layer(conv_body(type_, num_output=6, kernel_size=1, group=2),
                                     [x])
    check_gradient(layer, bottom, top)
    for b in layer.blobs:
        b.diff[...] = 0
    assert_param_diffs_accumulate(layer, bottom, top)


def test_in_place_is_refused():
    b = Blob((1, 2, 5, 5), np.float64)
    layer = create_layer(make_layer_param(conv_body(num_output=2, kernel_size=1)),
                         backends.get("cpu"), np.float64)
    with pytest.raises(LayerError, match="cannot run in place") as err:
        layer.setup([b], [b])
    assert "layer 'under_test'" in str(err.value)


def test_no_bottom_diff_without_propagate_down():
    x = RNG.standard_normal((1, 2, 4, 4))
    layer, bottom, top = build_layer(conv_body(num_output=2, kernel_size=3), [x])
    run_forward(layer, bottom, top)
    bottom[0].diff[...] = 7.0
    top[0].diff[...] = 1.0
    layer.backward(top, [False], bottom)
    assert np.all(bottom[0].diff == 7.0)
    assert np.any(layer.blobs[0].diff != 0)


# ---- Deconvolution ---------------------------------------------------------------------------
DECONV_CASES = [
    (dict(num_output=3, kernel_size=3), dict()),
    (dict(num_output=2, kernel_size=4, stride=2, pad=1), dict(stride=(2, 2), pad=(1, 1))),
    (dict(num_output=4, kernel_size=3, stride=2, dilation=2, group=2, pad=1),
     dict(stride=(2, 2), pad=(1, 1), dilation=(2, 2), group=2)),
]


@pytest.mark.parametrize("fields,geom", DECONV_CASES)
def test_deconvolution_forward_matches_reference(fields, geom):
    x = RNG.standard_normal((2, 4, 4, 3))
    layer, bottom, top = build_layer(conv_body("Deconvolution", **fields), [x])
    run_forward(layer, bottom, top)
    ref = ref_deconv(x, layer.blobs[0].data, layer.blobs[1].data, **geom)
    assert top[0].shape == ref.shape
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-12, atol=1e-12)


def test_deconvolution_output_size():
    x = np.zeros((1, 2, 5, 5))
    _, _, top = build_layer(conv_body("Deconvolution", num_output=3, kernel_size=4, stride=2,
                                      pad=1), [x])
    assert top[0].shape == (1, 3, 10, 10)  # 2 (5 - 1) + 4 - 2


@pytest.mark.parametrize("fields,geom", DECONV_CASES[1:])
def test_deconvolution_gradient(fields, geom):
    x = RNG.standard_normal((2, 4, 3, 3))
    layer, bottom, top = build_layer(conv_body("Deconvolution", **fields), [x])
    check_gradient(layer, bottom, top)


# ---- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("body,shape,match", [
    (conv_body(num_output=4, kernel_size=3, group=2), (1, 3, 5, 5), "not divisible by group"),
    (conv_body(num_output=3, kernel_size=3, group=2), (1, 4, 5, 5), "num_output 3 is not"),
    (conv_body(num_output=2, kernel_size=3), (1, 2, 4, 4, 4), "only 2-D convolution"),
    (conv_body(num_output=2, kernel_size=3), (2, 5), "only 2-D convolution"),
    (conv_body(num_output=2, kernel_size=5), (1, 1, 3, 3), "empty top"),
    (conv_body(num_output=2, kernel_size=3, stride=4), (1, 1, 2, 9), "height 2"),
    (conv_body(num_output=2, kernel_size=3, kernel_h=3, kernel_w=3), (1, 1, 5, 5),
     "not both"),
    ('type: "Convolution" convolution_param { num_output: 2 kernel_size: 1 kernel_size: 2 '
     'kernel_size: 3 }', (1, 1, 5, 5), "specified 3 times"),
    ('type: "Convolution" convolution_param { num_output: 2 }', (1, 1, 5, 5),
     "specified 0 times"),
    ('type: "Convolution" convolution_param { num_output: 2 kernel_h: 3 }', (1, 1, 5, 5),
     "nonzero"),
    ('type: "Convolution" convolution_param { kernel_size: 3 }', (1, 1, 5, 5), "num_output"),
    (conv_body(num_output=2, kernel_size=3, axis=4), (1, 1, 5, 5), "axis 4"),
    (conv_body("Deconvolution", num_output=2, kernel_size=2, pad=2), (1, 1, 1, 1),
     "empty top"),
])
def test_bad_parameters_name_the_layer(body, shape, match):
    with pytest.raises(LayerError, match=match) as err:
        build_layer(body, [np.zeros(shape)])
    assert "layer 'under_test'" in str(err.value)


def test_channel_change_at_reshape_is_an_error():
    layer, bottom, top = build_layer(conv_body(num_output=2, kernel_size=3),
                                     [np.zeros((1, 2, 5, 5))])
    bottom[0].reshape(1, 3, 5, 5)
    with pytest.raises(LayerError, match=r"3 channels.*made for 2"):
        layer.reshape(bottom, top)


def test_prototxt_blobs_of_the_wrong_shape_are_rejected():
    body = (conv_body(num_output=2, kernel_size=3)
            + ' blobs { shape { dim: 2 dim: 1 dim: 2 dim: 2 } ' + 'data: 0 ' * 8 + '}'
            + ' blobs { shape { dim: 2 } data: 0 data: 0 }')
    with pytest.raises(LayerError, match="incorrect weight shape"):
        build_layer(body, [np.zeros((1, 1, 5, 5))])


# ---- real Caffe ------------------------------------------------------------------------------
# Caffe computes a convolution one way (im2col and a GEMM); cct's layouts round differently.
# Lowered and direct agree with Caffe to float32 rounding of the sums; Winograd's transforms add
# an error that grows with the tile (6x6 tiles: about 2e-6 of the largest output on random
# data; 1.2e-8 against the 9e-9 that 2e-6 allows was seen on CIFAR10-quick's conv3 backward
# data). Each layout is checked with its own bound (a layout that does not apply runs lowered).
# The phase layouts (6-8: a strided undilated layer as a stride-1 one over its bottom's phase
# planes) apply here to the zoo's 4x4 stride-2 deconvolution (a 2x2 phase kernel: direct);
# 9 is the direct layout's 16-pixel tile (AVX-512; direct's bits).
LAYOUT_ATOL = {1: 2e-6, 3: 2e-6, 4: 1e-5, 5: 1e-5, 6: 2e-6, 7: 1e-5, 8: 1e-5, 9: 2e-6}


@pytest.fixture(params=list(LAYOUT_ATOL), ids=["lowered", "direct", "winograd", "winograd4x4",
                                               "phase-direct", "phase-winograd",
                                               "phase-winograd4x4", "direct16"])
def layout(request):
    from cct import _C
    _C.set_conv_layout(request.param)
    yield request.param
    _C.set_conv_layout(0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["conv0", "conv1", "deconv"])
def test_layer_zoo_matches_caffe(caffe_fixtures, name, dtype, layout):
    d = caffe_fixtures / "numerics"
    run = run_fixture_layer(d / "layer_zoo.TEST.npz", d / "layer_zoo.prototxt", name, dtype)
    assert_matches_caffe(run, atol=LAYOUT_ATOL[layout])


def test_deconv_in_phase_form_matches_caffe(caffe_fixtures):
    """The zoo's 4x4 stride-2 pad-1 Deconvolution under the forced phase-direct layout: all
    three of its kernels run in phase form (the plan table says so) and match Caffe within
    the direct layout's bound."""
    from cct import _C
    if not _C.cpu_has_direct_conv():
        pytest.skip("the direct layout needs a CPU with AVX2 and FMA")
    from cct.backend import cpu
    d = caffe_fixtures / "numerics"
    _C.clear_plans()
    _C.set_conv_layout(6)
    threads = cpu.get_num_threads()
    cpu.set_num_threads(2)  # two candidate plans (partitions), so the table records the choice
    try:
        run = run_fixture_layer(d / "layer_zoo.TEST.npz", d / "layer_zoo.prototxt", "deconv",
                                np.float32)
        layouts = {kernel: name for kernel, geom, _, name in _C.partition_choices()
                   if geom[7:11] == [4, 4, 2, 2]}
    finally:
        _C.set_conv_layout(0)
        cpu.set_num_threads(threads)
    assert layouts == {0: "phase-direct", 1: "phase-direct", 2: "phase-direct"}
    assert_matches_caffe(run, atol=LAYOUT_ATOL[6])


@pytest.mark.parametrize("name,propagate", [("conv1", False), ("conv2", True), ("conv3", True)])
def test_cifar10_quick_matches_caffe(caffe_fixtures, name, propagate, layout):
    """conv1 reads the data, which needs no gradient; in-place ReLUs rewrite conv2's bottom and
    the tops of conv2 and conv3."""
    d = caffe_fixtures / "numerics"
    run = run_fixture_layer(d / "cifar10_quick_train_test_b4.TRAIN.npz",
                            d / "cifar10_quick_train_test_b4.prototxt", name,
                            propagate_down=propagate)
    assert_matches_caffe(run, atol=LAYOUT_ATOL[layout])


# ---- convolution_param { engine: CAFFE } -------------------------------------------------------
def caffe_engine(lp) -> None:
    lp.convolution_param.engine = lp.convolution_param.CAFFE


@pytest.mark.parametrize("name", ["conv2", "conv3"])
def test_caffe_engine_matches_caffe_within_the_lowered_bound(caffe_fixtures, name, layout):
    """engine: CAFFE holds CIFAR10-quick's 5x5 layers (where direct and Winograd F(2x2, 5x5)
    apply) to Caffe's lowered arithmetic whichever layout is forced: the lowered bound holds."""
    d = caffe_fixtures / "numerics"
    run = run_fixture_layer(d / "cifar10_quick_train_test_b4.TRAIN.npz",
                            d / "cifar10_quick_train_test_b4.prototxt", name, edit=caffe_engine)
    assert run.layer.engine == "CAFFE"
    assert_matches_caffe(run, atol=LAYOUT_ATOL[1])

