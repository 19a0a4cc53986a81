"""Im2col: forward against Caffe's im2col_cpu loops written plainly, Caffe's own test cases,
col2im backward against the loops' transpose, gradient checks, agreement with Convolution
(weights times columns), bad parameters, and the numpy (device) backend."""
import numpy as np
import pytest

from cct.errors import LayerError
from tests.gradient_check import (build_layer, check_gradient, forward_backward_on,
                                  run_forward)

RNG = np.random.default_rng(11)


def ref_im2col(x, kernel, stride, pad, dilation):
    """Caffe's im2col_cpu per image, as loops over (channel, kernel row, kernel column)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, pad, dilation
    ho = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    wo = (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    out = np.zeros((n, c * kh * kw, ho, wo))
    for ch in range(c):
        for i in range(kh):
            for j in range(kw):
                row = (ch * kh + i) * kw + j
                for y in range(ho):
                    for z in range(wo):
                        hy, wz = y * sh - ph + i * dh, z * sw - pw + j * dw
                        if 0 <= hy < h and 0 <= wz < w:
                            out[:, row, y, z] = x[:, ch, hy, wz]
    return out


def ref_col2im(cols, x_shape, kernel, stride, pad, dilation):
    n, c, h, w = x_shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, pad, dilation
    ho, wo = cols.shape[2:]
    out = np.zeros(x_shape)
    for ch in range(c):
        for i in range(kh):
            for j in range(kw):
                row = (ch * kh + i) * kw + j
                for y in range(ho):
                    for z in range(wo):
                        hy, wz = y * sh - ph + i * dh, z * sw - pw + j * dw
                        if 0 <= hy < h and 0 <= wz < w:
                            out[:, ch, hy, wz] += cols[:, row, y, z]
    return out


def body(**fields):
    params = " ".join(f"{k}: {v}" for k, v in fields.items())
    return f'type: "Im2col" convolution_param {{ {params} }}'


CASES = [
    (dict(kernel_size=3, stride=2), ((3, 3), (2, 2), (0, 0), (1, 1))),
    (dict(kernel_size=3, stride=2, dilation=3), ((3, 3), (2, 2), (0, 0), (3, 3))),
    (dict(kernel_size=3, pad=1), ((3, 3), (1, 1), (1, 1), (1, 1))),
    (dict(kernel_h=5, kernel_w=3, stride=2), ((5, 3), (2, 2), (0, 0), (1, 1))),
    (dict(kernel_h=2, kernel_w=3, stride_h=1, stride_w=2, pad_h=2, pad_w=1),
     ((2, 3), (1, 2), (2, 1), (1, 1))),
    (dict(kernel_size=2, force_nd_im2col="true"), ((2, 2), (1, 1), (0, 0), (1, 1))),
]


@pytest.mark.parametrize("fields,geom", CASES)
def test_forward_and_backward_match_caffes_loops(fields, geom):
    x = RNG.standard_normal((2, 3, 10, 11))
    layer, bottom, top = build_layer(body(**fields), [x])
    run_forward(layer, bottom, top)
    ref = ref_im2col(x, *geom)
    assert top[0].shape == ref.shape
    np.testing.assert_array_equal(top[0].data, ref)
    dy = RNG.standard_normal(ref.shape)
    top[0].diff[...] = dy
    bottom[0].diff[...] = 9.0
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, ref_col2im(dy, x.shape, *geom), rtol=1e-14,
                               atol=1e-14)


def test_caffes_setup_shapes():
    # test_im2col_layer.cpp: a 2 x 3 x 6 x 5 bottom, kernel 3, stride 2 -> 2 x 27 x 2 x 2;
    # a 2 x 3 x 10 x 11 bottom with dilation 3 -> 2 x 27 x 2 x 3; kernel 5 x 3 -> 2 x 45 x ...
    for shape, fields, want in [
            ((2, 3, 6, 5), dict(kernel_size=3, stride=2), (2, 27, 2, 2)),
            ((2, 3, 10, 11), dict(kernel_size=3, stride=2, dilation=3), (2, 27, 2, 3)),
            ((2, 3, 6, 5), dict(kernel_h=5, kernel_w=3, stride=2), (2, 45, 1, 2))]:
        _, _, top = build_layer(body(**fields), [np.zeros(shape)])
        assert top[0].shape == want


def test_channel_axis_and_batch_axes():
    x = RNG.standard_normal((2, 2, 3, 5, 4))
    layer, bottom, top = build_layer(body(kernel_size=2, axis=2), [x])
    run_forward(layer, bottom, top)
    assert top[0].shape == (2, 2, 12, 4, 3)
    ref = ref_im2col(x.reshape(4, 3, 5, 4), (2, 2), (1, 1), (0, 0), (1, 1))
    np.testing.assert_array_equal(top[0].data, ref.reshape(2, 2, 12, 4, 3))


@pytest.mark.parametrize("fields", [dict(kernel_size=3, stride=2, pad=1),
                                    dict(kernel_size=2, dilation=2)])
def test_gradient(fields):
    layer, bottom, top = build_layer(body(**fields), [RNG.standard_normal((2, 2, 5, 4))])
    check_gradient(layer, bottom, top)


def test_columns_times_weights_is_the_convolution():
    x = RNG.standard_normal((2, 3, 7, 6))
    fields = dict(kernel_size=3, stride=2, pad=1)
    layer, bottom, top = build_layer(body(**fields), [x])
    run_forward(layer, bottom, top)
    conv, cb, ct = build_layer(
        'type: "Convolution" convolution_param { num_output: 4 kernel_size: 3 stride: 2 pad: 1 '
        'bias_term: false weight_filler { type: "gaussian" } }', [x])
    run_forward(conv, cb, ct)
    w = conv.blobs[0].data.reshape(4, -1)
    cols = top[0].data
    np.testing.assert_allclose(np.einsum("ok,nkhw->nohw", w, cols), ct[0].data, rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("text,shape,match", [
    (body(stride=2), (1, 1, 4, 4), r"kernel_size must be specified once, or once per spatial "
                                   r"dimension \(kernel_size specified 0 times"),
    (body(kernel_size=0), (1, 1, 4, 4), r"filter dimensions must be nonzero"),
    (body(kernel_size=2, kernel_h=2, kernel_w=2), (1, 1, 4, 4),
     r"either kernel_size or kernel_h/kernel_w should be specified; not both"),
    (body(kernel_size=2, stride=0), (1, 1, 4, 4), r"stride dimensions must be nonzero"),
    (body(kernel_size=2, dilation=0), (1, 1, 4, 4), r"dilation 0 x 0 must be nonzero"),
    (body(kernel_size=5), (1, 1, 4, 4), r"kernel 5 .* on a bottom of height 4 .* gives an "
                                         r"empty top; lower kernel_size/dilation or add pad"),
    (body(kernel_size=2), (1, 1, 4, 4, 4), r"only 2-D im2col is supported: the bottom of "
                                            r"shape \(1, 1, 4, 4, 4\) has 3 spatial axes"),
    (body(kernel_size=2, axis=4), (1, 1, 4, 4), r"convolution_param.axis 4 is out of range"),
])
def test_bad_parameters(text, shape, match):
    with pytest.raises(LayerError, match=r"^Im2col layer 'under_test': .*" + match):
        build_layer(text, [np.zeros(shape)])


def test_numpy_backend_matches_cpu():
    x = RNG.standard_normal((2, 3, 7, 6))
    top, diff, dy = forward_backward_on("cpu", body(kernel_size=3, stride=2, pad=1), x, RNG)
    for a, b in zip((top, diff), forward_backward_on("numpy", body(kernel_size=3, stride=2, pad=1), x, RNG, dy)):
        np.testing.assert_array_equal(a, b)


def test_a_huge_pad_is_not_materialised():
    x = np.array([[[[1.0, 2.0], [3.0, 4.0]]]])
    layer, bottom, top = build_layer(body(kernel_size=1, stride=100000, pad=100000), [x])
    run_forward(layer, bottom, top)
    assert top[0].shape == (1, 1, 3, 3)
    want = np.zeros((1, 1, 3, 3))
    want[0, 0, 1, 1] = 1.0
    np.testing.assert_array_equal(top[0].data, want)
    top[0].diff[...] = 2.0
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, [[[[2.0, 0.0], [0.0, 0.0]]]])
