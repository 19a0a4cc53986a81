"""The loss-curve model that turns a short probe into a predicted number of iterations.

A probe gives the training loss at iterations t0+1 .. t0+n of the run (t counted from the
run's start, so that a probe late in training sees the flat part of the curve). The model is a
power law without floor,

    L(t) = a * t^(-c),        log L = log a - c log t,

fitted by least squares in log-log space to the smoothed losses (a trailing moving average
over a fifth of the probe, each placed at the middle of its window; the first fifth left out
as transient). The iterations still needed to
reach a loss L* are then t* - t_now with t* = (a / L*)^(1/c).

This is an approximation, and a deliberately simple one: real curves flatten towards a floor
that a power law without floor does not have, so predictions far beyond the probe are
optimistic; a probe whose curve does not fall (c <= 0) predicts "never". It is used to rank
candidates against each other from probes of equal length, where the bias is shared, not to
promise a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

#: a probe whose smoothed loss ends above this multiple of its first losses has diverged
DIVERGENCE_RATIO = 1.5


def smooth(losses: Sequence[float], window: Optional[int] = None) -> np.ndarray:
    """Trailing moving average (the first values average what there is so far)."""
    x = np.asarray(losses, dtype=np.float64)
    if x.size == 0:
        return x
    w = window or max(1, x.size // 5)
    c = np.cumsum(np.insert(x, 0, 0.0))
    idx = np.arange(1, x.size + 1)
    lo = np.maximum(0, idx - w)
    return (c[idx] - c[lo]) / (idx - lo)


@dataclass
class CurveFit:
    """L(t) = a t^-c fitted on a probe; ``last`` the smoothed loss at ``t_last``."""
    a: float
    c: float
    t_last: int
    last: float
    diverged: bool = False

    def loss_at(self, t: float) -> float:
        return self.a * float(t) ** (-self.c)

    def iterations_to(self, target: float) -> float:
        """Iterations after ``t_last`` until the model reaches ``target`` (0 when the probe
        already has; inf when it never will)."""
        if self.diverged or not math.isfinite(self.last):
            return math.inf
        if self.last <= target:
            return 0.0
        if self.c <= 1e-6 or target <= 0:
            return math.inf
        log_t = math.log(self.a / target) / self.c
        if log_t > 700.0:           # a nearly flat curve: beyond any float, never
            return math.inf
        return max(0.0, math.exp(log_t) - self.t_last)


def fit_power_law(losses: Sequence[float], start_iter: int = 0) -> CurveFit:
    """Fit the model to the losses of iterations ``start_iter + 1, ...`` (see the module
    doc). Non-finite losses, or a smoothed loss ending above DIVERGENCE_RATIO times the
    highest loss of the first fifth, mark the fit diverged."""
    x = np.asarray(losses, dtype=np.float64)
    n = x.size
    if n == 0:
        return CurveFit(math.nan, 0.0, start_iter, math.nan, diverged=True)
    if not np.all(np.isfinite(x)):
        return CurveFit(math.nan, 0.0, start_iter + n, math.inf, diverged=True)
    w = max(1, n // 5)
    s = smooth(x, w)
    t = start_iter + 1 + np.arange(n, dtype=np.float64)
    # A trailing mean stands for the middle of its window, not its last iteration.
    centre = t - (np.minimum(np.arange(n) + 1, w) - 1) / 2.0
    skip = n // 5
    ts, ss = centre[skip:], np.maximum(s[skip:], 1e-12)
    last = float(s[-1])
    # Against the highest raw loss of the first fifth, not the smoothed start: near a low loss
    # the noise alone moves a short average by half, and that is not a divergence.
    diverged = last > DIVERGENCE_RATIO * float(np.max(x[:skip + 1])) + 1e-12
    if ts.size < 2 or np.ptp(np.log(ts)) == 0:
        return CurveFit(last, 0.0, int(t[-1]), last, diverged)
    slope, intercept = np.polyfit(np.log(ts), np.log(ss), 1)
    return CurveFit(float(math.exp(intercept)), float(-slope), int(t[-1]), last, diverged)
