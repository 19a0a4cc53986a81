"""The loss-curve model (cct/optimizer/curve.py) against synthetic curves whose answer is known."""
import math

import numpy as np
import pytest

from cct.optimizer.curve import fit_power_law, smooth


@pytest.mark.parametrize("a,c,start", [(3.0, 0.5, 0), (2.3, 0.3, 500), (5.0, 1.0, 10)])
def test_exact_power_law_is_recovered_and_predicts_the_crossing(a, c, start):
    t = start + 1 + np.arange(60)
    fit = fit_power_law(a * t ** (-c), start)
    assert fit.c == pytest.approx(c, rel=0.1)   # a window mean of a convex curve lies above it
    target = a * (4 * t[-1]) ** (-c)        # the model crosses it at 4 x the last iteration
    # Smoothing lags the curve slightly, so the prediction is close, not exact.
    assert fit.iterations_to(target) == pytest.approx(3 * t[-1], rel=0.15)


def test_noisy_power_law_predicts_the_crossing_within_a_tenth():
    rng = np.random.default_rng(0)
    t = 1 + np.arange(200)
    losses = 2.0 * t ** -0.4 * (1 + 0.1 * rng.standard_normal(t.size))
    fit = fit_power_law(losses)
    crossing = (2.0 / 0.2) ** (1 / 0.4)       # iteration 316
    assert 200 + fit.iterations_to(0.2) == pytest.approx(crossing, rel=0.1)


def test_reached_flat_and_diverged_curves():
    t = 1 + np.arange(40)
    assert fit_power_law(1.0 * t ** -0.5).iterations_to(5.0) == 0.0      # already below
    assert math.isinf(fit_power_law(np.full(40, 2.0)).iterations_to(1.0))   # flat: never
    rising = fit_power_law(np.linspace(1.0, 5.0, 40))
    assert rising.diverged and math.isinf(rising.iterations_to(0.5))
    nan = fit_power_law([2.0, 1.5, float("nan"), 1.0])
    assert nan.diverged and math.isinf(nan.iterations_to(0.5))


def test_smooth_is_a_trailing_mean():
    np.testing.assert_allclose(smooth([1, 2, 3, 4], window=2), [1, 1.5, 2.5, 3.5])
