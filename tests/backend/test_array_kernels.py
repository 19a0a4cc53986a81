"""The array-generic kernels (cct.backend.array_kernels) on NumPy, through the ``numpy`` backend,
against the NumPy reference (cct.backend.reference): the same code the GPU backend runs on
CuPy. Random geometries (odd sizes, groups, dilation, stride > kernel, pad, batch 1), forward
and backward, float64 to rounding and float32 to float32 tolerance; plus the index arrays'
own invariants and the kernels' signatures against cct.backend.cpu."""
import inspect

import numpy as np
import pytest

from cct import backend as backends
from cct.backend import array_kernels, cpu, gpu, reference
from cct.backend.array_kernels import ArrayKernels
from tests.backend.on_device import OnDevice
from tests.backend.kernel_cases import (BATCH_NORM_SHAPES, CONCAT_CASES, ELTWISE_CASES,
                                        check_batch_norm, check_concat,
                                        check_eltwise,
                                        CONV_CASES, DTYPES, POOL_CASES, check_ave_pool, check_conv,
                                        check_lrn, check_max_pool, check_pooling_writes_into_out,
                                        check_relu, check_sgd_update, check_softmax,
                                        check_softmax_loss, check_softmax_loss_bad_label,
                                        check_softmax_loss_floor, close, conv_arrays,
                                        has_empty_window, pool_arrays, rand, random_conv_cases,
                                        random_pool_cases)

K = OnDevice(backends.get("numpy"))

ALL_CONV = CONV_CASES + random_conv_cases(12, seed=11)


# --------------------------------------------------------------------------------------------
# Signatures
# --------------------------------------------------------------------------------------------
def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_every_cpu_kernel_is_an_array_kernel():
    """A kernel added to the CPU backend must be added to the array kernels too; besides
    kernels, every backend has the functions that move its arrays and those that time its work
    and recognise its out-of-memory error, with one signature."""
    # the size rules live in cct/backend/shapes.py and are the CPU backend's by import
    public = {name for name, fn in vars(cpu).items() if inspect.isfunction(fn)
              and fn.__module__ in (cpu.__name__, "cct.backend.shapes")
              and not name.startswith("_")}
    assert public == (set(array_kernels.KERNELS) | set(backends.MOVEMENT)
                      | set(backends.RUNTIME))
    for name in backends.MOVEMENT + backends.RUNTIME:
        for module in (K.backend, gpu):  # gpu.py defines them without CuPy too
            assert _params(getattr(module, name)) == _params(getattr(cpu, name)), module


@pytest.mark.parametrize("name", array_kernels.KERNELS)
def test_signatures_match_the_cpu_backend(name):
    want = _params(getattr(cpu, name))
    assert _params(getattr(K.backend, name)) == want
    assert _params(getattr(ArrayKernels(np), name)) == want


def test_numpy_backend_is_named_and_registered():
    assert K.name == "numpy" and K.xp is not np and K.xp.float32 is np.float32
    assert backends.device_of_xp(K.xp) is K.backend
    assert backends.owner(K.xp.zeros(2)) is K.backend
    assert backends.owner(np.zeros(2)) is cpu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ALL_CONV, ids=str)
def test_conv_matches_reference(case, dtype):
    x, weight, bias, dy, geom = conv_arrays(case, dtype)
    check_conv(K, x, weight, bias, dy, geom, dtype, no_bias=True)


@pytest.mark.parametrize("case", [c for c in ALL_CONV if c[0] > 1], ids=str)
def test_conv_lowered_in_chunks_of_images_gives_the_whole_batchs_values(case, monkeypatch):
    """A batch whose columns pass the column budget is lowered a chunk of images at a time
    (here one image: the smallest budget): the same values, to rounding (a GEMM of fewer
    columns, a sum over the taps vectorized by the chunk's width, the weight gradient added
    chunk by chunk may each move the last bits)."""
    dtype = np.float32
    x, weight, bias, dy, geom = conv_arrays(case, dtype)
    kernels = K.backend.kernels
    xd, wd, bd, dyd = (K.xp.asarray(a) for a in (x, weight, bias, dy))
    whole = [K.backend.to_host(a) for a in (
        kernels.conv_forward(xd, wd, bd, *geom), kernels.conv_backward_data(dyd, wd, x.shape, *geom),
        kernels.conv_backward_weight(xd, dyd, *geom))]
    monkeypatch.setattr(kernels, "col_budget", 1)
    assert len(kernels._chunks(x.shape[0], 4)) == x.shape[0]
    chunked = [K.backend.to_host(a) for a in (
        kernels.conv_forward(xd, wd, bd, *geom), kernels.conv_backward_data(dyd, wd, x.shape, *geom),
        kernels.conv_backward_weight(xd, dyd, *geom))]
    close(chunked[0], whole[0], dtype)
    close(chunked[0], reference.conv_forward(x, weight, bias, *geom), dtype)
    close(chunked[1], whole[1], dtype)
    close(chunked[1], reference.conv_backward_data(dy, weight, x.shape, *geom), dtype)
    close(chunked[2], whole[2], dtype)
    close(chunked[2], reference.conv_backward_weight(x, dy, *geom), dtype)


def test_the_column_budget_bounds_a_chunk():
    k = ArrayKernels(np, col_budget=100)
    assert k._chunks(10, 30) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert k._chunks(4, 1000) == [(0, 1), (1, 2), (2, 3), (3, 4)]   # at least one image
    assert k._chunks(4, 10) == [(0, 4)]
    assert k._chunks(0, 10) == [(0, 0)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_writes_into_out_and_accumulates(dtype):
    x, weight, bias, dy, geom = conv_arrays(CONV_CASES[2], dtype)
    y = np.full(dy.shape, np.nan, dtype)
    assert K.conv_forward(x, weight, bias, *geom, out=y) is y
    close(y, reference.conv_forward(x, weight, bias, *geom), dtype)
    dx = np.full(x.shape, np.nan, dtype)
    assert K.conv_backward_data(dy, weight, x.shape, *geom, out=dx) is dx
    close(dx, reference.conv_backward_data(dy, weight, x.shape, *geom), dtype)
    dw = np.ones(weight.shape, dtype)
    assert K.conv_backward_weight(x, dy, *geom, out=dw, accumulate=True) is dw
    close(dw, 1 + reference.conv_backward_weight(x, dy, *geom), dtype)
    fortran = np.asfortranarray(np.zeros(dy.shape, dtype))
    assert K.conv_forward(x, weight, bias, *geom, out=fortran) is fortran
    close(fortran, y, dtype)
    with pytest.raises(ValueError, match="out overlaps x"):
        K.conv_forward(x, weight, bias, *geom, out=x)
    with pytest.raises(ValueError, match="out must be given"):
        K.conv_backward_weight(x, dy, *geom, accumulate=True)
    with pytest.raises(TypeError, match="float32 or float64"):
        K.conv_forward(x.astype(np.float16), weight, bias, *geom)


def test_lowering_indices_do_not_depend_on_the_batch():
    """The batch is the gathers' last axis: one index array per geometry serves any batch."""
    kernels = ArrayKernels(np)
    x, weight, bias, dy, geom = conv_arrays(CONV_CASES[3], np.float64)
    for n in (1, 2, 5):
        xn = np.concatenate([x] * 3)[:n]
        dyn = np.concatenate([dy] * 3)[:n]
        check_conv(kernels, xn, weight, bias, dyn, geom, np.float64, weight_grad=False)
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
    a, b = rand((6, 4), dtype), rand((6, 5), dtype, 1)
    close(K.matmul(a.T, b), a.T @ b, dtype)
    out = np.ones((4, 5), dtype)
    assert K.matmul(a.T, b, out=out, accumulate=True) is out
    close(out, 1 + a.T @ b, dtype)
    dy = rand((3, 5, 4, 2), dtype)
    close(K.bias_backward(dy), reference.bias_backward(dy), dtype)
    db = np.ones(5, dtype)
    assert K.bias_backward(dy, out=db, accumulate=True) is db
    close(db, 1 + reference.bias_backward(dy), dtype)
    close(K.bias_backward(b), reference.bias_backward(b), dtype)  # InnerProduct's (M, N)
    with pytest.raises(ValueError, match="out must be given"):
        K.matmul(a, b.T, accumulate=True)


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------
ALL_POOL = POOL_CASES + random_pool_cases(14, seed=7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ALL_POOL, ids=str)
def test_max_pool_matches_cpu_and_reference(case, dtype):
    check_max_pool(K, cpu, case, dtype)
    x, _, geom = pool_arrays(case, dtype)
    if not has_empty_window(x.shape[2:], geom):  # the reference knows no empty windows
        check_max_pool(K, reference, case, dtype)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
@pytest.mark.parametrize("case", [c for c in ALL_POOL if c[0] > 1], ids=str)
def test_pooling_in_chunks_of_images_matches_cpu(case, monkeypatch):
    """The pooling kernels' gathers take a chunk of images at a time past the column budget
    (one image here): MAX's tops and masks to the bit, the rest as the CPU's."""
    monkeypatch.setattr(K.backend.kernels, "col_budget", 1)
    check_max_pool(K, cpu, case, np.float32)
    check_ave_pool(K, cpu, case, np.float32)


# A window wholly beyond the padded bottom has divisor 0 (or less), as in Caffe.
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ALL_POOL, ids=str)
def test_ave_pool_matches_cpu_and_reference(case, dtype):
    check_ave_pool(K, cpu, case, dtype)
    x, _, geom = pool_arrays(case, dtype)
    if not has_empty_window(x.shape[2:], geom):
        check_ave_pool(K, reference, case, dtype)


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
    x, dy = rand((2, 3, 9, 9), np.float64), rand((2, 3, 4, 4), np.float64, 1)
    geoms = [((3, 3), (2, 2), (0, 0), (4, 4)), ((2, 2), (2, 2), (0, 0), (4, 4)),
             ((3, 3), (3, 3), (1, 1), (4, 4))]
    kernels = ArrayKernels(np)
    masks = [kernels.max_pool_forward(x, *g)[1] for g in geoms]
    for g, mask in zip(geoms, masks):
        close(kernels.max_pool_backward(dy, mask, x.shape),
              reference.max_pool_backward(dy, mask, x.shape), np.float64)
    with pytest.raises(RuntimeError, match="no max_pool_forward from a 9x9 bottom"):
        ArrayKernels(np).max_pool_backward(dy, masks[0], x.shape)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pooling_writes_into_out(dtype):
    check_pooling_writes_into_out(K, dtype)


# --------------------------------------------------------------------------------------------
# ReLU, LRN, softmax, SoftmaxWithLoss, SGD
# --------------------------------------------------------------------------------------------
ELEMENTWISE_SHAPES = [(1, 3, 5, 7), (2, 1), (3, 17, 11, 7), (7,)]
LRN_SHAPES = [(1, 3, 5, 7), (2, 7, 4, 3), (2, 40, 3, 5)]
LRN_PARAMS = [(5, 1e-4, 0.75, 1.0), (3, 2.0, 0.5, 2.0), (1, 0.5, 1.3, 1.0), (7, 1.0, 0.75, 1.0)]
SOFTMAX_SHAPES = [(1, 10, 1), (64, 10, 1), (3, 5, 60), (2, 1, 7)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONCAT_CASES, ids=str)
def test_concat_matches_reference(case, dtype):
    check_concat(K, case, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slope", [0.0, 0.1, -0.5])
@pytest.mark.parametrize("shape", ELEMENTWISE_SHAPES, ids=str)
def test_relu_matches_reference(shape, slope, dtype):
    check_relu(K, shape, slope, dtype)


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
    check_lrn(K, shape, params, dtype)
    x = rand(shape, dtype)
    with pytest.raises(ValueError, match="out must not be x"):
        K.lrn_across_forward(x, *params, out=x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
def test_softmax_matches_reference(shape, dtype):
    check_softmax(K, shape, dtype)
    big = np.array([[[1000.0], [1001.0], [-1000.0]]], dtype)
    assert np.isfinite(K.softmax_forward(big)).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore", [None, 1, -1])
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
def test_softmax_loss_matches_reference(shape, ignore, dtype):
    check_softmax_loss(K, shape, ignore, dtype)


def test_softmax_loss_reports_the_first_bad_label_and_floors_at_flt_min():
    check_softmax_loss_bad_label(K)
    check_softmax_loss_floor(K)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("decay", [0.0, 5e-4])
@pytest.mark.parametrize("shape", ELEMENTWISE_SHAPES, ids=str)
def test_sgd_update_matches_reference(shape, decay, dtype):
    data, diff, hist = check_sgd_update(K, shape, decay, dtype)
    with pytest.raises(TypeError, match="one dtype"):
        K.sgd_update(data, diff.astype(np.float16), hist, 0.01, 0.9, decay)
    with pytest.raises(ValueError, match="different sizes"):
        K.sgd_update(data, np.zeros(data.size + 1, dtype), hist, 0.01, 0.9, decay)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BATCH_NORM_SHAPES, ids=str)
def test_batch_norm_matches_reference(shape, dtype):
    check_batch_norm(K, shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, count", ELTWISE_CASES, ids=str)
def test_eltwise_matches_reference(shape, count, dtype):
    check_eltwise(K, shape, count, dtype)
