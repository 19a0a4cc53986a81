"""oneDNN's bf16 matmul as an engine of the GEMM races (csrc/onednn.cpp's Matmul, gemm.cpp's
choice 13, plans.ONEDNN_CHOICE): under bf16 GEMMs, where oneDNN is offered to bf16's races,
a plain GEMM or a whole strided batch (Winograd's products, the pointwise layout's with its
weights shared by every item) in one call.

Its promise is "bf16 operands, float32 sums", in oneDNN's own order: against float64 on the
operands rounded to bf16 it must be within float32's accumulation error (and far from the
float32 product), the same bits on every call, and the same bits again from a plan table that
names it. Where oneDNN is not offered, a plan naming it runs the chosen bf16 engine, bit for
bit, and installing such a plan warns. Without oneDNN these skip, saying why; the plan rules
run everywhere."""
import numpy as np
import pytest

from cct import _C
from cct.backend import cpu, onednn, plans, precision, reference

from .kernel_cases import conv_arrays
from .test_bf16 import bf16_on, rounded
from .test_conv_onednn import needs_onednn

ONEDNN = plans.ONEDNN_CHOICE
POINTWISE_MODE = 2  # set_conv_layout's mode for the pointwise layout (1 + layout 1)
WINOGRAD_2X2_MODE = 4  # and for Winograd F(2x2, 3x3)


@pytest.fixture
def offered(monkeypatch):
    """bf16 GEMMs on (cct's kernel, or MKL emulating the units where the CPU lacks them),
    oneDNN loaded and offered to bf16's races, an empty plan table; all as it was after."""
    needs_onednn()
    engine = "avx512bf16" if _C.bf16_kernel_supported() else "mkl"
    bf16_on(monkeypatch, engine)
    was = (_C.onednn_offered(False), _C.onednn_offered(True))
    _C.set_onednn_offered(False, True)
    _C.clear_plans()
    yield
    _C.clear_plans()
    _C.set_onednn_offered(*was)
    precision.set_precision("float32")
    precision._chosen.clear()
    _C.set_conv_layout(0)
    _C.set_partition_mode(0)


def has_kernel() -> bool:
    """Whether oneDNN has a bf16 matmul kernel on this CPU (none on an AVX2 CPU, where the
    races leave it out)."""
    return _C.onednn_matmul_impl(False, False, 8, 8, 8) != ""


@pytest.fixture
def matmul(offered):
    """``offered``, on a CPU where oneDNN has a bf16 matmul kernel."""
    if not has_kernel():
        pytest.skip("oneDNN has no bf16 matmul kernel on this CPU (its bf16 kernels need "
                    "AVX-512 or AMX)")


def threads():
    return _C.blas_num_threads()


def plain(a, b, trans_a, trans_b, start, accumulate, choice):
    """_C.gemm of op(a) op(b) under a plan of ``choice``, into ``start``'s copy (added to it
    with accumulate, else over NaN, which must not come through)."""
    m = a.shape[1] if trans_a else a.shape[0]
    k = a.shape[0] if trans_a else a.shape[1]
    n = b.shape[0] if trans_b else b.shape[1]
    _C.clear_plans()
    _C.load_gemm_choices([(trans_a, trans_b, m, n, k, 2, threads(), accumulate, choice)])
    out = start.copy() if accumulate else np.full((m, n), np.nan, np.float32)
    _C.gemm(a, b, trans_a, trans_b, measured=True, out=out, accumulate=accumulate)
    return out


def batched(a, b, trans_a, trans_b, start, accumulate, choice):
    count = a.shape[0]
    m = a.shape[2] if trans_a else a.shape[1]
    k = a.shape[1] if trans_a else a.shape[2]
    n = b.shape[1] if trans_b else b.shape[2]
    _C.clear_plans()
    _C.load_gemm_batch_choices([(trans_a, trans_b, m, n, k, count, 2, threads(), accumulate,
                                 choice)])
    out = start.copy() if accumulate else np.full((count, m, n), np.nan, np.float32)
    _C.gemm_batch(a, b, trans_a, trans_b, out=out, accumulate=accumulate)
    return out


def exact(a, b, trans_a, trans_b, start, accumulate):
    """float64 on the operands rounded to bf16 (and C as it was, added)."""
    a64, b64 = rounded(a), rounded(b)
    a64 = np.swapaxes(a64, -1, -2) if trans_a else a64
    b64 = np.swapaxes(b64, -1, -2) if trans_b else b64
    return np.matmul(a64, b64) + (start.astype(np.float64) if accumulate else 0)


def assert_bf16_operands_float32_sums(got, a, b, trans_a, trans_b, start, accumulate):
    want = exact(a, b, trans_a, trans_b, start, accumulate)
    scale = np.abs(want).max()
    k = a.shape[-2] if trans_a else a.shape[-1]
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= 2 * k * 2.0 ** -24 * scale
    unrounded = np.matmul(np.swapaxes(a, -1, -2) if trans_a else a,
                          np.swapaxes(b, -1, -2) if trans_b else b).astype(np.float64)
    if accumulate:
        unrounded += start
    assert np.abs(got - unrounded).max() > 1e-4 * scale  # bf16's operands, not float32's


def operands(shape_a, shape_b, shape_c, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape_a, np.float32), rng.standard_normal(shape_b, np.float32),
            rng.standard_normal(shape_c, np.float32))


# m x n by k: one value, odd sizes under one of oneDNN's blocks, a Winograd product's, a
# lowered convolution's.
PLAIN_SHAPES = [(1, 1, 1), (7, 13, 5), (33, 65, 129), (96, 392, 48), (128, 700, 300)]


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True),
                                             (True, True)])
@pytest.mark.parametrize("m,n,k", PLAIN_SHAPES, ids=str)
def test_a_plain_gemm_is_bf16_operands_with_float32_sums(matmul, m, n, k, trans_a, trans_b,
                                                        accumulate):
    a, b, start = operands((k, m) if trans_a else (m, k), (n, k) if trans_b else (k, n),
                           (m, n), m * 1000 + n + k)
    assert _C.onednn_matmul_impl(trans_a, trans_b, m, n, k) != ""
    got = plain(a, b, trans_a, trans_b, start, accumulate, ONEDNN)
    assert_bf16_operands_float32_sums(got, a, b, trans_a, trans_b, start, accumulate)
    again = plain(a, b, trans_a, trans_b, start, accumulate, ONEDNN)
    np.testing.assert_array_equal(again.view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("count,m,n,k", [(1, 5, 6, 7), (16, 32, 49, 48), (36, 17, 30, 64)],
                         ids=str)
def test_a_whole_batch_is_bf16_operands_with_float32_sums(matmul, count, m, n, k, trans_a,
                                                         trans_b, accumulate):
    a, b, start = operands((count,) + ((k, m) if trans_a else (m, k)),
                           (count,) + ((n, k) if trans_b else (k, n)), (count, m, n), count + m)
    got = batched(a, b, trans_a, trans_b, start, accumulate, ONEDNN)
    assert_bf16_operands_float32_sums(got, a, b, trans_a, trans_b, start, accumulate)
    again = batched(a, b, trans_a, trans_b, start, accumulate, ONEDNN)
    np.testing.assert_array_equal(again.view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("parts", [1, 2], ids=["one partition", "one per thread"])
def test_the_pointwise_layout_shares_its_weights_across_the_batch(matmul, parts):
    """The pointwise layout's forward and backward data are batches whose A, the weights, is
    one matrix for every image (stride 0); with a batch partition per thread, two threads run
    the same primitive at once."""
    case = (4, 24, 7, 9, 40, (1, 1), (1, 1), (0, 0), (1, 1), 1)
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    p, c, o = 7 * 9, 24, 40
    images = 4 // parts
    assert _C.onednn_matmul_impl(False, False, o, p, c, images, shared_a=True) != ""
    _C.set_conv_layout(POINTWISE_MODE)
    _C.set_partition_mode(1 if parts == 1 else 2)
    _C.set_num_threads(2)
    rows = [(False, False, o, p, c, images, 2, 1 if parts == 2 else threads(), False, ONEDNN),
            (True, False, c, p, o, images, 2, 1 if parts == 2 else threads(), False, ONEDNN)]

    def run():
        _C.clear_plans()
        _C.load_gemm_batch_choices(rows)
        got = [cpu.conv_forward(x, weight, bias, *geom),
               cpu.conv_backward_data(dy, weight, x.shape, *geom)]
        assert sorted(r[-1] for r in _C.gemm_batch_choices()) == [ONEDNN, ONEDNN]
        return got

    first, second = run(), run()
    want = [reference.conv_forward(rounded(x), rounded(weight), bias.astype(np.float64),
                                   *geom),
            reference.conv_backward_data(rounded(dy), rounded(weight), x.shape, *geom)]
    for got, again, w in zip(first, second, want):
        np.testing.assert_array_equal(again.view(np.uint32), got.view(np.uint32))
        assert np.abs(got - w).max() <= 1e-5 * max(1.0, np.abs(w).max())


def test_the_races_offer_it_under_bf16_where_oneDNN_is_offered(matmul):
    assert ONEDNN in _C.gemm_candidates(40, 200, 300)
    _C.set_onednn_offered(False, False)
    assert ONEDNN not in _C.gemm_candidates(40, 200, 300)
    _C.set_onednn_offered(False, True)
    precision.set_precision("float32")
    assert ONEDNN not in _C.gemm_candidates(40, 200, 300)


def test_where_oneDNN_has_no_bf16_kernel_the_races_leave_it_out(offered):
    if has_kernel():
        pytest.skip("oneDNN has a bf16 matmul kernel on this CPU")
    assert ONEDNN not in _C.gemm_candidates(40, 200, 300)
    assert _C.onednn_matmul_impl(True, False, 40, 200, 300, 16) == ""


def test_winograd_races_it_and_its_table_replays_the_bits(matmul):
    """Winograd F(2x2, 3x3)'s batched products race it beside bf16's items and float32; the
    table, installed anew, gives the raced bits, whatever won."""
    case = (4, 16, 12, 12, 32, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    _C.set_conv_layout(WINOGRAD_2X2_MODE)
    _C.set_partition_mode(1)

    def kernels():
        return [cpu.conv_forward(x, weight, bias, *geom),
                cpu.conv_backward_data(dy, weight, x.shape, *geom),
                cpu.conv_backward_weight(x, dy, *geom)]

    raced = kernels()
    tab = plans.table()
    assert len(tab["gemm_batch"]) == 3
    _C.clear_plans()
    plans.install(tab)
    for got, first in zip(kernels(), raced):
        np.testing.assert_array_equal(got.view(np.uint32), first.view(np.uint32))
    _C.clear_plans()
    plans.install({"gemm_batch": [r[:9] + [ONEDNN] for r in tab["gemm_batch"]]})
    on_onednn = kernels()
    assert [r[-1] for r in _C.gemm_batch_choices()] == [ONEDNN] * 3
    want = [reference.conv_forward(*(a.astype(np.float64) for a in (x, weight, bias)), *geom),
            reference.conv_backward_data(dy.astype(np.float64), weight.astype(np.float64),
                                         x.shape, *geom),
            reference.conv_backward_weight(x.astype(np.float64), dy.astype(np.float64), *geom)]
    for got, w in zip(on_onednn, want):  # bf16's operand error, as the items' (test_bf16.py)
        assert 1e-4 < np.abs(got - w).max() / np.abs(w).max() < 1e-2


def test_where_oneDNN_is_not_offered_a_plan_of_it_runs_the_chosen_engine(offered, capfd):
    a, b, start = operands((40, 300), (300, 200), (40, 200), 3)
    on_engine = plain(a, b, False, False, start, True, 0)
    a3, b3, start3 = operands((16, 32, 48), (16, 48, 49), (16, 32, 49), 4)
    items = batched(a3, b3, False, False, start3, False, plans.BF16_ITEMS_CHOICE)
    _C.set_onednn_offered(False, False)
    got = plain(a, b, False, False, start, True, ONEDNN)
    np.testing.assert_array_equal(got.view(np.uint32), on_engine.view(np.uint32))
    got3 = batched(a3, b3, False, False, start3, False, ONEDNN)
    np.testing.assert_array_equal(got3.view(np.uint32), items.view(np.uint32))
    plans.install({"gemm": [[False, False, 40, 200, 300, 2, threads(), True, ONEDNN]]})
    warned = capfd.readouterr().err
    assert "1 bf16 GEMM plan(s) run oneDNN's matmul, which cannot run here" in warned


def test_a_plan_of_it_needs_itemsize_2():
    for bad in ({"gemm": [[False, False, 4, 5, 6, 4, 1, False, ONEDNN]]},
                {"gemm_batch": [[False, False, 4, 5, 6, 16, 4, 1, False, ONEDNN]]}):
        with pytest.raises(ValueError, match="itemsize"):
            plans.install(bad)
    with pytest.raises(ValueError, match="13 under bf16"):
        _C.load_gemm_choices([(False, False, 4, 5, 6, 4, 1, False, ONEDNN)])
    with pytest.raises(ValueError, match="or 13"):
        _C.load_gemm_batch_choices([(False, False, 4, 5, 6, 16, 4, 1, False, ONEDNN)])


def test_without_onednn_loaded_nothing_applies():
    if _C.onednn_loaded():
        pytest.skip("oneDNN is loaded in this process: its absence is tested where it is not")
    assert _C.onednn_matmul_impl(False, False, 8, 8, 8) == ""
    assert onednn.why_not_offered() is not None
