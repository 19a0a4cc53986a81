"""The skinny float32 GEMM engine (csrc/gemm_skinny.cpp): C = op(A) op(B) + beta C for C of at
most 64 rows (B^T: a fully connected layer's forward; B: its backward data), which the measured
GEMMs race against the BLAS's two operand orders (GEMM choice 4; 6
for its 16-lane tile on AVX-512 CPUs, which promises the same bits: a plan naming it on any
other CPU runs the 8-lane tile, so the tests of choice 6 check that tile's bits here and the
16-lane one's where the CPU has it).

Its promise is exact: each C value is one chain of fused multiply-adds in k's order from 0,
then beta C added with one rounding (last, as the BLAS adds it). The operands here are dyadic
numbers with few bits, so that float64 holds every partial sum exactly and rounding it to
float32 is the fused multiply-add's single rounding: the emulation below gives the engine's
bits."""
import numpy as np
import pytest

from cct import _C
from cct.backend import cpu, plans

pytestmark = pytest.mark.skipif(not _C.gemm_skinny_available(),
                                reason="this CPU has no AVX2 and FMA: no skinny engine")

SKINNY, SKINNY16 = plans.SKINNY_CHOICES


@pytest.fixture
def fresh_plans():
    _C.clear_plans()
    yield
    _C.clear_plans()


def dyadic(shape, seed, scale=2.0 ** -17):
    """Values with at most 8 significant bits on a 2^-17 grid."""
    return np.random.default_rng(seed).integers(-255, 256, shape).astype(np.float32) * scale


def fma_chain(a_op, b, start):
    """C[i, j] = start[i, j] + fma(a_op[i, k-1], b[j, k-1], ... fma(a_op[i, 0], b[j, 0], 0)),
    each step and the last sum rounded once to float32 (exact in float64 for dyadic())."""
    acc = np.zeros(start.shape, np.float32)
    a64, b64 = a_op.astype(np.float64), b.astype(np.float64)
    for k in range(a_op.shape[1]):
        acc = (acc.astype(np.float64) + a64[:, k, None] * b64[None, :, k]).astype(np.float32)
    return (acc.astype(np.float64) + start.astype(np.float64)).astype(np.float32)


def install(trans_a, m, n, k, accumulate, choice=SKINNY, trans_b=True):
    _C.load_gemm_choices([(trans_a, trans_b, m, n, k, 4, _C.blas_num_threads(), accumulate,
                           choice)])


# m: one vector of lanes, part of one, two, and the engine's most (64); n: partial tiles of six
# columns of C; k: past one step of 256 and, at m = 64, past one packed panel of 4096.
SHAPES = [(1, 1, 1), (5, 7, 3), (8, 6, 300), (13, 13, 257), (16, 11, 40), (17, 20, 513),
          (32, 37, 700), (64, 9, 4100)]


@pytest.mark.parametrize("choice", [SKINNY, SKINNY16])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("trans_b", [True, False])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
def test_each_value_is_one_fma_chain_in_k_order(fresh_plans, m, n, k, trans_a, trans_b,
                                                accumulate, choice):
    a_op, b = dyadic((m, k), 1), dyadic((n, k), 2)
    start = dyadic((m, n), 3, 2.0 ** -20) if accumulate else np.zeros((m, n), np.float32)
    # Without accumulate C is not read: NaN there must not come through.
    out = start.copy() if accumulate else np.full((m, n), np.nan, np.float32)
    install(trans_a, m, n, k, accumulate, choice, trans_b)
    a = np.ascontiguousarray(a_op.T) if trans_a else a_op
    b_stored = b if trans_b else np.ascontiguousarray(b.T)   # n x k, or k x n
    _C.gemm(a, b_stored, trans_a, trans_b, measured=True, out=out, accumulate=accumulate)
    np.testing.assert_array_equal(out, fma_chain(a_op, b, start))


@pytest.mark.parametrize("trans_b", [True, False])
def test_neither_the_threads_nor_the_tile_change_the_bits(fresh_plans, trans_b):
    m, n, k = 32, 100, 3000
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((n, k), np.float32)
    b_stored = b if trans_b else np.ascontiguousarray(b.T)
    saved = cpu.get_num_threads()
    got = []
    try:
        for threads in (1, 2, 3):
            cpu.set_num_threads(threads)
            for choice in (SKINNY, SKINNY16):
                install(False, m, n, k, False, choice, trans_b)
                got.append(_C.gemm(a, b_stored, False, trans_b, measured=True))
    finally:
        cpu.set_num_threads(saved)
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])
    np.testing.assert_allclose(got[0], a.astype(np.float64) @ b.T.astype(np.float64),
                               rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("choice", [SKINNY, SKINNY16])
def test_a_call_the_engine_cannot_take_runs_the_direct_order(fresh_plans, choice):
    """A plan naming the engine (either tile) for a shape outside its form (65 rows) runs the
    BLAS's direct order, bit for bit."""
    rng = np.random.default_rng(6)
    for m, trans_b in ((65, False), (65, True)):
        a = rng.standard_normal((m, 50), np.float32)
        b = rng.standard_normal((50, 30) if not trans_b else (30, 50), np.float32)
        _C.load_gemm_choices([(False, trans_b, m, 30, 50, 4, _C.blas_num_threads(), False,
                               choice)])
        skinny = _C.gemm(a, b, False, trans_b, measured=True)
        _C.load_gemm_choices([(False, trans_b, m, 30, 50, 4, _C.blas_num_threads(), False, 0)])
        np.testing.assert_array_equal(skinny, _C.gemm(a, b, False, trans_b, measured=True))


@pytest.mark.parametrize("backward", [False, True])
def test_the_race_tries_it_and_a_plan_keeps_it(fresh_plans, backward):
    """A fully connected layer's shapes at batch 32, forward (x W^T) and backward data (dy W),
    are raced with the engine among the candidates (its 16-lane tile too, on a CPU with
    AVX-512); whichever won, the table holds it, and a table naming either tile installs and
    runs it."""
    candidates = _C.gemm_candidates(32, 256, 2048)
    assert SKINNY in candidates and (SKINNY16 in candidates) == _C.gemm_skinny16_available()
    x, w = dyadic((32, 2048), 7), dyadic((256, 2048), 8)
    if backward:   # dx (32 x 2048) = dy (32 x 256) W (256 x 2048)
        x, w = dyadic((32, 256), 7), np.ascontiguousarray(dyadic((2048, 256), 8).T)

    def product():
        return cpu.matmul(x, w) if backward else cpu.matmul(x, w.T)

    n = w.shape[1] if backward else w.shape[0]
    want = fma_chain(x, w.T if backward else w, np.zeros((32, n), np.float32))
    np.testing.assert_allclose(product(), want, rtol=1e-5, atol=1e-9)
    rows = [r for r in plans.table()["gemm"] if r[2:4] == [32, n]]
    assert len(rows) == 1 and rows[0][1] is not backward
    # (the backward data's k = 256 also races the thin engine, test_gemm_thin.py)
    assert rows[0][8] in (False, True, SKINNY, SKINNY16, plans.THIN_CHOICE)
    for choice in (SKINNY, SKINNY16):
        forced = {"gemm": [rows[0][:8] + [choice]]}
        assert plans.install(forced) == 1
        assert plans.table()["gemm"] == forced["gemm"]
        np.testing.assert_array_equal(product(), want)


@pytest.mark.parametrize("row", [
    [False, True, 8, 6, 5, 8, 1, False, SKINNY],     # float64: no skinny engine
    [False, True, 8, 6, 5, 8, 1, False, SKINNY16],   # nor its 16-lane tile
    [False, True, 8, 6, 5, 4, 1, False, 7],          # no such choice
])
def test_a_choice_the_engines_do_not_have_is_refused(fresh_plans, row):
    with pytest.raises(ValueError, match="GEMM"):
        plans.install({"gemm": [row]})
    assert _C.plan_count() == 0


def test_a_large_c_does_not_round_away_the_products(fresh_plans):
    """beta C is added last, as the BLAS adds it: a chain started from a bias of 100 would round
    each product to 100's float32 step (7.6e-6) and drift from the exact sum."""
    m, n, k = 2, 5, 64
    a_op, b = dyadic((m, k), 7, 2.0 ** -12), dyadic((n, k), 8, 2.0 ** -12)
    out = np.full((m, n), 100.0, np.float32)
    install(False, m, n, k, True)
    _C.gemm(a_op, b, False, True, measured=True, out=out, accumulate=True)
    exact = a_op.astype(np.float64) @ b.astype(np.float64).T + 100.0  # exact in float64
    np.testing.assert_array_equal(out, exact.astype(np.float32))
