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

**Uncertainty.** ``c_se`` is the standard error of c from the residuals of the log-log fit,
se^2 = w * RSS / (m - 2) / sum (log t - mean log t)^2 over the m fitted points: the textbook
least-squares error times w, the smoothing window, because a moving average over w
iterations leaves about m / w independent residuals, not m (without the factor a third of
flat noisy probes look falling at 2 se; with it about one in twenty). It is inf with fewer
than 3 fitted points. The probe gives evidence of falling (``falling``) when c - 2 c_se > 0.
``iterations_interval`` gives the iterations to a loss at exponents c + 2 c_se and
c - 2 c_se, the fitted curve turned about its value at the probe's end (inf where
c - 2 c_se <= 0: the probe cannot rule out a flat curve). That interval is the spread of a
ranking device over the probe's noise, not a confidence interval for the run: the model's
bias (no floor) is not in it, nor the smoothing's (a window mean of a convex curve lies above
it, most near the curve's start). On synthetic noisy power laws probed past their bend it
holds the true crossing about 4 times in 5.

**Plateaus.** ``leaving`` asks a plainer question of the raw losses, whatever the curve's
shape: does the probe's last fifth sit below its first fifth, by more than 2% and three
standard errors of the two means? A plateau drifts by less (CIFAR10-quick at lr 0.003: 2.303
to 2.293 in 200 iterations), and a probe that leaves one bends too late for a power law fitted
to all of it. The optimizer's plateau rule (cct/optimizer/plan.py) rests on it.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

#: a probe whose smoothed loss ends above this multiple of its first losses has diverged
DIVERGENCE_RATIO = 1.5
#: a probe leaves a plateau (``leaving``) when its last fifth's mean is this share below its
#: first fifth's, and EVIDENCE_T standard errors below
EVIDENCE_DROP = 0.02
EVIDENCE_T = 3.0
#: standard errors of c a probe's curve must fall by to count as evidence (``falling``), and
#: the half-width of ``iterations_interval`` in them
SE_MULTIPLE = 2.0
_LOG_MAX = math.log(sys.float_info.max)


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
    """L(t) = a t^-c fitted on a probe; ``last`` the smoothed loss at ``t_last``; ``c_se`` the
    standard error of c (inf: unknown, as for a fit made by hand)."""
    a: float
    c: float
    t_last: int
    last: float
    diverged: bool = False
    c_se: float = math.inf

    def loss_at(self, t: float) -> float:
        return self.a * float(t) ** (-self.c)

    @property
    def falling(self) -> bool:
        """Whether the probe is evidence that the loss falls: c - SE_MULTIPLE c_se > 0."""
        return not self.diverged and self.c - SE_MULTIPLE * self.c_se > 0

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

    def iterations_interval(self, target: float) -> Tuple[float, float]:
        """(lo, hi): :meth:`iterations_to` at exponents c + SE_MULTIPLE c_se and
        c - SE_MULTIPLE c_se, the curve turned about the model's loss at ``t_last`` (at t = 1
        for a fit ending before it); hi is inf when c - SE_MULTIPLE c_se <= 0. lo <= the
        prediction <= hi, all equal when c_se is 0 (see the module doc for what it means)."""
        at = self.iterations_to(target)
        if (at == 0.0 or self.diverged or not math.isfinite(self.last) or target <= 0
                or not self.a > 0 or self.c_se == 0.0):
            return at, at
        pivot = max(1.0, float(self.t_last))
        log_gap = math.log(self.a) - self.c * math.log(pivot) - math.log(target)

        def to(c: float) -> float:
            if not c > 1e-6:
                return math.inf
            log_t = math.log(pivot) + log_gap / c
            if log_t > 700.0:
                return math.inf
            return max(0.0, math.exp(log_t) - self.t_last)

        half = SE_MULTIPLE * self.c_se
        return min(at, to(self.c + half)), max(at, to(self.c - half))


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
    log_t, log_s = np.log(ts), np.log(ss)
    slope, intercept = np.polyfit(log_t, log_s, 1)
    if max(intercept, slope * math.log(t[-1])) > _LOG_MAX:
        # A short noisy probe late in a run spans little log t: a slope so steep that a, or
        # the model at the probe's end, is beyond a float is noise, no evidence; flat, as for
        # a single point (it raised OverflowError).
        return CurveFit(last, 0.0, int(t[-1]), last, diverged)
    return CurveFit(float(math.exp(intercept)), float(-slope), int(t[-1]), last, diverged,
                    _slope_se(log_t, log_s, slope, intercept, w))


def _slope_se(x: np.ndarray, y: np.ndarray, slope: float, intercept: float, w: int) -> float:
    """The standard error of a least-squares slope through (x, y) whose y are moving averages
    over ``w`` points (see the module doc); inf with fewer than 3 points."""
    if x.size < 3:
        return math.inf
    sxx = float(np.sum((x - x.mean()) ** 2))
    rss = float(np.sum((y - (slope * x + intercept)) ** 2))
    if not sxx > 0:
        return math.inf
    return math.sqrt(w * rss / (x.size - 2) / sxx)


def leaving(losses: Sequence[float]) -> bool:
    """Whether a probe's losses fall: the mean of its last fifth below the mean of its first
    fifth by more than EVIDENCE_DROP of it and by more than EVIDENCE_T standard errors of the
    two means (the raw losses' spread within each fifth). A plateau's losses drift by less
    (CIFAR10-quick at lr 0.003: 2.303 to 2.293 in 200 iterations, 0.4%)."""
    x = np.asarray(losses, dtype=np.float64)
    k = max(3, x.size // 5)
    if x.size < 2 * k or not np.all(np.isfinite(x)):
        return False
    head, tail = x[:k], x[-k:]
    drop = float(head.mean() - tail.mean())
    noise = math.sqrt(float(head.var(ddof=1) + tail.var(ddof=1)) / k)
    return drop > EVIDENCE_DROP * float(head.mean()) and drop > EVIDENCE_T * noise
