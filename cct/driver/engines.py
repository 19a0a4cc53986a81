"""Engines: where the groups of an asynchronous run compute, behind one interface,
``run(store, groups, updates)``: pull, compute, push until ``updates`` were applied or the
solver was asked to stop.

* :class:`ThreadEngine`: each group on its device's own thread (cct's kernels release the
  GIL); the driver thread waits for whichever group finishes first, pushes its gradient and
  sends it off again, so pushes happen in completion order.
* :class:`SimulatedEngine`: the groups in one thread, in the order of a staleness schedule
  (round-robin, seeded exponential, or a replayed trace; cct/driver/staleness.py): the same
  pulls and pushes as real groups, with no real concurrency, so statistical efficiency under
  asynchrony can be studied and tested exactly, whatever the hardware.

A group whose computation raises (a device lost; not a user error, which stops the run) is
dropped with an error line and the others go on; the store keeps every update already applied.
"""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, wait
from typing import Dict, List, Optional, Sequence

from ..errors import CCTError, SourceLost
from ..glog import error, info
from .groups import Group
from .staleness import schedule


class AllGroupsLost(SourceLost):
    """Every group failed: the solver snapshots the last update before stopping."""


def _dropped(groups: List, group, e: BaseException) -> None:
    groups.remove(group)
    group.close()
    error("driver.cpp:0", f"{group.name} failed and is dropped: {type(e).__name__}: {e}; "
          f"{len(groups)} group(s) go on")
    if not groups:
        raise AllGroupsLost("every compute group failed; the last update is kept in a "
                            "snapshot") from None


class ThreadEngine:
    name = "threads"

    def run(self, store, groups: List[Group], updates: int) -> None:
        def work(group: Group):
            group.read_version = store.pull(group.params)
            return group.compute()

        def submit(group: Group):
            return group.devices[0].submit(work, group)

        pending: Dict = {submit(g): g for g in groups}
        applied = 0
        try:
            while applied < updates and pending:
                done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: pending[f].index):
                    group = pending.pop(future)
                    try:
                        loss = future.result()
                    except CCTError:
                        raise
                    except Exception as e:    # the group's device, not the user's net or data
                        _dropped(groups, group, e)
                        continue
                    if applied >= updates:
                        continue
                    if not store.push(group.params, group.read_version, loss, group.net):
                        return
                    applied += 1
                    if applied < updates:
                        pending[submit(group)] = group
        finally:
            wait(list(pending))     # no group still computes when the caller moves on


class SimulatedEngine:
    name = "simulated"

    def __init__(self, staleness: str = "round-robin", seed: int = 0,
                 trace: Optional[Sequence[int]] = None):
        self.staleness = staleness
        self.seed = seed
        self.trace = trace
        self._order = None

    def run(self, store, groups: List[Group], updates: int) -> None:
        if self._order is None:
            self._order = schedule(self.staleness, len(groups), self.seed, self.trace)
            for g in groups:
                g.read_version = store.pull(g.params)
        for _ in range(updates):
            group = groups[next(self._order)]
            loss = group.compute()
            if not store.push(group.params, group.read_version, loss, group.net):
                return
            group.read_version = store.pull(group.params)


ENGINES = ("threads", "processes", "simulated")


def describe(engine, groups: Sequence) -> None:
    info("driver.cpp:0", f"Engine {engine.name}: {len(groups)} group(s): "
         + "; ".join(g.name for g in groups))
