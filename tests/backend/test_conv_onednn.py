"""oneDNN's convolution layout (csrc/onednn.cpp, cct/backend/onednn.py; conv.cpp's layout 10,
set_conv_layout mode 11). Where oneDNN is installed (the ``onednn`` extra) every kernel under it
must compute the convolution: in float32 to float32's tolerance of the reference, under bf16
GEMMs exactly "bf16 operands, float32 sums" (the float64 reference on the operands rounded to
bf16), with Caffe's ReLU bits, accumulating where asked, and falling back to the lowered GEMM
where oneDNN has no kernel of its own. Without oneDNN these skip, saying why; the offer's rules
and the plan table's warning run everywhere."""
import os
import subprocess
import sys

import numpy as np
import pytest

from cct import _C
from cct.backend import cpu, mkl, onednn, plans, precision, reference
from cct.errors import CCTError
from cct.install import install_hint

from .kernel_cases import CONV_CASES, close, conv_arrays, random_conv_cases

ONEDNN_MODE = onednn.LAYOUT + 1  # set_conv_layout's mode: 1 + the layout's number


def needs_onednn():
    if onednn.library_path() is None:
        pytest.skip(f"oneDNN is not installed: {install_hint('onednn')}")
    why = onednn.load()
    if why is not None:
        pytest.skip(why)


@pytest.fixture
def forced():
    """oneDNN's layout forced wherever it applies (lowered elsewhere), offered to both
    precisions; everything as it was after."""
    needs_onednn()
    was = (_C.onednn_offered(False), _C.onednn_offered(True))
    _C.clear_plans()
    _C.set_onednn_offered(True, True)
    _C.set_conv_layout(ONEDNN_MODE)
    yield
    _C.set_conv_layout(0)
    _C.set_onednn_offered(*was)
    _C.clear_plans()


@pytest.fixture
def bf16_gemms(monkeypatch):
    """bf16 GEMMs on (cct's kernel, or MKL emulating the units where the CPU lacks them),
    float32 after."""
    engine = "avx512bf16" if _C.bf16_kernel_supported() else "mkl"
    if engine == "mkl" and mkl.library_path() is None:
        pytest.skip(f"no bf16 engine to turn bf16 GEMMs on: {install_hint('bf16')}")
    monkeypatch.setenv(precision.ENGINE_ENV, engine)
    monkeypatch.setitem(plans._state, "bf16", None)
    monkeypatch.setitem(plans._state, "bf16_shapes", [])
    precision._chosen.clear()
    assert precision.set_precision("bf16", emulate=True) == "bf16"
    # Where oneDNN has no kernel the lowered GEMM runs, in bf16 on the direct operand order
    # (measured, it may run in float32 where that is faster).
    _C.set_gemm_order(1)
    yield
    _C.set_gemm_order(0)
    precision.set_precision("float32")
    precision._chosen.clear()


def runs_onednn(case, kernel_id):
    n, c, h, w, o, kernel, stride, pad, dilation, group = case
    return _C.onednn_conv_impl(kernel_id, (n, c, h, w), o, kernel, stride, pad, dilation, group,
                               _C.bf16_gemm_enabled()) != ""


def rounded(a):
    return _C.round_to_bf16(a).astype(np.float64)


def three_kernels(x, weight, bias, dy, geom, accumulate_into=None):
    y = cpu.conv_forward(x, weight, bias, *geom)
    dx = cpu.conv_backward_data(dy, weight, x.shape, *geom)
    dw = (accumulate_into.copy() if accumulate_into is not None
          else np.empty_like(weight))
    cpu.conv_backward_weight(x, dy, *geom, out=dw, accumulate=accumulate_into is not None)
    return y, dx, dw


def reference_kernels(x, weight, bias, dy, geom, accumulate_into=None):
    y = reference.conv_forward(x, weight, bias, *geom)
    dx = reference.conv_backward_data(dy, weight, x.shape, *geom)
    dw = reference.conv_backward_weight(x, dy, *geom)
    if accumulate_into is not None:
        dw = dw + accumulate_into
    return y, dx, dw


CASES = CONV_CASES + random_conv_cases(12, seed=34)


@pytest.mark.parametrize("case", CASES)
def test_float32_kernels_match_the_reference(forced, case):
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    start = np.random.default_rng(5).standard_normal(weight.shape).astype(np.float32)
    got = three_kernels(x, weight, bias, dy, geom, accumulate_into=start)
    want = reference_kernels(*(a.astype(np.float64) for a in (x, weight, bias, dy)), geom,
                             accumulate_into=start.astype(np.float64))
    for g, w in zip(got, want):
        close(g, w.astype(np.float32), np.float32)


@pytest.mark.parametrize("case", CASES)
def test_bf16_kernels_are_bf16_operands_with_float32_sums(forced, bf16_gemms, case):
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    got = three_kernels(x, weight, bias, dy, geom)
    # The reference multiplies the operands rounded to bf16, exactly, in float64; the bias and
    # the sums stay float32's (the tolerance is float32's, not bf16's).
    want = reference_kernels(rounded(x), rounded(weight), bias.astype(np.float64), rounded(dy),
                             geom)
    for g, w in zip(got, want):
        close(g, w.astype(np.float32), np.float32)


def test_a_plan_naming_oneDNN_runs_it(forced):
    """A plan table's layout 10 (a machine cache's, a snapshot's) runs oneDNN: the bits of
    the forced layout."""
    case = (4, 8, 12, 12, 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    assert all(runs_onednn(case, k) for k in range(3))
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    want = three_kernels(x, weight, bias, dy, geom)
    _C.set_conv_layout(0)
    geometry = [4, 8, 12, 12, 16, 12, 12, 3, 3, 1, 1, 1, 1, 1, 1, 1]
    threads = min(_C.get_num_threads(), 4)
    assert plans.install({"conv": [[k, geometry, 4, threads, 0, 1, onednn.LAYOUT, False]
                                   for k in range(3)]}) == 3
    got = three_kernels(x, weight, bias, dy, geom)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    assert {layout for *_, layout in _C.partition_choices()} == {"onednn"}


def test_relu_has_caffes_bits(forced):
    """The fused ReLU writes what Caffe's ReLU writes after the same convolution: +0, not
    oneDNN's -0, for a negative sum."""
    x, weight, bias, _, geom = conv_arrays(CONV_CASES[2], np.float32)
    plain = cpu.conv_forward(x, weight, bias, *geom)
    fused = cpu.conv_forward_relu(x, weight, bias, *geom)
    assert (plain < 0).any()
    want = cpu.relu_forward(plain, 0.0)
    np.testing.assert_array_equal(fused.view(np.uint32), want.view(np.uint32))


def test_a_geometry_oneDNN_refuses_runs_lowered(forced):
    # stride 3 over a 6-pixel bottom with a 2-tap kernel: Caffe's floor leaves a right pad of
    # -1, which oneDNN does not take.
    case = (2, 3, 6, 6, 4, (2, 2), (3, 3), (0, 0), (1, 1), 1)
    assert not any(runs_onednn(case, k) for k in range(3))
    x, weight, bias, dy, geom = conv_arrays(case, np.float32)
    got = three_kernels(x, weight, bias, dy, geom)
    want = reference_kernels(*(a.astype(np.float64) for a in (x, weight, bias, dy)), geom)
    for g, w in zip(got, want):
        close(g, w.astype(np.float32), np.float32)


def test_threads_change_the_primitive_not_the_answer(forced):
    x, weight, bias, dy, geom = conv_arrays(CONV_CASES[9], np.float32)
    threads = _C.get_num_threads()
    try:
        _C.set_num_threads(1)
        one = three_kernels(x, weight, bias, dy, geom)
        _C.set_num_threads(2)
        two = three_kernels(x, weight, bias, dy, geom)
    finally:
        _C.set_num_threads(threads)
    for a, b in zip(one, two):
        close(a, b, np.float32)


def test_the_offer_follows_the_environment(monkeypatch):
    monkeypatch.setenv(onednn.OFFER_ENV, "sometimes")
    with pytest.raises(CCTError, match=r"\$CCT_ONEDNN must be 'bf16', 'all' or 'off', got "
                                       r"'sometimes'"):
        onednn.wanted()
    for value, want in (("", (False, True)), ("bf16", (False, True)), ("ALL", (True, True)),
                        ("off", (False, False))):
        monkeypatch.setenv(onednn.OFFER_ENV, value)
        assert onednn.wanted() == want


def test_off_offers_nothing_and_keeps_the_fingerprint(monkeypatch):
    monkeypatch.setattr(onednn, "_state", {})
    monkeypatch.setenv(onednn.OFFER_ENV, "off")
    was = (_C.onednn_offered(False), _C.onednn_offered(True))
    try:
        onednn.offer()
        assert not _C.onednn_offered(False) and not _C.onednn_offered(True)
        assert onednn.why_not_offered() == "$CCT_ONEDNN=off"
        assert onednn.fingerprint() is None and "onednn" not in plans.fingerprint()
    finally:
        if any(was):
            _C.set_onednn_offered(*was)


def test_offered_it_enters_the_fingerprint(monkeypatch):
    needs_onednn()
    monkeypatch.setattr(onednn, "_state", {})
    monkeypatch.setenv(onednn.OFFER_ENV, "bf16")
    was = (_C.onednn_offered(False), _C.onednn_offered(True))
    try:
        onednn.offer()
        assert (_C.onednn_offered(False), _C.onednn_offered(True)) == (False, True)
        assert plans.fingerprint()["onednn"] == f"{_C.onednn_version()}; bf16"
        assert _C.onednn_version().startswith("3.")
    finally:
        _C.set_onednn_offered(*was)


def test_plans_naming_oneDNN_where_it_is_not_offered_warn(monkeypatch, capfd):
    monkeypatch.setattr(onednn, "_state", {"offered": (False, False), "why": "$CCT_ONEDNN=off"})
    row = [0, [2, 3, 7, 9, 4, 5, 7, 3, 3, 1, 1, 0, 0, 1, 1, 1], 4, 1, 0, 1, onednn.LAYOUT, False]
    try:
        assert plans.install({"conv": [row]}) == 1
    finally:
        _C.clear_plans()
    err = capfd.readouterr().err
    assert ("1 convolution plan(s) run oneDNN, which is not offered here ($CCT_ONEDNN=off): "
            "they run the lowered GEMM") in err


def test_a_library_that_is_not_onednn_is_refused(tmp_path):
    """In a process of its own: the first load holds for the process."""
    fake = tmp_path / "libdnnl.so.3"
    fake.write_bytes(b"not a library")
    code = "from cct.backend import onednn; from cct import _C; " \
           "print(onednn.load()); print(_C.onednn_loaded())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, onednn.LIBRARY_ENV: str(fake)}, check=True).stdout
    why, loaded = out.strip().splitlines()
    assert why.startswith(f"oneDNN '{fake}' did not load: ") and loaded == "False"
