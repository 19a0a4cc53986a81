"""bf16 mixed precision on the CPU backend (cct/backend/precision.py, csrc/bf16.cpp): the
rounding, and every GEMM-backed kernel against the NumPy reference run in float64 on the
operands rounded to bf16 (so the check is exactly "bf16 operands, float32 accumulation"), plus
the kernels' gradients against the exact float64 ones at bf16's tolerance.

Each runs on every engine that runs here: cct's own kernel needs a CPU with AVX512-BF16; MKL
needs its wheel (the ``bf16`` extra) and, on a CPU without bf16 units, emulates them
(the same numerics, more slowly); MKL on its own threads (``mkl_threaded``) also needs GNU
OpenMP. An engine that cannot run here skips, saying why."""
import ctypes
import re

import numpy as np
import pytest

from cct import _C
from cct.backend import cpu, mkl, plans, precision, reference
from cct.errors import CCTError
from cct.install import install_hint

from .kernel_cases import CONV_CASES, close, conv_arrays, rand, random_conv_cases

NO_MKL = f"no MKL bf16 engine: {install_hint('bf16')}"
NO_KERNEL = "this CPU has no AVX512-BF16 for cct's own bf16 kernel"


def skip_unless_runs(engine: str) -> None:
    if engine.startswith("mkl") and mkl.library_path() is None:
        pytest.skip(NO_MKL)
    if engine == "mkl_threaded":
        failure = mkl.threading_failure(mkl.library_path())
        if failure is not None:
            pytest.skip(f"MKL cannot run its own threads here: {failure}")
    if engine == "avx512bf16" and not _C.bf16_kernel_supported():
        pytest.skip(NO_KERNEL)


def runnable_engines():
    runs = []
    for engine in precision.ENGINES:
        try:
            skip_unless_runs(engine)
        except pytest.skip.Exception:
            continue
        runs.append(engine)
    return runs


def bf16_on(monkeypatch, engine):
    """bf16 GEMMs on ``engine``, named (MKL emulated where the CPU has no bf16 units); no
    engine raced shape by shape."""
    skip_unless_runs(engine)
    monkeypatch.setenv(precision.ENGINE_ENV, engine)
    monkeypatch.setitem(plans._state, "bf16", None)
    monkeypatch.setitem(plans._state, "bf16_shapes", [])
    precision._chosen.clear()
    assert precision.set_precision("bf16", emulate=True) == "bf16"
    assert _C.bf16_engine() == engine and _C.bf16_shape_engines() == []


@pytest.fixture(params=precision.ENGINES)
def bf16(request, monkeypatch):
    """bf16 GEMMs on, on one engine, for the test; float32 after."""
    bf16_on(monkeypatch, request.param)
    # The direct operand order in bf16: measured, a GEMM may run in float32 where that is
    # faster (test_measured_gemms_may_choose_float32 below).
    _C.set_gemm_order(1)
    yield request.param
    _C.set_gemm_order(0)
    precision.set_precision("float32")
    precision._chosen.clear()
    _C.set_conv_layout(0)
    _C.set_partition_mode(0)
    _C.set_num_threads(0)


def rounded(a):
    """``a`` rounded to bf16, in float64 for the reference."""
    return _C.round_to_bf16(a).astype(np.float64)


def bf16_oracle(a):
    """Round to nearest even, written from the definition: of the two bf16 neighbours (the
    float32 with its low 16 bits cleared, and the next one up in magnitude) the nearer, on a
    tie the one whose last kept bit is 0."""
    bits = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    down = bits & 0xFFFF0000
    rest = bits & 0xFFFF
    up = down + 0x10000
    even_down = (down >> 16) & 1 == 0
    pick_up = (rest > 0x8000) | ((rest == 0x8000) & ~even_down)
    out = np.where(pick_up, up, down).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(a), np.float32(np.nan), out)


def test_rounding_is_round_to_nearest_even():
    x = np.concatenate([
        rand(10000, np.float32, 5) * np.float32(10.0) ** rand(10000, np.float32, 6).clip(-30, 30),
        np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 2 ** -130, 3.4e38, -3.4e38,
                  0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 1e-45], np.float32)])
    got = _C.round_to_bf16(x)
    want = bf16_oracle(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32) & 0xFFFF, 0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))
    # the ties: 1 + 2^-8 goes down to 1, 1 + 3 * 2^-8 up to 1 + 2^-6 (both to the even side)
    assert got[10001] == 1.0 and got[10002] == 1.0 + 2 ** -6
    # a float32 payload NaN whose high half alone would read as infinity stays a NaN
    payload = np.array([0x7F800001], np.uint32).view(np.float32)
    assert np.isnan(_C.round_to_bf16(payload)[0])


@pytest.mark.parametrize("m,n,k", [(7, 130, 33), (64, 500, 800), (1, 1, 1), (5, 193, 17),
                                   (130, 3, 257)])
def test_matmul_multiplies_bf16_operands_in_float32(bf16, m, n, k):
    for ta in (False, True):
        for tb in (False, True):
            a = rand((k, m) if ta else (m, k), np.float32, 1)
            b = rand((n, k) if tb else (k, n), np.float32, 2)
            a, b = (a.T if ta else a), (b.T if tb else b)
            want = rounded(a) @ rounded(b)
            close(cpu.matmul(a, b), want.astype(np.float32), np.float32)
            out = rand((m, n), np.float32, 3)
            start = out.copy()
            cpu.matmul(a, b, out=out, accumulate=True)
            close(out, (start + want).astype(np.float32), np.float32)


def test_matmul_is_not_float32_while_bf16_is_on(bf16):
    a, b = rand((40, 60), np.float32, 1), rand((60, 30), np.float32, 2)
    got = cpu.matmul(a, b)
    exact = a.astype(np.float64) @ b
    # bf16's 8-bit significand: errors of order 2^-9 of the terms, far above float32's
    assert np.abs(got - exact).max() > 1e-4 * np.abs(exact).max()
    precision.set_precision("float32")
    close(cpu.matmul(a, b), exact.astype(np.float32), np.float32)


def test_bf16_gemms_repeat_to_the_bit_on_any_thread_count(bf16):
    """Column blocks (cct's kernel, MKL on cct's threads): the same bits whatever the thread
    count. MKL on its own threads splits a whole GEMM as the count says, so its bits follow
    the count; at one count they repeat (MKL told not to change the count it is given)."""
    a, b = rand((384, 1200), np.float32, 1), rand((1200, 700), np.float32, 2)
    results = {}
    for threads in (1, 2, 3):
        _C.set_num_threads(threads)
        results[threads] = cpu.matmul(a, b)
        np.testing.assert_array_equal(cpu.matmul(a, b), results[threads])
    if bf16 != "mkl_threaded":
        for threads in (2, 3):
            np.testing.assert_array_equal(results[threads], results[1])


def mkl_calls(capfd, run):
    """The (n, threads) of every bf16 GEMM MKL ran during run(), from its verbose mode (MKL
    writes a line per call to the process's stdout)."""
    library = ctypes.CDLL(mkl.library_path())  # the handle cct loaded: same library
    capfd.readouterr()
    library.MKL_Verbose(1)
    try:
        run()
    finally:
        library.MKL_Verbose(0)
    lines = capfd.readouterr().out.splitlines()
    calls = []
    for line in lines:
        # GEMM_BF16BF16F32(N,N,<n>,<m>,<k>,...) for a row-major call (MKL prints it column-major)
        match = re.search(r"GEMM_BF16BF16F32\(\w,\w,(\d+),.*NThr:(\d+)", line)
        if match:
            calls.append((int(match.group(1)), int(match.group(2))))
    return calls


def test_mkl_threaded_runs_whole_gemms_on_mkls_threads(capfd, monkeypatch):
    """mkl_threaded hands MKL each GEMM whole with cct's thread count (AMX wants whole GEMMs);
    mkl cuts it into column blocks of 64, one MKL thread each; inside a batch partition (one
    core's share) both make one-thread calls."""
    for engine in ("mkl", "mkl_threaded"):
        skip_unless_runs(engine)
    a, b = rand((96, 363), np.float32, 1), rand((363, 700), np.float32, 2)
    monkeypatch.setitem(plans._state, "bf16", None)
    try:
        for engine, want in (("mkl_threaded", [(700, 2)]),
                             ("mkl", [(64, 1)] * 10 + [(700 - 640, 1)])):
            monkeypatch.setenv(precision.ENGINE_ENV, engine)
            plans._state["bf16"] = None
            assert precision.set_precision("bf16", emulate=True) == "bf16"
            assert _C.bf16_engine() == engine
            _C.set_gemm_order(1)
            _C.set_num_threads(2)
            got = []
            calls = mkl_calls(capfd, lambda: got.append(cpu.matmul(a, b)))
            assert sorted(calls) == sorted(want), engine
            close(got[0], (rounded(a) @ rounded(b)).astype(np.float32), np.float32)
        # A batch partitioned over the two threads: each partition's GEMMs in blocks on one.
        _C.set_conv_layout(1)
        _C.set_partition_mode(2)
        x, weight, bias, _, geom = conv_arrays(CONV_CASES[0], np.float32)
        calls = mkl_calls(capfd, lambda: cpu.conv_forward(x, weight, bias, *geom))
        assert calls and all(threads == 1 and n <= 64 for n, threads in calls)
    finally:
        precision.set_precision("float32")
        precision._chosen.clear()
        _C.set_gemm_order(0)
        _C.set_conv_layout(0)
        _C.set_partition_mode(0)
        _C.set_num_threads(0)


@pytest.mark.parametrize("case", CONV_CASES + random_conv_cases(12, seed=16))
def test_convolution_multiplies_bf16_operands(bf16, case):
    _C.set_conv_layout(1)  # lowered: the float32 direct and Winograd layouts are not bf16's
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    xr, wr, dyr = rounded(x), rounded(weight), rounded(dy)
    # the bias is added in float32, not rounded
    close(cpu.conv_forward(x, weight, bias, *geom),
          reference.conv_forward(xr, wr, bias.astype(np.float64), *geom).astype(np.float32),
          np.float32)
    close(cpu.conv_backward_data(dy, weight, x.shape, *geom),
          reference.conv_backward_data(dyr, wr, x.shape, *geom).astype(np.float32), np.float32)
    close(cpu.conv_backward_weight(x, dy, *geom),
          reference.conv_backward_weight(xr, dyr, *geom).astype(np.float32), np.float32)


@pytest.mark.parametrize("case", CONV_CASES)
def test_lowering_straight_into_bf16_gives_the_gemms_bits(bf16, case):
    """On MKL's engines the lowered forward writes its columns in bf16 (no float32 copy to
    round); its product is the bf16 GEMM's on the float32 columns to the bit: the same
    rounding, the same engine calls. One partition, one chunk: one GEMM per group."""
    _C.set_conv_layout(1)
    _C.set_partition_mode(1)
    _C.set_gemm_order(1)  # matmul: the direct order in bf16, not a float32 choice
    x, weight, bias, _, geom = conv_arrays(case, np.float32)
    got = cpu.conv_forward(x, weight, None, *geom)
    cols, ho, wo = reference._lower(x, *geom)
    group = geom[4]
    w = weight.reshape(group, weight.shape[0] // group, -1)
    n = x.shape[0]
    want = np.stack([cpu.matmul(w[g], cols[g]) for g in range(group)])  # (group, O/g, N*P)
    want = want.reshape(group, -1, n, ho * wo).transpose(2, 0, 1, 3).reshape(got.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", CONV_CASES)
def test_weight_gradient_lowered_straight_into_bf16_gives_the_gemms_bits(bf16, case):
    """The weight gradient's columns too, once its GEMM's race is known to have gone to the
    bf16 GEMM in the direct order (forced here): dW_g = dY_g cols_g^T, to the bit."""
    _C.set_conv_layout(1)
    _C.set_partition_mode(1)
    _C.set_gemm_order(1)
    x, weight, _, dy, geom = conv_arrays(case, np.float32)
    got = cpu.conv_backward_weight(x, dy, *geom)
    cols, ho, wo = reference._lower(x, *geom)
    group, n = geom[4], x.shape[0]
    dyg = dy.reshape(n, group, -1, ho * wo).transpose(1, 2, 0, 3).reshape(group, -1, n * ho * wo)
    want = np.stack([cpu.matmul(dyg[g], cols[g].T) for g in range(group)])
    np.testing.assert_array_equal(got, want.reshape(got.shape))


@pytest.mark.parametrize("case", CONV_CASES[:6])
def test_lowered_kernels_repeat_their_raced_first_call(bf16, case):
    """Measured, a lowered kernel's first call races its GEMM on float32 columns; later calls
    lower straight into bf16 only where the race chose the engine's direct order (MKL's
    engines), else run the raced plan again: the first call's bits either way."""
    _C.set_conv_layout(1)
    _C.set_partition_mode(1)
    _C.set_gemm_order(0)
    _C.clear_plans()
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)

    def kernels():
        return [cpu.conv_forward(x, weight, bias, *geom),
                cpu.conv_backward_data(dy, weight, x.shape, *geom),
                cpu.conv_backward_weight(x, dy, *geom)]

    first = kernels()
    # the forward's GEMM (neither operand transposed) raced, on MKL's engines too: it once
    # lowered into bf16 unraced there
    assert [r for r in plans.table()["gemm"] if r[5] == 2 and not r[0] and not r[1]]
    for again, was in zip(kernels(), first):
        np.testing.assert_array_equal(again, was)


def small_integers(shape, seed):
    """Integers in [-4, 4] as float32: bf16 holds each, and float32 holds every sum of the
    tests' products, so any order of summing gives the exact result."""
    return np.random.default_rng(seed).integers(-4, 5, shape).astype(np.float32)


@pytest.mark.parametrize("case", [c for c in CONV_CASES if c[0] > 1])
def test_top_diff_gathered_straight_into_bf16_lands_in_place(bf16, case):
    """On MKL's engines a chunk of several images gathers its top diff straight into bf16 for
    the backward-data and weight-gradient GEMMs (once their races are known to have gone to
    the bf16 GEMM in the direct order: forced here). With values bf16 holds and sums float32
    holds, both gradients are the exact ones whatever the engine's order of summing: a value
    gathered out of place would show."""
    _C.set_conv_layout(1)
    _C.set_partition_mode(1)
    _C.set_gemm_order(1)
    x, weight, _, dy, geom = conv_arrays(case, np.float32)
    x, weight, dy = (small_integers(a.shape, seed) for seed, a in enumerate((x, weight, dy)))
    want_dx = reference.conv_backward_data(dy.astype(np.float64), weight.astype(np.float64),
                                           x.shape, *geom)
    want_dw = reference.conv_backward_weight(x.astype(np.float64), dy.astype(np.float64), *geom)
    np.testing.assert_array_equal(cpu.conv_backward_data(dy, weight, x.shape, *geom),
                                  want_dx.astype(np.float32))
    np.testing.assert_array_equal(cpu.conv_backward_weight(x, dy, *geom),
                                  want_dw.astype(np.float32))


@pytest.mark.parametrize("layout,kernel", [(3, (3, 3)), (5, (3, 3)), (4, (5, 5))])
def test_forced_float32_layouts_stay_float32_under_bf16(bf16, layout, kernel):
    """The direct layout and Winograd's 6x6 tiles (F(4x4, 3x3), F(2x2, 5x5)) are float32
    kernels, their GEMMs included: under bf16 a convolution that takes them computes what it
    computes in float32, to the bit."""
    case = (2, 8, 12, 12, 8, kernel, (1, 1), (1, 1), (1, 1), 1)
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    _C.set_conv_layout(layout)
    _C.set_partition_mode(1)  # the partitions sum the weight gradient in their own order
    under_bf16 = [cpu.conv_forward(x, weight, bias, *geom),
                  cpu.conv_backward_weight(x, dy, *geom)]
    precision.set_precision("float32")
    in_float32 = [cpu.conv_forward(x, weight, bias, *geom),
                  cpu.conv_backward_weight(x, dy, *geom)]
    for a, b in zip(under_bf16, in_float32):
        np.testing.assert_array_equal(a, b)
    lowered_bf16 = rounded(x), rounded(weight)
    assert not np.allclose(under_bf16[0], reference.conv_forward(
        *lowered_bf16, bias.astype(np.float64), *geom), rtol=1e-6, atol=0)


WINOGRAD_2X2 = 4  # set_conv_layout's Winograd F(2x2, 3x3) (and F(2x2, 5x5))


def winograd_2x2_kernels(x, weight, bias, dy, geom):
    return [cpu.conv_forward(x, weight, bias, *geom),
            cpu.conv_backward_data(dy, weight, x.shape, *geom),
            cpu.conv_backward_weight(x, dy, *geom)]


@pytest.mark.parametrize("parts", [1, 2], ids=["one partition", "one per thread"])
def test_winograd_2x2_products_race_bf16_against_float32(bf16, parts):
    """Under bf16, Winograd F(2x2, 3x3)'s batched products race their items in bf16
    (choice 7) against the float32 batched call (0; and MKL's, 5, where offered), in the
    batched table under element size 2. Whatever the race chose, its table installed anew
    gives the same bits; with every row on 0 the kernels give float32's bits; with every row on
    7 they give bf16's: close to the exact gradients, not float32's."""
    case = (4, 16, 12, 12, 32, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    _C.set_conv_layout(WINOGRAD_2X2)
    _C.set_partition_mode(parts)  # 2: the batched calls made inside each thread's partition
    _C.set_num_threads(2)
    _C.set_gemm_order(0)
    _C.clear_plans()
    raced = winograd_2x2_kernels(x, weight, bias, dy, geom)
    rows = plans.table()["gemm_batch"]
    assert len(rows) == 3  # forward, backward data, weight gradient
    assert all(r[6] == 2 and r[9] in (0, plans.MKL_CHOICE, plans.BF16_ITEMS_CHOICE)
               for r in rows), rows
    _C.clear_plans()
    plans.install({"gemm_batch": rows})
    for a, b in zip(winograd_2x2_kernels(x, weight, bias, dy, geom), raced):
        np.testing.assert_array_equal(a, b)

    def with_every_row_on(choice):
        _C.clear_plans()
        plans.install({"gemm_batch": [r[:9] + [choice] for r in rows]})
        return winograd_2x2_kernels(x, weight, bias, dy, geom)

    on_float32, on_bf16 = with_every_row_on(0), with_every_row_on(plans.BF16_ITEMS_CHOICE)
    precision.set_precision("float32")
    # float32's own batched rows (element size 4) on the BLAS's call too: where MKL is loaded
    # (an earlier test may have loaded it) a fresh race could pick MKL's, other bits
    _C.clear_plans()
    plans.install({"gemm_batch": [r[:6] + [4] + r[7:9] + [0] for r in rows]})
    in_float32 = winograd_2x2_kernels(x, weight, bias, dy, geom)
    for a, b in zip(on_float32, in_float32):
        np.testing.assert_array_equal(a, b)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, weight, dy))
    exact = [reference.conv_forward(x64, w64, bias.astype(np.float64), *geom),
             reference.conv_backward_data(dy64, w64, x.shape, *geom),
             reference.conv_backward_weight(x64, dy64, *geom)]
    for got, float32, want in zip(on_bf16, in_float32, exact):
        # bf16 operands' error (about 1.7x the lowered bf16 GEMM's: conv_winograd.cpp), far
        # above float32 Winograd's
        assert 1e-4 < relative_error(got, want) < 1e-2
        assert relative_error(float32, want) < 1e-5


def test_batched_bf16_items_are_refused_outside_bf16_rows():
    with pytest.raises(ValueError, match="itemsize 2"):
        plans.install({"gemm_batch": [[False, False, 4, 5, 6, 16, 4, 1, False,
                                       plans.BF16_ITEMS_CHOICE]]})
    with pytest.raises(ValueError, match="itemsize is not 2"):
        plans.install({"gemm_batch": [[False, False, 4, 5, 6, 16, 8, 1, False, 0]]})


def relative_error(got, exact):
    return float(np.linalg.norm(got - exact) / np.linalg.norm(exact))


@pytest.mark.parametrize("case", [CONV_CASES[2], CONV_CASES[9],
                                  (4, 16, 12, 12, 32, (5, 5), (1, 1), (2, 2), (1, 1), 1)])
def test_convolution_gradients_at_bf16_tolerance(bf16, case):
    """The gradients a bf16 backward pass gives, against the exact (float64) ones: within a few
    units of bf16's rounding (2^-9 = 0.2% per operand)."""
    _C.set_conv_layout(1)
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, weight, dy))
    for got, exact in [
            (cpu.conv_forward(x, weight, None, *geom), reference.conv_forward(x64, w64, None, *geom)),
            (cpu.conv_backward_data(dy, weight, x.shape, *geom),
             reference.conv_backward_data(dy64, w64, x.shape, *geom)),
            (cpu.conv_backward_weight(x, dy, *geom),
             reference.conv_backward_weight(x64, dy64, *geom))]:
        assert 1e-4 < relative_error(got, exact) < 1e-2


def test_inner_product_gradients_at_bf16_tolerance(bf16):
    x, w, dy = rand((64, 800), np.float32, 1), rand((500, 800), np.float32, 2), \
        rand((64, 500), np.float32, 3)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    for got, exact in [(cpu.matmul(x, w.T), x64 @ w64.T), (cpu.matmul(dy, w), dy64 @ w64),
                       (cpu.matmul(dy.T, x), dy64.T @ x64)]:
        assert 1e-4 < relative_error(got, exact) < 1e-2


def test_unknown_precision_is_refused():
    with pytest.raises(CCTError, match="unknown precision 'fp8'; known: float32, tf32, bf16, fp16"):
        precision.set_precision("fp8", source="solver.prototxt: precision")


def test_float32_turns_bf16_off(bf16):
    assert precision.precision() == "bf16"
    assert precision.set_precision("float32") == "float32"
    assert precision.precision() == "float32" and not _C.bf16_gemm_enabled()


@pytest.mark.skipif(_C.cpu_has_bf16_units(), reason="this CPU has bf16 units")
def test_without_bf16_units_cct_says_so_and_stays_float32(capfd):
    assert precision.set_precision("bf16", source="train: -precision") == "float32"
    err = capfd.readouterr().err
    assert "train: -precision: bf16 asked for, training in float32: this CPU has no bf16 units" \
        in err
    assert precision.precision() == "float32"


def test_output_is_written_not_read_when_not_accumulating(bf16):
    a, b = rand((9, 40), np.float32, 1), rand((40, 70), np.float32, 2)
    out = np.full((9, 70), np.nan, np.float32)
    cpu.matmul(a, b, out=out)
    close(out, (rounded(a) @ rounded(b)).astype(np.float32), np.float32)


def test_the_fastest_engine_is_chosen_by_timing_each(monkeypatch):
    runnable = runnable_engines()
    if len(runnable) < 2:
        pytest.skip(f"one bf16 engine runs here ({', '.join(runnable) or 'none'}): no race")
    monkeypatch.delenv(precision.ENGINE_ENV, raising=False)
    monkeypatch.setitem(plans._state, "bf16", None)
    precision._chosen.clear()
    try:
        assert precision.set_precision("bf16", emulate=True) == "bf16"
        speeds = precision._chosen["speeds"]
        # float32's speed too: the engines faster than it race shape by shape besides the one
        assert set(speeds) == set(runnable) | {"float32"}
        assert all(g > 0 for g in speeds.values())
        assert _C.bf16_engine() == max(runnable, key=speeds.get)
        assert "measured the faster" in precision.engine_description()
        assert plans.table()["bf16"] == _C.bf16_engine()  # a plan: cached, and in side files
        others = [e for e in plans.BF16_SHAPE_ENGINES
                  if e in runnable and e != _C.bf16_engine() and speeds[e] > speeds["float32"]]
        assert plans.bf16_shape_engines() == others == _C.bf16_shape_engines()
        assert plans.table().get("bf16_shapes", []) == others
    finally:
        precision.set_precision("float32")
        precision._chosen.clear()


def test_an_unknown_engine_is_refused(monkeypatch):
    monkeypatch.setenv(precision.ENGINE_ENV, "amx")
    precision._chosen.clear()
    with pytest.raises(CCTError, match=r"\$CCT_BF16_ENGINE must be one of avx512bf16, mkl"):
        precision.set_precision("bf16", emulate=True)
    with pytest.raises(RuntimeError, match="unknown bf16 engine 'amx' "
                       r"\(expected mkl, mkl_threaded or avx512bf16\)"):
        _C.set_bf16_engine("amx")


def test_measured_gemms_may_choose_float32(bf16):
    """Measured, each GEMM shape under bf16 picks among both operand orders in bf16 and in
    float32 (a GEMM bound by memory can run faster in float32); the choice is a plan, and the
    first call's result is the chosen plan's."""
    _C.set_gemm_order(0)
    _C.clear_plans()
    a, b = rand((24, 300), np.float32, 1), rand((300, 200), np.float32, 2)
    got = cpu.matmul(a, b)
    (row,) = [r for r in plans.table()["gemm"] if r[2:5] == [24, 200, 300]]
    assert row[5] == 2 and row[7] is False
    assert row[8] in (False, True, 2, 3, plans.MKL_CHOICE) + plans.SKINNY_CHOICES
    again = cpu.matmul(a, b)
    np.testing.assert_array_equal(got, again)
    for choice, expect_float32 in ((False, False), (True, False), (2, True), (3, True)):
        _C.clear_plans()
        plans.install({"gemm": [row[:8] + [choice]]})
        out = cpu.matmul(a, b)
        want = (a.astype(np.float64) @ b) if expect_float32 else rounded(a) @ rounded(b)
        close(out, want.astype(np.float32), np.float32)
    if _C.gemm_skinny_available():
        # the skinny engine (choice 4, and 6 for its 16-lane tile) is a float32 candidate under
        # bf16 too, where its form fits (at most 64 rows of C), op(B) = B or B^T
        bt = np.ascontiguousarray(b.T)
        for skinny in plans.SKINNY_CHOICES:
            for trans_b, b_op in ((True, bt.T), (False, b)):
                _C.clear_plans()
                plans.install({"gemm": [[False, trans_b] + row[2:8] + [skinny]]})
                close(cpu.matmul(a, b_op), (a.astype(np.float64) @ b).astype(np.float32),
                      np.float32)
    if _C.mkl_loaded():
        # MKL's sgemm (choice 5) is a float32 candidate under bf16 too
        _C.clear_plans()
        plans.install({"gemm": [row[:8] + [plans.MKL_CHOICE]]})
        close(cpu.matmul(a, b), (a.astype(np.float64) @ b).astype(np.float32), np.float32)
    _C.clear_plans()
    with pytest.raises(ValueError, match="choice"):
        plans.install({"gemm": [row[:8] + [7]]})


# --- engines raced shape by shape (csrc/bf16.h's set_bf16_shape_engines; GEMM and batched
# choices 8 and 9, csrc/gemm.cpp) ------------------------------------------------------------
ENGINE_CHOICE = {engine: choice for choice, engine in plans.BF16_ENGINE_CHOICES.items()}
ENGINE_PAIRS = [(chosen, other) for chosen in precision.ENGINES
                for other in plans.BF16_SHAPE_ENGINES if other != chosen]


@pytest.fixture
def shape_engines(monkeypatch):
    """Sets bf16 on an engine (bf16_on); float32, no shape engines, measured plans after."""
    _C.set_num_threads(2)
    yield lambda engine: bf16_on(monkeypatch, engine)
    _C.set_bf16_shape_engines([])
    _C.set_gemm_order(0)
    precision.set_precision("float32")
    precision._chosen.clear()
    _C.clear_plans()
    _C.set_conv_layout(0)
    _C.set_partition_mode(0)
    _C.set_num_threads(0)


@pytest.mark.parametrize("chosen,other", ENGINE_PAIRS)
def test_a_shape_engine_choice_runs_that_engine_whatever_the_chosen_one(shape_engines, chosen,
                                                                         other):
    """A GEMM row on choice 8 or 9 gives the bits of that engine's direct order, and a batched
    row (Winograd F(2x2, 3x3)'s products) the bits of its items on it, whichever engine the
    process chose."""
    skip_unless_runs(chosen)
    a, b = rand((40, 300), np.float32, 1), rand((300, 200), np.float32, 2)
    case = (4, 16, 12, 12, 32, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    _C.set_conv_layout(WINOGRAD_2X2)
    _C.set_partition_mode(1)  # one partition: the batched calls of the whole batch

    shape_engines(other)
    _C.set_gemm_order(1)  # the direct order, batches' items in bf16: other's own bits
    want, want_conv = cpu.matmul(a, b), winograd_2x2_kernels(x, weight, bias, dy, geom)

    precision.set_precision("float32")
    shape_engines(chosen)
    _C.set_gemm_order(0)
    _C.clear_plans()
    cpu.matmul(a, b)
    winograd_2x2_kernels(x, weight, bias, dy, geom)
    tab = plans.table()
    (row,) = [r for r in tab["gemm"] if r[2:5] == [40, 200, 300]]
    batched = tab["gemm_batch"]
    assert row[5] == 2 and len(batched) == 3 and all(r[6] == 2 for r in batched)
    _C.clear_plans()
    choice = ENGINE_CHOICE[other]
    plans.install({"gemm": [row[:8] + [choice]], "gemm_batch": [r[:9] + [choice] for r in batched]})
    np.testing.assert_array_equal(cpu.matmul(a, b), want)
    for got, expected in zip(winograd_2x2_kernels(x, weight, bias, dy, geom), want_conv):
        np.testing.assert_array_equal(got, expected)
    # (Whether the chosen engine's bits differ from the other's is not asserted: both add
    # pair products in float32, and an AMX tile may add them in the kernel's order.)


@pytest.mark.parametrize("chosen,other", ENGINE_PAIRS)
def test_offered_engines_join_the_race_and_replay(shape_engines, chosen, other):
    """Offered, an engine other than the chosen one is a candidate of every bf16 GEMM race and
    batched race; not offered, or the chosen one itself, it is not. A race's table installed
    anew gives the same bits."""
    skip_unless_runs(other)
    shape_engines(chosen)
    choice = ENGINE_CHOICE[other]
    assert choice not in _C.gemm_candidates(40, 200, 300)
    _C.set_bf16_shape_engines([other])
    assert choice in _C.gemm_candidates(40, 200, 300)
    if chosen in plans.BF16_SHAPE_ENGINES:
        _C.set_bf16_shape_engines([other, chosen])
        assert ENGINE_CHOICE[chosen] not in _C.gemm_candidates(40, 200, 300)
    a, b = rand((40, 300), np.float32, 1), rand((300, 200), np.float32, 2)
    x, weight, bias, dy, geom = conv_arrays((4, 16, 12, 12, 32, (3, 3), (1, 1), (1, 1),
                                             (1, 1), 1), np.float32)
    _C.set_conv_layout(WINOGRAD_2X2)
    _C.set_partition_mode(1)
    _C.clear_plans()
    raced = [cpu.matmul(a, b)] + winograd_2x2_kernels(x, weight, bias, dy, geom)
    tab = plans.table()
    allowed_gemm = {False, True, 2, 3, plans.MKL_CHOICE, *plans.SKINNY_CHOICES, choice}
    assert all(r[8] in allowed_gemm for r in tab["gemm"]), tab["gemm"]
    allowed_batch = {0, plans.MKL_CHOICE, plans.BF16_ITEMS_CHOICE, choice}
    assert all(r[9] in allowed_batch for r in tab["gemm_batch"]), tab["gemm_batch"]
    _C.clear_plans()
    plans.install(tab)
    again = [cpu.matmul(a, b)] + winograd_2x2_kernels(x, weight, bias, dy, geom)
    for got, first in zip(again, raced):
        np.testing.assert_array_equal(got, first)


def test_shape_engines_are_those_faster_than_float32():
    speeds = {"avx512bf16": 343.0, "mkl": 113.0, "mkl_threaded": 166.0, "float32": 203.0}
    assert precision._shape_engines("avx512bf16", speeds) == []  # MKL emulated (Zen 4)
    amx = {"avx512bf16": 408.0, "mkl": 700.0, "mkl_threaded": 1400.0, "float32": 320.0}
    assert precision._shape_engines("mkl_threaded", amx) == ["avx512bf16"]
    assert precision._shape_engines("mkl", amx) == ["mkl_threaded", "avx512bf16"]
    assert precision._shape_engines("mkl", {}) == []  # untimed (one engine, deterministic)


def test_deterministic_runs_race_no_engine_shape_by_shape(monkeypatch):
    if len(runnable_engines()) < 2:
        pytest.skip("one bf16 engine runs here: nothing to race shape by shape anyway")
    monkeypatch.delenv(precision.ENGINE_ENV, raising=False)
    monkeypatch.setitem(plans._state, "bf16", None)
    monkeypatch.setitem(plans._state, "bf16_shapes", ["avx512bf16"])
    precision._chosen.clear()
    plans.set_deterministic(True)
    try:
        assert precision.set_precision("bf16", emulate=True) == "bf16"
        assert plans.bf16_shape_engines() == [] == _C.bf16_shape_engines()
        assert "bf16_shapes" not in plans.table()
    finally:
        plans.set_deterministic(False)
        precision.set_precision("float32")
        precision._chosen.clear()


def test_shape_engines_are_a_plan_and_bad_ones_are_refused(monkeypatch):
    monkeypatch.setitem(plans._state, "bf16", None)
    monkeypatch.setitem(plans._state, "bf16_shapes", [])
    plans.record_bf16_engine("mkl", ["mkl_threaded", "avx512bf16"])
    tab = plans.table()
    assert tab["bf16"] == "mkl" and tab["bf16_shapes"] == ["mkl_threaded", "avx512bf16"]
    plans.record_bf16_engine("mkl", [])
    plans.install(tab)
    assert plans.bf16_shape_engines() == ["mkl_threaded", "avx512bf16"]
    for bad, match in (({"bf16": "mkl", "bf16_shapes": ["mkl"]}, "bf16_shapes"),
                       ({"bf16": "mkl", "bf16_shapes": "mkl_threaded"}, "bf16_shapes"),
                       ({"bf16_shapes": ["avx512bf16"]}, "without the 'bf16' engine"),
                       ({"gemm": [[False, False, 4, 5, 6, 4, 1, False, 8]]}, "itemsize 2"),
                       ({"gemm": [[False, False, 4, 5, 6, 2, 1, False, 7]]}, "choice"),
                       ({"gemm_batch": [[False, False, 4, 5, 6, 16, 4, 1, False, 9]]},
                        "itemsize 2")):
        with pytest.raises(ValueError, match=match):
            plans.install(bad)
    # the kernels' own refusals, under plans.py's
    with pytest.raises(ValueError, match="8, 9, 11, 12 or 13"):
        _C.load_gemm_choices([(False, False, 4, 5, 6, 4, 1, False, 9)])
    with pytest.raises(ValueError, match=r"7, 8, 9 \(bf16 items\) or 13"):
        _C.load_gemm_batch_choices([(False, False, 4, 5, 6, 16, 4, 1, False, 8)])
    with pytest.raises(RuntimeError, match="cannot race shape by shape"):
        _C.set_bf16_shape_engines(["mkl"])


def test_a_shape_engine_plan_that_cannot_run_here_says_so(monkeypatch, capfd):
    monkeypatch.setattr(_C, "bf16_kernel_supported", lambda: False)
    _C.clear_plans()
    try:
        plans.install({"gemm": [[False, False, 4, 5, 6, 2, 1, False, 9]]})
    finally:
        _C.clear_plans()
    assert re.search(r"1 bf16 GEMM plan\(s\) run on avx512bf16, which cannot run here "
                     r"\(this CPU has no AVX512-BF16\)", capfd.readouterr().err)
