"""Devices: anything that can run a net replica, a group of CPU cores or a GPU.

A device owns one worker thread. Everything the device runs (building its replica, forward,
backward, timing) happens on that thread, so that per-thread settings stay put: a CPU device pins
the thread to its cores and gives cct's loops its own thread count (``cct._C``'s per-thread
count); a GPU device makes its GPU current. The scheduler (cct/scheduler.py) talks to devices
only through :class:`Device`: ``build`` a replica, ``run`` a function on the device's thread,
``synchronize``; arrays move through the device's backend (cct.backend ``copy``/``host``).

Spelling of a device list (``cct train --devices=...``, ``Solver(devices=...)``):
``cpu`` (every core the process may use), ``cpu:N`` (a group of N cores; several such groups
take disjoint cores in order), ``cpu@I`` or ``cpu@I-J`` (those core ids), ``gpu`` or ``gpuI`` /
``gpu:I`` (GPU I), ``gpu:all`` (every GPU), ``standin`` (the GPU path on the CuPy-rules
stand-in, for machines without a GPU: CI).
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence

from . import backend as backends, glog
from .native import _C
from .errors import SourceLost
from .net import Net


class BlasThreads:
    """The BLAS's thread count while devices run at once on CPU cores: one number for the
    process, it becomes the smallest group's, so that no device's GEMMs spread beyond its own
    cores (OpenBLAS's worker threads are not pinned with the device's thread). Whoever holds
    the devices holds this and calls :meth:`release` when they close, because OpenBLAS rounds
    differently with another thread count (and the GEMMs' plans are keyed by it): a later run
    in the same process must find the count it had.

    Holders overlap (a scheduler for the next place is built before the last one is closed)
    and are released in any order, so the count is kept for all of them at once: while any
    holds it, the smallest any asks for; when the last lets go, the count from before the
    first. (Releasing each one to "the count it replaced" left 1 thread behind whenever two
    overlapped and the older went first.)"""

    _lock = threading.Lock()
    _live: List["BlasThreads"] = []      # the process's holders: the BLAS is one per process
    _base: Optional[int] = None          # the count before the first of them

    def __init__(self, devices: Sequence["Device"]):
        cpus = [d for d in devices if isinstance(d, CPUDevice)]
        self.count: Optional[int] = min(d.threads for d in cpus) if cpus else None
        self.held = False
        if self.count is None:
            return
        with BlasThreads._lock:
            if not BlasThreads._live:
                BlasThreads._base = _C.blas_num_threads()
            BlasThreads._live.append(self)
            self.held = True
            BlasThreads._apply()

    @staticmethod
    def _apply() -> None:
        live = BlasThreads._live
        _C.set_blas_num_threads(min(h.count for h in live) if live else BlasThreads._base)

    def release(self) -> None:
        """Let go (once; later calls do nothing)."""
        with BlasThreads._lock:
            if not self.held:
                return
            self.held = False
            BlasThreads._live.remove(self)
            BlasThreads._apply()


class DeviceError(SourceLost):
    """A device list that cannot be honoured, or a device that failed while training."""


def available_cores() -> List[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no affinity, count only
        return list(range(os.cpu_count() or 1))


class Device:
    """A net replica's home. Subclasses say which backend their replica uses and what their
    worker thread must set up before it runs anything."""

    #: the backend name the replica's layers run on (cct.backend.get)
    backend = "cpu"
    #: whether the replica's arrays live in host memory (so it may share the master's)
    host_memory = True
    #: the device of its backend the arrays live on (the backend's ``device()``): None for the
    #: host
    device_id = None

    def __init__(self, name: str):
        self.name = name
        self._pool: Optional[ThreadPoolExecutor] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return self.name

    # The worker thread -----------------------------------------------------------------------
    def activate(self) -> None:
        """Runs once on the device's worker thread before anything else."""

    def twin(self) -> "Device":
        """Another device of the same place (cores, GPU) with a worker thread of its own."""
        raise NotImplementedError

    def submit(self, fn: Callable, *args) -> Future:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"cct-{self.name}",
                                                initializer=self.activate)
        return self._pool.submit(fn, *args)

    def run(self, fn: Callable, *args):
        return self.submit(fn, *args).result()

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    # Arrays: moved by the device's backend, their one owner (cct.backend) -------------------
    @property
    def memory(self):
        """The backend module whose arrays this device's replica holds."""
        return backends.get(self.backend)

    def synchronize(self) -> None:
        """Waits for work queued on the device (GPUs run asynchronously); call it on the
        device's thread."""
        self.memory.synchronize()

    # Replicas --------------------------------------------------------------------------------
    def build(self, net_param, dtype, rng=None):
        """A Net for ``net_param`` on this device's backend, built on its thread (with its own
        random generator ``rng``, else drawing from the process-wide one)."""
        def build():
            with glog.quiet():
                return Net(net_param, backend=self.backend, dtype=dtype,
                           source=f"<replica on {self.name}>", rng=rng)
        return self.run(build)


class CPUDevice(Device):
    """A group of CPU cores: its thread is pinned to them (Linux) and cct's loops use that many
    threads. The BLAS's thread count is process-wide, so a scheduler with several CPU devices
    sets it to the smallest group (cct/scheduler.py)."""

    def __init__(self, cores: Sequence[int]):
        self.cores = tuple(cores)
        if len(self.cores) == 1:
            label = f"cpu:{self.cores[0]}"
        else:
            label = f"cpu:{self.cores[0]}-{self.cores[-1]}"
        super().__init__(label)

    @property
    def threads(self) -> int:
        return len(self.cores)

    def twin(self) -> "CPUDevice":
        return CPUDevice(self.cores)

    def activate(self) -> None:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, self.cores)  # Linux: the calling thread only
        _C.set_thread_num_threads(self.threads)


class GPUDevice(Device):
    """GPU ``index`` through the CuPy backend (cct/backend/gpu.py)."""

    backend = "gpu"
    host_memory = False

    def __init__(self, index: int):
        super().__init__(f"gpu{index}")
        self.index = index
        self.device_id = index

    def activate(self) -> None:
        from .backend import gpu
        gpu.use_device(self.index)

    def twin(self) -> "GPUDevice":
        return GPUDevice(self.index)


class StandInDevice(Device):
    """The GPU path without a GPU: a device whose replica runs on the ``numpy`` backend (the
    GPU's kernels on NumPy memory behind CuPy's rules, cct/backend/standin.py), so that a
    machine without a GPU (CI) trains with a device group, a hybrid split or a device learner
    as a GPU would, host/device copies and CuPy's refusals included. Spelled ``standin``."""

    backend = "numpy"
    host_memory = False
    device_id = 0            # the stand-in's one device

    def __init__(self):
        super().__init__("standin")

    def twin(self) -> "StandInDevice":
        return StandInDevice()


def _gpu_count() -> int:
    from .backend import gpu
    ok, reason = gpu.available()
    if not ok:
        raise DeviceError(f"GPU devices asked for, but {reason}.")
    return gpu.device_count()


def _core_range(item: str, cores: List[int]) -> List[int]:
    first, _, last = item[4:].partition("-")
    try:
        ids = list(range(int(first), int(last or first) + 1))
    except ValueError:
        ids = []
    if not ids:
        raise DeviceError(f"device {item!r}: 'cpu@I' or 'cpu@I-J' names core ids, I <= J.")
    missing = [c for c in ids if c not in cores]
    if missing:
        raise DeviceError(f"device {item!r}: core(s) {missing} are not available to this "
                          f"process (it may use {cores}).")
    return ids


def parse_devices(spec: str, cores: Optional[List[int]] = None) -> List[Device]:
    """Devices from a comma-separated list (see the module docstring)."""
    cores = list(available_cores() if cores is None else cores)
    items = [s.strip().lower() for s in spec.split(",") if s.strip()]
    if not items:
        raise DeviceError(f"empty device list {spec!r}; give e.g. 'cpu', 'cpu:1,cpu:1' or "
                          f"'cpu,gpu0'.")
    devices: List[Device] = []
    free = list(cores)
    whole_cpu = 0
    for item in items:
        if item == "cpu":
            whole_cpu += 1
            devices.append(CPUDevice(cores))
        elif item.startswith("cpu@"):
            ids = _core_range(item, cores)
            taken = [c for c in ids if c not in free]
            if taken:
                raise DeviceError(f"device {item!r}: core(s) {taken} belong to another device "
                                  f"of {spec!r} already.")
            devices.append(CPUDevice(ids))
            free = [c for c in free if c not in ids]
        elif item.startswith("cpu:"):
            try:
                n = int(item[4:])
            except ValueError:
                n = 0
            if n < 1:
                raise DeviceError(f"device {item!r}: 'cpu:N' takes a number of cores N >= 1.")
            if n > len(free):
                raise DeviceError(f"device {item!r}: {n} core(s) asked for, but only "
                                  f"{len(free)} of this process's {len(cores)} core(s) are "
                                  f"left for it (devices: {spec}).")
            devices.append(CPUDevice(free[:n]))
            del free[:n]
        elif item == "standin":
            devices.append(StandInDevice())
        elif item in ("gpu:all", "gpu-all", "all"):
            devices.extend(GPUDevice(i) for i in range(_gpu_count()))
        elif item.startswith("gpu"):
            rest = item[3:].lstrip(":")
            try:
                index = int(rest) if rest else 0
            except ValueError:
                raise DeviceError(f"unknown device {item!r}; devices are spelled 'cpu', "
                                  f"'cpu:N', 'gpuI' or 'gpu:all'.") from None
            count = _gpu_count()
            if not 0 <= index < count:
                raise DeviceError(f"device {item!r}: there are {count} GPU(s) "
                                  f"(0..{count - 1}).")
            devices.append(GPUDevice(index))
        else:
            raise DeviceError(f"unknown device {item!r}; devices are spelled 'cpu', 'cpu:N', "
                              f"'cpu@I-J', 'gpuI', 'gpu:all' or 'standin'.")
    cpu = [d for d in devices if isinstance(d, CPUDevice)]
    if whole_cpu and len(cpu) > 1:
        raise DeviceError(f"device list {spec!r}: 'cpu' takes every core, so it cannot be "
                          f"combined with other CPU devices; use 'cpu:N' groups.")
    names = [d.name for d in devices]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise DeviceError(f"device list {spec!r} names {', '.join(dup)} more than once.")
    return devices
