"""Omnivore's optimizer as a baseline (HazyResearch/Omnivore ``omnivore.py``'s cold start, as
../shared/research/omnivore.md section 1 describes it), for bench/bench_time_to_accuracy.py.

Faithful in what it decides:

* groups from 1 upward (Omnivore's loop runs from one group of all machines to the most
  groups); at 1 group, lr in {1e-4, 1e-3, 1e-2, 1e-1} at momentum 0.9; at more groups, momentum
  in {0, .3, .6, .9} x lr in {lr_prev / 10, lr_prev}; probes in lr-ascending, then
  momentum-ascending order;
* skipped: lr >= lr_NaN and momentum >= mu_NaN once (lr_NaN, mu_NaN) gave a NaN; lr above
  lr_prev, or lr_prev with momentum above mu_prev ("staleness only lowers the optimum"); lr
  below lr_prev with momentum below mu_prev ("too low");
* each probe is a fixed slice of wall time, from the same starting point (here: the state the
  search began in; Omnivore: seed-1 initialisation), scored by the mean loss of its last 10
  display lines (display every 5 iterations, each line the mean loss of its 5 iterations, as
  Omnivore's FC server prints them); a NaN loss scores NaN;
* HE(g), seconds per iteration, is measured once, on the first probe at g, over the second half
  of its display lines; after any probe at g, HE(g) > HE(g_prev) / 1.10 ends the cold start
  (its probes so far still compete; this is a reading of "returns at once");
* the best (lr, momentum) at each g is the lowest score (buffer 1.0, so the buffer rule never
  fires in cold start); the chosen g is the one whose best scored lowest: equal wall time,
  lowest loss, no HE x SE model. Phases 1 and 3 are off, as in both of Omnivore's examples.

Different, and said so: probes branch from an in-memory copy of weights, history and data
position (:meth:`Solver.capture`) instead of relaunching the cluster, so no probe pays
Omnivore's 30 s of start and kill; the decision run goes on from that same state in this
process. Steady state (re-search every epoch from the last snapshot, halving the groups when the
best momentum is 0) is :meth:`OmnivoreSearch.steady`, with the same branches.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..glog import info
from .plan import Candidate, Optimizer

SRC = "omnivore.py:0"
COLD_LRS = (1e-4, 1e-3, 1e-2, 1e-1)
MOMENTA = (0.0, 0.3, 0.6, 0.9)
DISPLAY = 5             # Omnivore's solver templates: display: 5
LAST_LINES = 10         # the score: mean loss of the last 10 display lines
TIME_THRESHOLD = 0.10   # "FC saturation": more groups must cut HE by 10%


@dataclass
class Probe:
    groups: int
    lr: float
    momentum: float
    score: float = math.nan
    lines: int = 0
    status: str = "probed"

    def row(self) -> str:
        return (f"groups {self.groups:>3} lr {self.lr:>8.4g} momentum {self.momentum:>4.2g} "
                f"score {self.score:>8.4g} ({self.lines} display lines)  {self.status}")


@dataclass
class Choice:
    groups: int
    lr: float
    momentum: float
    score: float
    probes: List[Probe] = field(default_factory=list)
    he: Dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0        # wall time the search took


def display_lines(record: Sequence[Tuple[float, float]], display: int = DISPLAY
                  ) -> List[Tuple[float, float]]:
    """(time, mean loss) of each complete display interval of a probe's iterations."""
    out = []
    for i in range(display, len(record) + 1, display):
        chunk = record[i - display:i]
        out.append((chunk[-1][0], float(np.mean([v for _, v in chunk]))))
    return out


def score(lines: Sequence[Tuple[float, float]]) -> float:
    """Mean loss of the last 10 display lines; NaN when any line is NaN or there is none."""
    losses = [v for _, v in lines]
    if not losses or not all(math.isfinite(v) for v in losses):
        return math.nan
    return float(np.mean(losses[-LAST_LINES:]))


def seconds_per_iteration(lines: Sequence[Tuple[float, float]], display: int = DISPLAY
                          ) -> float:
    """Omnivore's HE: (t[N-1] - t[N-k]) / (k - 1) / display, k = N - max(N // 2, 1)."""
    n = len(lines)
    k = n - max(n // 2, 1)
    if k < 2:
        return math.inf if n < 2 else (lines[-1][0] - lines[0][0]) / (n - 1) / display
    return (lines[n - 1][0] - lines[n - k][0]) / (k - 1) / display


class OmnivoreSearch:
    """Omnivore's cold start (module doc) on ``solver``; ``groups`` ascending (default 1, 2,
    4, ... up to the cores or devices), each probe ``probe_seconds`` of wall time."""

    def __init__(self, solver, *, probe_seconds: float = 60.0,
                 groups: Optional[Sequence[int]] = None, engine: str = "threads",
                 devices=None, staleness: str = "round-robin"):
        self.probe_seconds = probe_seconds
        self.opt = Optimizer(solver, engine=engine, devices=devices, groups=groups,
                             staleness=staleness)
        self.solver = solver

    def _probe(self, g: int, lr: float, mu: float, he: Dict[int, float]) -> Probe:
        cand = self.opt._candidate(g, self.opt.data_batch, lr, mu)
        branch = self.opt._branch(cand, DISPLAY, seconds=self.probe_seconds)
        lines = display_lines(branch.record)
        p = Probe(g, lr, mu, math.nan if branch.diverged else score(lines), len(lines))
        if math.isnan(p.score):
            p.status = "NaN"
        he.setdefault(g, seconds_per_iteration(lines))
        return p

    def _grid(self, prev: Optional[Probe], lrs: Sequence[float]) -> List[Tuple[float, float]]:
        if prev is None:
            return [(lr, 0.9) for lr in sorted(lrs)]
        return sorted((lr, mu) for lr in (prev.lr / 10, prev.lr) for mu in MOMENTA)

    def _skip(self, lr: float, mu: float, prev: Optional[Probe],
              nan_at: Optional[Tuple[float, float]]) -> str:
        if nan_at is not None and lr >= nan_at[0] and mu >= nan_at[1]:
            return "skipped: at or above a NaN"
        if prev is not None:
            if lr > prev.lr or (lr == prev.lr and mu > prev.momentum):
                return "skipped: above the previous optimum"
            if lr < prev.lr and mu < prev.momentum:
                return "skipped: too low"
        return ""

    def search(self, lrs: Sequence[float] = COLD_LRS, prev: Optional[Probe] = None,
               groups: Optional[Sequence[int]] = None) -> Choice:
        """The cold start: the chosen (groups, lr, momentum) and every probe, logged."""
        began = time.perf_counter()
        he: Dict[int, float] = {}
        probes: List[Probe] = []
        best: Optional[Probe] = None
        prev_g: Optional[int] = None
        for g in groups or self.opt.groups:
            nan_at = None
            here: List[Probe] = []
            saturated = False
            for lr, mu in self._grid(prev, lrs):
                why = self._skip(lr, mu, prev, nan_at)
                if why:
                    probes.append(Probe(g, lr, mu, status=why))
                    continue
                p = self._probe(g, lr, mu, he)
                probes.append(p)
                here.append(p)
                if math.isnan(p.score) and nan_at is None:
                    nan_at = (lr, mu)
                if prev_g is not None and he[g] > he[prev_g] / (1 + TIME_THRESHOLD):
                    p.status += f"; HE {he[g]:.3g} s/iter not 10% better: stop adding groups"
                    saturated = True
                    break
            scored = [p for p in here if not math.isnan(p.score)]
            if scored:
                cand = min(scored, key=lambda p: p.score)
                if best is None or cand.score < best.score:
                    best = cand
                prev, prev_g = cand, g
            if saturated:
                break
        if best is None:
            best = Probe(1, min(lrs), 0.9, status="every probe gave NaN")
        best.status += "; chosen"
        choice = Choice(best.groups, best.lr, best.momentum, best.score, probes, he,
                        time.perf_counter() - began)
        info(SRC, f"Omnivore cold start: {len(probes)} grid points, "
             f"{sum(p.lines > 0 for p in probes)} probes of {self.probe_seconds:g} s, "
             f"{choice.seconds:.3g} s; HE " +
             ", ".join(f"g={g}: {v:.3g} s/iter" for g, v in he.items()))
        for p in probes:
            info(SRC, "  " + p.row())
        return choice

    def steady(self, last: Choice) -> Choice:
        """Omnivore's steady state, one epoch's re-search from the current state: lr in
        {lr_last / 10, lr_last} x momentum around (lr_last, mu_last) with the same skips; while
        the best momentum is 0 and groups can halve, halve them and search again with
        mu_last = 0.6."""
        prev = Probe(last.groups, last.lr, last.momentum)
        while True:
            choice = self.search(lrs=(), prev=prev, groups=[prev.groups])
            if choice.momentum != 0 or choice.groups <= 1:
                return choice
            prev = Probe(max(1, choice.groups // 2), choice.lr, 0.6)

    def configure(self, choice: Choice) -> Candidate:
        """Make the solver train as ``choice`` says (the optimizer's configure: the solver
        alone, or a driver on it)."""
        cand = self.opt._candidate(choice.groups, self.opt.data_batch, choice.lr,
                                   choice.momentum)
        self.opt.configure(cand)
        return cand

    def step(self, iters: int) -> None:
        self.opt._step(iters)

    def close(self) -> None:
        self.opt.close()
