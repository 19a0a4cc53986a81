"""cct's bf16 kernel in the thin form (csrc/bf16_kernel.cpp, bf16.h's gemm_bf16_thin): C =
op(A) B + beta C for k <= 256 and B stored k x n (a fully connected layer's weight gradient at
a small batch, k the batch; a lowered convolution's backward data with few filters), which the
measured GEMMs race under bf16 as choice 12 on CPUs with AVX512-BF16.

Its promise is the kernel's own bits (choice 9: the kernel's direct order, panels packed
first), whatever the threads: each C value is one chain of VDPBF16PS pair steps in k's order
from 0, then beta C added with one rounding. So the tests compare the two forms bit for bit,
and the kernel's against float64 on the rounded operands."""
import numpy as np
import pytest

from cct import _C
from cct.backend import cpu, plans

from .test_bf16 import rounded
from . import test_bf16_skinny as skinny
# the fixture: bf16 GEMMs on cct's kernel, an empty plan table (skips without AVX512-BF16)
from .test_bf16_skinny import bf16  # noqa: F401

THIN = plans.BF16_THIN_CHOICE
KERNEL = 9  # plans.BF16_ENGINE_CHOICES: the kernel's direct order


def product(a_op, b, start, trans_a, accumulate, choice):
    """The skinny tests' product with B stored k x n."""
    return skinny.product(a_op, b, start, trans_a, accumulate, choice, trans_b=False)


def operands(m, n, k, seed):
    return skinny.operands(m, n, k, seed, trans_b=False)


# m: one row, under a tile of six, several tiles with a partial last; n: one column, under and
# over a vector of 16, a partial tile of 64 with a partial vector, and B's pairs in two and three
# blocks of 512 KiB (1,024 columns at k = 256); k: one, odd (a pair completed by a zero), even,
# the most (256).
SHAPES = [(1, 1, 1), (5, 7, 3), (6, 16, 32), (13, 17, 33), (32, 100, 64), (7, 1100, 256),
          (19, 2100, 255), (64, 70, 2)]


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
def test_the_kernels_bits(bf16, m, n, k, trans_a, accumulate):
    a, b, start = operands(m, n, k, m * 1000 + n + k)
    want = product(a, b, start, trans_a, accumulate, KERNEL)
    got = product(a, b, start, trans_a, accumulate, THIN)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_bf16_operands_summed_in_float32(bf16):
    """Against float64 on the operands rounded to bf16: float32's accumulation error only."""
    m, n, k = 300, 500, 32
    a, b, start = operands(m, n, k, 1)
    got = product(a, b, start, True, True, THIN)
    want = rounded(a) @ rounded(b) + start
    scale = np.abs(rounded(a)) @ np.abs(rounded(b)) + np.abs(start)
    assert np.all(np.abs(got - want) <= 1e-5 * scale)
    # and not float32's product: the operands were rounded
    assert not np.allclose(got, a.astype(np.float64) @ b.astype(np.float64) + start,
                           rtol=1e-6, atol=1e-6)


def test_the_same_bits_on_any_threads(bf16):
    """Three threads split (block, six rows) items so that one thread's run crosses from one
    block of B's pairs to the next, rounding the next one itself."""
    m, n, k = 40, 2301, 200
    a, b, start = operands(m, n, k, 2)
    got = []
    for threads in (1, 2, 3):
        cpu.set_num_threads(threads)
        got.append(product(a, b, start, True, True, THIN))
    for g in got[1:]:
        np.testing.assert_array_equal(g.view(np.uint32), got[0].view(np.uint32))


def test_nan_and_infinity_as_the_kernel_has_them(bf16):
    m, n, k = 20, 70, 14
    a, b, start = operands(m, n, k, 3)
    a[2, 5], a[7, 13] = np.nan, np.inf
    b[3, 10], b[9, 0] = -np.inf, np.nan
    b[11, 40] = 3e38  # rounds to infinity in bf16
    want = product(a, b, start, True, True, KERNEL)
    got = product(a, b, start, True, True, THIN)
    assert np.isnan(got).any() and np.isinf(got).any()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_nothing_past_c_is_read_or_written(bf16):
    m, n, k = 9, 70, 33
    a, b, _ = operands(m, n, k, 4)
    for accumulate in (False, True):
        buffer = np.full((m + 1, n), 7.0, np.float32)
        _C.load_gemm_choices([(False, False, m, n, k, 2, _C.blas_num_threads(), accumulate,
                               THIN)])
        _C.gemm(a, b, False, False, measured=True, out=buffer[:m], accumulate=accumulate)
        np.testing.assert_array_equal(buffer[m], 7.0)
        want = rounded(a) @ rounded(b) + (7.0 if accumulate else 0.0)
        np.testing.assert_allclose(buffer[:m], want, rtol=1e-5, atol=1e-4)


def test_the_race_offers_it_under_bf16_only_in_its_form(bf16):
    assert THIN in _C.gemm_candidates(4096, 9216, 32, trans_b=False)
    assert THIN in _C.gemm_candidates(1, 1, 256, trans_b=False)
    assert THIN not in _C.gemm_candidates(4096, 9216, 257, trans_b=False)
    assert THIN not in _C.gemm_candidates(4096, 9216, 32, trans_b=True)
    _C.set_bf16_gemm(False)
    assert THIN not in _C.gemm_candidates(4096, 9216, 32, trans_b=False)


def test_a_raced_weight_gradient_keeps_its_choice(bf16):
    """A weight gradient at batch 32 raced under bf16, adding into C: whichever choice won, the
    table holds it, the result is that choice's, and a table naming this form installs and
    gives the kernel's bits."""
    rng = np.random.default_rng(5)
    dy, x = rng.standard_normal((32, 600), np.float32), rng.standard_normal((32, 700), np.float32)
    w = rng.standard_normal((600, 700), np.float32)

    def raced():
        out = w.copy()
        _C.gemm(dy, x, True, False, measured=True, out=out, accumulate=True)
        return out

    first = raced()
    rows = [r for r in plans.table()["gemm"] if r[:8] == [True, False, 600, 700, 32, 2,
                                                         _C.blas_num_threads(), True]]
    assert len(rows) == 1
    assert np.array_equal(raced(), first)
    _C.clear_plans()
    assert plans.install({"gemm": [rows[0][:8] + [THIN]]}) == 1
    got = raced()
    _C.clear_plans()
    _C.load_gemm_choices([tuple(rows[0][:8]) + (KERNEL,)])
    np.testing.assert_array_equal(got, raced())


def test_a_call_outside_the_form_runs_the_chosen_engines_direct_order(bf16):
    """A row of this choice for op(B) = B^T, or for k over 256 (not the form), runs the chosen
    engine's direct order, the kernel's here, bit for bit."""
    rng = np.random.default_rng(6)
    for tb, k in ((True, 90), (False, 300)):
        a = rng.standard_normal((20, k), np.float32)
        b = rng.standard_normal((50, k) if tb else (k, 50), np.float32)
        results = []
        for choice in (THIN, 0):
            _C.load_gemm_choices([(False, tb, 20, 50, k, 2, _C.blas_num_threads(), False,
                                   choice)])
            results.append(_C.gemm(a, b, False, tb, measured=True))
        np.testing.assert_array_equal(results[0], results[1])


def test_a_plan_of_it_needs_bf16s_element_size():
    _C.clear_plans()
    with pytest.raises(ValueError, match="itemsize 2"):
        plans.install({"gemm": [[True, False, 8, 6, 5, 4, 1, True, THIN]]})
    with pytest.raises(ValueError, match="GEMM choice"):
        _C.load_gemm_choices([(True, False, 8, 6, 5, 4, 1, True, THIN)])
    assert _C.plan_count() == 0
