"""The thin float32 GEMM engine (csrc/gemm_thin.cpp): C = op(A) B + beta C for a summed
dimension of at most 256 and B stored k x n (a fully connected layer's weight gradient at a
small batch, dW += dy^T x), which the measured GEMMs race as choice 10 on CPUs with AVX2 and
FMA: its 16-lane tile where the CPU has AVX-512F, else its 8-lane tile, which reads B packed.

Its promise is the skinny engine's: each C value is one chain of fused multiply-adds in k's
order from 0, then beta C added with one rounding, whatever the threads. The operands are
dyadic numbers with few bits (test_gemm_skinny's), so that float64 emulates those bits
exactly; the two engines give the same bits where both take a call."""
import numpy as np
import pytest

from cct import _C
from cct.backend import cpu, plans

from .test_gemm_skinny import dyadic, fma_chain

pytestmark = pytest.mark.skipif(not _C.gemm_thin_available(),
                                reason="this CPU has no AVX2 and FMA: no thin engine")

THIN = plans.THIN_CHOICE


@pytest.fixture
def fresh_plans():
    _C.clear_plans()
    yield
    _C.clear_plans()


def install(trans_a, m, n, k, accumulate, choice=THIN):
    _C.load_gemm_choices([(trans_a, False, m, n, k, 4, _C.blas_num_threads(), accumulate,
                           choice)])


def run(a_op, b_op, start, trans_a, accumulate):
    """_C.gemm of op(A) (m x k) and B (k x n) as the engine takes them: A stored transposed with
    trans_a, B as it is; C starts as ``start`` when accumulating, else as NaN."""
    out = start.copy() if accumulate else np.full(start.shape, np.nan, np.float32)
    a = np.ascontiguousarray(a_op.T) if trans_a else a_op
    _C.gemm(a, b_op, trans_a, False, measured=True, out=out, accumulate=accumulate)
    return out


# m: one tile row and part of one, several with a partial last; n: one column, part of a
# vector, a whole tile of 64, a partial last vector past whole tiles, and wider than one block
# of B's columns at k = 256 (512 columns); k: 1, odd, and the engine's most (256).
SHAPES = [(1, 1, 1), (5, 7, 3), (6, 64, 32), (7, 65, 33), (13, 130, 256), (100, 17, 64),
          (37, 1000, 5), (64, 700, 256)]


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
def test_each_value_is_one_fma_chain_in_k_order(fresh_plans, m, n, k, trans_a, accumulate):
    a_op, b = dyadic((m, k), 1), dyadic((n, k), 2)
    start = dyadic((m, n), 3, 2.0 ** -20) if accumulate else np.zeros((m, n), np.float32)
    install(trans_a, m, n, k, accumulate)
    # Without accumulate C is not read: the NaN run() starts it with must not come through.
    got = run(a_op, np.ascontiguousarray(b.T), start, trans_a, accumulate)
    np.testing.assert_array_equal(got, fma_chain(a_op, b, start))


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
def test_each_tile_gives_the_chains(m, n, k, trans_a, accumulate, lanes):
    """Each tile called directly: the 8-lane one wherever the engine runs (on AVX-512 CPUs the
    plans run the 16-lane one), the 16-lane one where the CPU has it (else the 8-lane again)."""
    a_op, b = dyadic((m, k), 10), dyadic((n, k), 11)
    start = dyadic((m, n), 12, 2.0 ** -20) if accumulate else np.zeros((m, n), np.float32)
    out = start.copy() if accumulate else np.full((m, n), np.nan, np.float32)
    a = np.ascontiguousarray(a_op.T) if trans_a else a_op
    _C.gemm_thin(a, np.ascontiguousarray(b.T), trans_a, out, accumulate, lanes)
    np.testing.assert_array_equal(out, fma_chain(a_op, b, start))


def test_a_direct_call_checks_its_shapes_and_lanes():
    a, b = np.zeros((4, 8), np.float32), np.zeros((8, 5), np.float32)
    with pytest.raises(ValueError, match="op\\(a\\) m x k"):
        _C.gemm_thin(a, b, False, np.zeros((4, 6), np.float32), False, 8)
    with pytest.raises(ValueError, match="lanes must be 8 or 16"):
        _C.gemm_thin(a, b, False, np.zeros((4, 5), np.float32), False, 4)
    with pytest.raises(ValueError, match="outside the engine's form"):  # k > 256
        _C.gemm_thin(np.zeros((4, 300), np.float32), np.zeros((300, 5), np.float32), False,
                     np.zeros((4, 5), np.float32), False, 8)


def test_nothing_past_c_is_read_or_written(fresh_plans):
    """C the first rows of a larger array: the rows after it are neither read nor written by
    the last row's partial vector. (A row's overrun into the next would show in the chains
    above, the next row being added to.)"""
    m, n, k = 9, 70, 32
    a_op, b = dyadic((m, k), 4), dyadic((k, n), 5)
    for accumulate in (False, True):
        buffer = np.full((m + 1, n), 7.0, np.float32)
        install(False, m, n, k, accumulate)
        _C.gemm(a_op, b, False, False, measured=True, out=buffer[:m], accumulate=accumulate)
        np.testing.assert_array_equal(buffer[m], 7.0)
        start = np.full((m, n), 7.0 if accumulate else 0.0, np.float32)
        np.testing.assert_array_equal(buffer[:m], fma_chain(a_op, b.T, start))


def test_the_same_bits_as_the_skinny_engine_and_any_threads(fresh_plans):
    m, n, k = 40, 300, 96
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    saved = cpu.get_num_threads()
    got = []
    try:
        for threads in (1, 2, 3):
            cpu.set_num_threads(threads)
            for choice in (THIN, *plans.SKINNY_CHOICES):
                install(False, m, n, k, False, choice)
                got.append(_C.gemm(a, b, False, False, measured=True))
    finally:
        cpu.set_num_threads(saved)
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])
    np.testing.assert_allclose(got[0], a.astype(np.float64) @ b.astype(np.float64),
                               rtol=1e-4, atol=1e-3)


def test_a_call_the_engine_cannot_take_runs_the_direct_order(fresh_plans):
    """A plan naming the engine for a shape outside its form (k = 257; B stored n x k) runs
    the BLAS's direct order, bit for bit."""
    rng = np.random.default_rng(6)
    for k, trans_b in ((257, False), (30, True)):
        a = rng.standard_normal((20, k), np.float32)
        b = rng.standard_normal((50, k) if trans_b else (k, 50), np.float32)
        rows = [(False, trans_b, 20, 50, k, 4, _C.blas_num_threads(), False, choice)
                for choice in (THIN, 0)]
        _C.load_gemm_choices(rows[:1])
        thin = _C.gemm(a, b, False, trans_b, measured=True)
        _C.load_gemm_choices(rows[1:])
        np.testing.assert_array_equal(thin, _C.gemm(a, b, False, trans_b, measured=True))


def test_the_race_tries_it_and_a_plan_keeps_it(fresh_plans):
    """A fully connected layer's weight gradient at batch 32 (dW += dy^T x: op(A) = dy^T, B = x
    stored k x n) races the engine; whichever won, the table holds it, and a table naming the
    engine installs and runs it."""
    assert THIN in _C.gemm_candidates(256, 1024, 32, trans_b=False)
    assert THIN not in _C.gemm_candidates(256, 1024, 32, trans_b=True)
    assert THIN not in _C.gemm_candidates(256, 1024, 257, trans_b=False)
    dy, x = dyadic((32, 256), 7), dyadic((32, 1024), 8)
    start = dyadic((256, 1024), 9, 2.0 ** -20)
    want = fma_chain(np.ascontiguousarray(dy.T), np.ascontiguousarray(x.T), start)
    dw = start.copy()
    cpu.matmul(dy.T, x, out=dw, accumulate=True)
    np.testing.assert_allclose(dw, want, rtol=1e-5, atol=1e-9)
    rows = [r for r in plans.table()["gemm"] if r[2:5] == [256, 1024, 32]]
    assert len(rows) == 1 and rows[0][:2] == [True, False] and rows[0][7] is True
    forced = {"gemm": [rows[0][:8] + [THIN]]}
    assert plans.install(forced) == 1
    assert plans.table()["gemm"] == forced["gemm"]
    dw = start.copy()
    cpu.matmul(dy.T, x, out=dw, accumulate=True)
    np.testing.assert_array_equal(dw, want)


def test_a_thin_plan_is_refused_in_float64(fresh_plans):
    with pytest.raises(ValueError, match="GEMM"):
        plans.install({"gemm": [[True, False, 8, 6, 5, 8, 1, False, THIN]]})
    assert _C.plan_count() == 0
