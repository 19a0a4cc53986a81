"""Who issues the updates: each group's updates, records and step times (CPU+GPU Hogbatch's
problem is that the fast-updating worker dominates), shown at every display, and Adaptive
Hogbatch's re-sizing of the batches so that every group updates at about the same rate.

Ma & Rusu (arXiv 2004.08771) describe the adaptive rule but never shipped it; as written here:
every ``window`` updates, if some group's share of them is off 1/g by more than ``threshold``,
the groups' speeds (records per second of their steps in the window) set new batches,
b_k = b_max * v_k / v_fastest: the fastest group takes the largest batch it was given (the
one its device is known to hold) and the others in proportion, so that every group's steps
take about as long. ``threshold`` is the imbalance tolerated (it keeps batches from moving on
noise, each new shape costing a plan timing), and batches never leave [1, b_max].
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence

from ..errors import CCTError
from ..glog import info

SRC = "driver.cpp:0"
#: The largest batch: Caffe's Blob::Reshape checks every dimension and count against INT_MAX.
MAX_BATCH = 2 ** 31 - 1


def parse_batch_sizes(text: str, groups: Sequence[Sequence[str]]) -> List[Optional[int]]:
    """``--batch-sizes``: one batch per group in order (``16,256``), or per device
    (``cpu:16,gpu0:256``: the last ``:`` separates the batch; a device name as cct spells it,
    e.g. ``cpu:0``, ``cpu:0-1``, ``gpu0``, or a kind, ``cpu`` or ``gpu``, for every group on
    one). ``groups``: each group's device names. Groups named by no entry keep the data
    layers' batch (None)."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    try:
        if all(":" not in e for e in entries):
            sizes = [int(e) for e in entries]
            if len(sizes) != len(groups):
                raise CCTError(f"--batch-sizes={text} gives {len(sizes)} batch size(s) for "
                               f"{len(groups)} group(s): give one per group, or name devices "
                               f"(cpu:16,gpu0:256)")
            out = sizes
        else:
            out = [None] * len(groups)
            for e in entries:
                name, _, size = e.rpartition(":")
                hits = [k for k, names in enumerate(groups)
                        if any(d == name or d.rstrip("0123456789:-") == name for d in names)]
                if not hits:
                    names = "; ".join(",".join(n) or f"group {k} (simulated)"
                                      for k, n in enumerate(groups))
                    raise CCTError(f"--batch-sizes: no group runs on '{name}' (groups' "
                                   f"devices: {names})")
                for k in hits:
                    out[k] = int(size)
    except ValueError:
        raise CCTError(f"--batch-sizes must be batch sizes (16,256) or device:batch pairs "
                       f"(cpu:16,gpu0:256), got '{text}'") from None
    if any(b is not None and b < 1 for b in out):
        raise CCTError(f"--batch-sizes must be at least 1, got '{text}'")
    if any(b is not None and b > MAX_BATCH for b in out):
        raise CCTError(f"--batch-sizes={text}: a batch above {MAX_BATCH} (INT_MAX) is no Caffe "
                       f"blob's dimension; give batches that fit the devices' memory")
    return out


class UpdateBalance:
    """The engines' observer (``pushing(group)`` before each push): counts per group, the
    display lines, and (``adaptive``) the re-sizing rule of the module doc."""

    def __init__(self, groups: List, feeder, adaptive: bool = False, threshold: float = 0.05,
                 window: Optional[int] = None, clock: Optional[Callable[[], float]] = None):
        if not 0 < threshold < 1:
            raise CCTError(f"--threshold is the tolerated gap between a group's share of the "
                           f"updates and 1/g: give a number in (0, 1), got {threshold}")
        self.groups = groups
        self.feeder = feeder
        self.adaptive = adaptive
        self.threshold = float(threshold)
        self.window = window or 8 * len(groups)
        self.max_batch = max(g.batch for g in groups)
        self.clock = clock or time.perf_counter
        self.updates: Dict[int, int] = {g.index: 0 for g in groups}
        self._interval = self._zero()
        self._seen = self._zero()           # the adaptive window: updates, records, seconds
        self._since = self.clock()
        self.resizes = 0

    def _zero(self) -> Dict[int, List[float]]:
        return {g.index: [0, 0, 0.0] for g in self.groups}

    def pushing(self, group) -> None:
        k = group.index
        self.updates[k] = self.updates.get(k, 0) + 1
        for acc in (self._interval, self._seen):
            row = acc.setdefault(k, [0, 0, 0.0])
            row[0] += 1
            row[1] += getattr(group, "last_batch", group.batch)
            row[2] += group.seconds or 0.0
        if self.adaptive and sum(r[0] for r in self._seen.values()) >= self.window:
            self._rebalance()

    def shares(self, counts: Dict[int, List[float]]) -> Dict[int, float]:
        total = sum(r[0] for r in counts.values()) or 1
        return {k: counts.get(k, [0])[0] / total for k in (g.index for g in self.groups)}

    def _rebalance(self) -> None:
        seen, self._seen = self._seen, self._zero()
        live = [g for g in self.groups]
        shares = self.shares(seen)
        fair = 1.0 / len(live)
        worst = max(abs(shares[g.index] - fair) for g in live)
        if worst <= self.threshold:
            return
        speeds = {}
        for g in live:
            n, records, seconds = seen.get(g.index, [0, 0, 0.0])
            if n == 0 or seconds <= 0:
                return          # a group with no finished step in the window: wait for it
            speeds[g.index] = records / seconds
        fastest = max(speeds.values())
        old = [g.batch for g in live]
        for g in live:
            g.batch = max(1, min(self.max_batch,
                                 int(round(self.max_batch * speeds[g.index] / fastest))))
        self.resizes += 1
        info(SRC, "Adaptive Hogbatch: update shares "
             + "/".join(f"{shares[g.index]:.2f}" for g in live)
             + f" off 1/{len(live)} by more than {self.threshold:g}; speeds "
             + "/".join(f"{speeds[g.index]:.4g}" for g in live) + " records/s; batches "
             + ",".join(map(str, old)) + " -> " + ",".join(str(g.batch) for g in live))

    def display(self) -> None:
        """Per group, named with where it runs (CPU+GPU Hogbatch's per-device lines): batch,
        updates in this display interval (share, per second) and the records of the epoch it
        took so far."""
        now = self.clock()
        lapse, self._since = now - self._since, now
        interval, self._interval = self._interval, self._zero()
        shares = self.shares(interval)
        records = self.feeder.records
        total_records = sum(records.values()) or 1
        for g in self.groups:
            n = interval.get(g.index, [0])[0]
            rate = n / lapse if lapse > 0 else 0.0
            took = records.get(g.index, 0)
            share = 100 * shares[g.index]
            # the group's name says where it runs (its devices, cores, process or node)
            info(SRC, f"    {g.name}: batch {g.batch}, {n} updates ({share:.1f}%), "
                 f"{rate:.4g} updates/s; {took} records so far "
                 f"({100 * took / total_records:.1f}% of those read)")

    def summary(self) -> None:
        total = sum(self.updates.values()) or 1
        counts = [(g.index, self.updates.get(g.index, 0)) for g in self.groups]
        records = [(g.index, self.feeder.records.get(g.index, 0)) for g in self.groups]
        info(SRC, "Updates by group: "
             + ", ".join(f"group {k} {n} ({100 * n / total:.1f}%)" for k, n in counts)
             + "; records: " + ", ".join(f"group {k} {n}" for k, n in records))

    # -- snapshots ---------------------------------------------------------------------------
    def state(self) -> dict:
        return {"batches": {str(g.index): g.batch for g in self.groups},
                "updates": {str(k): v for k, v in self.updates.items()},
                "window": {str(k): v for k, v in self._seen.items()}}

    def load_state(self, state: dict) -> None:
        batches = {int(k): int(v) for k, v in state.get("batches", {}).items()}
        for g in self.groups:
            if g.index in batches:
                g.batch = batches[g.index]
        self.updates = {int(k): int(v) for k, v in state.get("updates", {}).items()}
        self._seen = {int(k): list(v) for k, v in state.get("window", {}).items()}
