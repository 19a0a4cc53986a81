"""Staleness: how many updates other groups applied between a group's read of the weights and
its own update; its statistics; the implicit momentum they imply; and the simulated engine's
schedules of which group finishes next.

"Asynchrony begets momentum" (arXiv 1605.09774, Theorems 3 and 5): with staleness geometric,
P(tau = l) = (1 - mu_S) mu_S^l, asynchronous SGD behaves in expectation like SGD with momentum
mu_S; M workers with exponential work times give exactly that with E[tau] = M - 1, so
mu_S = 1 - 1/M. A geometric law with mean m has mu_S = m / (1 + m), which is the estimator
used here, from the staleness actually measured (a window of recent updates), not from the
number of groups: real groups are neither homogeneous nor exponential, and the paper's own
optima fall more slowly than 1 - 1/g (../shared/research/omnivore.md section 3.3).
"""
from __future__ import annotations

import collections
import heapq
from typing import Deque, Dict, List, Optional, Sequence, Union

import numpy as np

from ..errors import CCTError


def implicit_momentum(mean_staleness: float) -> float:
    """mu_S of a geometric staleness law with this mean: m / (1 + m)."""
    m = max(0.0, float(mean_staleness))
    return m / (1.0 + m)


class StalenessStats:
    """Every update's staleness: a histogram over the whole run (kept with snapshots), the
    current display interval's mean, max and count, and a window for the momentum estimate."""

    def __init__(self, window: int = 200):
        self.histogram: Dict[int, int] = collections.Counter()
        self.window: Deque[int] = collections.deque(maxlen=window)
        self._interval: List[int] = []

    def record(self, staleness: int) -> None:
        self.histogram[int(staleness)] += 1
        self.window.append(int(staleness))
        self._interval.append(int(staleness))

    @property
    def count(self) -> int:
        return sum(self.histogram.values())

    def mean(self) -> float:
        n = self.count
        return sum(k * v for k, v in self.histogram.items()) / n if n else 0.0

    def recent_mean(self) -> Optional[float]:
        return float(np.mean(self.window)) if self.window else None

    def take_interval(self):
        """(mean, max, count) of the updates since the last call, and start a new interval."""
        values, self._interval = self._interval, []
        if not values:
            return 0.0, 0, 0
        return float(np.mean(values)), max(values), len(values)

    def state(self) -> dict:
        return {"histogram": {str(k): v for k, v in sorted(self.histogram.items())},
                "window": list(self.window)}

    def load_state(self, state: dict) -> None:
        self.histogram = collections.Counter({int(k): int(v)
                                              for k, v in state["histogram"].items()})
        self.window.clear()
        self.window.extend(int(v) for v in state["window"])


# -- the simulated engine's schedules: which virtual group finishes next -------------------------
STALENESS_MODELS = ("round-robin", "exponential", "replay")


def schedule(model: str, groups: int, seed: int = 0,
             trace: Optional[Sequence[int]] = None,
             speeds: Optional[Sequence[float]] = None) -> "Schedule":
    """Group indices in the order their updates arrive (``next(schedule)``).

    ``round-robin``: 0, 1, ..., g-1, 0, ... (homogeneous groups, Omnivore's steady state:
    every update after the first g has staleness exactly g - 1); ``exponential``: each group's
    work time is drawn from Exp(1) (seeded), events in time order (Theorem 5's model: staleness
    geometric with mean g - 1); ``replay``: the group indices of ``trace`` in turn, cycled.
    A schedule's ``state()`` and ``load_state()`` let a snapshot resume it exactly."""
    if groups < 1:
        raise CCTError(f"the simulated engine needs at least one group, got {groups}")
    if speeds is not None:
        return VirtualClock(groups, speeds)
    if model == "round-robin":
        return Cycle(list(range(groups)))
    if model == "exponential":
        return Exponential(groups, seed)
    if model == "replay":
        if not trace:
            raise CCTError("staleness 'replay' needs a trace: the group index of every update")
        bad = [k for k in trace if not 0 <= int(k) < groups]
        if bad:
            raise CCTError(f"the staleness trace names group {bad[0]}, but there are {groups} "
                           f"groups (0 to {groups - 1})")
        return Cycle([int(k) for k in trace])
    raise CCTError(f"unknown staleness model '{model}'; known: {', '.join(STALENESS_MODELS)}")


class Cycle:
    """The given group indices in turn, over and over."""

    def __init__(self, order: List[int]):
        self.order = order
        self.position = 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        k = self.order[self.position % len(self.order)]
        self.position += 1
        return k

    def start(self, group: int, batch: int) -> None:
        """A group starts a step (its order is fixed: nothing to do)."""

    def seconds(self, group: int) -> Optional[float]:
        return None

    def state(self) -> dict:
        return {"position": self.position}

    def load_state(self, state: dict) -> None:
        self.position = int(state["position"])


class Exponential:
    """Each group's work times drawn from Exp(1); the group whose work ends first is next."""

    def __init__(self, groups: int, seed: int):
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise CCTError(f"the exponential staleness model's seed (--seed) must be an "
                           f"integer of at least 0 (NumPy's generators take no negative "
                           f"seed), got {seed!r}")
        self.rng = np.random.default_rng(seed)
        self.events = [(float(self.rng.exponential()), k) for k in range(groups)]
        heapq.heapify(self.events)

    def __iter__(self):
        return self

    def __next__(self) -> int:
        t, k = heapq.heappop(self.events)
        heapq.heappush(self.events, (t + float(self.rng.exponential()), k))
        return k

    def start(self, group: int, batch: int) -> None:
        """A group starts a step (its work time is drawn when it finishes)."""

    def seconds(self, group: int) -> Optional[float]:
        return None

    def state(self) -> dict:
        return {"events": [[t, k] for t, k in self.events],
                "rng": self.rng.bit_generator.state}

    def load_state(self, state: dict) -> None:
        self.events = [(float(t), int(k)) for t, k in state["events"]]
        heapq.heapify(self.events)
        self.rng.bit_generator.state = state["rng"]


class VirtualClock:
    """Devices of given speeds (records per virtual second): a step of ``batch`` records on
    group k takes batch / speeds[k]; the group whose step ends first is next (ties: the lower
    index). Heterogeneous devices, studied deterministically (``--simulate-speeds``)."""

    def __init__(self, groups: int, speeds: Sequence[float]):
        if len(speeds) != groups:
            raise CCTError(f"--simulate-speeds gives {len(speeds)} speed(s) for {groups} "
                           f"group(s): give one per group")
        if any(not v > 0 for v in speeds):
            raise CCTError(f"--simulate-speeds must be positive, got {list(speeds)}")
        self.speeds = [float(v) for v in speeds]
        self.now = 0.0
        self.began = [0.0] * groups
        self.last = [0.0] * groups
        self.events: List = []

    def __iter__(self):
        return self

    def start(self, group: int, batch: int) -> None:
        self.began[group] = self.now
        heapq.heappush(self.events, (self.now + batch / self.speeds[group], group))

    def __next__(self) -> int:
        t, k = heapq.heappop(self.events)
        self.now = t
        self.last[k] = t - self.began[k]
        return k

    def seconds(self, group: int) -> Optional[float]:
        """The virtual duration of the group's step that just ended."""
        return self.last[group]

    def state(self) -> dict:
        return {"now": self.now, "began": list(self.began), "last": list(self.last),
                "events": [[t, k] for t, k in self.events]}

    def load_state(self, state: dict) -> None:
        self.now = float(state["now"])
        self.began = [float(t) for t in state["began"]]
        self.last = [float(t) for t in state["last"]]
        self.events = [(float(t), int(k)) for t, k in state["events"]]
        heapq.heapify(self.events)


Schedule = Union[Cycle, Exponential, VirtualClock]
