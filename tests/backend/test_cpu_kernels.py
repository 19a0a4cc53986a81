"""The C++ CPU kernels (cct._C through cct.backend.cpu) against the NumPy reference
(cct.backend.reference): convolution forward, backward data and backward weight, max and
average pooling forward and backward, on hand-picked and random geometries, float32 and
float64."""
import os
import signal
import threading
import time

import numpy as np
import pytest

from cct import _C
from cct.backend import cpu, reference
from tests.backend import kernel_cases
from tests.backend.kernel_cases import (BATCH_NORM_SHAPES, CONCAT_CASES, ELTWISE_CASES,
                                        check_batch_norm, check_concat,
                                        check_eltwise,
                                        DTYPES, check_ave_pool, check_conv, check_lrn,
                                        check_max_pool, check_pooling_writes_into_out, check_relu,
                                        check_sgd_update, check_softmax, check_softmax_loss,
                                        check_softmax_loss_bad_label, check_softmax_loss_floor,
                                        close, conv_arrays, rand, random_conv_cases,
                                        random_pool_cases)

CONV_CASES = kernel_cases.CONV_CASES + [
    (3, 6, 5, 7, 4, (1, 1), (1, 1), (0, 0), (3, 2), 2),      # 1x1 with groups (no lowering)
]
ALL_CONV = CONV_CASES + random_conv_cases(12, seed=3)


@pytest.fixture
def col_buffer_limit():
    """Set the lowering workspace limit for one test, restoring it after."""
    saved = _C.get_col_buffer_limit()
    yield _C.set_col_buffer_limit
    _C.set_col_buffer_limit(saved)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ALL_CONV, ids=str)
def test_conv_matches_reference(case, dtype):
    x, weight, bias, dy, geom = conv_arrays(case, dtype)
    check_conv(cpu, x, weight, bias, dy, geom, dtype, no_bias=True)


@pytest.mark.parametrize("limit", [1, 3000])
@pytest.mark.parametrize("case", [CONV_CASES[2], CONV_CASES[5], CONV_CASES[8], CONV_CASES[10]],
                         ids=str)
def test_conv_in_chunks_of_the_batch(case, limit, col_buffer_limit):
    """A small workspace makes the kernels take the batch a few images (or one) at a time;
    backward weight then accumulates over chunks. One-image chunks read and write the tops in
    place, and 1x1 convolutions then skip the lowering."""
    x, weight, bias, dy, geom = conv_arrays(case, np.float64)
    x, dy = np.concatenate([x] * 3), np.concatenate([dy] * 3)
    col_buffer_limit(limit)
    check_conv(cpu, x, weight, bias, dy, geom, np.float64)


@pytest.fixture
def num_threads():
    """Set the kernels' thread count for one test, restoring it after."""
    saved = cpu.get_num_threads()
    yield cpu.set_num_threads
    cpu.set_num_threads(saved)


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
    x, weight, bias, dy, geom = conv_arrays(case, np.float64)
    want = reference.conv_backward_weight(x, dy, *geom)
    gemm_order(order)
    close(cpu.conv_backward_weight(x, dy, *geom), want, np.float64)
    col_buffer_limit(1)
    close(cpu.conv_backward_weight(x, dy, *geom), want, np.float64)


@pytest.fixture
def partition_mode():
    """Force convolution batch partitioning for one test (0 = measure again)."""
    yield _C.set_partition_mode
    _C.set_partition_mode(0)


@pytest.mark.parametrize("limit", [None, 2000])
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("case", [CONV_CASES[1], CONV_CASES[2], CONV_CASES[8], CONV_CASES[10]],
                         ids=str)
def test_conv_batch_partitions(case, mode, limit, partition_mode, col_buffer_limit,
                               num_threads):
    """One partition with threaded BLAS, or one per thread (each its slice of the batch, its
    own lowering and single-threaded GEMM, weight gradients summed after); with and without
    chunks; batch 1 leaves a partition empty."""
    x, weight, bias, dy, geom = conv_arrays(case, np.float64)
    partition_mode(mode)
    if limit:
        col_buffer_limit(limit)
    num_threads(3)
    check_conv(cpu, x, weight, bias, dy, geom, np.float64)


def test_partitioning_is_measured_once_per_layer(num_threads):
    num_threads(2)
    x, weight, bias, dy, geom = conv_arrays((4, 3, 9, 9, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1),
                                            np.float32)
    for _ in range(3):
        y = cpu.conv_forward(x, weight, bias, *geom)
    close(y, reference.conv_forward(x, weight, bias, *geom), np.float32)
    mine = [c for c in _C.partition_choices() if c[0] == 0 and c[1][:5] == [4, 3, 9, 9, 5]]
    assert len(mine) == 1 and mine[0][2] in (1, 2)


def test_gemm_order_is_measured_once_per_shape():
    x, weight, bias, dy, geom = conv_arrays(CONV_CASES[4], np.float32)
    cpu.conv_backward_weight(x, dy, *geom)
    cpu.conv_backward_weight(x, dy, *geom)
    o, c, h, w = weight.shape[0], x.shape[1], dy.shape[2], dy.shape[3]
    key = (False, True, o, c * geom[0][0] * geom[0][1], x.shape[0] * h * w, 4)
    assert [choice[:6] for choice in _C.gemm_choices()].count(key) == 1


def test_conv_takes_non_contiguous_arrays_and_keeps_float32():
    x, weight, bias, dy, geom = conv_arrays(CONV_CASES[0], np.float32)
    xt = np.asfortranarray(x)
    y = cpu.conv_forward(xt, weight, bias, *geom)
    close(y, reference.conv_forward(x, weight, bias, *geom), np.float32)
    geom_np = tuple(np.array(g) for g in geom[:4]) + (np.int64(geom[4]),)
    close(cpu.conv_forward(x, weight, bias, *geom_np), y, np.float32)


def test_conv_rejects_geometry_that_does_not_fit():
    x, weight, bias, dy, geom = conv_arrays(CONV_CASES[2], np.float32)
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
    cases = [conv_arrays(case, np.float64, seed=i) for i, case in enumerate(CONV_CASES[:4])]
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
        close(g, w, np.float64)


def test_results_do_not_depend_on_thread_count(num_threads):
    x, weight, bias, dy, geom = conv_arrays((8, 8, 40, 40, 8, (3, 3), (1, 1), (1, 1), (1, 1), 1),
                                            np.float64)
    num_threads(1)
    assert cpu.get_num_threads() == 1
    one = cpu.conv_backward_data(dy, weight, x.shape, *geom)
    num_threads(2)
    two = cpu.conv_backward_data(dy, weight, x.shape, *geom)
    np.testing.assert_array_equal(one, two)
    num_threads(0)
    assert cpu.get_num_threads() == _C.available_cores()


@pytest.mark.parametrize("gap_us", [0, 50, 150, 250, 2000])
@pytest.mark.parametrize("threads", [2, 3])
def test_parallel_loops_any_gap_apart_all_run(num_threads, threads, gap_us):
    """cct's workers spin for a while after a parallel loop, then block (csrc/threads.cpp), and
    a threaded BLAS call parks them at once: a loop that finds them spinning, blocking, blocked
    or parked still runs every part of its work, whatever the gap since the last one."""
    num_threads(threads)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1 << 18, dtype=np.float32)  # over the grain: one slice per thread
    a = rng.standard_normal((96, 96), dtype=np.float32)
    for i in range(40):
        deadline = time.perf_counter() + gap_us * 1e-6
        while time.perf_counter() < deadline:
            pass
        if i % 3 == 2:
            _C.gemm(a, a)  # the BLAS's threads: parks the spinning workers
        shift = np.float32(i % 5 - 2)
        np.testing.assert_array_equal(cpu.relu_forward(x + shift, 0.0),
                                      np.maximum(x + shift, 0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True)])
def test_gemm(trans_a, trans_b, dtype):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((7, 5)).astype(dtype)
    b = rng.standard_normal((5, 9) if not trans_b else (9, 5)).astype(dtype)
    a_op = a.T.copy() if trans_a else a
    want = a @ (b.T if trans_b else b)
    close(_C.gemm(a_op, b, trans_a, trans_b), want, dtype)


@pytest.mark.parametrize("order", [0, 1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_takes_views_and_empty_shapes(dtype, order, gemm_order):
    gemm_order(order)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 4)).astype(dtype)
    b = rng.standard_normal((6, 5)).astype(dtype)
    close(cpu.matmul(a.T, b), a.T @ b, dtype)                 # transposed view, no copy
    close(cpu.matmul(b.T, a), b.T @ a, dtype)
    close(cpu.matmul(a[::2], a[::2].T), a[::2] @ a[::2].T, dtype)  # strided: copied
    close(cpu.matmul(a[:, :0], b[:4].T[:0]), np.zeros((6, 4)), dtype)  # K = 0
    assert cpu.matmul(a[:0], b[:4]).shape == (0, 5)


# --------------------------------------------------------------------------------------------
# Outputs given by the caller (out=), accumulation into param diffs, the pointwise layout
# --------------------------------------------------------------------------------------------
@pytest.fixture
def conv_layout():
    """Force the layout of pointwise convolutions for one test (0 = measure again)."""
    yield _C.set_conv_layout
    _C.set_conv_layout(0)


@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [CONV_CASES[1], CONV_CASES[2], CONV_CASES[5], CONV_CASES[10]],
                         ids=str)
def test_conv_writes_into_out_and_accumulates(case, dtype, mode, partition_mode):
    """out= is written in place and returned; whatever it held is overwritten, except with
    accumulate, where the weight gradient is added to it."""
    x, weight, bias, dy, geom = conv_arrays(case, dtype)
    partition_mode(mode)
    y = np.full(reference.conv_forward(x, weight, bias, *geom).shape, np.nan, dtype)
    assert cpu.conv_forward(x, weight, bias, *geom, out=y) is y
    close(y, reference.conv_forward(x, weight, bias, *geom), dtype)
    dx = np.full(x.shape, np.nan, dtype)
    assert cpu.conv_backward_data(dy, weight, x.shape, *geom, out=dx) is dx
    close(dx, reference.conv_backward_data(dy, weight, x.shape, *geom), dtype)
    grad = reference.conv_backward_weight(x, dy, *geom)
    dw = np.full(weight.shape, np.nan, dtype)
    assert cpu.conv_backward_weight(x, dy, *geom, out=dw) is dw
    close(dw, grad, dtype)
    before = rand(weight.shape, dtype, 7)
    dw = before.copy()
    assert cpu.conv_backward_weight(x, dy, *geom, out=dw, accumulate=True) is dw
    close(dw, before + grad, dtype)


def test_accumulate_is_exact_on_the_first_call_that_measures(num_threads):
    """The first call of a geometry runs the kernel once per candidate plan to time them;
    an accumulating call must still add the gradient exactly once."""
    num_threads(2)
    for case in [(4, 6, 7, 5, 4, (1, 1), (1, 1), (0, 0), (1, 1), 2),  # 4 candidate plans
                 (4, 3, 9, 8, 5, (3, 2), (1, 2), (1, 0), (1, 1), 1)]:  # 2
        x, weight, _, dy, geom = conv_arrays(case, np.float64, seed=11)
        before = rand(weight.shape, np.float64, 3)
        dw = before.copy()
        cpu.conv_backward_weight(x, dy, *geom, out=dw, accumulate=True)
        close(dw, before + reference.conv_backward_weight(x, dy, *geom), np.float64)
        mine = [c for c in _C.partition_choices() if c[0] == 2 and c[1][:5] == list(case[:5])]
        assert len(mine) == 1


def check_weight_gradient_accumulates(x, weight, dy, geom, dtype):
    """conv_backward_weight with accumulate=True adds the gradient to what out= held."""
    before = rand(weight.shape, dtype, 5)
    dw = before.copy()
    cpu.conv_backward_weight(x, dy, *geom, out=dw, accumulate=True)
    close(dw, before + reference.conv_backward_weight(x, dy, *geom), dtype)


@pytest.mark.parametrize("limit", [None, 1, 3000])
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("case", [CONV_CASES[5], CONV_CASES[10],
                                  (1, 4, 3, 3, 8, (1, 1), (1, 1), (0, 0), (1, 1), 4),
                                  (5, 8, 6, 5, 6, (1, 1), (1, 1), (0, 0), (1, 1), 2)], ids=str)
def test_pointwise_layout(case, mode, limit, conv_layout, partition_mode, col_buffer_limit,
                          num_threads):
    """1x1 convolutions with stride 1 and no pad, computed on the blobs themselves (no
    lowering): with groups, batch 1, one or several partitions, whole or chunked batches."""
    x, weight, bias, dy, geom = conv_arrays(case, np.float64)
    conv_layout(2)
    partition_mode(mode)
    if limit:
        col_buffer_limit(limit)
    num_threads(3)
    check_conv(cpu, x, weight, bias, dy, geom, np.float64, weight_grad=False, no_bias=True)
    check_weight_gradient_accumulates(x, weight, dy, geom, np.float64)


def test_layout_is_measured_for_pointwise_layers_only(num_threads):
    num_threads(2)
    for case in [(3, 5, 6, 7, 4, (1, 1), (1, 1), (0, 0), (1, 1), 1),
                 (3, 5, 6, 7, 4, (1, 1), (2, 2), (0, 0), (1, 1), 1)]:  # strided: lowered
        x, weight, bias, dy, geom = conv_arrays(case, np.float32)
        cpu.conv_forward(x, weight, bias, *geom)
    layouts = {tuple(c[1][7:11]): c[3] for c in _C.partition_choices()
               if c[0] == 0 and c[1][:5] == [3, 5, 6, 7, 4]}
    assert layouts[(1, 1, 1, 1)] in ("lowered", "pointwise", "direct", "direct16")
    assert layouts[(1, 1, 2, 2)] == "lowered"


# The direct layout (csrc/conv_direct.cpp): stride-1 float32 layers on AVX2/FMA CPUs. Its
# cases add what the hand-picked ones lack for it: several tiles of 4 channels and 3 vectors
# with a partial last one, rows of 8 and of more than 8 pixels, weight-gradient chunks of
# several images.
DIRECT_CASES = [c for c in ALL_CONV + random_conv_cases(40, seed=8) if c[6] == (1, 1)] + [
    (3, 32, 16, 16, 32, (5, 5), (1, 1), (2, 2), (1, 1), 1),  # CIFAR10-quick conv2 in small
    (2, 5, 13, 13, 7, (3, 3), (1, 1), (1, 1), (1, 1), 1),    # CaffeNet conv3-like rows
    (2, 4, 9, 21, 6, (5, 5), (1, 1), (2, 2), (1, 1), 2),     # groups, 3 vectors per row
    (2, 3, 12, 12, 5, (3, 3), (1, 1), (2, 2), (2, 2), 1),    # dilation with pad
    (12, 16, 20, 20, 9, (3, 3), (1, 1), (1, 1), (1, 1), 1),  # weight gradient in 3 chunks
    # rows that the 16-lane layout runs in its pair form (8 pixels of two channels a vector)
    (2, 20, 12, 12, 50, (5, 5), (1, 1), (0, 0), (1, 1), 1),  # LeNet conv2: rows of 8
    (2, 1, 28, 28, 20, (5, 5), (1, 1), (0, 0), (1, 1), 1),   # LeNet conv1: rows of 24
    (3, 5, 7, 7, 7, (3, 3), (1, 1), (1, 1), (1, 1), 1),      # rows of 7, a quad of 3
]
needs_direct = pytest.mark.skipif(not _C.cpu_has_direct_conv(),
                                  reason="the direct layout needs a CPU with AVX2 and FMA")


@needs_direct
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("case", DIRECT_CASES, ids=str)
def test_direct_layout(case, mode, threads, conv_layout, partition_mode, num_threads):
    """Forced direct (backward data falls back to lowered where its pad would be negative):
    one or several partitions, one or several threads, and accumulation into a weight diff."""
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    conv_layout(3)
    partition_mode(mode)
    num_threads(threads)
    check_conv(cpu, x, weight, bias, dy, geom, np.float32, no_bias=True)
    check_weight_gradient_accumulates(x, weight, dy, geom, np.float32)


needs_avx512 = pytest.mark.skipif(not (_C.cpu_has_direct_conv() and _C.cpu_has_avx512()),
                                  reason="the direct layout's AVX-512 tiles need AVX-512")


@needs_avx512
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("case", DIRECT_CASES, ids=str)
def test_direct_tiles_of_16_lanes_give_the_same_bits(case, mode, conv_layout, partition_mode,
                                                     num_threads):
    """The AVX-512 tiles (layout 9) compute each sum with the same fused multiply-adds in the
    same order as the AVX2 ones (layout 3), so measurement may pick either: forward and
    backward data (vectors of 16 pixels against 8, or on rows of 1-8 pixels past a multiple
    of 16, two output channels' 8 pixels to a vector), and the weight gradient (two output
    channels' 8 pixels to a vector against one's), overwritten and accumulated, to the bit."""
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    before = rand(weight.shape, np.float32, 5)
    partition_mode(mode)
    num_threads(3)
    results = {}
    for layout in (3, 9):
        conv_layout(layout)
        dw = before.copy()
        cpu.conv_backward_weight(x, dy, *geom, out=dw, accumulate=True)
        results[layout] = (cpu.conv_forward(x, weight, bias, *geom),
                           cpu.conv_backward_data(dy, weight, x.shape, *geom),
                           cpu.conv_backward_weight(x, dy, *geom), dw)
    for got, want in zip(results[9], results[3]):
        np.testing.assert_array_equal(got, want)


@needs_direct
def test_direct_layout_repeats_to_the_bit_on_any_thread_count(conv_layout, partition_mode,
                                                              num_threads):
    """Each output is summed in one fixed order: threads split images (forward, backward data)
    or output channels (weight gradient, one partition), never a sum."""
    x, weight, bias, dy, geom = conv_arrays((5, 12, 11, 19, 10, (5, 3), (1, 1), (2, 1), (1, 1), 1),
                                            np.float32)
    conv_layout(3)
    partition_mode(1)
    runs = []
    for threads in (1, 2, 3):
        num_threads(threads)
        runs.append([cpu.conv_forward(x, weight, bias, *geom),
                     cpu.conv_backward_data(dy, weight, x.shape, *geom),
                     cpu.conv_backward_weight(x, dy, *geom)])
    for run in runs[1:]:
        for got, want in zip(run, runs[0]):
            np.testing.assert_array_equal(got, want)


def test_direct_layout_is_measured_for_stride_1_float32_only(num_threads):
    num_threads(2)
    cases = [((3, 4, 9, 9, 8, (3, 3), (1, 1), (1, 1), (1, 1), 1), np.float32),
             ((3, 4, 9, 9, 8, (3, 3), (2, 2), (1, 1), (1, 1), 1), np.float32),
             ((3, 4, 9, 10, 8, (3, 3), (1, 1), (1, 1), (1, 1), 1), np.float64)]
    for case, dtype in cases:
        x, weight, bias, dy, geom = conv_arrays(case, dtype)
        cpu.conv_forward(x, weight, bias, *geom)
    layouts = {(c[1][3], c[1][9]): c[3] for c in _C.partition_choices()
               if c[0] == 0 and c[1][:3] == [3, 4, 9] and c[1][4] == 8}
    assert layouts[(9, 2)] != "direct" and layouts[(10, 1)] != "direct"
    if not _C.cpu_has_direct_conv():
        assert layouts[(9, 1)] != "direct"


@needs_direct
def test_a_direct_plan_where_it_cannot_run_runs_lowered(num_threads):
    """A plan table from another machine may name the direct layout for a float64 layer, or
    for backward data whose pad exceeds the kernel: those run lowered, correctly."""
    for case, dtype, kernel in [((2, 3, 7, 7, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1), np.float64, 0),
                                ((2, 3, 7, 7, 4, (3, 3), (1, 1), (3, 3), (1, 1), 1), np.float32, 1)]:
        x, weight, bias, dy, geom = conv_arrays(case, dtype)
        n, c, h, w, o = case[:5]
        ho = dy.shape[2]
        key = [n, c, h, w, o, ho, dy.shape[3], 3, 3, 1, 1, case[7][0], case[7][1], 1, 1, 1]
        num_threads(2)
        _C.load_conv_plans([(kernel, key, np.dtype(dtype).itemsize, 2, 0, 2, 2, False)])
        check_conv(cpu, x, weight, bias, dy, geom, dtype)
        assert (kernel, key, 2, "direct") in _C.partition_choices()  # the plan stood


# The Winograd layout (csrc/conv_winograd.cpp): 3x3 and 5x5, stride-1, undilated float32
# layers, all three kernels. Odd sizes cut the 2x2 tiles at the top's edge; pad k leaves
# backward data lowered (its flipped pad k - 1 - p would be -1); pad 0 with a k-pixel bottom is
# one tile; 32 x 16 x 16 tiles of 32 channels make V's matrices 4 KiB apart before their skew.
WINOGRAD_CASES = [
    (2, 3, 7, 9, 4, (3, 3), (1, 1), (0, 0), (1, 1), 1),
    (1, 3, 8, 8, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (3, 4, 11, 10, 6, (3, 3), (1, 1), (2, 1), (1, 1), 2),
    (2, 6, 13, 13, 9, (3, 3), (1, 1), (1, 1), (1, 1), 3),
    (2, 2, 5, 6, 3, (3, 3), (1, 1), (3, 2), (1, 1), 1),
    (2, 2, 3, 3, 3, (3, 3), (1, 1), (0, 0), (1, 1), 1),
    (4, 16, 12, 7, 24, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (2, 3, 9, 9, 4, (5, 5), (1, 1), (2, 2), (1, 1), 1),
    (3, 4, 11, 10, 6, (5, 5), (1, 1), (4, 3), (1, 1), 2),
    (2, 2, 8, 9, 3, (5, 5), (1, 1), (5, 1), (1, 1), 1),
    (2, 3, 5, 5, 5, (5, 5), (1, 1), (0, 0), (1, 1), 1),
    (2, 32, 16, 16, 32, (5, 5), (1, 1), (2, 2), (1, 1), 1),
]


# The phase layouts (csrc/conv_phase.cpp): a strided undilated float32 layer as a stride-1 one
# over its bottom's phase planes, computed by the direct layout (6, or 10 with 16-pixel vectors)
# or Winograd F(2x2) (7) or F(4x4, 3x3) (8) where they apply to the phase form, whose kernel is ceil(k / stride) a side.
# The cases: CaffeNet's conv1 in small (11x11, stride 4: a 3x3 phase kernel), GoogLeNet's (7x7
# stride 2 pad 3: 4x4), kernels that are no multiple of the stride, different strides per axis
# with a rectangular kernel, groups, a 5x5 phase kernel, bottom rows and columns no tap reads
# (their gradient is zero), and a stride equal to the kernel (a 1x1 phase kernel).
PHASE_CASES = [
    (2, 3, 27, 27, 8, (11, 11), (4, 4), (0, 0), (1, 1), 1),
    (2, 3, 17, 16, 6, (7, 7), (2, 2), (3, 3), (1, 1), 1),
    (3, 4, 13, 11, 6, (3, 3), (2, 2), (1, 1), (1, 1), 2),
    (2, 3, 20, 19, 5, (5, 4), (3, 2), (2, 1), (1, 1), 1),
    (2, 2, 12, 12, 4, (6, 6), (2, 2), (0, 0), (1, 1), 1),
    (1, 6, 15, 15, 6, (9, 9), (3, 3), (4, 4), (1, 1), 3),
    (2, 2, 13, 12, 3, (10, 10), (2, 2), (5, 4), (1, 1), 1),
    (2, 3, 14, 15, 4, (5, 5), (4, 4), (0, 0), (1, 1), 1),
    (2, 3, 9, 8, 5, (2, 2), (2, 2), (0, 1), (1, 1), 1),
]


def phase_layouts(case):
    """The phase layouts that apply to a case (their stride-1 layout applies to its phase
    form)."""
    kernel, stride = case[5], case[6]
    phase_kernel = tuple(-(-k // s) for k, s in zip(kernel, stride))
    layouts = [6] if _C.cpu_has_direct_conv() else []
    if phase_kernel in ((3, 3), (5, 5)):
        layouts.append(7)
    if phase_kernel == (3, 3):
        layouts.append(8)
    if _C.cpu_has_direct_conv() and _C.cpu_has_avx512():
        layouts.append(10)  # direct's AVX-512 tiles
    return layouts


@pytest.mark.parametrize("limit", [None, 1])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("case, layout",
                         [(c, 4) for c in WINOGRAD_CASES]
                         + [(c, 5) for c in WINOGRAD_CASES if c[5] == (3, 3)]
                         + [(c, layout) for c in PHASE_CASES for layout in phase_layouts(c)],
                         ids=str)
def test_winograd_and_phase_layouts(case, layout, mode, threads, limit, conv_layout,
                                    partition_mode, num_threads, col_buffer_limit):
    """Forced Winograd, 2x2 (layout 4) or, for 3x3 layers, 4x4 (5) output tiles, and the
    phase layouts of strided layers (6-8, 10), against the reference: one or several
    partitions and threads, the batch whole or an image at a time (the weight gradient then
    sums over chunks), accumulating into a weight diff."""
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    conv_layout(layout)
    partition_mode(mode)
    num_threads(threads)
    if limit:
        col_buffer_limit(limit)
    check_conv(cpu, x, weight, bias, dy, geom, np.float32, no_bias=True)
    check_weight_gradient_accumulates(x, weight, dy, geom, np.float32)


def test_phase_layouts_are_measured_for_strided_undilated_float32_only(num_threads):
    """A measured plan may be a phase layout only on a strided, undilated float32 layer whose
    kernel is at least its stride, and never under Caffe's engine."""
    num_threads(2)
    _C.clear_plans()
    cases = [((3, 4, 9, 9, 6, (3, 3), (1, 1), (1, 1), (1, 1), 1), np.float32, "DEFAULT"),
             ((3, 4, 9, 9, 6, (3, 3), (2, 2), (1, 1), (2, 2), 1), np.float32, "DEFAULT"),
             ((3, 4, 9, 9, 6, (1, 1), (2, 2), (0, 0), (1, 1), 1), np.float32, "DEFAULT"),
             ((3, 4, 9, 9, 6, (3, 3), (2, 2), (1, 1), (1, 1), 1), np.float64, "DEFAULT"),
             ((3, 4, 9, 9, 6, (5, 5), (2, 2), (1, 1), (1, 1), 1), np.float32, "CAFFE")]
    for case, dtype, engine in cases:
        x, weight, bias, dy, geom = conv_arrays(case, dtype)
        cpu.conv_forward(x, weight, bias, *geom, engine=engine)
        cpu.conv_backward_data(dy, weight, x.shape, *geom, engine=engine)
        cpu.conv_backward_weight(x, dy, *geom, engine=engine)
    assert len(_C.conv_plan_table()) == 3 * len(cases)
    assert not [c for c in _C.partition_choices() if c[3].startswith("phase")]


def test_a_phase_plan_where_it_cannot_run_runs_lowered(num_threads):
    """A plan table from another machine may name a phase layout for a float64 layer or for a
    geometry with no phase form (stride 1): those run lowered, correctly."""
    num_threads(2)
    for case, dtype in [((2, 3, 11, 11, 4, (5, 5), (2, 2), (1, 1), (1, 1), 1), np.float64),
                        ((2, 3, 7, 7, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1), np.float32)]:
        x, weight, bias, dy, geom = conv_arrays(case, dtype)
        n, c, h, w, o, kernel, stride, pad = case[:8]
        key = [n, c, h, w, o, *dy.shape[2:], *kernel, *stride, *pad, 1, 1, 1]
        _C.load_conv_plans([(k, key, np.dtype(dtype).itemsize, 2, 0, 2, 5, False)
                            for k in range(3)])
        check_conv(cpu, x, weight, bias, dy, geom, dtype)
        assert (0, key, 2, "phase-direct") in _C.partition_choices()  # the plan stood


@pytest.mark.parametrize("layout", [3, 4, 5, 6, 7, 8, 9, 10])
def test_a_forced_layout_is_what_runs(layout, conv_layout):
    """Forcing direct (3), Winograd (4), Winograd F(4x4, 3x3) (5), their phase forms (6-8, on
    a 6x6 stride-2 layer: a 3x3 phase kernel), direct's AVX-512 tiles (9) or their phase form
    (10) runs another algorithm than lowered (1), not a fallback: each kernel's plan names
    the forced layout, and the results of both agree with lowered's to float32 rounding. (Not
    "differ in the last bits": on AVX-512, OpenBLAS's kernel and the direct one can sum a
    short k in the same order, to the same bits.)"""
    if layout in (3, 6, 9, 10) and not _C.cpu_has_direct_conv():
        pytest.skip("the direct layout needs a CPU with AVX2 and FMA")
    if layout in (9, 10) and not _C.cpu_has_avx512():
        pytest.skip("the direct layout's 16-pixel tile needs AVX-512")
    kernel, stride = ((6, 6), (2, 2)) if layout in (6, 7, 8, 10) else ((3, 3), (1, 1))
    x, weight, bias, dy, geom = conv_arrays((4, 16, 12, 7, 24, kernel, stride, (1, 1), (1, 1), 1),
                                            np.float32)
    _C.clear_plans()
    results = {}
    for mode in (1, layout):
        conv_layout(mode)
        results[mode] = (cpu.conv_forward(x, weight, bias, *geom),
                         cpu.conv_backward_data(dy, weight, x.shape, *geom),
                         cpu.conv_backward_weight(x, dy, *geom))
    for lowered, other in zip(results[1], results[layout]):
        close(other, lowered, np.float32)
    # a plan's modes are the forced layout mode here (the rest of the modes are 0); its layout
    # 0 lowered, 2 direct, 3 Winograd, 4 Winograd F(4x4, 3x3), 5-7 their phase forms, 8
    # direct's 16-pixel tile, 9 its phase form
    chosen = {(kernel, modes): plan_layout
              for kernel, _, _, _, modes, _, plan_layout, _ in _C.conv_plan_table()}
    for kernel in range(3):
        assert chosen[(kernel, 1)] == 0
        assert chosen.get((kernel, layout), 0) == layout - 1


@pytest.mark.parametrize("layout", [3, 4, 5, 6, 7, 8])
def test_caffe_engine_runs_lowered_under_a_forced_layout(layout, conv_layout):
    """engine "CAFFE" (convolution_param.engine) keeps the three kernels on the lowered layout
    even where another is forced and applies (a 3x3 16 -> 16 layer: direct and both Winograd
    tiles do; a 6x6 stride-2 one for the phase forms), while the default engine takes the
    forced one; both agree with lowered to float32 rounding."""
    if layout in (3, 6) and not _C.cpu_has_direct_conv():
        pytest.skip("the direct layout needs a CPU with AVX2 and FMA")
    kernel, stride = ((6, 6), (2, 2)) if layout >= 6 else ((3, 3), (1, 1))
    x, weight, bias, dy, geom = conv_arrays((4, 16, 10, 9, 16, kernel, stride, (1, 1), (1, 1), 1),
                                            np.float32)
    conv_layout(layout)
    results, layouts = {}, {}
    for engine in ("CAFFE", "DEFAULT"):
        _C.clear_plans()
        results[engine] = (cpu.conv_forward(x, weight, bias, *geom, engine=engine),
                           cpu.conv_backward_data(dy, weight, x.shape, *geom, engine=engine),
                           cpu.conv_backward_weight(x, dy, *geom, engine=engine))
        layouts[engine] = sorted(row[6] for row in _C.conv_plan_table())
    assert layouts == {"CAFFE": [0, 0, 0], "DEFAULT": [layout - 1] * 3}
    expected = (reference.conv_forward(x, weight, bias, *geom),
                reference.conv_backward_data(dy, weight, x.shape, *geom),
                reference.conv_backward_weight(x, dy, *geom))
    for engine in results:
        for got, want in zip(results[engine], expected):
            close(got, want, np.float32)


@pytest.mark.parametrize("layout", [6, 10])
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("case", [PHASE_CASES[1], PHASE_CASES[3], PHASE_CASES[6]], ids=str)
def test_phase_direct_skips_the_phase_forms_zero_taps(case, mode, layout, conv_layout,
                                                      partition_mode):
    """The direct layout on a phase form (6, or 10 with 16-pixel vectors) multiplies only the
    layer's own taps: an infinite bottom pixel reaches the outputs whose window holds it, as in
    Caffe's arithmetic, and no others (a zero tap would add 0 * inf = NaN to outputs whose
    window does not)."""
    if layout == 10 and not _C.cpu_has_avx512():
        pytest.skip("the direct layout's 16-pixel tile needs AVX-512F, which this CPU lacks")
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    conv_layout(layout)
    partition_mode(mode)
    for row, col in [(0, 0), (x.shape[2] // 2, x.shape[3] // 2), (x.shape[2] - 1, 1)]:
        xi = x.copy()
        xi[:, :, row, col] = np.inf
        got = cpu.conv_forward(xi, weight, bias, *geom)
        want = reference.conv_forward(xi, weight, bias, *geom)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        finite = np.isfinite(want)
        close(got[finite], want[finite], np.float32)


# Convolution with the in-place ReLU after it applied as each layout writes the top
# (conv_forward_relu, which Net fuses): the numbers of relu_forward run on conv_forward's top
# to the bit, special values included (inf, -inf: NaN through Caffe's 0 * min(x, 0), NaN, -0
# from a zero weight row and a -0 bias), with and without a bias, every layout (forced: 1 lowered, 2
# pointwise, 3 direct, 4-5 Winograd, 6-8 and 10 the phase forms, 9 direct's 16-pixel tile;
# where one does not apply the layer runs lowered), Caffe's engine, one or several partitions,
# the batch whole or an image at a time.
RELU_CASES = [WINOGRAD_CASES[3], WINOGRAD_CASES[8], CONV_CASES[10], PHASE_CASES[0],
              PHASE_CASES[1], PHASE_CASES[3], DIRECT_CASES[0], DIRECT_CASES[-1]]


@pytest.mark.parametrize("limit", [None, 1])
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("layout", range(11))
@pytest.mark.parametrize("case", RELU_CASES, ids=str)
def test_conv_forward_applies_the_relu_with_its_bits(case, layout, mode, limit, conv_layout,
                                                     partition_mode, col_buffer_limit):
    conv_layout(layout)
    partition_mode(mode)
    if limit:
        col_buffer_limit(limit)
    for dtype in DTYPES:
        x, weight, bias, dy, geom = conv_arrays(case, dtype)
        # the last image's corners: the first images stay finite
        x[-1, 0, 0, 0], x[-1, -1, -1, -1], x[-1, 0, -1, 0] = np.inf, -np.inf, np.nan
        weight[0] = 0.0
        bias[0] = -0.0
        for b in (bias, None):
            for engine in ("DEFAULT", "CAFFE"):
                want = cpu.relu_forward(cpu.conv_forward(x, weight, b, *geom, engine=engine), 0.0)
                got = cpu.conv_forward_relu(x, weight, b, *geom, engine=engine)
                # Every number to the bit (-0 apart from +0); a NaN's sign and payload are the
                # compiler's choice of operand order, not arithmetic.
                nan = np.isnan(want)
                np.testing.assert_array_equal(np.isnan(got), nan)
                assert got[~nan].tobytes() == want[~nan].tobytes(), (dtype, b is None, engine)
                assert nan.any() and (want == 0).any() and (want > 0).any()


@pytest.mark.parametrize("layout", [1, 3, 4, 5, 6, 7, 8])
def test_workspaces_left_by_other_shapes_do_not_leak(layout, conv_layout):
    """The per-thread workspaces and padded buffers outlive a call: a layer's results are the
    same bits after calls on other shapes whose inputs were NaN. (The phase layouts' (6-8)
    layer is strided, with a 3x3 phase kernel; the other shapes are theirs too.)"""
    conv_layout(layout)
    stride, kernel = ((2, 2), (6, 6)) if layout >= 6 else ((1, 1), (3, 3))
    x, weight, bias, dy, geom = conv_arrays((5, 7, 11, 9, 10, kernel, stride, (1, 1), (1, 1), 1),
                                            np.float32)

    def kernels(x, weight, bias, dy, geom):
        return (cpu.conv_forward(x, weight, bias, *geom),
                cpu.conv_backward_data(dy, weight, x.shape, *geom),
                cpu.conv_backward_weight(x, dy, *geom))

    first = kernels(x, weight, bias, dy, geom)
    for other in [(3, 16, 20, 20, 24, kernel, stride, (2, 2), (1, 1), 1),
                  (2, 4, 30, 7, 8, kernel, stride, (0, 0), (1, 1), 2)]:
        xo, wo, bo, dyo, go = conv_arrays(other, np.float32, seed=9)
        xo[:] = np.nan
        dyo[:] = np.nan
        kernels(xo, wo, bo, dyo, go)
    for got, want in zip(kernels(x, weight, bias, dy, geom), first):
        np.testing.assert_array_equal(got, want)


def test_winograd_is_measured_for_3x3_and_5x5_stride_1_float32_only(num_threads):
    num_threads(2)
    for case, dtype in [((3, 4, 9, 9, 6, (3, 3), (1, 1), (1, 1), (1, 1), 1), np.float32),
                        ((3, 4, 9, 9, 6, (3, 3), (1, 1), (1, 1), (2, 2), 1), np.float32),
                        ((3, 4, 9, 9, 6, (7, 7), (1, 1), (1, 1), (1, 1), 1), np.float32),
                        ((3, 4, 9, 9, 6, (3, 5), (1, 1), (1, 1), (1, 1), 1), np.float32),
                        ((3, 4, 9, 9, 6, (3, 3), (2, 2), (1, 1), (1, 1), 1), np.float32),
                        ((3, 4, 9, 10, 6, (3, 3), (1, 1), (1, 1), (1, 1), 1), np.float64)]:
        x, weight, bias, dy, geom = conv_arrays(case, dtype)
        cpu.conv_forward(x, weight, bias, *geom)
        cpu.conv_backward_weight(x, dy, *geom)
    winograd = {(c[1][3], c[1][7], c[1][9], c[1][13], c[0]) for c in _C.partition_choices()
                if c[1][:3] == [3, 4, 9] and c[1][4] == 6 and c[3].startswith("winograd")}
    # only the first case may be Winograd: never a 7x7, non-square, strided, dilated or float64
    # layer
    assert winograd <= {(9, 3, 1, 1, 0), (9, 3, 1, 1, 2)}


@pytest.mark.parametrize("dtype", DTYPES)
def test_outputs_that_are_not_plain_buffers_are_still_filled(dtype):
    x, weight, bias, dy, geom = conv_arrays(CONV_CASES[2], dtype)
    want = reference.conv_forward(x, weight, bias, *geom)
    y = np.asfortranarray(np.zeros(want.shape, dtype))
    assert cpu.conv_forward(x, weight, bias, *geom, out=y) is y
    close(y, want, dtype)
    before = np.asfortranarray(rand(weight.shape, dtype, 2))
    dw = before.copy(order="F")
    assert cpu.conv_backward_weight(x, dy, *geom, out=dw, accumulate=True) is dw
    close(dw, before + reference.conv_backward_weight(x, dy, *geom), dtype)
    dx = np.zeros(x.shape, np.float64 if dtype == np.float32 else np.float32)  # other dtype
    assert cpu.conv_backward_data(dy, weight, x.shape, *geom, out=dx) is dx
    np.testing.assert_allclose(dx, reference.conv_backward_data(dy, weight, x.shape, *geom),
                               rtol=1e-5, atol=1e-5)


def test_out_that_overlaps_an_input_is_refused():
    x, weight, bias, dy, geom = conv_arrays((2, 4, 5, 5, 4, (1, 1), (1, 1), (0, 0), (1, 1), 1),
                                            np.float32)
    with pytest.raises(ValueError, match="out overlaps x"):
        cpu.conv_forward(x, weight, bias, *geom, out=x)
    with pytest.raises(ValueError, match="out overlaps dy"):
        cpu.conv_backward_data(dy, weight, x.shape, *geom, out=dy)
    with pytest.raises(ValueError, match="out overlaps x"):
        cpu.conv_backward_weight(x, dy, *geom, out=x[0, :, :4, :1].reshape(weight.shape))
    with pytest.raises(ValueError, match="out overlaps dy"):
        cpu.bias_backward(dy, out=dy[0, :, 0, 0])
    with pytest.raises(ValueError, match="out overlaps a"):
        cpu.matmul(x[0, 0], x[0, 1], out=x[0, 0])
    with pytest.raises(ValueError, match="out overlaps x"):
        cpu.max_pool_forward(x, (1, 1), (1, 1), (0, 0), (5, 5), out=x)
    # The C++ side refuses it too, for callers that go straight to cct._C.
    with pytest.raises(ValueError, match="out overlaps x"):
        _C.conv_forward(x, weight, bias, *geom[:4], 1, x)


def test_accumulate_needs_out_and_out_needs_the_right_shape():
    x, weight, bias, dy, geom = conv_arrays(CONV_CASES[0], np.float32)
    with pytest.raises(ValueError, match="out must be given"):
        cpu.conv_backward_weight(x, dy, *geom, accumulate=True)
    with pytest.raises(ValueError, match="out must be given"):
        cpu.bias_backward(dy, accumulate=True)
    with pytest.raises(ValueError, match="wrong shape"):
        cpu.conv_forward(x, weight, bias, *geom, out=np.zeros((2, 4, 5, 6), np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 5, 1, 1), (7, 4), (3, 6, 11), (33, 1, 9, 9),
                                   (4, 70)], ids=str)
def test_bias_backward_matches_reference(shape, dtype):
    dy = rand(shape, dtype)
    close(cpu.bias_backward(dy), reference.bias_backward(dy), dtype)
    before = rand(shape[1], dtype, 1)
    db = before.copy()
    assert cpu.bias_backward(dy, out=db, accumulate=True) is db
    close(db, before + reference.bias_backward(dy), dtype)
    db = np.full(shape[1], np.nan, dtype)
    cpu.bias_backward(dy, out=db)
    close(db, reference.bias_backward(dy), dtype)


def test_bias_backward_of_an_empty_batch():
    db = np.ones(3, np.float32)
    cpu.bias_backward(np.zeros((0, 3, 4, 4), np.float32), out=db, accumulate=True)
    np.testing.assert_array_equal(db, 1)
    cpu.bias_backward(np.zeros((0, 3, 4, 4), np.float32), out=db)
    np.testing.assert_array_equal(db, 0)


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_into_out_and_accumulating(dtype, order, gemm_order):
    """InnerProduct's GEMMs: the top and bottom diff written in place, the weight diff added
    into (beta = 1), in both operand orders of the measured GEMM."""
    gemm_order(order)
    a, b = rand((9, 6), dtype), rand((9, 5), dtype, 1)
    out = np.full((6, 5), np.nan, dtype)
    assert cpu.matmul(a.T, b, out=out) is out
    close(out, a.T @ b, dtype)
    before = rand((6, 5), dtype, 2)
    out = before.copy()
    assert cpu.matmul(a.T, b, out=out, accumulate=True) is out
    close(out, before + a.T @ b, dtype)
    out_f = np.asfortranarray(before)
    cpu.matmul(a.T, b, out=out_f, accumulate=True)
    close(out_f, before + a.T @ b, dtype)
    out = before.copy()
    cpu.matmul(a.T[:, :0], b[:0], out=out, accumulate=True)  # K = 0 adds nothing
    np.testing.assert_array_equal(out, before)


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------
POOL_CASES = kernel_cases.POOL_CASES + [
    # Rows wide enough for the four-windows-at-once path of strides 1 and 2, with the scalar
    # windows on both sides of it.
    (2, 3, 6, 37, (3, 3), (2, 2), (1, 1), True),
    (2, 2, 5, 30, (3, 3), (1, 1), (1, 1), True),
    (1, 2, 4, 41, (2, 4), (1, 2), (0, 1), False),
]
# Windows wholly beyond the bottom have their own test (test_empty_window_is_caffes).
ALL_POOL = POOL_CASES + random_pool_cases(12, seed=5, empty_windows=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ALL_POOL, ids=str)
def test_max_pool_matches_reference(case, dtype):
    check_max_pool(cpu, reference, case, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pooling_writes_into_out(dtype):
    check_pooling_writes_into_out(cpu, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ALL_POOL, ids=str)
def test_ave_pool_matches_reference(case, dtype):
    check_ave_pool(cpu, reference, case, dtype)


def caffe_ave_windows(h, w, kernel, stride, pad, pooled):
    """Caffe's AVE windows (pooling_layer.cpp), in its order: (oh, ow, the bottom rows and
    columns, clipped to the bottom, and the divisor, the window clipped to the padded bottom,
    as float32)."""
    (kh, kw), (sh, sw), (ph, pw), (ho, wo) = kernel, stride, pad, pooled
    for oh in range(ho):
        hs = oh * sh - ph
        he = min(hs + kh, h + ph)
        for ow in range(wo):
            ws = ow * sw - pw
            we = min(ws + kw, w + pw)
            yield (oh, ow, range(max(hs, 0), min(he, h)), range(max(ws, 0), min(we, w)),
                   np.float32((he - hs) * (we - ws)))


def caffe_ave_pool(x, kernel, stride, pad, pooled):
    """Caffe's AVE loops in float32, window by window: each sum from zero in row-major order
    over the window, divided by its size."""
    n, c, h, w = x.shape
    y = np.empty((n, c) + tuple(pooled), np.float32)
    for oh, ow, rows, cols, size in caffe_ave_windows(h, w, kernel, stride, pad, pooled):
        acc = np.zeros((n, c), np.float32)
        for i in rows:
            for j in cols:
                acc += x[:, :, i, j]
        with np.errstate(invalid="ignore"):
            y[:, :, oh, ow] = acc / size
    return y


def caffe_ave_pool_backward(dy, x_shape, kernel, stride, pad):
    """Caffe's AVE backward loops in float32: dx from zero, each window's dy / size added
    into its taps, window after window."""
    dx = np.zeros(x_shape, np.float32)
    windows = caffe_ave_windows(x_shape[2], x_shape[3], kernel, stride, pad, dy.shape[2:])
    for oh, ow, rows, cols, size in windows:
        share = dy[:, :, oh, ow] / size
        for i in rows:
            for j in cols:
                dx[:, :, i, j] += share
    return dx


@pytest.mark.parametrize("case", [
    (2, 3, 16, 16, (3, 3), (2, 2), (0, 0)),    # CIFAR10-quick's pool2: 8 windows a row
    (2, 3, 8, 8, (3, 3), (2, 2), (0, 0)),      # pool3: 4, the last past the edge
    (1, 2, 9, 29, (3, 3), (1, 1), (1, 1)),     # 29 windows: four groups of eight, padded
    (1, 2, 7, 21, (2, 4), (2, 2), (1, 2)),
    (1, 1, 5, 12, (5, 5), (1, 1), (4, 4)),     # windows mostly padding
    # eight planes side by side (pooling.cpp's pool_planes8), the rest by the rows' kernels
    (3, 5, 16, 16, (3, 3), (2, 2), (0, 0)),    # CIFAR10-quick's pool2 (backward only)
    (4, 4, 8, 8, (3, 3), (2, 2), (0, 0)),      # its pool3
    (2, 9, 14, 14, (5, 5), (3, 3), (0, 0)),    # GoogLeNet's loss pools
    (2, 8, 7, 7, (7, 7), (1, 1), (0, 0)),      # its global pool5
    (3, 3, 11, 6, (4, 3), (3, 2), (2, 1)),     # padding, ceil's part-windows
], ids=str)
def test_ave_pool_adds_in_caffes_order(case):
    """AVE pooling forward and backward give Caffe's float32 sums to the bit in every code
    path (the whole-plane AVX2 kernels for rows of 2 to 31 windows and the eight planes side
    by side included), +0 and -0 inputs too."""
    n, c, h, w, kernel, stride, pad = case
    rng = np.random.default_rng(9)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = -0.0
    pooled = tuple(cpu.pool_out_size(s, k, st, p, True)
                   for s, k, st, p in zip((h, w), kernel, stride, pad))
    got = cpu.ave_pool_forward(x, kernel, stride, pad, pooled)
    want = caffe_ave_pool(x, kernel, stride, pad, pooled)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    dy = rng.standard_normal(got.shape).astype(np.float32)
    dy[rng.random(dy.shape) < 0.1] = -0.0
    got = cpu.ave_pool_backward(dy, x.shape, kernel, stride, pad, pooled)
    want = caffe_ave_pool_backward(dy, x.shape, kernel, stride, pad)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_max_pool_ties_go_to_the_first_element():
    x = np.zeros((1, 1, 4, 4), np.float32)
    y, mask = cpu.max_pool_forward(x, (2, 2), (2, 2), (0, 0), (2, 2))
    np.testing.assert_array_equal(mask.ravel(), [0, 2, 8, 10])
    np.testing.assert_array_equal(y, 0)


@pytest.mark.parametrize("width", [9, 21, 45, 160])
@pytest.mark.parametrize("stride", [1, 2, 3])
def test_max_pool_ties_and_nan_in_wide_rows(stride, width):
    """Caffe's strict `>` in every code path: a NaN never wins (not even against -FLT_MAX
    padding), and of equal values the first in row-major window order wins. Widths: rows of
    fewer than eight windows, of one and two groups of eight, and 160 (7 x 160 is past the
    32 x 32 under which the kernel takes the padded plane: pooling.cpp's max_plane_padded)."""
    rng = np.random.default_rng(8)
    x = rng.integers(-2, 3, (2, 3, 7, width)).astype(np.float32)  # many ties
    x[0, 0, 1, ::3] = np.nan
    x[1, 2, 2:5, 1:8:2] = np.nan  # (no window all NaN: there the reference says -inf)
    x[1, 0, :, 1::2] = np.where(x[1, 0, :, 1::2] == 0, -0.0, x[1, 0, :, 1::2])  # -0 ties +0
    geom = ((3, 3), (stride, stride), (1, 1),
            tuple(cpu.pool_out_size(s, 3, stride, 1, True) for s in (7, width)))
    y, mask = cpu.max_pool_forward(x, *geom)
    y_ref, mask_ref = reference.max_pool_forward(x, *geom)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(mask, mask_ref)
    # each top is its winner's bits (-0.0 where a -0.0 came first), as Caffe copies it
    won = np.take_along_axis(x.reshape(2, 3, -1), mask.reshape(2, 3, -1), axis=2)
    np.testing.assert_array_equal(y.reshape(2, 3, -1).view(np.uint32), won.view(np.uint32))


def caffe_max_pool(x, kernel, stride, pad, pooled):
    """Caffe's MAX loop (pooling_layer.cpp), window by window: each window's taps clipped to
    the bottom, scanned in row-major order with a strict `>` from -FLT_MAX, mask -1."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (ho, wo) = kernel, stride, pad, pooled
    y = np.full((n, c, ho, wo), -np.finfo(np.float32).max, np.float32)
    mask = np.full((n, c, ho, wo), -1, np.int32)
    for oh in range(ho):
        hs, he = max(oh * sh - ph, 0), min(oh * sh - ph + kh, h)
        for ow in range(wo):
            ws, we = max(ow * sw - pw, 0), min(ow * sw - pw + kw, w)
            for i in range(hs, he):
                for j in range(ws, we):
                    win = x[:, :, i, j] > y[:, :, oh, ow]
                    y[:, :, oh, ow] = np.where(win, x[:, :, i, j], y[:, :, oh, ow])
                    mask[:, :, oh, ow] = np.where(win, i * w + j, mask[:, :, oh, ow])
    return y, mask


@pytest.mark.parametrize("kernel,stride,pad", [
    ((3, 3), (1, 1), (1, 1)),   # GoogLeNet's inception pools
    ((2, 2), (1, 1), (0, 0)), ((3, 2), (1, 2), (2, 1)), ((5, 3), (1, 1), (4, 0)),
    ((4, 4), (1, 2), (3, 3)), ((3, 3), (2, 1), (1, 1)), ((3, 3), (2, 2), (1, 1)),
    ((1, 3), (1, 1), (0, 1))])
@pytest.mark.parametrize("size", [(7, 7), (14, 14), (9, 5), (28, 28), (3, 31)])
def test_max_pool_small_planes_are_caffes_scan(kernel, stride, pad, size):
    """Planes under 32 x 32 take the -FLT_MAX-padded plane (pooling.cpp's max_plane_padded),
    with vertical stride 1 its row-by-row merge (max_plane_by_rows), and rows of fewer than
    eight windows the eight planes side by side (pool_planes8): tops and masks equal
    Caffe's window-by-window scan to the bit, with ties everywhere, NaN (which never wins),
    -FLT_MAX in the bottom (which never wins either: Caffe's mask stays -1 where a window holds
    nothing else), +inf, and -0.0 beside +0.0 (equal under `>`: the first one's sign stays)."""
    rng = np.random.default_rng(sum(kernel + stride + pad + size))
    # 15 planes: eight side by side where a row has under eight windows (pool_planes8), the
    # other seven through the planes' own kernels
    x = rng.integers(-1, 2, (3, 5) + size).astype(np.float32)
    u = rng.random(x.shape)
    x[u < 0.15] = np.nan
    x[(u >= 0.15) & (u < 0.4)] = -np.finfo(np.float32).max
    x[(u >= 0.4) & (u < 0.43)] = np.inf
    x[(u >= 0.43) & (u < 0.5)] = -0.0  # ties with +0.0: the first in the scan stays
    x[1, 2] = np.nan  # a whole plane without a winner
    x[0, 3] = -np.finfo(np.float32).max
    pooled = tuple(cpu.pool_out_size(s, k, st, p, True)
                   for s, k, st, p in zip(size, kernel, stride, pad))
    y, mask = cpu.max_pool_forward(x, kernel, stride, pad, pooled)
    y_ref, mask_ref = caffe_max_pool(x, kernel, stride, pad, pooled)
    np.testing.assert_array_equal(y.view(np.uint32), y_ref.view(np.uint32))
    np.testing.assert_array_equal(mask, mask_ref)


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


# --------------------------------------------------------------------------------------------
# In-place kernels: ReLU, LRN, softmax, SoftmaxWithLoss, SGD
# --------------------------------------------------------------------------------------------
# Odd shapes, batch 1, and sizes past the threading grain and the kernels' block sizes.
ELEMENTWISE_SHAPES = [(1, 3, 5, 7), (2, 1), (3, 17, 41, 37), (7,)]
# The last two cut their planes into blocks (csrc/lrn.cpp's lrn_block): one image's 1,763
# pixels into blocks for the threads, and planes of 4,270 pixels past the 4,096 cap with a
# short last block; the channel window's ring rows are reused across blocks.
LRN_SHAPES = [(1, 3, 5, 7), (2, 7, 4, 3), (2, 300, 7, 9), (3, 96, 27, 27), (1, 6, 41, 43),
              (3, 9, 70, 61)]
LRN_PARAMS = [(5, 1e-4, 0.75, 1.0), (3, 2.0, 0.5, 2.0), (1, 0.5, 1.3, 1.0), (7, 1.0, 0.75, 1.0)]
SOFTMAX_SHAPES = [(1, 10, 1), (64, 10, 1), (3, 5, 600), (2, 1, 7), (5, 1000, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONCAT_CASES, ids=str)
def test_concat_matches_reference(case, dtype):
    check_concat(cpu, case, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slope", [0.0, 0.1, -0.5])
@pytest.mark.parametrize("shape", ELEMENTWISE_SHAPES, ids=str)
def test_relu_matches_reference(shape, slope, dtype):
    check_relu(cpu, shape, slope, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_in_place(dtype):
    x, dy = rand((3, 17, 41, 37), dtype), rand((3, 17, 41, 37), dtype, 1)
    want_y = reference.relu_forward(x, 0.2)
    want_dx = reference.relu_backward(x, dy, 0.2)
    buf = x.copy()
    assert cpu.relu_forward(buf, 0.2, out=buf) is buf
    np.testing.assert_array_equal(buf, want_y)
    assert cpu.relu_backward(x, dy, 0.2, out=dy) is dy
    np.testing.assert_array_equal(dy, want_dx)


def test_relu_keeps_caffes_special_values():
    x = np.array([-np.inf, -0.0, 0.0, np.nan, np.inf, -2.0], np.float32)
    with np.errstate(invalid="ignore"):  # 0 * -inf is NaN in Caffe's formula too
        for slope in (0.0, 0.5):
            np.testing.assert_array_equal(cpu.relu_forward(x, slope),
                                          reference.relu_forward(x, slope))


def test_out_that_is_not_a_plain_buffer_is_still_filled():
    x = rand((4, 6), np.float32)
    out = np.zeros((6, 4), np.float32).T  # Fortran-ordered view
    assert cpu.relu_forward(x, 0.0, out=out) is out
    np.testing.assert_array_equal(out, np.maximum(x, 0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params", LRN_PARAMS, ids=str)
@pytest.mark.parametrize("shape", LRN_SHAPES, ids=str)
def test_lrn_across_matches_reference(shape, params, dtype):
    check_lrn(cpu, shape, params, dtype)


def test_lrn_writes_into_out_and_scale():
    x = rand((2, 7, 4, 3), np.float32)
    out, scale = np.empty_like(x), np.empty_like(x)
    y, s = cpu.lrn_across_forward(x, 5, 1e-4, 0.75, 1.0, out=out, scale=scale)
    assert y is out and s is scale
    with pytest.raises(ValueError, match="out must not be x"):
        cpu.lrn_across_forward(x, 5, 1e-4, 0.75, 1.0, out=x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
def test_softmax_matches_reference(shape, dtype):
    check_softmax(cpu, shape, dtype)


def test_softmax_does_not_overflow():
    x = np.array([[[1000.0], [1001.0], [-1000.0]]], np.float32)
    y = cpu.softmax_forward(x)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y.sum(axis=1), 1, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore", [None, 1, -1])
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
def test_softmax_loss_matches_reference(shape, ignore, dtype):
    check_softmax_loss(cpu, shape, ignore, dtype)


def test_softmax_loss_reports_the_first_bad_label():
    check_softmax_loss_bad_label(cpu)


def test_softmax_loss_floors_the_probability_at_flt_min():
    check_softmax_loss_floor(cpu)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("decay", [0.0, 5e-4])
@pytest.mark.parametrize("shape", ELEMENTWISE_SHAPES, ids=str)
def test_sgd_update_matches_reference(shape, decay, dtype):
    check_sgd_update(cpu, shape, decay, dtype)


def test_in_place_kernels_refuse_arrays_they_would_copy():
    a = np.zeros(4, np.float32)
    with pytest.raises(TypeError):
        cpu.sgd_update(a, np.zeros(4, np.float64), np.zeros(4, np.float32), 0.1, 0.9, 0.0)
    with pytest.raises(ValueError, match="different sizes"):
        cpu.sgd_update(a, np.zeros(5, np.float32), np.zeros(4, np.float32), 0.1, 0.9, 0.0)


# --------------------------------------------------------------------------------------------
# The persistent worker threads (csrc/threads.cpp)
# --------------------------------------------------------------------------------------------
def test_workers_serve_several_python_threads_at_once(num_threads):
    """One call owns the workers; a concurrent call starts its own threads."""
    num_threads(2)
    arrays = [rand((3, 17, 41, 37), np.float32, seed) for seed in range(4)]
    want = [reference.relu_backward(a, a[::-1].copy(), 0.3) for a in arrays]
    got = [None] * len(arrays)

    def run(i):
        for _ in range(30):
            got[i] = cpu.relu_backward(arrays[i], arrays[i][::-1].copy(), 0.3)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(arrays))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_workers_in_a_forked_child(num_threads):
    """A child forked after the parent's workers started has none of them: it starts its own."""
    num_threads(2)
    x = rand((3, 17, 41, 37), np.float32)
    want = reference.relu_forward(x, 0.1)
    np.testing.assert_array_equal(cpu.relu_forward(x, 0.1), want)
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        signal.alarm(120)  # a hung child must not hang the test run
        ok = all(np.array_equal(cpu.relu_forward(x, 0.1), want) for _ in range(5))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BATCH_NORM_SHAPES, ids=str)
def test_batch_norm_matches_reference(shape, dtype):
    check_batch_norm(cpu, shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, count", ELTWISE_CASES, ids=str)
def test_eltwise_matches_reference(shape, count, dtype):
    check_eltwise(cpu, shape, count, dtype)


def test_numba_caches_its_kernels_outside_the_package():
    """The numba kernels' on-disk cache is cct's user cache folder, never the installed package
    (a file there outlives `pip uninstall`, and the folder left behind shadows an editable
    install as a namespace package)."""
    import numba

    import cct
    from cct.backend import jit  # noqa: F401  (sets the cache folder)
    package = os.path.dirname(os.path.abspath(cct.__file__))
    assert numba.config.CACHE_DIR
    assert not os.path.abspath(numba.config.CACHE_DIR).startswith(package)
