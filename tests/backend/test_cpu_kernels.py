"""The C++ CPU kernels (cct._C through cct.backend.cpu) against the NumPy reference
(cct.backend.reference): convolution forward, backward data and backward weight, max and
average pooling forward and backward, on hand-picked and random geometries, float32 and
float64."""
import threading

import numpy as np
import pytest

from cct import _C
from cct.backend import cpu, reference

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
    (3, 6, 5, 7, 4, (1, 1), (1, 1), (0, 0), (3, 2), 2),      # 1x1 with groups (no lowering)
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


ALL_CONV = CONV_CASES + _random_conv_cases(12, seed=3)
TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def _conv_arrays(case, dtype, seed=0):
    n, c, h, w, o, kernel, stride, pad, dilation, group = case
    rng = np.random.default_rng(seed)
    ho = cpu.conv_out_size(h, kernel[0], stride[0], pad[0], dilation[0])
    wo = cpu.conv_out_size(w, kernel[1], stride[1], pad[1], dilation[1])
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    weight = rng.standard_normal((o, c // group) + kernel).astype(dtype)
    bias = rng.standard_normal(o).astype(dtype)
    dy = rng.standard_normal((n, o, ho, wo)).astype(dtype)
    return x, weight, bias, dy, (kernel, stride, pad, dilation, group)


def _close(got, want, dtype):
    assert got.dtype == np.dtype(dtype)
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got / scale, want / scale, **TOL[dtype])


@pytest.fixture
def col_buffer_limit():
    """Set the lowering workspace limit for one test, restoring it after."""
    saved = _C.get_col_buffer_limit()
    yield _C.set_col_buffer_limit
    _C.set_col_buffer_limit(saved)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ALL_CONV, ids=str)
def test_conv_matches_reference(case, dtype):
    x, weight, bias, dy, geom = _conv_arrays(case, dtype)
    _close(cpu.conv_forward(x, weight, bias, *geom),
           reference.conv_forward(x, weight, bias, *geom), dtype)
    _close(cpu.conv_forward(x, weight, None, *geom),
           reference.conv_forward(x, weight, None, *geom), dtype)
    _close(cpu.conv_backward_data(dy, weight, x.shape, *geom),
           reference.conv_backward_data(dy, weight, x.shape, *geom), dtype)
    _close(cpu.conv_backward_weight(x, dy, *geom),
           reference.conv_backward_weight(x, dy, *geom), dtype)


@pytest.mark.parametrize("limit", [1, 3000])
@pytest.mark.parametrize("case", [CONV_CASES[2], CONV_CASES[5], CONV_CASES[8], CONV_CASES[10]],
                         ids=str)
def test_conv_in_chunks_of_the_batch(case, limit, col_buffer_limit):
    """A small workspace makes the kernels take the batch a few images (or one) at a time;
    backward weight then accumulates over chunks. One-image chunks read and write the tops in
    place, and 1x1 convolutions then skip the lowering."""
    x, weight, bias, dy, geom = _conv_arrays(case, np.float64)
    x, dy = np.concatenate([x] * 3), np.concatenate([dy] * 3)
    col_buffer_limit(limit)
    _close(cpu.conv_forward(x, weight, bias, *geom),
           reference.conv_forward(x, weight, bias, *geom), np.float64)
    _close(cpu.conv_backward_data(dy, weight, x.shape, *geom),
           reference.conv_backward_data(dy, weight, x.shape, *geom), np.float64)
    _close(cpu.conv_backward_weight(x, dy, *geom),
           reference.conv_backward_weight(x, dy, *geom), np.float64)


@pytest.fixture
def gemm_order():
    """Force the operand order of measured GEMMs for one test (0 = measure again)."""
    yield _C.set_gemm_order
    _C.set_gemm_order(0)


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("case", [CONV_CASES[2], CONV_CASES[3]], ids=str)
def test_conv_weight_gradient_in_both_gemm_orders(case, order, col_buffer_limit, gemm_order):
    """Both operand orders of the weight-gradient GEMM (normally chosen by measurement), whole
    batch and in chunks."""
    x, weight, bias, dy, geom = _conv_arrays(case, np.float64)
    want = reference.conv_backward_weight(x, dy, *geom)
    gemm_order(order)
    _close(cpu.conv_backward_weight(x, dy, *geom), want, np.float64)
    col_buffer_limit(1)
    _close(cpu.conv_backward_weight(x, dy, *geom), want, np.float64)


@pytest.fixture
def partition_mode():
    """Force convolution batch partitioning for one test (0 = measure again)."""
    yield _C.set_partition_mode
    _C.set_partition_mode(0)


@pytest.mark.parametrize("limit", [None, 2000])
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("case", [CONV_CASES[1], CONV_CASES[2], CONV_CASES[8], CONV_CASES[10]],
                         ids=str)
def test_conv_batch_partitions(case, mode, limit, partition_mode, col_buffer_limit):
    """One partition with threaded BLAS, or one per thread (each its slice of the batch, its
    own lowering and single-threaded GEMM, weight gradients summed after); with and without
    chunks; batch 1 leaves a partition empty."""
    x, weight, bias, dy, geom = _conv_arrays(case, np.float64)
    partition_mode(mode)
    if limit:
        col_buffer_limit(limit)
    saved = cpu.get_num_threads()
    try:
        cpu.set_num_threads(3)
        _close(cpu.conv_forward(x, weight, bias, *geom),
               reference.conv_forward(x, weight, bias, *geom), np.float64)
        _close(cpu.conv_backward_data(dy, weight, x.shape, *geom),
               reference.conv_backward_data(dy, weight, x.shape, *geom), np.float64)
        _close(cpu.conv_backward_weight(x, dy, *geom),
               reference.conv_backward_weight(x, dy, *geom), np.float64)
    finally:
        cpu.set_num_threads(saved)


def test_partitioning_is_measured_once_per_layer():
    saved = cpu.get_num_threads()
    try:
        cpu.set_num_threads(2)
        x, weight, bias, dy, geom = _conv_arrays((4, 3, 9, 9, 5, (3, 3), (1, 1), (1, 1), (1, 1),
                                                  1), np.float32)
        for _ in range(3):
            y = cpu.conv_forward(x, weight, bias, *geom)
        _close(y, reference.conv_forward(x, weight, bias, *geom), np.float32)
    finally:
        cpu.set_num_threads(saved)
    mine = [c for c in _C.partition_choices() if c[0] == 0 and c[1][:5] == [4, 3, 9, 9, 5]]
    assert len(mine) == 1 and mine[0][2] in (1, 2)


def test_gemm_order_is_measured_once_per_shape():
    x, weight, bias, dy, geom = _conv_arrays(CONV_CASES[4], np.float32)
    cpu.conv_backward_weight(x, dy, *geom)
    cpu.conv_backward_weight(x, dy, *geom)
    o, c, h, w = weight.shape[0], x.shape[1], dy.shape[2], dy.shape[3]
    key = (False, True, o, c * geom[0][0] * geom[0][1], x.shape[0] * h * w, 4)
    assert [choice[:6] for choice in _C.gemm_choices()].count(key) == 1


def test_conv_takes_non_contiguous_arrays_and_keeps_float32():
    x, weight, bias, dy, geom = _conv_arrays(CONV_CASES[0], np.float32)
    xt = np.asfortranarray(x)
    y = cpu.conv_forward(xt, weight, bias, *geom)
    _close(y, reference.conv_forward(x, weight, bias, *geom), np.float32)
    geom_np = tuple(np.array(g) for g in geom[:4]) + (np.int64(geom[4]),)
    _close(cpu.conv_forward(x, weight, bias, *geom_np), y, np.float32)


def test_conv_rejects_geometry_that_does_not_fit():
    x, weight, bias, dy, geom = _conv_arrays(CONV_CASES[2], np.float32)
    with pytest.raises(ValueError, match="group"):
        cpu.conv_forward(x, weight, bias, geom[0], geom[1], geom[2], geom[3], 1)
    with pytest.raises(ValueError, match="kernel"):
        cpu.conv_forward(x, weight, bias, (3, 3), geom[1], geom[2], geom[3], geom[4])
    with pytest.raises(ValueError, match="top size"):
        cpu.conv_backward_data(dy, weight, (3, 4, 30, 10), *geom)
    with pytest.raises(TypeError, match="float32 or float64"):
        cpu.conv_forward(x.astype(np.float16), weight, bias, *geom)


def test_conv_from_several_python_threads():
    """The kernels release the GIL and keep their workspace per thread."""
    cases = [_conv_arrays(case, np.float64, seed=i) for i, case in enumerate(CONV_CASES[:4])]
    want = [reference.conv_backward_weight(x, dy, *g) for x, _, _, dy, g in cases]
    got = [None] * len(cases)

    def run(i):
        x, _, _, dy, g = cases[i]
        for _ in range(20):
            got[i] = cpu.conv_backward_weight(x, dy, *g)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, w in zip(got, want):
        _close(g, w, np.float64)


def test_results_do_not_depend_on_thread_count():
    x, weight, bias, dy, geom = _conv_arrays((8, 8, 40, 40, 8, (3, 3), (1, 1), (1, 1), (1, 1),
                                              1), np.float64)
    saved = cpu.get_num_threads()
    try:
        cpu.set_num_threads(1)
        assert cpu.get_num_threads() == 1
        one = cpu.conv_backward_data(dy, weight, x.shape, *geom)
        cpu.set_num_threads(2)
        two = cpu.conv_backward_data(dy, weight, x.shape, *geom)
    finally:
        cpu.set_num_threads(saved)
    np.testing.assert_array_equal(one, two)
    cpu.set_num_threads(0)
    assert cpu.get_num_threads() == _C.available_cores()
    cpu.set_num_threads(saved)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True)])
def test_gemm(trans_a, trans_b, dtype):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((7, 5)).astype(dtype)
    b = rng.standard_normal((5, 9) if not trans_b else (9, 5)).astype(dtype)
    a_op = a.T.copy() if trans_a else a
    want = a @ (b.T if trans_b else b)
    _close(_C.gemm(a_op, b, trans_a, trans_b), want, dtype)


@pytest.mark.parametrize("order", [0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_takes_views_and_empty_shapes(dtype, order, gemm_order):
    gemm_order(order)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 4)).astype(dtype)
    b = rng.standard_normal((6, 5)).astype(dtype)
    _close(cpu.matmul(a.T, b), a.T @ b, dtype)                 # transposed view, no copy
    _close(cpu.matmul(b.T, a), b.T @ a, dtype)
    _close(cpu.matmul(a[::2], a[::2].T), a[::2] @ a[::2].T, dtype)  # strided: copied
    _close(cpu.matmul(a[:, :0], b[:4].T[:0]), np.zeros((6, 4)), dtype)  # K = 0
    assert cpu.matmul(a[:0], b[:4]).shape == (0, 5)


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
        # Skip windows that lie wholly outside the bottom (test_empty_window_is_caffes).
        if any((cpu.pool_out_size(s, k, st, p, ceil_mode) - 1) * st - p >= s
               for s, k, st, p in zip((h, w), kernel, stride, pad)):
            continue
        cases.append((int(rng.integers(1, 4)), int(rng.integers(1, 4)), h, w, kernel, stride,
                      pad, ceil_mode))
    return cases


ALL_POOL = POOL_CASES + _random_pool_cases(12, seed=5)


def _pool_arrays(case, dtype):
    n, c, h, w, kernel, stride, pad, ceil_mode = case
    out = tuple(cpu.pool_out_size(s, k, st, p, ceil_mode)
                for s, k, st, p in zip((h, w), kernel, stride, pad))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    dy = rng.standard_normal((n, c) + out).astype(dtype)
    return x, dy, (kernel, stride, pad, out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ALL_POOL, ids=str)
def test_max_pool_matches_reference(case, dtype):
    x, dy, geom = _pool_arrays(case, dtype)
    y, mask = cpu.max_pool_forward(x, *geom)
    y_ref, mask_ref = reference.max_pool_forward(x, *geom)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(mask, mask_ref)
    assert y.dtype == np.dtype(dtype) and mask.dtype == np.int64
    _close(cpu.max_pool_backward(dy, mask, x.shape),
           reference.max_pool_backward(dy, mask_ref, x.shape), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ALL_POOL, ids=str)
def test_ave_pool_matches_reference(case, dtype):
    x, dy, geom = _pool_arrays(case, dtype)
    _close(cpu.ave_pool_forward(x, *geom), reference.ave_pool_forward(x, *geom), dtype)
    _close(cpu.ave_pool_backward(dy, x.shape, *geom),
           reference.ave_pool_backward(dy, x.shape, *geom), dtype)


def test_max_pool_ties_go_to_the_first_element():
    x = np.zeros((1, 1, 4, 4), np.float32)
    y, mask = cpu.max_pool_forward(x, (2, 2), (2, 2), (0, 0), (2, 2))
    np.testing.assert_array_equal(mask.ravel(), [0, 2, 8, 10])
    np.testing.assert_array_equal(y, 0)


def test_empty_window_is_caffes():
    """Ceil rounding without pad can place a last window wholly beyond the bottom (height 14,
    kernel 1, stride 3: 6 rows, the last at 15). Caffe leaves such a MAX top at -FLT_MAX with
    mask -1, and its AVE divisor is end - start = -1, so the top is 0 / -1."""
    x = np.ones((1, 1, 14, 4), np.float32)
    geom = ((1, 1), (3, 1), (0, 0), (cpu.pool_out_size(14, 1, 3, 0, True), 4))
    assert geom[3][0] == 6
    y, mask = cpu.max_pool_forward(x, *geom)
    np.testing.assert_array_equal(y[0, 0, 5], -np.finfo(np.float32).max)
    np.testing.assert_array_equal(mask[0, 0, 5], -1)
    np.testing.assert_array_equal(y[0, 0, :5], 1)
    dx = cpu.max_pool_backward(np.ones_like(y), mask, x.shape)
    assert dx.sum() == 20
    ave = cpu.ave_pool_forward(x, *geom)
    np.testing.assert_array_equal(ave[0, 0, 5], 0)
    np.testing.assert_array_equal(ave[0, 0, :5], 1)
