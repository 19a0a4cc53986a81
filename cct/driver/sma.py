"""Synchronous model averaging (Crossbow's SMA, Koliousis et al., VLDB 2019): k learners,
each with its own model replica w_j and its own history, take local steps with the solver's
rule on their own small batches; every ``sync_period`` rounds each is pulled toward the
central model z, and z moves by the sum of those pulls plus momentum on z:

    c_j = alpha (w_j - z);   w_j <- w_j - c_j;   z <- z + sum_j c_j + mu (z - z_prev)

z is the solver's train net's params: what the test nets score and what a snapshot saves as
the .caffemodel; the replicas, their histories and z_prev go beside it
(``<state>.cct.sma.npz``) for an exact resume. alpha defaults to 1/k (the paper's choice)
and mu to 0 (Crossbow's released code: its central momentum is compiled out by default). The
pulls are simultaneous: with one learner and alpha 1, learner and z swap. One learner with
alpha 0 is plain training, loss for loss (z then stays where it started).

``learners="auto"``: Crossbow's autotuner. Start with one learner per device; every
``interval`` rounds compare the throughput (records per second, virtual seconds on the
simulated engine) with the last measurement; while it improves by more than 10%, add one
learner per device (a copy of z with a fresh history), else remove the last ones added and
stop tuning. Each step is logged.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np

from ..backend import copy as copy_array, host
from ..errors import CCTError
from ..glog import info
from ..io.atomic import load_arrays, save_arrays

SRC = "driver.cpp:0"


class LearnerTuner:
    """Crossbow's ``--autotune-models``: see the module doc."""

    def __init__(self, per_step: int, interval: int = 4, gain: float = 0.10):
        self.per_step = per_step          # learners added or removed at once (one per device)
        self.interval = interval
        self.gain = gain
        self.records = 0
        self.seconds = 0.0
        self.rounds = 0
        self.last: Optional[float] = None
        self.done = False

    def round(self, records: int, seconds: float, learners: int) -> Optional[str]:
        """'add', 'remove' (then tuning stops) or None, after a round of ``records`` taking
        ``seconds``. The first round after a change only warms up (new shapes are timed)."""
        if self.done:
            return None
        self.rounds += 1
        if self.rounds == 1:
            return None
        self.records += records
        self.seconds += seconds
        if self.rounds <= self.interval:
            return None
        speed = self.records / self.seconds if self.seconds > 0 else 0.0
        last, self.last = self.last, speed
        self.rounds, self.records, self.seconds = 0, 0, 0.0
        if last is None:
            info(SRC, f"SMA autotune: {learners} learner(s): {speed:.4g} records/s; adding "
                 f"{self.per_step}")
            return "add"
        change = speed / last - 1 if last > 0 else 0.0
        if change > self.gain:
            info(SRC, f"SMA autotune: {learners} learner(s): {speed:.4g} records/s "
                 f"({100 * change:+.1f}% over the last, more than {100 * self.gain:g}%); "
                 f"adding {self.per_step}")
            return "add"
        self.done = True
        info(SRC, f"SMA autotune: {learners} learner(s): {speed:.4g} records/s "
             f"({100 * change:+.1f}% over the last, not more than {100 * self.gain:g}%); "
             f"removing the last {self.per_step}: {learners - self.per_step} learner(s), "
             f"tuning stops")
        return "remove"

    def state(self) -> dict:
        return {k: getattr(self, k) for k in ("records", "seconds", "rounds", "last", "done")}

    def load_state(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)


class ModelAveraging:
    """The SMA strategy over a solver and its learners (groups computing on their own
    weights), run by an engine's ``compute_all``. ``make_learner(index)`` builds one more
    (autotune)."""

    def __init__(self, solver, learners: List, engine, make_learner: Callable[[int], object],
                 alpha: Optional[float] = None, momentum: float = 0.0, sync_period: int = 1,
                 autotune: Optional[LearnerTuner] = None):
        if sync_period < 1:
            raise CCTError(f"--sync-period must be at least 1 round, got {sync_period}")
        if alpha is not None and not 0 <= alpha <= 1:
            raise CCTError(f"--sma-alpha must be in [0, 1] (the share of the gap to the central "
                           f"model a learner closes at each synchronisation), got {alpha}")
        if solver.param.iter_size != 1:
            raise CCTError("--strategy=sma takes one batch per local step: set iter_size 1 "
                           "and give the learners smaller batches with --batch-sizes instead")
        self.solver = solver
        self.learners = learners
        self.engine = engine
        self.make_learner = make_learner
        self.alpha = alpha
        self.momentum = float(momentum)
        self.sync_period = sync_period
        self.autotune = autotune
        self.rounds = 0
        self.seconds = 0.0       # the rounds' time (virtual on the simulated engine)
        self.central = solver.params
        self.previous = [np.array(host(b.data)) for b in self.central.blobs]  # z_prev
        self.delta = [np.zeros_like(p) for p in self.previous]
        self.scratch = [np.zeros_like(p) for p in self.previous]
        self.histories = {}      # learner index -> its history (the solver's update's state)
        for g in learners:
            self._adopt(g)

    def _adopt(self, learner) -> None:
        """A learner starts from z with a fresh history."""
        self.central.copy_weights_to(learner.params)
        self.histories[learner.index] = self.solver.update.init(learner.params)

    def describe(self) -> str:
        alpha = "1/k" if self.alpha is None else f"{self.alpha:g}"
        return (f"SMA: {len(self.learners)} learner(s), alpha {alpha}, central momentum "
                f"{self.momentum:g}, synchronising every {self.sync_period} round(s)"
                + ("; learners autotuned" if self.autotune else ""))

    # -- running -----------------------------------------------------------------------------
    def step(self, iters: int) -> None:
        s = self.solver
        s.start_steps()
        for _ in range(iters):
            if not s.begin_iteration(clear_diffs=False):
                break
            losses = self.engine.compute_all(self.learners)
            self.seconds += self.engine.round_seconds
            s.record_loss(float(np.mean(losses)), self.learners[0].net)
            for j, g in enumerate(self.learners):
                # Each learner's update asks the schedule, as one solver's would; the first
                # writes Caffe's lr line.
                s.update.apply(self.histories[g.index], g.params, s.learning_rate(log=j == 0),
                               s.iter)
            self.rounds += 1
            if self.rounds % self.sync_period == 0:
                self.synchronise()
            if self.autotune is not None:
                self._tune(sum(getattr(g, "last_batch", g.batch) for g in self.learners))
            if not s.end_iteration():
                break

    def synchronise(self) -> None:
        """Pull every learner toward z and move z by the pulls and its momentum."""
        dtype = self.previous[0].dtype.type if self.previous else np.float32
        alpha = dtype(1.0 / len(self.learners) if self.alpha is None else self.alpha)
        mu = dtype(self.momentum)
        for d in self.delta:
            d[...] = 0
        # The averaging runs on the host (z_prev, the deltas); weights held on a device, a
        # learner's or z's, come over and go back, one copy each way.
        central = [host(z) for z in self.central.weights()]
        for g in self.learners:
            for w, z, d, c in zip(g.params.weights(), central, self.delta, self.scratch):
                mine = host(w)
                np.subtract(mine, z, out=c)
                c *= alpha
                mine -= c
                d += c
                if mine is not w:
                    copy_array(w, mine)
        for z, prev, d, m in zip(central, self.previous, self.delta, self.scratch):
            np.subtract(z, prev, out=m)
            m *= mu
            prev[...] = z
            z += d
            z += m
        for z, mine in zip(self.central.weights(), central):
            if mine is not z:
                copy_array(z, mine)

    def _tune(self, records: int) -> None:
        action = self.autotune.round(records, self.engine.round_seconds, len(self.learners))
        step = self.autotune.per_step
        if action == "add":
            for _ in range(step):
                index = max(g.index for g in self.learners) + 1
                learner = self.make_learner(index)
                self._adopt(learner)
                self.learners.append(learner)
        elif action == "remove" and len(self.learners) > step:
            for _ in range(step):
                learner = self.learners.pop()
                del self.histories[learner.index]
                learner.close()

    # -- snapshots ---------------------------------------------------------------------------
    @staticmethod
    def arrays_file(state_file: str) -> str:
        return state_file + ".cct.sma.npz"

    def state(self, state_file: str) -> dict:
        arrays = {f"zprev_p{i}": p for i, p in enumerate(self.previous)}
        for g in self.learners:
            for i, w in enumerate(g.params.weights()):
                arrays[f"l{g.index}_p{i}"] = host(w)
            for i, h in enumerate(self.histories[g.index]):
                arrays[f"l{g.index}_h{i}"] = host(h)
        save_arrays(self.arrays_file(state_file), arrays)
        return {"rounds": self.rounds, "seconds": self.seconds,
                "learners": [g.index for g in self.learners],
                "batches": [g.batch for g in self.learners],
                "autotune": self.autotune.state() if self.autotune else None}

    def load_state(self, state: dict, state_file: str) -> None:
        path = self.arrays_file(state_file)
        arrays = load_arrays(path, "the SMA learners' file")
        indices = [int(k) for k in state["learners"]]
        while len(self.learners) < len(indices):        # autotune had added learners
            learner = self.make_learner(indices[len(self.learners)])
            self._adopt(learner)
            self.learners.append(learner)
        while len(self.learners) > len(indices):
            learner = self.learners.pop()
            del self.histories[learner.index]
            learner.close()
        for g, index, batch in zip(self.learners, indices, state["batches"]):
            if g.index != index:
                raise ValueError(f"the snapshot's learner {index} is learner {g.index} here")
            g.batch = int(batch)
            for i, w in enumerate(g.params.weights()):
                _load(w, arrays, f"l{index}_p{i}", path)
            for i, h in enumerate(self.histories[index]):
                _load(h, arrays, f"l{index}_h{i}", path)
        for i, p in enumerate(self.previous):
            _load(p, arrays, f"zprev_p{i}", path)
        self.rounds = int(state["rounds"])
        self.seconds = float(state.get("seconds", 0.0))
        if self.autotune and state.get("autotune"):
            self.autotune.load_state(state["autotune"])


def _load(into: np.ndarray, arrays: dict, key: str, path: str) -> None:
    a = arrays.get(key)
    if a is None or a.shape != into.shape:
        raise ValueError(f"'{path}' has no array '{key}' of shape {tuple(into.shape)}")
    copy_array(into, a)
