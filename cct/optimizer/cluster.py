"""Planning past this machine (``cct plan --cluster nodes=N,bandwidth=X[,shards=S]``): the
scale-out model of the parameter store (issue 11, checked in bench/bench_ray.py) turns the step
time measured here into a cluster's hardware efficiency; the simulated engine gives the
statistical efficiency of as many groups.

One group per node; a group's update cycle is its step T plus pulling and pushing the model's
M bytes over its link of bandwidth B plus the engine's fixed cost per update c; S store shards
apply at most S / t_apply updates per second (t_apply: one update of the whole model with the
solver's rule) and their links carry at most S B / (2M):

    updates/s(N) = min(N / (T + 2M/B + c), S / t_apply, S B / (2M))

A plan for the cluster considers g = 1, 2, 4, ... of its N nodes (and N): one group trains on
its node alone (HE = T, no store); g > 1 groups train through the store, HE(g) = 1 /
updates/s(g). T is the seconds per iteration of one group measured here (the optimizer's first
HE), M the model's bytes, t_apply measured here on a branch; B and S as stated (S by default
Zou et al.'s ceil(2M / (B T)), :func:`cct.driver.ray_engine.auto_shards`), c as stated
(default 0: bench/RESULTS.md measured about 10 ms for the Ray engine).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from ..errors import CCTError

FORM = "nodes=N,bandwidth=BYTES_PER_S[,shards=S][,overhead=SECONDS]"


def updates_per_second(nodes: int, step: float, model_bytes: float, bandwidth: float,
                       overhead: float = 0.0, apply: float = 0.0, shards: int = 1) -> float:
    """The scale-out model (module doc): updates per second of ``nodes`` groups, one per
    node, through ``shards`` store shards."""
    cycle = step + 2.0 * model_bytes / bandwidth + overhead
    return min(nodes / cycle, shards / apply if apply > 0 else math.inf,
               shards * bandwidth / (2.0 * model_bytes) if model_bytes > 0 else math.inf)


@dataclass
class Cluster:
    nodes: int
    bandwidth: float            # bytes/s per link
    shards: Optional[int] = None
    overhead: float = 0.0       # seconds per update the engine adds (c)

    def describe(self) -> str:
        shards = "auto" if self.shards is None else str(self.shards)
        return (f"{self.nodes} nodes at {self.bandwidth / 1e9:.4g} GB/s, {shards} shards, "
                f"{self.overhead * 1e3:.3g} ms per update of engine overhead")

    def groups(self) -> List[int]:
        """1, 2, 4, ... up to the nodes, and the nodes."""
        out, g = [], 1
        while g < self.nodes:
            out.append(g)
            g *= 2
        return out + [self.nodes]


def parse_cluster(text: str) -> Cluster:
    """``nodes=N,bandwidth=X[,shards=S][,overhead=C]``; a CCTError naming the form otherwise."""
    def bad(why: str) -> CCTError:
        return CCTError(f"plan: -cluster '{text}': {why}; expected {FORM} (e.g. "
                        f"nodes=4,bandwidth=1.25e9 for four nodes on 10 Gbit/s links)")
    fields: Dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or not value.strip():
            raise bad(f"'{part}' is not key=value")
        if key not in ("nodes", "bandwidth", "shards", "overhead"):
            raise bad(f"unknown key '{key}'")
        if key in fields:
            raise bad(f"'{key}' given twice")
        fields[key] = value.strip()
    for key in ("nodes", "bandwidth"):
        if key not in fields:
            raise bad(f"'{key}' is missing")

    def number(key: str, kind):
        try:
            v = kind(fields[key])
        except ValueError:
            raise bad(f"{key} must be a{'n integer' if kind is int else ' number'}, got "
                      f"'{fields[key]}'") from None
        if not math.isfinite(v) or v < 0 or (v == 0 and key != "overhead"):
            raise bad(f"{key} must be {'at least 0' if key == 'overhead' else 'positive'}, "
                      f"got '{fields[key]}'")
        return v
    return Cluster(nodes=number("nodes", int), bandwidth=number("bandwidth", float),
                   shards=number("shards", int) if "shards" in fields else None,
                   overhead=number("overhead", float) if "overhead" in fields else 0.0)


def apply_seconds(solver, repeats: int = 5) -> float:
    """One update of the whole model with the solver's rule, here, on a branch that is thrown
    away (what one shard does per update): the median of ``repeats``."""
    captured = solver.capture()
    try:
        rate = solver.learning_rate(log=False)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            solver.update.apply(solver.history, solver.params, rate, solver.iter)
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]
    finally:
        solver.restore_capture(captured)


class ClusterModel:
    """The optimizer's ``he_model`` for a cluster: the HE of a candidate from the first
    seconds per iteration measured here at its batch (one group's step T) and the scale-out
    model (module doc)."""

    def __init__(self, cluster: Cluster, model_bytes: int, apply: float):
        self.cluster = cluster
        self.model_bytes = model_bytes
        self.apply = apply
        self.steps: Dict[int, float] = {}

    def shards(self, step: float) -> int:
        if self.cluster.shards is not None:
            return self.cluster.shards
        from ..driver.ray_engine import auto_shards
        return auto_shards(self.model_bytes, step, self.cluster.bandwidth)

    def __call__(self, cand, measured: float) -> float:
        step = self.steps.setdefault(cand.batch, measured)
        if cand.groups == 1:
            return step
        c = self.cluster
        return 1.0 / updates_per_second(cand.groups, step, self.model_bytes, c.bandwidth,
                                        c.overhead, self.apply, self.shards(step))

    def lines(self) -> List[str]:
        c = self.cluster
        out = [f"Cluster: {c.describe()}; model {self.model_bytes / 1024 ** 2:.3g} MB, one "
               f"shard's apply {self.apply * 1e3:.3g} ms (measured here)"]
        for batch, step in sorted(self.steps.items()):
            s = self.shards(step)
            cells = ", ".join(
                f"g={g}: {self(_Groups(g, batch), step):.4g} s/iter" for g in c.groups())
            out.append(f"Cluster: batch {batch}: step T {step * 1e3:.4g} ms measured here, "
                       f"{s} shards -> HE {cells} (updates/s = min(N / (T + 2M/B + c), "
                       f"S / t_apply, S B / 2M))")
        return out


@dataclass
class _Groups:
    groups: int
    batch: int
