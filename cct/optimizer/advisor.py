"""The advisor (Zou et al., arXiv 1709.06622, as reconstructed in
../shared/research/anchors.md section 5): the batch size per device from a memory model and a
measured throughput curve, which devices to use at all, and the parameter store's shards on a
cluster. Each answer comes with the numbers it used.

* Memory model: bytes = fixed + b x per_item, where per_item is the data and diff bytes of
  every blob whose first axis is the batch, divided by the batch (from the built train net),
  and fixed is the params' data, diff and the solver's history. The budget is half of the
  machine's physical memory for the CPU (an assumption, not a measurement; GPU budgets are not
  modelled yet). Workspaces (the lowering buffers of cct's convolutions) are not counted.
* Throughput curve: images/s of a replica of the net below its data layers at a few batch
  sizes (the data layers' batch x 1/4 .. 4, within the memory budget), a few timed iterations
  each. The advice is the smallest batch within 10% of the best measured throughput: the
  largest that saturates the device, no larger, since larger batches cost statistical
  efficiency.
* Devices: with several, the hybrid scheduler's own probe (cct/scheduler.py) times each and
  :func:`~cct.scheduler.choose_devices` leaves out any that make the batch slower.
* Shards: :func:`cct.driver.ray_engine.auto_shards` from the model's bytes, a step's measured
  seconds and a link bandwidth (given; 10 Gbit/s by default, an assumption).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..backend import copy as copy_array, host
from ..glog import info, quiet

SRC = "optimizer.py:0"
SATURATION = 0.9
DEFAULT_BANDWIDTH = 1.25e9      # bytes/s: 10 Gbit/s


@dataclass
class Advice:
    per_item_bytes: int = 0
    fixed_bytes: int = 0
    budget_bytes: int = 0
    max_batch: int = 0
    curve: List[Tuple[int, float]] = field(default_factory=list)   # (batch, img/s)
    batch: int = 0
    batch_why: str = ""
    devices_why: str = ""
    shards: Optional[int] = None
    shards_why: str = ""

    def lines(self) -> List[str]:
        mb = 1024.0 ** 2
        out = [f"Advisor: memory model {self.fixed_bytes / mb:.3g} MB fixed (params, diffs, "
               f"history) + {self.per_item_bytes / 1024:.4g} KB per item (blobs' data and "
               f"diffs); budget {self.budget_bytes / mb:.0f} MB -> at most {self.max_batch} "
               f"items per device",
               "Advisor: throughput " + ", ".join(f"batch {b}: {v:.4g} img/s"
                                                  for b, v in self.curve),
               f"Advisor: batch per device {self.batch}: {self.batch_why}",
               f"Advisor: devices: {self.devices_why}"]
        if self.shards_why:
            out.append(f"Advisor: store shards on a cluster {self.shards}: {self.shards_why}")
        return out


def memory_model(net) -> Tuple[int, int]:
    """(per-item bytes, fixed bytes) of a built train net (see the module doc)."""
    batch = next((int(top.shape[0]) for top in net.source_tops().values()
                  if top.shape and top.shape[0]), 1)
    params = {id(p) for p in net.params_list}
    per_item = 0
    for blob in net.blobs_list:
        if id(blob) in params or not blob.shape or int(blob.shape[0]) != batch:
            continue
        per_item += 2 * int(np.prod(blob.shape)) * np.dtype(net.dtype).itemsize // batch
    fixed = sum(3 * int(np.prod(p.shape)) * np.dtype(net.dtype).itemsize
                for p in net.learnable_params)
    return per_item, fixed


def memory_budget() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2)
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def throughput_curve(solver, batches: Sequence[int], iters: int = 3) -> List[Tuple[int, float]]:
    """Images/s of a replica of the train net at each batch size (see the module doc), on
    the next batch's records repeated; the data position is restored afterwards."""
    from ..net import Net
    master = solver.net
    captured = solver.capture()
    try:
        master.next_batch()
        tops = list(master.source_tops().values())
        out = []
        for b in batches:
            with quiet():
                net = Net(master.replica_param(b), dtype=master.dtype)
            for dst, src in zip(net.input_blobs(), tops):
                reps = -(-b // src.shape[0])
                copy_array(dst.data, np.concatenate([host(src.data)] * reps)[:b])
            net.forward_backward()
            net.backend.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                net.forward_backward()
            net.backend.synchronize()      # a GPU's kernels may still be running
            out.append((b, b * iters / (time.perf_counter() - t0)))
        return out
    finally:
        solver.restore_capture(captured)


def advise_batch(curve: Sequence[Tuple[int, float]], max_batch: int) -> Tuple[int, str]:
    fits = [(b, v) for b, v in curve if b <= max_batch]
    if not fits:
        return 1, f"no measured batch fits the memory budget ({max_batch} items)"
    best = max(v for _, v in fits)
    b, v = min((bv for bv in fits if bv[1] >= SATURATION * best), key=lambda bv: bv[0])
    return b, (f"the smallest measured batch within {1 - SATURATION:.0%} of the best "
               f"throughput ({v:.4g} of {best:.4g} img/s) that fits memory")


def advise_devices(solver, devices) -> str:
    """Which devices pay for themselves, from the hybrid scheduler's probe of each."""
    from ..devices import parse_devices
    from ..scheduler import HybridScheduler, choose_devices
    if devices is None:
        from ..devices import available_cores
        return (f"one device ({len(available_cores())} cores as one group of the CPU): nothing "
                f"to leave out")
    devs = parse_devices(devices) if isinstance(devices, str) else list(devices)
    if len(devs) == 1:
        return f"one device ({devs[0].name}): nothing to leave out"
    captured = solver.capture()
    sched = None
    try:
        with quiet():
            sched = HybridScheduler(solver.net, devs)
            sched.compute_gradients()
        speeds = [r.speed or 0.0 for r in sched.replicas]
        overheads = [r.overhead for r in sched.replicas]
        names = [r.device.name for r in sched.replicas]
        split, why = choose_devices(sched.batch, speeds, overheads, names)
        measured = ", ".join(f"{n} {s:.4g} img/s (+{o * 1e3:.3g} ms sync)"
                             for n, s, o in zip(names, speeds, overheads))
        return f"split {split} of {sched.batch}, {why}; measured {measured}"
    finally:
        if sched is not None:
            sched.close()
        solver.restore_capture(captured)
        for d in devs:
            d.close()


def advise_shards(model_bytes: int, step_seconds: float,
                  bandwidth: float = DEFAULT_BANDWIDTH) -> Tuple[int, str]:
    from ..driver.ray_engine import auto_shards
    n = auto_shards(model_bytes, step_seconds, bandwidth)
    return n, (f"ceil(2 x {model_bytes / 1024 ** 2:.3g} MB / ({bandwidth / 1e9:.3g} GB/s x "
               f"{step_seconds:.3g} s/step)) (Zou et al.; bandwidth assumed)")


def advise(solver, devices=None, step_seconds: Optional[float] = None,
           bandwidth: float = DEFAULT_BANDWIDTH, log: bool = True) -> Advice:
    a = Advice()
    a.per_item_bytes, a.fixed_bytes = memory_model(solver.net)
    a.budget_bytes = memory_budget()
    a.max_batch = max(1, (a.budget_bytes - a.fixed_bytes) // max(1, a.per_item_bytes))
    from .plan import _data_batch
    b0 = _data_batch(solver.net)
    sizes = sorted({max(1, b0 * k // 4) for k in (1, 2, 4, 8, 16)})
    a.curve = throughput_curve(solver, [b for b in sizes if b <= a.max_batch])
    a.batch, a.batch_why = advise_batch(a.curve, a.max_batch)
    a.devices_why = advise_devices(solver, devices)
    if step_seconds:
        from ..params import ParamSet
        a.shards, a.shards_why = advise_shards(ParamSet.of_net(solver.net).nbytes,
                                               step_seconds, bandwidth)
    if log:
        for line in a.lines():
            info(SRC, line)
    return a
