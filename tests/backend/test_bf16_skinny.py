"""cct's bf16 kernel in the skinny form (csrc/bf16_kernel.cpp, bf16.h's gemm_bf16_skinny): C =
op(A) B^T + beta C for at most 64 rows of op(A) and B stored n x k (a fully connected layer's
forward at a small batch), which the measured GEMMs race under bf16 as choice 11 on CPUs with
AVX512-BF16.

Its promise is the kernel's own bits (choice 9: the kernel's direct order, panels packed
first), whatever the threads: each C value is one chain of VDPBF16PS pair steps in k's order
from 0, then beta C added with one rounding. So the tests compare the two forms bit for bit,
and the kernel's against float64 on the rounded operands."""
import numpy as np
import pytest

from cct import _C
from cct.backend import cpu, plans

from .test_bf16 import bf16_on, rounded

SKINNY = plans.BF16_SKINNY_CHOICE
KERNEL = 9  # plans.BF16_ENGINE_CHOICES: the kernel's direct order


@pytest.fixture
def bf16(monkeypatch):
    """bf16 GEMMs on cct's kernel, an empty plan table; float32 and all threads after. Skips
    where the CPU has no AVX512-BF16 (the plan checks below run everywhere)."""
    from cct.backend import precision
    bf16_on(monkeypatch, "avx512bf16")
    _C.clear_plans()
    yield
    _C.clear_plans()
    precision.set_precision("float32")
    precision._chosen.clear()
    _C.set_num_threads(0)


def product(a_op, b, start, trans_a, accumulate, choice, trans_b=True):
    """_C.gemm of op(A) (m x k) and B (n x k, op(B) = B^T; k x n without trans_b, as
    test_bf16_thin.py has it) under a plan of ``choice``; C starts as ``start`` when
    accumulating, else as NaN (which must not come through)."""
    m, k = a_op.shape
    _C.load_gemm_choices([(trans_a, trans_b, m, b.shape[0 if trans_b else 1], k, 2,
                           _C.blas_num_threads(), accumulate, choice)])
    out = start.copy() if accumulate else np.full(start.shape, np.nan, np.float32)
    a = np.ascontiguousarray(a_op.T) if trans_a else a_op
    _C.gemm(a, b, trans_a, trans_b, measured=True, out=out, accumulate=accumulate)
    return out


def operands(m, n, k, seed, trans_b=True):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k), np.float32),
            rng.standard_normal((n, k) if trans_b else (k, n), np.float32),
            rng.standard_normal((m, n), np.float32))


# m: one row, under and over a vector of 16 lanes, two vectors, a partial third, the most (64);
# n: one row of B, under a tile of six, several tiles with a partial last; k: one, odd (a pair
# completed by a zero), a partial step of 128 pairs, whole steps, and past one panel of op(A)'s
# pairs (4,096 of them at 64 lanes).
SHAPES = [(1, 1, 1), (5, 7, 3), (16, 6, 32), (17, 13, 33), (32, 100, 256), (33, 7, 257),
          (64, 19, 300), (50, 7, 8197)]


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
def test_the_kernels_bits(bf16, m, n, k, trans_a, accumulate):
    a, b, start = operands(m, n, k, m * 1000 + n + k)
    want = product(a, b, start, trans_a, accumulate, KERNEL)
    got = product(a, b, start, trans_a, accumulate, SKINNY)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_bf16_operands_summed_in_float32(bf16):
    """Against float64 on the operands rounded to bf16: float32's accumulation error only."""
    m, n, k = 32, 200, 1000
    a, b, start = operands(m, n, k, 1)
    got = product(a, b, start, False, True, SKINNY)
    want = rounded(a) @ rounded(b).T + start
    scale = np.abs(rounded(a)) @ np.abs(rounded(b)).T + np.abs(start)
    assert np.all(np.abs(got - want) <= 1e-5 * scale)
    # and not float32's product: the operands were rounded
    assert not np.allclose(got, a.astype(np.float64) @ b.T.astype(np.float64) + start,
                           rtol=1e-6, atol=1e-6)


def test_the_same_bits_on_any_threads(bf16):
    m, n, k = 40, 301, 700
    a, b, start = operands(m, n, k, 2)
    got = []
    for threads in (1, 2, 3):
        cpu.set_num_threads(threads)
        got.append(product(a, b, start, False, False, SKINNY))
    for g in got[1:]:
        np.testing.assert_array_equal(g.view(np.uint32), got[0].view(np.uint32))


def test_nan_and_infinity_as_the_kernel_has_them(bf16):
    m, n, k = 20, 14, 70
    a, b, start = operands(m, n, k, 3)
    a[2, 5], a[7, 69] = np.nan, np.inf
    b[3, 10], b[9, 0] = -np.inf, np.nan
    b[11, 40] = 3e38  # rounds to infinity in bf16
    want = product(a, b, start, False, True, KERNEL)
    got = product(a, b, start, False, True, SKINNY)
    assert np.isnan(got).any() and np.isinf(got).any()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_nothing_past_c_is_read_or_written(bf16):
    m, n, k = 9, 70, 33
    a, b, _ = operands(m, n, k, 4)
    for accumulate in (False, True):
        buffer = np.full((m + 1, n), 7.0, np.float32)
        _C.load_gemm_choices([(False, True, m, n, k, 2, _C.blas_num_threads(), accumulate,
                               SKINNY)])
        _C.gemm(a, b, False, True, measured=True, out=buffer[:m], accumulate=accumulate)
        np.testing.assert_array_equal(buffer[m], 7.0)
        want = rounded(a) @ rounded(b).T + (7.0 if accumulate else 0.0)
        np.testing.assert_allclose(buffer[:m], want, rtol=1e-5, atol=1e-4)


def test_the_race_offers_it_under_bf16_only_in_its_form(bf16):
    assert SKINNY in _C.gemm_candidates(32, 4096, 9216, trans_b=True)
    assert SKINNY in _C.gemm_candidates(64, 10, 3, trans_b=True)
    assert SKINNY not in _C.gemm_candidates(65, 4096, 9216, trans_b=True)
    assert SKINNY not in _C.gemm_candidates(32, 9216, 4096, trans_b=False)
    _C.set_bf16_gemm(False)
    assert SKINNY not in _C.gemm_candidates(32, 4096, 9216, trans_b=True)


def test_a_raced_fully_connected_forward_keeps_its_choice(bf16):
    """fc-like forward at batch 32 raced under bf16: whichever choice won, the table holds it,
    the result is that choice's, and a table naming this form installs and gives the kernel's
    bits."""
    a, b, _ = operands(32, 600, 2048, 5)
    raced = _C.gemm(a, b, False, True, measured=True)
    rows = [r for r in plans.table()["gemm"] if r[2:6] == [32, 600, 2048, 2]]
    assert len(rows) == 1
    assert np.array_equal(_C.gemm(a, b, False, True, measured=True), raced)
    forced = {"gemm": [rows[0][:8] + [SKINNY]]}
    _C.clear_plans()
    assert plans.install(forced) == 1
    got = _C.gemm(a, b, False, True, measured=True)
    _C.clear_plans()
    _C.load_gemm_choices([tuple(rows[0][:8]) + (KERNEL,)])
    np.testing.assert_array_equal(got, _C.gemm(a, b, False, True, measured=True))


def test_a_call_outside_the_form_runs_the_chosen_engines_direct_order(bf16):
    """A row of this choice for op(B) = B (not the form) runs the chosen engine's direct order,
    the kernel's here, bit for bit."""
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((20, 90), np.float32), rng.standard_normal((90, 50), np.float32)
    results = []
    for choice in (SKINNY, 0):
        _C.load_gemm_choices([(False, False, 20, 50, 90, 2, _C.blas_num_threads(), False,
                               choice)])
        results.append(_C.gemm(a, b, False, False, measured=True))
    np.testing.assert_array_equal(results[0], results[1])


def test_a_plan_of_it_needs_bf16s_element_size():
    _C.clear_plans()
    with pytest.raises(ValueError, match="itemsize 2"):
        plans.install({"gemm": [[False, True, 8, 6, 5, 4, 1, False, SKINNY]]})
    with pytest.raises(ValueError, match="GEMM choice"):
        _C.load_gemm_choices([(False, True, 8, 6, 5, 4, 1, False, SKINNY)])
    assert _C.plan_count() == 0
