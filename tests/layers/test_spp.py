"""SPP: Caffe's setup shapes, forward against Caffe's per-level pooling geometry pooled by the
plain-loop pooling reference, summed backward, gradient checks, a bottom that changes shape,
bad parameters, and the numpy (device) backend."""
import math

import numpy as np
import pytest

from cct.errors import LayerError
from tests.gradient_check import (build_layer, check_gradient, forward_backward_on,
                                  run_forward)
from tests.layers.test_pooling import ref_pool

RNG = np.random.default_rng(5)


def body(height, pool="MAX"):
    return f'type: "SPP" spp_param {{ pyramid_height: {height} pool: {pool} }}'


def caffe_level(level, size):
    """spp_layer.cpp's GetPoolingParam along one axis: (kernel, stride, pad)."""
    bins = int(math.pow(2, level))
    kernel = int(math.ceil(size / bins))
    pad = (kernel * bins - size + 1) // 2
    return kernel, kernel, pad


def ref_spp(x, height, method):
    levels = []
    for level in range(height):
        (kh, sh, ph), (kw, sw, pw) = (caffe_level(level, s) for s in x.shape[2:])
        y, _ = ref_pool(x, method, (kh, kw), (sh, sw), (ph, pw))
        levels.append(y)
    if height == 1:
        return levels[0]
    return np.concatenate([y.reshape(x.shape[0], -1) for y in levels], axis=1)


@pytest.mark.parametrize("shape,height,want", [
    ((2, 3, 9, 8), 3, (2, 63)),          # test_spp_layer.cpp TestSetup
    ((4, 3, 1024, 765), 5, (4, 1023)),   # TestEqualOutputDims
    ((10, 3, 7, 7), 3, (10, 63)),        # TestEqualOutputDims2
    ((2, 3, 9, 8), 1, (2, 3, 1, 1)),     # one level: the pooling top itself
])
def test_caffes_setup_shapes(shape, height, want):
    _, _, top = build_layer(body(height), [np.zeros(shape, np.float32)], dtype=np.float32)
    assert top[0].shape == want


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("shape,height", [((2, 3, 9, 8), 3), ((2, 2, 7, 7), 3),
                                          ((1, 2, 13, 6), 2), ((2, 3, 5, 4), 1)])
def test_forward_matches_per_level_pooling(method, shape, height):
    x = RNG.standard_normal(shape)
    layer, bottom, top = build_layer(body(height, method), [x])
    run_forward(layer, bottom, top)
    ref = ref_spp(x, height, method)
    assert top[0].shape == ref.shape
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("height", [1, 3])
def test_gradient(method, height):
    layer, bottom, top = build_layer(body(height, method), [RNG.standard_normal((1, 2, 9, 8))])
    check_gradient(layer, bottom, top)


def test_backward_sums_the_levels_and_overwrites_the_bottom_diff():
    x = RNG.standard_normal((2, 2, 6, 6))
    layer, bottom, top = build_layer(body(2, "AVE"), [x])
    run_forward(layer, bottom, top)
    top[0].diff[...] = 1.0
    bottom[0].diff[...] = 3.0
    layer.backward(top, [True], bottom)
    # level 0 averages all 36 values, level 1 each 3 x 3 quarter: every value gets both
    np.testing.assert_allclose(bottom[0].diff, 1 / 36 + 1 / 9, rtol=1e-14)


def test_bottom_shape_change_rebuilds_the_levels():
    layer, bottom, top = build_layer(body(2), [RNG.standard_normal((2, 3, 9, 8))])
    x = RNG.standard_normal((3, 3, 13, 6))
    bottom[0].reshape(x.shape)
    bottom[0].data[...] = x
    run_forward(layer, bottom, top)
    np.testing.assert_allclose(top[0].data, ref_spp(x, 2, "MAX"), rtol=1e-13)


@pytest.mark.parametrize("text,shape,match", [
    ('type: "SPP"', (1, 1, 4, 4), r"spp_param.pyramid_height must be given and at least 1"),
    (body(3), (1, 1, 5, 8), r"pyramid level 2 \(4 bins per axis\) on a 5 x 8 bottom needs "
                            r"kernel 2 x 2 with pad 2 x 0.*lower pyramid_height \(to 2 or less\)"),
    (body(2, "STOCHASTIC"), (1, 1, 4, 4), r"STOCHASTIC pooling is not supported"),
    (body(2), (1, 4, 4), r"input must have 4 axes .* shape \(1, 4, 4\)"),
    (body(2), (1, 1, 0, 4), r"input dimensions cannot be zero"),
])
def test_bad_parameters(text, shape, match):
    with pytest.raises(LayerError, match=r"^SPP layer 'under_test': " + match):
        build_layer(text, [np.zeros(shape)])


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_numpy_backend_matches_cpu(method):
    x = RNG.standard_normal((2, 3, 9, 8))
    top, diff, dy = forward_backward_on("cpu", body(3, method), x, RNG)
    for a, b in zip((top, diff), forward_backward_on("numpy", body(3, method), x, RNG, dy)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
