"""MKL's sgemm as a candidate in the float32 GEMM races (cct/backend/mkl.py, csrc/mkl.cpp, GEMM
choice 5). Where MKL is installed (the ``mkl`` extra) the runs offer it to the races; a plan that
chose it must compute op(A) op(B) (+ C) in every operand order, be MKL's own product (the bits
MKL gives the same call), and repeat its bits. Without MKL these skip, saying why; the offer's
rules and the plan rows' checks run everywhere."""
import ctypes

import numpy as np
import pytest

from cct import _C
from cct.backend import cpu, mkl, plans, reference
from cct.errors import CCTError
from cct.install import install_hint
from tests.backend.kernel_cases import close, conv_arrays

MKL = plans.MKL_CHOICE


def needs_mkl():
    if mkl.library_path() is None:
        pytest.skip(f"MKL is not installed: {install_hint('mkl')}")
    why = mkl.load()
    if why is not None:
        pytest.skip(why)


@pytest.fixture
def fresh_plans():
    _C.clear_plans()
    threads = _C.get_num_threads()
    yield
    _C.set_num_threads(threads)
    _C.clear_plans()


@pytest.fixture
def offered():
    """MKL's sgemm offered to the races for the test, as it was after."""
    needs_mkl()
    was = _C.mkl_sgemm_offered()
    _C.set_mkl_sgemm_offered(True)
    yield
    _C.set_mkl_sgemm_offered(was)


def dyadic(shape, seed, scale=2.0 ** -17):
    """Values with at most 8 significant bits on a 2^-17 grid: every partial sum of the shapes
    below is exact in float32, so any order of the sums gives the exact product."""
    return np.random.default_rng(seed).integers(-255, 256, shape).astype(np.float32) * scale


def install(ta, tb, m, n, k, accumulate, choice=MKL):
    _C.load_gemm_choices([(ta, tb, m, n, k, 4, _C.blas_num_threads(), accumulate, choice)])


def operands(ta, tb, m, n, k, seed=0):
    a = dyadic((k, m) if ta else (m, k), seed)
    b = dyadic((n, k) if tb else (k, n), seed + 1)
    return a, b


def normal_operands(m, n, k, seed):
    """A (m x k) and B (n x k, used as B^T) of full float32 precision: products that round."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k), np.float32), rng.standard_normal((n, k), np.float32)


def exact(a, b, ta, tb, start=None):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    out = (a64.T if ta else a64) @ (b64.T if tb else b64)
    return (out if start is None else out + start).astype(np.float32)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (13, 70, 33), (32, 100, 260), (64, 9, 700)],
                         ids=str)
def test_a_plan_of_mkl_computes_the_product(fresh_plans, m, n, k, ta, tb, accumulate, threads):
    needs_mkl()
    _C.set_num_threads(threads)
    a, b = operands(ta, tb, m, n, k)
    start = dyadic((m, n), 7, 2.0 ** -20)
    out = start.copy() if accumulate else np.full((m, n), np.nan, np.float32)
    install(ta, tb, m, n, k, accumulate)
    _C.gemm(a, b, ta, tb, measured=True, out=out, accumulate=accumulate)
    assert _C.gemm_choices() == [(ta, tb, m, n, k, 4, _C.blas_num_threads(), accumulate, MKL)]
    np.testing.assert_array_equal(out, exact(a, b, ta, tb, start if accumulate else None))


def test_a_plan_of_mkl_is_mkls_own_product(fresh_plans):
    """The bits MKL's cblas_sgemm gives the same call on one thread (the library handle is the
    one cct loaded): the plan runs MKL, not another engine with MKL's name."""
    needs_mkl()
    _C.set_num_threads(1)
    m, n, k = 32, 200, 1000
    a, b = normal_operands(m, n, k, 3)
    install(False, True, m, n, k, False)
    got = _C.gemm(a, b, False, True, measured=True)
    library = ctypes.CDLL(mkl.library_path())
    f, i, p = ctypes.c_float, ctypes.c_int, ctypes.c_void_p
    library.cblas_sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    library.cblas_sgemm.restype = None
    want = np.empty((m, n), np.float32)
    library.cblas_sgemm(101, 111, 112, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, k, 0.0,
                        want.ctypes.data, n)
    np.testing.assert_array_equal(got, want)
    install(False, True, m, n, k, False, choice=0)
    assert not np.array_equal(_C.gemm(a, b, False, True, measured=True), got), \
        "OpenBLAS gave MKL's bits: the comparison cannot tell the engines apart"


@pytest.mark.parametrize("threads", [1, 2])
def test_a_plan_of_mkl_repeats_its_bits(fresh_plans, threads):
    """The same call twice, and on copies of the operands at other alignments, gives the same
    bits: a plan replays its numbers wherever NumPy puts the arrays."""
    needs_mkl()
    _C.set_num_threads(threads)
    m, n, k = 32, 300, 2000
    a, b = normal_operands(m, n, k, 4)
    install(False, True, m, n, k, False)
    first = _C.gemm(a, b, False, True, measured=True)
    for shift in (1, 3, 5):
        pool = np.empty(a.size + b.size + 8, np.float32)
        a2 = pool[shift:shift + a.size].reshape(a.shape)
        b2 = pool[shift + a.size:shift + a.size + b.size].reshape(b.shape)
        a2[...], b2[...] = a, b
        np.testing.assert_array_equal(_C.gemm(a2, b2, False, True, measured=True), first)


@pytest.fixture
def blas_threads():
    threads = _C.blas_num_threads()
    yield
    _C.set_blas_num_threads(threads)


def test_the_races_time_mkl_only_where_offered(offered, blas_threads):
    if not _C.mkl_threaded():
        # An MKL without its own threads (mkl.threading() says why) is raced on one thread.
        assert MKL not in _C.gemm_candidates(32, 100, 200) or _C.blas_num_threads() == 1
        _C.set_blas_num_threads(1)
    assert MKL in _C.gemm_candidates(32, 100, 200)
    _C.set_mkl_sgemm_offered(False)
    assert MKL not in _C.gemm_candidates(32, 100, 200)


def test_a_raced_shape_may_choose_mkl_and_gives_its_product(fresh_plans, offered):
    a, b = operands(False, True, 40, 50, 60)
    got = _C.gemm(a, b, False, True, measured=True)
    [row] = _C.gemm_choices()
    assert row[-1] in _C.gemm_candidates(40, 50, 60)
    np.testing.assert_array_equal(got, exact(a, b, False, True))


def test_mkl_sgemm_off_keeps_it_out(monkeypatch):
    was = _C.mkl_sgemm_offered()
    monkeypatch.setattr(mkl, "_state", {})
    monkeypatch.setenv(mkl.SGEMM_ENV, "off")
    try:
        mkl.offer_sgemm()
        assert not _C.mkl_sgemm_offered()
        assert mkl.sgemm_fingerprint() is None
        assert plans.fingerprint()["mkl"] is None
    finally:
        _C.set_mkl_sgemm_offered(was)


def test_a_bad_mkl_sgemm_setting_is_named(monkeypatch):
    monkeypatch.setattr(mkl, "_state", {})
    monkeypatch.setenv(mkl.SGEMM_ENV, "maybe")
    with pytest.raises(CCTError, match=r"\$CCT_MKL_SGEMM must be 'on', 'off' or unset, "
                                       r"got 'maybe'"):
        mkl.offer_sgemm()


def test_offered_mkl_is_in_the_fingerprint(offered):
    """A cache of plans made with MKL among the candidates is another machine's cache."""
    assert plans.fingerprint()["mkl"] == _C.mkl_version() != ""


def test_a_plan_of_mkl_where_it_cannot_run_warns_and_runs_the_direct_order(fresh_plans,
                                                                             monkeypatch, capfd):
    monkeypatch.setattr(mkl, "load", lambda: "no MKL here")
    row = [False, True, 8, 9, 10, 4, _C.blas_num_threads(), False, MKL]
    assert plans.install({"gemm": [row]}) == 1
    err = capfd.readouterr().err
    assert "1 GEMM plan(s) run MKL's sgemm, which cannot run here (no MKL here)" in err
    assert plans.table()["gemm"] == [row]


@pytest.mark.parametrize("row", [
    [False, True, 8, 9, 10, 8, 1, False, 5],   # MKL's sgemm is float32's: no double plan
    [False, True, 8, 9, 10, 4, 1, False, 7],   # no such choice
])
def test_a_plan_row_mkl_cannot_take_is_refused(fresh_plans, row):
    with pytest.raises(ValueError):
        plans.install({"gemm": [row]})


def mkl_in_a_child(body: str, env: dict) -> str:
    """Runs ``body`` in a fresh process (MKL's threading is fixed once per process, at its
    load) with ``env``; returns its stderr, the body having printed "ok"."""
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", body + "\nprint('ok')\n"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
    return run.stderr


def env_without_spin_settings():
    import os
    return {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}


def needs_mkls_gnu_threads():
    path = mkl.library_path()
    if path is None:
        pytest.skip(f"MKL is not installed: {install_hint('mkl')}")
    if not mkl.beside(path, "libmkl_gnu_thread"):
        pytest.skip(f"no libmkl_gnu_thread beside {path}")
    try:
        ctypes.CDLL("libgomp.so.1")
    except OSError as e:
        pytest.skip(f"GNU OpenMP does not load: {e}")


LOAD_AFTER = """
import ctypes
{before}
from cct import _C
from cct.backend import mkl
_C.set_blas_num_threads(2)
assert mkl.load() is None
print(mkl.threading(), file=__import__("sys").stderr)
assert _C.mkl_threaded() == {threaded}, mkl.threading()
mkl.offer_sgemm()
assert _C.mkl_sgemm_offered()
"""


def test_a_gnu_openmp_loaded_first_keeps_mkl_on_the_callers_thread():
    """A libgomp loaded before MKL without a spin setting (PyTorch's, when PyTorch is imported
    first) has read GNU OpenMP's default spin-wait, and MKL's threads would be its threads,
    keeping the cores from cct's after each call: MKL runs on the caller's thread, and the
    run is told why and what to set."""
    needs_mkls_gnu_threads()
    if not mkl.beside(mkl.library_path(), "libmkl_sequential"):
        pytest.skip(f"no libmkl_sequential beside {mkl.library_path()}: MKL is refused here "
                    f"(test_mkl_on_neither_threading_layer_is_refused)")
    err = mkl_in_a_child(LOAD_AFTER.format(before='ctypes.CDLL("libgomp.so.1")',
                                           threaded=False), env_without_spin_settings())
    assert "GNU OpenMP was loaded before MKL (" in err
    assert "set GOMP_SPINCOUNT=10000 in the environment before Python starts" in err
    assert "MKL runs without its own threads" in err
    assert "the float32 GEMMs on 2 threads race without it" in err


def test_mkl_on_neither_threading_layer_is_refused(tmp_path):
    """A libmkl_rt with neither its GNU threading layer nor its sequential one beside it (as in
    scripts/cpu_bundle.sh's bundle, where a libgomp loaded first rules out MKL's threads): MKL
    would end the process at its first call, "Cannot load libmkl_sequential.so.3" (it did, on
    the device's Xeon). load() refuses it, naming both, before anything is loaded."""
    import os
    lib = tmp_path / "libmkl_rt.so.3"
    lib.write_bytes(b"")     # refused before it is opened
    env = dict(os.environ, **{mkl.LIBRARY_ENV: str(lib)})
    mkl_in_a_child(f"""
from cct import _C
from cct.backend import mkl
why = mkl.load()
assert why == ("MKL '{lib}' cannot run here: not on its own threads (no libmkl_gnu_thread "
               "beside {lib}), nor on the caller's thread (no libmkl_sequential beside it)"), why
assert not _C.mkl_loaded()
""", env)


@pytest.mark.parametrize("setting", [None, ("GOMP_SPINCOUNT", "10000"),
                                     ("OMP_WAIT_POLICY", "passive")], ids=str)
def test_mkl_runs_its_own_threads_where_gnu_openmp_spins_briefly(setting):
    """MKL loading GNU OpenMP itself (which then reads cct's short spin), or a libgomp loaded
    first under a spin setting of the user's: MKL's own threads."""
    needs_mkls_gnu_threads()
    env = env_without_spin_settings()
    before = ""
    if setting is not None:
        env[setting[0]] = setting[1]
        before = 'ctypes.CDLL("libgomp.so.1")'
    err = mkl_in_a_child(LOAD_AFTER.format(before=before, threaded=True), env)
    assert "MKL runs without its own threads" not in err


# --------------------------------------------------------------------------------------------
# Strided batched GEMMs (Winograd's products, the pointwise layout's): MKL's
# cblas_sgemm_batch_strided raced against the BLAS's, in the "gemm_batch" table
# --------------------------------------------------------------------------------------------
def batch_operands(count, m, n, k, tb, seed=0, dyadic_values=True):
    if dyadic_values:
        return dyadic((count, m, k), seed), dyadic((count, n, k) if tb else (count, k, n), seed + 1)
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((count, m, k), np.float32),
            rng.standard_normal((count, n, k) if tb else (count, k, n), np.float32))


def batch_exact(a, b, tb, start=None):
    out = np.einsum("imk,ink->imn" if tb else "imk,ikn->imn", a.astype(np.float64),
                    b.astype(np.float64))
    return (out if start is None else out + start).astype(np.float32)


def install_batch(m, n, k, count, tb, accumulate, choice=MKL):
    _C.load_gemm_batch_choices([(False, tb, m, n, k, count, 4, _C.blas_num_threads(),
                                 accumulate, choice)])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("count,m,n,k", [(2, 1, 1, 1), (36, 32, 64, 32), (16, 13, 70, 33)],
                         ids=str)
def test_a_batched_plan_of_mkl_computes_the_products(fresh_plans, offered, count, m, n, k, tb,
                                                     accumulate, threads):
    _C.set_num_threads(threads)
    a, b = batch_operands(count, m, n, k, tb)
    start = dyadic((count, m, n), 7, 2.0 ** -20)
    out = start.copy() if accumulate else np.full((count, m, n), np.nan, np.float32)
    install_batch(m, n, k, count, tb, accumulate)
    _C.gemm_batch(a, b, False, tb, out=out, accumulate=accumulate)
    assert _C.gemm_batch_choices() == [(False, tb, m, n, k, count, 4, _C.blas_num_threads(),
                                        accumulate, MKL)]
    np.testing.assert_array_equal(out, batch_exact(a, b, tb, start if accumulate else None))


def test_a_batched_plan_of_mkl_is_mkls_own_product(fresh_plans, offered):
    """The bits MKL's cblas_sgemm_batch_strided gives the same call on one thread: the plan
    runs MKL's batched call, and the BLAS's plan gives other bits. An installed plan runs where
    MKL is loaded, offered to the races or not (a resumed run replays the run it continues)."""
    _C.set_mkl_sgemm_offered(False)   # the fixture offers it again after
    _C.set_num_threads(1)
    count, m, n, k = 36, 32, 32, 200
    a, b = batch_operands(count, m, n, k, True, seed=3, dyadic_values=False)
    install_batch(m, n, k, count, True, False)
    got = _C.gemm_batch(a, b, False, True)
    library = ctypes.CDLL(mkl.library_path())
    f, i, p = ctypes.c_float, ctypes.c_int, ctypes.c_void_p
    library.cblas_sgemm_batch_strided.argtypes = [i, i, i, i, i, i, f, p, i, i, p, i, i, f, p,
                                                  i, i, i]
    library.cblas_sgemm_batch_strided.restype = None
    want = np.empty((count, m, n), np.float32)
    library.cblas_sgemm_batch_strided(101, 111, 112, m, n, k, 1.0, a.ctypes.data, k, m * k,
                                      b.ctypes.data, k, n * k, 0.0, want.ctypes.data, n, m * n,
                                      count)
    np.testing.assert_array_equal(got, want)
    install_batch(m, n, k, count, True, False, choice=0)
    assert not np.array_equal(_C.gemm_batch(a, b, False, True), got), \
        "OpenBLAS gave MKL's bits: the comparison cannot tell the engines apart"


def test_the_batched_race_runs_only_where_mkl_is_offered(fresh_plans, offered):
    """Not offered: the BLAS's call, nothing timed or kept. Offered: one row, either engine,
    the product either way; deterministic mode keeps the BLAS's without timing."""
    a, b = batch_operands(36, 32, 64, 32, False)
    _C.set_mkl_sgemm_offered(False)
    np.testing.assert_array_equal(_C.gemm_batch(a, b), batch_exact(a, b, False))
    assert _C.gemm_batch_choices() == []
    _C.set_mkl_sgemm_offered(True)
    np.testing.assert_array_equal(_C.gemm_batch(a, b), batch_exact(a, b, False))
    [row] = _C.gemm_batch_choices()
    assert row[:9] == (False, False, 32, 64, 32, 36, 4, _C.blas_num_threads(), False)
    assert row[9] in (0, MKL)
    _C.clear_plans()
    _C.set_plan_measurement(False)
    try:
        _C.gemm_batch(a, b)
    finally:
        _C.set_plan_measurement(True)
    assert [r[9] for r in _C.gemm_batch_choices()] == [0]


@pytest.mark.parametrize("layout,case", [
    (4, (3, 16, 9, 9, 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)),    # Winograd F(2x2, 3x3)
    (4, (2, 8, 12, 12, 12, (5, 5), (1, 1), (2, 2), (1, 1), 1)),   # Winograd F(2x2, 5x5)
    (2, (3, 16, 7, 7, 24, (1, 1), (1, 1), (0, 0), (1, 1), 2)),    # pointwise, shared weights
], ids=["winograd3x3", "winograd5x5", "pointwise"])
def test_a_layer_on_mkl_batched_plans_repeats_its_bits_through_the_table(fresh_plans, offered,
                                                                          layout, case):
    """A convolution whose batched GEMMs are MKL's: every kernel close to the reference, the
    table holds MKL's rows, and the same plans installed anew give the same bits."""
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)

    def run():
        return (cpu.conv_forward(x, weight, bias, *geom),
                cpu.conv_backward_data(dy, weight, x.shape, *geom),
                cpu.conv_backward_weight(x, dy, *geom))
    _C.set_conv_layout(layout)
    try:
        run()   # the races
        rows = _C.gemm_batch_choices()
        assert rows, "the layout made no batched GEMM"
        plans.install({"gemm_batch": [list(r[:9]) + [MKL] for r in rows]})
        first = run()
        table = plans.table()
        assert {r[9] for r in table["gemm_batch"]} == {MKL}
        _C.clear_plans()
        plans.install(table)
        again = run()
    finally:
        _C.set_conv_layout(0)
    want = (reference.conv_forward(x, weight, bias, *geom),
            reference.conv_backward_data(dy, weight, x.shape, *geom),
            reference.conv_backward_weight(x, dy, *geom))
    for got, same, ref in zip(first, again, want):
        close(got, ref, np.float32)
        np.testing.assert_array_equal(got, same)


@pytest.mark.parametrize("row", [
    [False, True, 8, 9, 10, 4, 4, 1, False, 4],     # no skinny engine for a batch
    [False, True, 8, 9, 10, 4, 4, 1, False, True],  # not an operand order
    [False, True, 8, 9, 10, 4, 1, False],           # short (even of the older nine)
    [False, 1, 8, 9, 10, 4, 4, 1, False, 5],        # a flag that is not true/false
    [False, True, 8, 9, 10, 4, 4, 1, False, 7],     # bf16 items in a float32 row
])
def test_a_batched_plan_row_is_checked(fresh_plans, row):
    with pytest.raises(ValueError):
        plans.install({"gemm_batch": [row]})
    assert _C.gemm_batch_choices() == []


def test_a_batched_plan_of_mkl_where_it_cannot_run_warns(fresh_plans, monkeypatch, capfd):
    monkeypatch.setattr(mkl, "load", lambda: "no MKL here")
    row = [False, False, 8, 9, 10, 4, 4, _C.blas_num_threads(), False, MKL]
    assert plans.install({"gemm_batch": [row]}) == 1
    assert "1 GEMM plan(s) run MKL's sgemm, which cannot run here (no MKL here)" in \
        capfd.readouterr().err
    assert plans.table()["gemm_batch"] == [row]
