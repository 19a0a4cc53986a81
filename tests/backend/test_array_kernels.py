"""The array-generic kernels (cct.backend.array_kernels) on NumPy, through the ``numpy`` backend,
against the NumPy reference (cct.backend.reference): the same code the GPU backend runs on
CuPy. Random geometries (odd sizes, groups, dilation, stride > kernel, pad, batch 1), forward
and backward, float64 to rounding and float32 to float32 tolerance; plus the index arrays'
own invariants and the kernels' signatures against cct.backend.cpu."""
import inspect

import numpy as np
import pytest

from cct import backend as backends
from cct.backend import array_kernels, cpu, reference
from cct.backend.array_kernels import ArrayKernels

K = backends.get("numpy")

# (n, c, h, w, o, kernel, stride, pad, dilation, group)
CONV_CASES = [
    (2, 3, 7, 9, 4, (3, 3), (1, 1), (0, 0), (1, 1), 1),      # plain, odd sizes
    (1, 3, 8, 8, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1),      # batch 1, pad
    (3, 4, 11, 10, 6, (3, 5), (2, 1), (1, 2), (1, 1), 2),    # rectangular, groups
    (2, 6, 9, 9, 6, (3, 3), (1, 1), (2, 2), (2, 2), 3),      # dilation
    (2, 2, 13, 12, 3, (2, 2), (4, 3), (1, 0), (1, 1), 1),    # stride > kernel
    (2, 3, 5, 6, 2, (1, 1), (1, 1), (0, 0), (1, 1), 1),      # 1x1
    (2, 2, 5, 5, 3, (3, 3), (1, 1), (4, 3), (1, 1), 1),      # pad > kernel
    (1, 2, 6, 7, 2, (6, 7), (1, 1), (0, 0), (1, 1), 1),      # kernel = bottom: 1x1 top
    (2, 4, 17, 15, 4, (5, 3), (3, 2), (2, 1), (2, 3), 4),    # depthwise-like, everything
    (2, 3, 27, 27, 8, (11, 11), (4, 4), (0, 0), (1, 1), 1),  # CaffeNet conv1 in small
]


def _random_conv_cases(count, seed):
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        group = int(rng.choice([1, 1, 2, 3]))
        c, o = group * int(rng.integers(1, 4)), group * int(rng.integers(1, 4))
        kernel = tuple(int(k) for k in rng.integers(1, 6, 2))
        stride = tuple(int(s) for s in rng.integers(1, 5, 2))
        pad = tuple(int(p) for p in rng.integers(0, 4, 2))
        dilation = tuple(int(d) for d in rng.integers(1, 3, 2))
        h, w = (int(s) for s in rng.integers(1, 14, 2))
        extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
        if h + 2 * pad[0] < extent[0] or w + 2 * pad[1] < extent[1]:
            continue
        cases.append((int(rng.integers(1, 4)), c, h, w, o, kernel, stride, pad, dilation,
                      group))
    return cases


ALL_CONV = CONV_CASES + _random_conv_cases(12, seed=11)
TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}
DTYPES = [np.float32, np.float64]


def _close(got, want, dtype):
    assert got.dtype == np.dtype(dtype)
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got / scale, want / scale, **TOL[dtype])


def _rand(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _conv_arrays(case, dtype, seed=0):
    n, c, h, w, o, kernel, stride, pad, dilation, group = case
    ho = cpu.conv_out_size(h, kernel[0], stride[0], pad[0], dilation[0])
    wo = cpu.conv_out_size(w, kernel[1], stride[1], pad[1], dilation[1])
    x = _rand((n, c, h, w), dtype, seed)
    weight = _rand((o, c // group) + kernel, dtype, seed + 1)
    bias = _rand(o, dtype, seed + 2)
    dy = _rand((n, o, ho, wo), dtype, seed + 3)
    return x, weight, bias, dy, (kernel, stride, pad, dilation, group)


# --------------------------------------------------------------------------------------------
# Signatures
# --------------------------------------------------------------------------------------------
def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_every_cpu_kernel_is_an_array_kernel():
    """A kernel added to the CPU backend must be added to the array kernels too."""
    public = {name for name, fn in vars(cpu).items() if inspect.isfunction(fn)
              and fn.__module__ == cpu.__name__ and not name.startswith("_")}
    assert public == set(array_kernels.KERNELS)


@pytest.mark.parametrize("name", array_kernels.KERNELS)
def test_signatures_match_the_cpu_backend(name):
    want = _params(getattr(cpu, name))
    assert _params(getattr(K, name)) == want
    assert _params(getattr(ArrayKernels(np), name)) == want


def test_numpy_backend_is_named_and_registered():
    assert K.name == "numpy" and K.xp is not np and K.xp.float32 is np.float32
    assert K.xp.linalg is np.linalg  # lazily resolved NumPy names work too


# --------------------------------------------------------------------------------------------
# Convolution
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ALL_CONV, ids=str)
def test_conv_matches_reference(case, dtype):
    x, weight, bias, dy, geom = _conv_arrays(case, dtype)
    _close(K.conv_forward(x, weight, bias, *geom),
           reference.conv_forward(x, weight, bias, *geom), dtype)
    _close(K.conv_forward(x, weight, None, *geom),
           reference.conv_forward(x, weight, None, *geom), dtype)
    _close(K.conv_backward_data(dy, weight, x.shape, *geom),
           reference.conv_backward_data(dy, weight, x.shape, *geom), dtype)
    _close(K.conv_backward_weight(x, dy, *geom),
           reference.conv_backward_weight(x, dy, *geom), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_writes_into_out_and_accumulates(dtype):
    x, weight, bias, dy, geom = _conv_arrays(CONV_CASES[2], dtype)
    y = np.full(dy.shape, np.nan, dtype)
    assert K.conv_forward(x, weight, bias, *geom, out=y) is y
    _close(y, reference.conv_forward(x, weight, bias, *geom), dtype)
    dx = np.full(x.shape, np.nan, dtype)
    assert K.conv_backward_data(dy, weight, x.shape, *geom, out=dx) is dx
    _close(dx, reference.conv_backward_data(dy, weight, x.shape, *geom), dtype)
    dw = np.ones(weight.shape, dtype)
    assert K.conv_backward_weight(x, dy, *geom, out=dw, accumulate=True) is dw
    _close(dw, 1 + reference.conv_backward_weight(x, dy, *geom), dtype)
    fortran = np.asfortranarray(np.zeros(dy.shape, dtype))
    assert K.conv_forward(x, weight, bias, *geom, out=fortran) is fortran
    _close(fortran, y, dtype)
    with pytest.raises(ValueError, match="out overlaps x"):
        K.conv_forward(x, weight, bias, *geom, out=x)
    with pytest.raises(ValueError, match="out must be given"):
        K.conv_backward_weight(x, dy, *geom, accumulate=True)
    with pytest.raises(TypeError, match="float32 or float64"):
        K.conv_forward(x.astype(np.float16), weight, bias, *geom)


def test_lowering_indices_do_not_depend_on_the_batch():
    """The batch is the gathers' last axis: one index array per geometry serves any batch."""
    kernels = ArrayKernels(np)
    x, weight, bias, dy, geom = _conv_arrays(CONV_CASES[3], np.float64)
    for n in (1, 2, 5):
        xn = np.concatenate([x] * 3)[:n]
        dyn = np.concatenate([dy] * 3)[:n]
        _close(kernels.conv_forward(xn, weight, bias, *geom),
               reference.conv_forward(xn, weight, bias, *geom), np.float64)
        _close(kernels.conv_backward_data(dyn, weight, xn.shape, *geom),
               reference.conv_backward_data(dyn, weight, xn.shape, *geom), np.float64)
    assert len(kernels._cache.items) == 2  # im2col and col2im indices, once each


def test_index_arrays_point_padding_at_the_zero_slot():
    idx = array_kernels.conv_columns_index(2, 3, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    assert idx.shape == (1, 2 * 9, 3 * 4)
    slot = 2 * 3 * 4
    # Tap (0, 0) of output (0, 0) lies in the top-left padding; the centre tap is the pixel.
    assert idx[0, 0, 0] == slot and idx[0, 4, 0] == 0
    # Every real pixel is read once per tap whose window covers it: 9 for inner pixels.
    counts = np.bincount(idx[idx < slot], minlength=slot)
    assert counts.reshape(2, 3, 4)[0, 1, 1] == 9 and counts.reshape(2, 3, 4)[0, 0, 0] == 4
    inv = array_kernels.inverse_index(idx, slot, exclude=slot)
    assert inv.shape == (slot, 9)
    flat = idx.ravel()
    for t in range(slot):
        listed = inv[t][inv[t] < flat.size]
        assert sorted(listed) == list(listed) and (flat[listed] == t).all()
        assert len(listed) == counts[t]


# --------------------------------------------------------------------------------------------
# GEMM and bias
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_and_bias_backward(dtype):
    a, b = _rand((6, 4), dtype), _rand((6, 5), dtype, 1)
    _close(K.matmul(a.T, b), a.T @ b, dtype)
    out = np.ones((4, 5), dtype)
    assert K.matmul(a.T, b, out=out, accumulate=True) is out
    _close(out, 1 + a.T @ b, dtype)
    dy = _rand((3, 5, 4, 2), dtype)
    _close(K.bias_backward(dy), reference.bias_backward(dy), dtype)
    db = np.ones(5, dtype)
    assert K.bias_backward(dy, out=db, accumulate=True) is db
    _close(db, 1 + reference.bias_backward(dy), dtype)
    _close(K.bias_backward(b), reference.bias_backward(b), dtype)  # InnerProduct's (M, N)
    with pytest.raises(ValueError, match="out must be given"):
        K.matmul(a, b.T, accumulate=True)


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------
# (n, c, h, w, kernel, stride, pad, ceil_mode)
POOL_CASES = [
    (2, 3, 7, 9, (3, 3), (2, 2), (0, 0), True),    # CaffeNet-like overlapping windows
    (1, 2, 8, 8, (2, 2), (2, 2), (0, 0), True),    # batch 1, tiling windows
    (2, 2, 9, 11, (3, 2), (1, 3), (1, 1), True),   # rectangular, pad, stride > kernel in w
    (3, 1, 10, 7, (2, 2), (3, 3), (1, 0), False),  # stride > kernel, floor mode
    (2, 3, 5, 5, (5, 5), (1, 1), (0, 0), True),    # global
    (1, 4, 13, 13, (3, 3), (2, 2), (2, 2), True),  # pad, last window dropped by the clip rule
]


def _random_pool_cases(count, seed):
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        kernel = tuple(int(k) for k in rng.integers(1, 5, 2))
        stride = tuple(int(s) for s in rng.integers(1, 5, 2))
        pad = tuple(int(rng.integers(0, k)) for k in kernel)  # Caffe: pad < kernel
        h, w = (int(s) for s in rng.integers(1, 15, 2))
        ceil_mode = bool(rng.integers(0, 2))
        if h + 2 * pad[0] < kernel[0] or w + 2 * pad[1] < kernel[1]:
            continue
        cases.append((int(rng.integers(1, 4)), int(rng.integers(1, 4)), h, w, kernel, stride,
                      pad, ceil_mode))
    return cases


ALL_POOL = POOL_CASES + _random_pool_cases(14, seed=7)


def _pool_arrays(case, dtype):
    n, c, h, w, kernel, stride, pad, ceil_mode = case
    pooled = tuple(cpu.pool_out_size(s, k, st, p, ceil_mode)
                   for s, k, st, p in zip((h, w), kernel, stride, pad))
    x = _rand((n, c, h, w), dtype, 2)
    dy = _rand((n, c) + pooled, dtype, 3)
    return x, dy, (kernel, stride, pad, pooled)


def _has_empty_window(x, geom):
    kernel, stride, pad, pooled = geom
    return any((p - 1) * st - pd >= s
               for s, st, pd, p in zip(x.shape[2:], stride, pad, pooled))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ALL_POOL, ids=str)
def test_max_pool_matches_cpu_and_reference(case, dtype):
    x, dy, geom = _pool_arrays(case, dtype)
    y, mask = K.max_pool_forward(x, *geom)
    y_cpu, mask_cpu = cpu.max_pool_forward(x, *geom)
    np.testing.assert_array_equal(y, y_cpu)
    np.testing.assert_array_equal(mask, mask_cpu)
    assert y.dtype == np.dtype(dtype) and mask.dtype == np.int64
    _close(K.max_pool_backward(dy, mask, x.shape), cpu.max_pool_backward(dy, mask_cpu, x.shape),
           dtype)
    if not _has_empty_window(x, geom):  # the reference knows no empty windows
        y_ref, mask_ref = reference.max_pool_forward(x, *geom)
        np.testing.assert_array_equal(y, y_ref)
        np.testing.assert_array_equal(mask, mask_ref)
        _close(K.max_pool_backward(dy, mask, x.shape),
               reference.max_pool_backward(dy, mask_ref, x.shape), dtype)


# A window wholly beyond the padded bottom has divisor 0 (or less), as in Caffe.
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ALL_POOL, ids=str)
def test_ave_pool_matches_cpu_and_reference(case, dtype):
    x, dy, geom = _pool_arrays(case, dtype)
    _close(K.ave_pool_forward(x, *geom), cpu.ave_pool_forward(x, *geom), dtype)
    _close(K.ave_pool_backward(dy, x.shape, *geom), cpu.ave_pool_backward(dy, x.shape, *geom),
           dtype)
    if not _has_empty_window(x, geom):
        _close(K.ave_pool_forward(x, *geom), reference.ave_pool_forward(x, *geom), dtype)
        _close(K.ave_pool_backward(dy, x.shape, *geom),
               reference.ave_pool_backward(dy, x.shape, *geom), dtype)


def test_max_pool_ties_nan_and_empty_windows_are_caffes():
    x = np.zeros((1, 1, 4, 4), np.float32)
    y, mask = K.max_pool_forward(x, (2, 2), (2, 2), (0, 0), (2, 2))
    np.testing.assert_array_equal(mask.ravel(), [0, 2, 8, 10])
    x[0, 0, 0, 0] = np.nan   # NaN never wins (Caffe's strict >)
    x[0, 0, 0, 1] = -1.0
    y, mask = K.max_pool_forward(x, (2, 2), (2, 2), (0, 0), (2, 2))
    assert mask[0, 0, 0, 0] == 4 and y[0, 0, 0, 0] == 0
    # Ceil rounding without pad: the last window lies wholly below the bottom.
    x = np.ones((1, 1, 14, 4), np.float32)
    geom = ((1, 1), (3, 1), (0, 0), (cpu.pool_out_size(14, 1, 3, 0, True), 4))
    y, mask = K.max_pool_forward(x, *geom)
    np.testing.assert_array_equal(y[0, 0, 5], -np.finfo(np.float32).max)
    np.testing.assert_array_equal(mask[0, 0, 5], -1)
    assert K.max_pool_backward(np.ones_like(y), mask, x.shape).sum() == 20
    np.testing.assert_array_equal(K.ave_pool_forward(x, *geom), cpu.ave_pool_forward(x, *geom))


def test_max_pool_backward_with_two_geometries_of_the_same_sizes():
    """MAX backward finds the windows from the forward calls: 3x3 stride 2, 2x2 stride 2
    (floor) and 3x3 stride 3 pad 1 all take a 9x9 bottom to a 4x4 top; each mask routes
    through the union of their windows correctly."""
    x, dy = _rand((2, 3, 9, 9), np.float64), _rand((2, 3, 4, 4), np.float64, 1)
    geoms = [((3, 3), (2, 2), (0, 0), (4, 4)), ((2, 2), (2, 2), (0, 0), (4, 4)),
             ((3, 3), (3, 3), (1, 1), (4, 4))]
    kernels = ArrayKernels(np)
    masks = [kernels.max_pool_forward(x, *g)[1] for g in geoms]
    for g, mask in zip(geoms, masks):
        _close(kernels.max_pool_backward(dy, mask, x.shape),
               reference.max_pool_backward(dy, mask, x.shape), np.float64)
    with pytest.raises(RuntimeError, match="no max_pool_forward from a 9x9 bottom"):
        ArrayKernels(np).max_pool_backward(dy, masks[0], x.shape)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pooling_writes_into_out(dtype):
    x, dy, geom = _pool_arrays(POOL_CASES[2], dtype)
    y_ref, mask_ref = reference.max_pool_forward(x, *geom)
    y, mask = np.full(y_ref.shape, np.nan, dtype), np.full(y_ref.shape, -7, np.int64)
    got = K.max_pool_forward(x, *geom, out=y, mask=mask)
    assert got[0] is y and got[1] is mask
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(mask, mask_ref)
    dx = np.full(x.shape, np.nan, dtype)
    assert K.max_pool_backward(dy, mask, x.shape, out=dx) is dx
    _close(dx, reference.max_pool_backward(dy, mask_ref, x.shape), dtype)
    assert K.ave_pool_forward(x, *geom, out=y) is y
    _close(y, reference.ave_pool_forward(x, *geom), dtype)
    assert K.ave_pool_backward(dy, x.shape, *geom, out=dx) is dx
    _close(dx, reference.ave_pool_backward(dy, x.shape, *geom), dtype)
    with pytest.raises(ValueError, match="out overlaps dy"):
        K.ave_pool_backward(dy, dy.shape, (1, 1), (1, 1), (0, 0), dy.shape[2:], out=dy)


# --------------------------------------------------------------------------------------------
# ReLU, LRN, softmax, SoftmaxWithLoss, SGD
# --------------------------------------------------------------------------------------------
ELEMENTWISE_SHAPES = [(1, 3, 5, 7), (2, 1), (3, 17, 11, 7), (7,)]
LRN_SHAPES = [(1, 3, 5, 7), (2, 7, 4, 3), (2, 40, 3, 5)]
LRN_PARAMS = [(5, 1e-4, 0.75, 1.0), (3, 2.0, 0.5, 2.0), (1, 0.5, 1.3, 1.0), (7, 1.0, 0.75, 1.0)]
SOFTMAX_SHAPES = [(1, 10, 1), (64, 10, 1), (3, 5, 60), (2, 1, 7)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slope", [0.0, 0.1, -0.5])
@pytest.mark.parametrize("shape", ELEMENTWISE_SHAPES, ids=str)
def test_relu_matches_reference(shape, slope, dtype):
    x, dy = _rand(shape, dtype), _rand(shape, dtype, 1)
    np.testing.assert_array_equal(K.relu_forward(x, slope), reference.relu_forward(x, slope))
    np.testing.assert_array_equal(K.relu_backward(x, dy, slope),
                                  reference.relu_backward(x, dy, slope))
    buf, want = x.copy(), reference.relu_forward(x, slope)
    assert K.relu_forward(buf, slope, out=buf) is buf          # in place
    np.testing.assert_array_equal(buf, want)
    want = reference.relu_backward(x, dy, slope)
    assert K.relu_backward(x, dy, slope, out=dy) is dy
    np.testing.assert_array_equal(dy, want)


def test_relu_keeps_caffes_special_values():
    x = np.array([-np.inf, -0.0, 0.0, np.nan, np.inf, -2.0], np.float32)
    dy = np.ones_like(x)
    with np.errstate(invalid="ignore"):
        for slope in (0.0, 0.5):
            np.testing.assert_array_equal(K.relu_forward(x, slope),
                                          cpu.relu_forward(x, slope))
            np.testing.assert_array_equal(K.relu_backward(x, dy, slope),
                                          cpu.relu_backward(x, dy, slope))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params", LRN_PARAMS, ids=str)
@pytest.mark.parametrize("shape", LRN_SHAPES, ids=str)
def test_lrn_across_matches_reference(shape, params, dtype):
    size, alpha, beta, k = params
    x, dy = _rand(shape, dtype), _rand(shape, dtype, 1)
    out, scale = np.empty_like(x), np.empty_like(x)
    y, s = K.lrn_across_forward(x, size, alpha, beta, k, out=out, scale=scale)
    assert y is out and s is scale
    want_y, want_scale = reference.lrn_across_forward(x, size, alpha, beta, k)
    _close(scale, want_scale, dtype)
    _close(y, want_y, dtype)
    dx = dy.copy()
    assert K.lrn_across_backward(x, y, scale, dx, size, alpha, beta, out=dx) is dx
    _close(dx, reference.lrn_across_backward(x, want_y, want_scale, dy, size, alpha, beta),
           dtype)
    with pytest.raises(ValueError, match="out must not be x"):
        K.lrn_across_forward(x, size, alpha, beta, k, out=x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
def test_softmax_matches_reference(shape, dtype):
    x, dy = 5 * _rand(shape, dtype), _rand(shape, dtype, 1)
    y = K.softmax_forward(x)
    _close(y, reference.softmax_forward(x), dtype)
    _close(K.softmax_backward(y, dy), reference.softmax_backward(y, dy), dtype)
    buf = x.copy()
    assert K.softmax_forward(buf, out=buf) is buf
    np.testing.assert_array_equal(buf, y)
    want = reference.softmax_backward(y, dy)
    K.softmax_backward(y, dy, out=dy)
    _close(dy, want, dtype)
    big = np.array([[[1000.0], [1001.0], [-1000.0]]], dtype)
    assert np.isfinite(K.softmax_forward(big)).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore", [None, 1, -1])
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
def test_softmax_loss_matches_reference(shape, ignore, dtype):
    outer, channels, inner = shape
    x = 3 * _rand(shape, dtype)
    lab = np.random.default_rng(2).integers(0, channels, (outer, inner))
    if ignore is not None:
        lab[::2, ::3] = ignore
    label = (lab + 0.7 * (ignore is None)).astype(dtype)  # truncated to int, as in Caffe
    prob = np.empty(shape, dtype)
    got = K.softmax_loss_forward(x, label, ignore, prob=prob)
    want = reference.softmax_loss_forward(x, label, ignore)
    assert got[0] is prob
    _close(prob, want[0], dtype)
    assert isinstance(got[1], np.dtype(dtype).type)
    np.testing.assert_allclose(got[1], want[1], **TOL[dtype])
    assert got[2:] == want[2:] and got[3] is None
    dx = np.full(shape, 9, dtype)
    assert K.softmax_loss_backward(prob, label, ignore, 0.25, out=dx) is dx
    _close(dx, reference.softmax_loss_backward(prob, label, ignore, 0.25), dtype)


def test_softmax_loss_reports_the_first_bad_label_and_floors_at_flt_min():
    x = _rand((3, 4, 2), np.float32)
    label = np.array([[0, 3], [4, -1], [7, 2]], np.float32)
    assert K.softmax_loss_forward(x, label, None)[2:] == (3, 4)
    assert K.softmax_loss_forward(x, label, 4)[2:] == (3, -1)
    x = np.array([[[0.0], [-200.0]]], np.float32)
    _, loss, _, _ = K.softmax_loss_forward(x, np.array([[1.0]], np.float32), None)
    np.testing.assert_allclose(loss, -np.log(np.finfo(np.float32).tiny), rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("decay", [0.0, 5e-4])
@pytest.mark.parametrize("shape", ELEMENTWISE_SHAPES, ids=str)
def test_sgd_update_matches_reference(shape, decay, dtype):
    data, diff, hist = _rand(shape, dtype), _rand(shape, dtype, 1), _rand(shape, dtype, 2)
    want = [a.copy() for a in (data, diff, hist)]
    reference.sgd_update(*want, 0.01, 0.9, decay)
    K.sgd_update(data, diff, hist, 0.01, 0.9, decay)
    for got, w in zip((data, diff, hist), want):
        np.testing.assert_array_equal(got, w)
    with pytest.raises(TypeError, match="one dtype"):
        K.sgd_update(data, diff.astype(np.float16), hist, 0.01, 0.9, decay)
    with pytest.raises(ValueError, match="different sizes"):
        K.sgd_update(data, np.zeros(data.size + 1, dtype), hist, 0.01, 0.9, decay)
