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
The processes and Ray engines, whose groups can stop answering without failing (a stopped
process, an unreachable node), wait for an answer no longer than :class:`AnswerTimeout` says
and drop the group as a failed one (:class:`NoAnswer`). A thread cannot be stopped or taken
away from its device, so the threads engine has no such limit.
"""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Callable, Dict, List, Optional, Sequence

from ..backend import copy as copy_array, host
from ..errors import CCTError, SourceLost, bug_report, is_bug
from ..glog import error, info
from ..io.atomic import load_arrays, save_arrays
from .groups import Group
from .staleness import schedule


class AllGroupsLost(SourceLost):
    """Every group failed: the solver snapshots the last update before stopping."""


class NoAnswer(RuntimeError):
    """A group (a process, a Ray actor) did not answer within the answer timeout: it is
    dropped as a dead one is (a stopped or hung process never says it is gone)."""


class AnswerTimeout:
    """How long the driver waits for one answer of a group, a store shard or a Ray call:
    ``seconds`` when given (``Driver(group_timeout=)``), else the larger of ``FLOOR`` and
    ``FACTOR`` times the slowest step seen so far. The rule rather than a fixed number: steps
    range from milliseconds (a small net) to minutes (a large one on a shared core), and only
    a multiple of what this run's own steps took tells a slow group from a hung one. The floor
    covers the first steps, which also time the kernels' plans (or compile a GPU's kernels)
    before any step has been seen."""

    FLOOR = 300.0
    FACTOR = 10.0

    def __init__(self, seconds: Optional[float] = None):
        if seconds is not None and not seconds > 0:
            raise CCTError(f"the group timeout must be a positive number of seconds, got "
                           f"{seconds}")
        self.fixed = seconds
        self.slowest = 0.0

    def seen(self, seconds: float) -> None:
        """A step (or call) that answered after ``seconds``."""
        self.slowest = max(self.slowest, seconds)

    def __call__(self) -> float:
        if self.fixed is not None:
            return self.fixed
        return max(self.FLOOR, self.FACTOR * self.slowest)


def _dropped(groups: List, group, e: BaseException) -> None:
    if is_bug(e):
        error("driver.cpp:0", bug_report(group.name, e))
        raise e
    groups.remove(group)
    group.close()
    error("driver.cpp:0", f"{group.name} failed and is dropped: {type(e).__name__}: {e}; "
          f"{len(groups)} group(s) go on")
    if not groups:
        raise AllGroupsLost("every compute group failed; the last update is kept in a "
                            "snapshot") from None


def wait_any(store, groups: List, updates: int, start: Callable, finished: Callable,
             result: Callable, drain: Callable, observer=None) -> None:
    """The driver's loop over real groups: start every group (``start(group)`` returns a
    handle), then until ``updates`` were pushed: take whichever handles are ``finished``
    (lowest group first when several are), ``result(handle, group)`` (its loss; an exception
    that is not a CCTError drops the group), push, and start that group again. Afterwards
    ``drain`` waits for the handles still pending (so that no group computes when the caller
    moves on) and their results are read, unused, a failure among them still dropping its
    group. ``observer.pushing(group)`` sees each group before its push (update-rate
    accounting, batch re-sizing before the group starts again)."""
    pending: Dict = {}
    for g in list(groups):
        _start(start, groups, g, pending)
    try:
        _loop(store, groups, updates, pending, start, finished, result, observer)
    finally:
        drain(pending)
    for handle, group in sorted(pending.items(), key=lambda item: item[1].index):
        try:      # computed past the last update: its result is not used, a failure is
            result(handle, group)
        except CCTError:
            pass
        except Exception as e:
            _dropped(groups, group, e)


def _start(start, groups, group, pending) -> None:
    """Start a group's next step; one that cannot start (its process is gone) is dropped."""
    try:
        pending[start(group)] = group
    except CCTError:
        raise
    except Exception as e:
        _dropped(groups, group, e)


def _results(groups: List, waits) -> List[float]:
    """The losses of a round's ``(group, wait for its loss)`` pairs, in order; a group whose
    computation failed (not a CCTError) is dropped and gives none."""
    losses = []
    for group, get in waits:
        try:
            losses.append(get())
        except CCTError:
            raise
        except Exception as e:
            _dropped(groups, group, e)
    return losses


def _loop(store, groups, updates, pending, start, finished, result, observer) -> None:
    applied = 0
    while applied < updates and pending:
        for handle in sorted(finished(list(pending)), key=lambda h: pending[h].index):
            group = pending.pop(handle)
            try:
                loss = result(handle, group)
            except CCTError:
                raise
            except Exception as e:    # the group's device or process, not the user's net
                _dropped(groups, group, e)
                continue
            if applied >= updates:
                continue          # computed past the last update: not used
            if loss is None:      # the group was restarted and its step lost: start it again
                _start(start, groups, group, pending)
                continue
            if observer is not None:
                observer.pushing(group)
            if not store.push(group.params, group.read_version, loss, group.net, group.pushed):
                return
            applied += 1
            if applied < updates:
                _start(start, groups, group, pending)


class Engine:
    """What every engine offers besides ``run`` (and ``compute_all`` for SMA's rounds): the
    store's weights where the solver reads them (``gather``, before tests and snapshots),
    restored weights back to where the groups read them (``scatter``), and ``close``. An
    in-process store is the solver's own params: nothing to move."""

    round_seconds = 0.0      # the last compute_all's duration (virtual when simulated)
    timeout = AnswerTimeout()   # engines whose groups can stop answering set their own

    def gather(self) -> None:
        """The solver's params are the store's."""

    def scatter(self) -> None:
        """The groups pull the solver's params."""

    def close(self) -> None:
        """Nothing of its own to release."""


class ThreadEngine(Engine):
    name = "threads"

    def run(self, store, groups: List[Group], updates: int, observer=None) -> None:
        def work(group: Group):
            began = time.perf_counter()
            group.read_version = store.pull(group.params)
            loss = group.compute()
            group.seconds = time.perf_counter() - began
            return loss

        wait_any(store, groups, updates,
                 start=lambda g: g.submit(work, g),
                 finished=lambda futures: wait(futures, return_when=FIRST_COMPLETED)[0],
                 result=lambda future, _: future.result(),
                 drain=lambda pending: wait(list(pending)), observer=observer)

    def compute_all(self, groups: List[Group]) -> List[float]:
        """Every group's gradient on its own weights at once (SMA's learners); the losses.
        A group that fails is dropped (and gives no loss)."""
        def work(group: Group):
            began = time.perf_counter()
            loss = group.compute(fed=True)
            group.seconds = time.perf_counter() - began
            return loss
        began = time.perf_counter()
        for g in groups:          # in order: the learners' batches do not depend on timing
            g.feed()
        futures = [(g, g.submit(work, g)) for g in list(groups)]
        losses = _results(groups, [(g, f.result) for g, f in futures])
        self.round_seconds = time.perf_counter() - began
        return losses


def _in_turn(group: Group) -> float:
    """A group's step, one at a time (the simulated engine): on its device's thread when it
    has a device (a GPU current there), else in this thread."""
    if group.devices:
        return group.submit(group.compute).result()
    return group.compute()


class SimulatedEngine(Engine):
    """See the module doc. Its state (the schedule's, each group's read version and the
    weights it read) goes with a snapshot, so a resumed simulated run repeats the
    uninterrupted one exactly: the weights into ``<state>.cct.groups.npz``."""

    name = "simulated"

    def __init__(self, staleness: str = "round-robin", seed: int = 0,
                 trace: Optional[Sequence[int]] = None,
                 speeds: Optional[Sequence[float]] = None):
        self.staleness = staleness
        self.seed = seed
        self.trace = trace
        self.speeds = list(speeds) if speeds else None
        self._order = None
        self._pushing: Optional[Group] = None   # its push may snapshot before it pulls again

    def now(self) -> float:
        """The virtual clock (simulated speeds); 0 before the run or without speeds."""
        return getattr(self._order, "now", 0.0)

    def _schedule(self, groups: int):
        return schedule(self.staleness, groups, self.seed, self.trace, self.speeds)

    def _start(self, store, groups: List[Group]) -> None:
        self._order = self._schedule(len(groups))
        for g in groups:
            g.read_version = store.pull(g.params)
            self._order.start(g.index, g.batch)

    def run(self, store, groups: List[Group], updates: int, observer=None) -> None:
        if self._order is None:
            self._start(store, groups)
        for _ in range(updates):
            group = groups[next(self._order)]
            loss = _in_turn(group)
            group.seconds = self._order.seconds(group.index)
            if observer is not None:
                observer.pushing(group)
            self._pushing = group
            try:
                if not store.push(group.params, group.read_version, loss, group.net,
                                  group.pushed):
                    return
            finally:
                self._pushing = None
            group.read_version = store.pull(group.params)
            self._order.start(group.index, group.batch)

    def compute_all(self, groups: List[Group]) -> List[float]:
        """Every group's gradient in turn (SMA's learners, in this thread). Learner k runs on
        simulated device k mod len(speeds); a round's virtual time is its busiest device's
        (speed 1 per device without speeds)."""
        losses = []
        busy: Dict[int, float] = {}
        for g in groups:
            losses.append(_in_turn(g))
            place = g.index % len(self.speeds) if self.speeds else 0
            g.seconds = g.batch / self.speeds[place] if self.speeds else float(g.batch)
            busy[place] = busy.get(place, 0.0) + g.seconds
        # Learners on one simulated device share it: a round lasts as long as the busiest.
        self.round_seconds = max(busy.values())
        return losses

    # -- snapshots -----------------------------------------------------------------------------
    @staticmethod
    def weights_file(state_file: str) -> str:
        return state_file + ".cct.groups.npz"

    def state(self, groups: List[Group], state_file: str) -> dict:
        if self._order is None:
            return {}
        arrays = {f"g{g.index}_p{i}": host(b.data)
                  for g in groups for i, b in enumerate(g.params.blobs)}
        save_arrays(self.weights_file(state_file), arrays)
        # The group whose push is being applied pulls right after it: a resumed run pulls
        # for it (the store's weights are then this snapshot's).
        return {"schedule": self._order.state(), "reads": [g.read_version for g in groups],
                "pull": [] if self._pushing is None else [self._pushing.index]}

    def load_state(self, state: dict, groups: List[Group], state_file: str, store) -> None:
        if not state:
            return
        if len(state["reads"]) != len(groups):
            raise ValueError(f"the snapshot's simulated run had {len(state['reads'])} groups, "
                             f"this one {len(groups)}")
        path = self.weights_file(state_file)
        arrays = load_arrays(path, "the groups' weights")
        for g in groups:
            for i, b in enumerate(g.params.blobs):
                a = arrays.get(f"g{g.index}_p{i}")
                if a is None or a.shape != b.data.shape:
                    raise ValueError(f"'{path}' does not hold group {g.index}'s param {i} of "
                                     f"shape {tuple(b.data.shape)}")
        order = self._schedule(len(groups))
        order.load_state(state["schedule"])
        for g, read in zip(groups, state["reads"]):
            for i, b in enumerate(g.params.blobs):
                copy_array(b.data, arrays[f"g{g.index}_p{i}"])
            g.read_version = int(read)
        for k in state["pull"]:
            groups[int(k)].read_version = store.pull(groups[int(k)].params)
            order.start(int(k), groups[int(k)].batch)
        self._order = order



def describe(engine, groups: Sequence) -> None:
    info("driver.cpp:0", f"Engine {engine.name}: {len(groups)} group(s): "
         + "; ".join(g.name for g in groups))
