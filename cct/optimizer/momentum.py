"""``--momentum=auto``: the explicit momentum for asynchronous groups, measured by short probes
at the run's group count, not set by the 1 - 1/g rule alone (issue 33, item 2).

"Asynchrony begets momentum" (arXiv 1605.09774): staleness of mean E[tau] acts as an implicit
momentum mu_S = E[tau] / (1 + E[tau]) (Theorem 5's 1 - 1/M for M exponential workers), so the
rule sets explicit = solver's momentum - mu_S. The paper's own measured optima sit well above
that rule (CIFAR 0.7/0.6/0.2/0.1 at 1/2/4/8 workers; ../shared/research/omnivore.md section
3.2), and on LeNet at 8 round-robin groups the rule's 0.028 tests no better than 0 while 0.45
is 24% lower. So the rule is used as a lower bound, and the momentum is chosen by probes:

1. **Measure** the staleness at ``groups``: one short driven branch (:meth:`Optimizer.measure_he`
   with ``4 x groups`` iterations, at least MEASURE_MIN), which fills ``Optimizer.implicit``.
2. **Candidates** (:func:`candidate_momenta`): the paper's grid GRID, capped at the solver's
   momentum, pruned below the rule's centre ``solver's momentum - mu_S`` minus one grid step,
   and extended below zero in STEP steps down to that floor when negative momenta are allowed
   (``allow_negative``) or the measured staleness alone puts the centre below zero.
3. **Probes** (:meth:`Optimizer.probe`: branches of the run from :meth:`Solver.capture`, every
   one from the same point over the same batches, so paired) by successive halving: every
   candidate for ``n = 9 (E[tau] + 1)`` updates (ROUNDS_OF_STALENESS: shorter probes favour
   small momenta, whose gain comes early; at least MIN_ROUND, less where the first round would
   pass ``budget``), then the better half goes on from its probe's end for as many updates
   again as it has had, until one is left or another round would pass ``budget`` (probe
   updates in all, the measurement included: 500 by default; LeNet at 8 groups spends 487 in
   one round of 7 x 65). Equal lr, equal updates: candidates rank by their smoothed loss at
   the probe's end, the mean of the last quarter of its losses (at least SCORE_MIN of them);
   a diverged probe is out.
4. **The probes are thrown away**: the run goes back to where it was (the branches restore it),
   and training starts there with the chosen momentum, so its log, tests and snapshots are
   those of a run given that momentum (``--momentum=X``); the probe updates are a cost,
   reported apart (:attr:`MomentumChoice.probe_updates`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from ..glog import info
from .plan import Candidate, Optimizer

SRC = "momentum.py:0"
GRID = (0.0, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9)   # the grid, the paper's 0.15 steps
STEP = 0.15
MU_MIN = -0.9               # the optimizer's floor (plan.MU_RANGE)
MEASURE_MIN = 16            # updates of the staleness measurement, at least
MIN_ROUND = 20              # updates of a first-round probe, at least
# A first-round probe lasts this many rounds of staleness, E[tau] + 1 updates each: momentum
# pays only once its history has built up, later the more stale the updates. On LeNet at 8
# round-robin groups, probes of 3 rounds ranked 0.15 first (500 updates: 0.6 is best, 0.15
# 45% worse); probes of 8 to 10 rounds ranked the momenta as 500 updates do.
ROUNDS_OF_STALENESS = 9
SCORE_MIN = 5               # losses averaged for a probe's score, at least
BUDGET = 500                # probe updates in all (measurement included), by default


@dataclass
class MomentumChoice:
    """What ``--momentum=auto`` measured, probed and chose."""
    momentum: float
    groups: int
    staleness_mean: float           # E[tau] measured
    implicit: float                 # E[tau] / (1 + E[tau])
    centre: float                   # the rule: the solver's momentum - implicit
    solver_momentum: float
    negative: str                   # whether negative momenta were considered, and why
    candidates: List[Candidate] = field(default_factory=list)
    pruned: List[float] = field(default_factory=list)     # grid values not probed
    measure_updates: int = 0
    # every update the probes cost, the measurement included (a diverged probe counted in full)
    probe_updates: int = 0
    rounds: List[str] = field(default_factory=list)
    stopped: str = ""
    reason: str = ""

    def table(self) -> List[str]:
        rows = [f"{'momentum':>8} {'probe it':>8} {'end loss':>9}  status"]
        for c in sorted(self.candidates, key=lambda c: c.momentum):
            score = _score(c)
            rows.append(f"{c.momentum:>8.4g} {c.probed:>8} "
                        f"{score if math.isfinite(score) else float('nan'):>9.4g}  {c.status}")
        for mu in self.pruned:
            why = (f"above the solver's {self.solver_momentum:g}"
                   if mu > self.solver_momentum + 1e-6 else
                   f"below the rule's {self.centre:.3g} minus one step {STEP:g}")
            rows.append(f"{mu:>8.4g} {'-':>8} {'-':>9}  not probed: {why}")
        return rows

    def log(self) -> None:
        info(SRC, f"Momentum auto: probed {len(self.candidates)} momenta at {self.groups} "
             f"groups (measured staleness E[tau]={self.staleness_mean:.3g} over "
             f"{self.measure_updates} updates, implicit {self.implicit:.3g}; the rule's "
             f"centre {self.solver_momentum:g} - {self.implicit:.3g} = {self.centre:.3g}; "
             f"{self.negative}); rounds {', '.join(self.rounds)}"
             f"{'; stopped: ' + self.stopped if self.stopped else ''}; "
             f"{self.probe_updates} probe updates, thrown away")
        for row in self.table():
            info(SRC, "  " + row)
        info(SRC, f"Momentum auto: chose {self.momentum:.4g}: {self.reason}")


def candidate_momenta(solver_momentum: float, implicit: float, *, allow_negative: bool = False,
                      grid: Sequence[float] = GRID, step: float = STEP
                      ) -> Tuple[List[float], List[float], str]:
    """(momenta to probe, ascending; grid values left out; whether negatives were considered
    and why). The grid capped at ``solver_momentum`` and pruned below the rule's centre
    ``solver_momentum - implicit`` minus ``step``; below zero, multiples of ``step`` down to
    that floor (not under MU_MIN) when ``allow_negative`` or the centre is negative."""
    centre = solver_momentum - implicit
    floor = centre - step
    eps = 1e-6          # the solver's momentum is a float32: 0.9 reads 0.89999998
    keep = [round(m, 4) for m in sorted(grid) if floor - eps <= m <= solver_momentum + eps]
    left = [round(m, 4) for m in sorted(grid) if round(m, 4) not in keep]
    if allow_negative or centre < 0:
        why = ("allowed (-allow-negative-momentum)" if allow_negative else
               f"the measured implicit momentum {implicit:.3g} exceeds the solver's "
               f"{solver_momentum:g}")
        k, negative = 1, []
        while -k * step >= max(floor, MU_MIN) - eps:
            negative.append(round(-k * step, 4))
            k += 1
        note = (f"negative momenta considered ({why}): "
                f"{', '.join(f'{m:g}' for m in reversed(negative))}" if negative else
                f"negative momenta considered ({why}), none within one step of the centre")
        keep = sorted(set(negative) | set(keep))
    else:
        note = ("negative momenta not considered (the centre is not negative; "
                "-allow-negative-momentum allows them)")
    if not keep:            # a grid that misses the window: its value nearest the centre
        keep = [min(grid, key=lambda m: abs(m - centre))]
        left = [m for m in left if m not in keep]
    return keep, left, note


def first_round(staleness_mean: float, candidates: int, budget: int) -> int:
    """A first-round probe's updates: ROUNDS_OF_STALENESS x (E[tau] + 1), at least MIN_ROUND,
    less where one round of every candidate would pass ``budget``."""
    want = max(MIN_ROUND, math.ceil(ROUNDS_OF_STALENESS * (staleness_mean + 1)))
    return max(MIN_ROUND, min(want, budget // max(1, candidates)))


def choose_momentum(solver, *, groups: int, engine: str = "simulated", devices=None,
                    staleness: str = "round-robin", allow_negative: bool = False,
                    grid: Optional[Sequence[float]] = None, probe_iters: Optional[int] = None,
                    budget: int = BUDGET, batch: Optional[int] = None,
                    log: bool = True, driver_config=None) -> MomentumChoice:
    """Measure the staleness at ``groups``, probe the candidate momenta, choose (module doc).
    The solver is left where it was (weights, history, iteration, data position).
    ``probe_iters`` fixes the first round's length; ``budget`` bounds the probe updates in all
    (the measurement included) when it does not; ``batch`` is the groups' batch (Hogbatch's,
    default the data layers'); ``driver_config`` the run's DriverConfig, whose other settings
    (``seed``, ``sync_fc`` ...) the probes' drivers take too."""
    opt = Optimizer(solver, engine=engine, devices=devices, groups=[groups],
                    staleness=staleness, he_iters=max(MEASURE_MIN, 4 * groups) - 2,
                    driver_config=driver_config)
    try:
        base, lr = opt.base_momentum, opt.base_lr
        batch = batch or opt.data_batch
        centre_c = opt._candidate(groups, batch, lr, base)
        opt.measure_he(centre_c)
        measured = 2 + opt.he_iters
        implicit = opt.implicit.get(centre_c.config, 0.0)
        tau = implicit / (1.0 - implicit) if implicit < 1 else math.inf
        momenta, left, note = candidate_momenta(base, implicit, allow_negative=allow_negative,
                                                grid=GRID if grid is None else grid)
        choice = MomentumChoice(momenta[0], groups, tau, implicit, base - implicit, base, note,
                                pruned=left, measure_updates=measured)
        live = [opt._candidate(groups, batch, lr, mu) for mu in momenta]
        choice.candidates = list(live)
        n = probe_iters or first_round(tau, len(live), max(0, budget - measured))
        spent, more = measured, n
        while True:
            cost = len(live) * more
            if choice.rounds and spent + cost > budget and not probe_iters:
                choice.stopped = (f"another round ({cost} updates) would pass the budget of "
                                  f"{budget} probe updates")
                break
            for c in live:
                opt.probe(c, more, keep=True)
            spent += cost
            choice.rounds.append(f"{len(live)} x {live[0].probed}")
            live = [c for c in live if c.status == "kept"]
            if not live:
                break
            live.sort(key=_score)
            if len(live) == 1:
                break
            better = live[:(len(live) + 1) // 2]
            for c in live[len(better):]:
                c.status = (f"out after {c.probed} updates: end loss {_score(c):.4g} behind "
                            f"the leader's {_score(live[0]):.4g}")
                c.drop_branch()
            live = better
            more = live[0].probed
            if len(live) == 1:
                break
        choice.probe_updates = spent
        if live:
            winner = live[0]
            for c in live[1:]:
                c.status = (f"behind the leader's {_score(winner):.4g} after {c.probed} "
                            f"updates, when the budget stopped the halving")
            winner.status = "chosen"
            choice.momentum = winner.momentum
            others = sorted((c for c in choice.candidates
                             if c is not winner and c.status != "pruned: diverged"),
                            key=lambda c: (-c.probed, _score(c)))
            choice.reason = (f"the lowest end loss {_score(winner):.4g} (mean of the last "
                             f"{_window(winner)} of {winner.probed} probe updates, paired "
                             f"batches)")
            if others:
                o = others[0]
                choice.reason += (f"; next {o.momentum:.4g} at {_score(o):.4g} after "
                                  f"{o.probed}")
        else:
            choice.momentum = max(0.0, min(base, choice.centre)) if not allow_negative \
                else choice.centre
            choice.reason = (f"every probe diverged; the rule's centre "
                             f"{choice.momentum:.4g} (lower base_lr in the solver)")
        for c in choice.candidates:
            c.drop_branch()
        if log:
            choice.log()
        return choice
    finally:
        opt.close()


def _window(c: Candidate) -> int:
    return max(SCORE_MIN, len(c.losses) // 4)


def _score(c: Candidate) -> float:
    """The smoothed loss at the probe's end: the mean of the last quarter of its losses."""
    if not c.losses or c.status == "pruned: diverged":
        return math.inf
    tail = c.losses[-_window(c):]
    value = sum(tail) / len(tail)
    return value if math.isfinite(value) else math.inf
