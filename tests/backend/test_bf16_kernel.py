"""cct's bf16 kernel (csrc/bf16_kernel.cpp) against VDPBF16PS as Intel's SDM defines it.

The kernel's forms promise one chain per value of C: VDPBF16PS's pair steps in k's order from
zero, then beta C added with one rounding (test_bf16_skinny.py, test_bf16_thin.py). Those tests
compare the forms with each other; these compare all three with the chain itself, computed here
exactly from the SDM's Operation section for VDPBF16PS: in each 32-bit lane the product of the
high bf16 pair (k = 2p + 1) is added first, then the low one's (k = 2p), each step "FP32 FMA
with daz in, ftz out and RNE rounding", MXCSR neither consulted nor updated.

They run where the CPU has AVX512-BF16 (the hardware's bits: a Zen 4, a Xeon) and on the
emulated build of test_avx512_emulated.py (csrc/avx512.h's cct_emulated_dpbf16_ps), so a chain
that differs from the definition on either fails here. The model's own tests run everywhere.

A denormal result is "tiny" as x86 detects it (SDM vol. 1, 11.5.2.5): after rounding to 24 bits
with the exponent unbounded. The one case that tells that from the alternative (tiny before
rounding) has a test of its own, so that a CPU that flushes otherwise is named by it."""
import math
from fractions import Fraction

import numpy as np
import pytest

from cct.backend import plans

# the fixture: bf16 GEMMs on cct's kernel, an empty plan table (skips without AVX512-BF16)
from .test_bf16_skinny import bf16  # noqa: F401
from .test_bf16_skinny import product

KERNEL = 9  # plans.BF16_ENGINE_CHOICES: the kernel's direct order
FORMS = {"kernel": KERNEL, "skinny": plans.BF16_SKINNY_CHOICE, "thin": plans.BF16_THIN_CHOICE}
SMALLEST_NORMAL = 2.0 ** -126
OVERFLOW = 2.0 ** 128


def round_to_float32(q: Fraction, flush: bool) -> float:
    """``q`` rounded to nearest even: to 24 bits with the exponent unbounded, then a result
    under float32's smallest normal flushed to a zero of its sign (``flush``, VDPBF16PS's "ftz
    out") or rounded again onto the denormals' grid of 2^-149 (IEEE's, the beta C step's)."""
    if q == 0:
        return 0.0
    sign, q = (-1.0 if q < 0 else 1.0), abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1  # 2^e <= q < 2^(e + 1)
    step = Fraction(2) ** (e - 23)
    if not flush and e < -126:
        step = Fraction(2) ** -149
    units, rest = divmod(q, step)
    units += rest > step / 2 or (rest == step / 2 and units % 2 == 1)
    value = float(units * step)
    if value >= OVERFLOW:
        return sign * math.inf
    if flush and value < SMALLEST_NORMAL:
        return sign * 0.0
    return sign * value


def daz(v: float) -> float:
    return math.copysign(0.0, v) if 0.0 < abs(v) < SMALLEST_NORMAL else v


def fused(acc: float, x: float, y: float, flush: bool) -> float:
    """acc + x y with one rounding (``round_to_float32``'s)."""
    if not (math.isfinite(acc) and math.isfinite(x) and math.isfinite(y)):
        return float(np.float32(acc + x * y))  # IEEE's infinities and NaN (x y is exact here)
    exact = Fraction(acc) + Fraction(x) * Fraction(y)
    if exact == 0:  # an exact zero is -0 only as (-0) + (-0): round to nearest even's rule
        product_negative = math.copysign(1.0, x) * math.copysign(1.0, y) < 0
        return -0.0 if math.copysign(1.0, acc) < 0 and product_negative else 0.0
    return round_to_float32(exact, flush)


def dpbf16_step(acc: float, x: float, y: float) -> float:
    """acc + x y as one step of VDPBF16PS: denormal inputs read as zero, one rounding, a tiny
    result flushed."""
    return fused(daz(acc), daz(x), daz(y), flush=True)


def chain(a_row, b_column, start=None) -> np.float32:
    """One value of C as the kernel promises it, from op(A)'s row and op(B)'s column (bf16
    values): the pairs in k's order, the high one of each first, an odd k's last pair completed
    by zeros; then ``start`` (beta C, beta 1) added with IEEE's one rounding."""
    a, b = [float(v) for v in a_row], [float(v) for v in b_column]
    if len(a) % 2:
        a, b = a + [0.0], b + [0.0]
    acc = 0.0
    for p in range(len(a) // 2):
        acc = dpbf16_step(acc, a[2 * p + 1], b[2 * p + 1])
        acc = dpbf16_step(acc, a[2 * p], b[2 * p])
    if start is not None:  # fma(beta, C, chain), beta 1, under the default MXCSR
        acc = fused(acc, 1.0, float(start), flush=False)
    return np.float32(acc)


def bf16_values(x):
    """float32 values that are bf16 already (the kernel's rounding leaves them as they are)."""
    x = np.asarray(x, np.float32)
    assert np.all(x.view(np.uint32) & 0xFFFF == 0), "not exactly bf16"
    return x


def run(form, a_op, b_op, start=None):
    """C = op(A) op(B) (+ start) on one of the kernel's forms: op(B) handed as B (n x k) for
    the skinny form and the kernel, as k x n for the thin one."""
    m, n = a_op.shape[0], b_op.shape[1]
    accumulate = start is not None
    if start is None:
        start = np.zeros((m, n), np.float32)
    if form == "thin":
        return product(a_op, np.ascontiguousarray(b_op), start, False, accumulate,
                       FORMS[form], trans_b=False)
    return product(a_op, np.ascontiguousarray(b_op.T), start, False, accumulate, FORMS[form])


def tiled(a_k, b_k, m=3, n=20):
    """op(A) (m x k) with every row ``a_k`` and op(B) (k x n) with every column ``b_k``: every
    lane of every tile runs the case."""
    a_k, b_k = bf16_values(a_k), bf16_values(b_k)
    return np.tile(a_k, (m, 1)), np.tile(b_k[:, None], (1, n))


# (a's k values, b's k values, the value of C, why): products chosen exact in bf16's range so
# that each case turns on one clause of the definition.
CASES = {
    # 1 + 2^-24 ties to 1 twice, then 1 - 1: 0. The low product first (SIMDe's VDPBF16PS),
    # or each pair summed before it is added, leaves 2^-24.
    "the high pair first": ([2.0 ** -24, 1.0, -1.0, 2.0 ** -24], [1.0] * 4, 0.0),
    # a denormal bf16 operand (2^-130) times 2^100 would be 2^-30
    "denormal a read as zero": ([2.0 ** -130, 0.0], [2.0 ** 100, 0.0], 0.0),
    "denormal b read as zero": ([2.0 ** 100, 0.0], [2.0 ** -130, 0.0], 0.0),
    # 2^-70 2^-70 = 2^-140: a denormal float32, exact, and still flushed
    "a denormal result flushed": ([2.0 ** -70, 0.0], [2.0 ** -70, 0.0], 0.0),
    "its sign kept": ([-(2.0 ** -70), 0.0], [2.0 ** -70, 0.0], -0.0),
    # 2^-126 - 2^-152 rounds to 2^-126 on 24 bits: not tiny, kept
    "just under 2^-126, rounding up to it": ([-(2.0 ** -76), 2.0 ** -63],
                                             [2.0 ** -76, 2.0 ** -63], SMALLEST_NORMAL),
    # 2^127 2 + 2^127 2: each product 2^128 computed exactly inside the FMA, then infinity
    "overflow to infinity": ([2.0 ** 127, 2.0 ** 127], [2.0, 2.0], math.inf),
    # k odd: the last pair's high half is zero
    "an odd k": ([3.0, 5.0, 7.0], [1.0, 2.0, 4.0], 41.0),
}
# 2^-126 - 2^-150 has 24 bits: tiny after rounding (flushed), where the denormals' grid of
# 2^-149 would round it up to 2^-126 (a tie, to even).
TINY_AFTER_ROUNDING = ([-(2.0 ** -75), 2.0 ** -63], [2.0 ** -75, 2.0 ** -63], 0.0)


def bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_model_gives_each_cases_value(case):
    a_k, b_k, want = CASES[case]
    assert bits(chain(bf16_values(a_k), bf16_values(b_k))) == bits(want)


def test_the_model_flushes_a_result_tiny_after_rounding():
    a_k, b_k, want = TINY_AFTER_ROUNDING
    assert bits(chain(bf16_values(a_k), bf16_values(b_k))) == bits(want)


def test_the_models_beta_step_keeps_denormals():
    """beta C is IEEE's FMA under the default MXCSR: a denormal C comes through."""
    assert bits(chain(bf16_values([0.0]), bf16_values([0.0]), np.float32(2.0 ** -140))) == \
        bits(2.0 ** -140)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_case_as_defined(bf16, case, form):
    a_k, b_k, want = CASES[case]
    a_op, b_op = tiled(a_k, b_k)
    got = run(form, a_op, b_op)
    np.testing.assert_array_equal(bits(got), np.full(got.shape, bits(want)), err_msg=case)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_result_tiny_after_rounding_is_flushed(bf16, form):
    """x86's tininess (after rounding, the exponent unbounded). A CPU that detects it before
    rounding gives 2^-126 here, and the emulation (csrc/avx512.h) would have to follow it."""
    a_k, b_k, want = TINY_AFTER_ROUNDING
    got = run(form, *tiled(a_k, b_k))
    np.testing.assert_array_equal(bits(got), np.full(got.shape, bits(want)))


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_denormal_c_comes_through_the_beta_step(bf16, form):
    a_op, b_op = tiled([0.0, 0.0], [0.0, 0.0])
    start = np.full((a_op.shape[0], b_op.shape[1]), 2.0 ** -140, np.float32)
    got = run(form, a_op, b_op, start)
    np.testing.assert_array_equal(bits(got), bits(start))


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_value_is_the_defined_chain(bf16, form, accumulate):
    """Random operands, exactly bf16, at magnitudes from 2^-40 to 2^40 (so the steps round
    at many places): every value of C, bit for bit, against the chain computed exactly."""
    rng = np.random.default_rng(7)
    m, n, k = 5, 37, 23  # a partial tile each way, an odd k

    def operand(shape):  # truncated to bf16's 8 significant bits
        x = np.float32(rng.standard_normal(shape) * np.exp2(rng.integers(-40, 41, shape)))
        return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)

    a_op, b_op = operand((m, k)), operand((k, n))
    start = operand((m, n)) if accumulate else None
    got = run(form, a_op, b_op, start)
    want = np.array([[chain(a_op[i], b_op[:, j], None if start is None else start[i, j])
                      for j in range(n)] for i in range(m)], np.float32)
    np.testing.assert_array_equal(bits(got), bits(want))

