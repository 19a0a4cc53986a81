"""Where a run's groups compute: the registry of engines by name, each entry a placement that
builds its engine and then its groups (the strategies' gradient-source factory).

A placement owns what the engine needs besides the groups: the devices each group gets (the
threads and simulated engines), the cores and device spelling of each group process, the Ray
cluster (the Ray engine builds its own groups as actors). ``group(index, batch)`` builds group
``index``; an index past the places (a learner SMA's autotune adds) takes the place of group
``index`` mod the places, on a twin of its devices (its own thread, the same cores or GPU).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np

from ..devices import BlasThreads, CPUDevice, Device, available_cores, parse_devices
from ..errors import CCTError
from .engines import AnswerTimeout, SimulatedEngine, ThreadEngine
from .groups import Group
from .processes import ProcessEngine, ProcessGroup


def group_devices(groups: int, devices=None) -> List[List[Device]]:
    """The devices of each group: ``devices`` (a spelling or a list) partitioned in order into
    ``groups`` contiguous parts; without devices, the cores shared out (one core each when
    there are more groups than cores, several groups then sharing a core)."""
    if devices is None:
        cores = available_cores()
        if groups <= len(cores):
            per = len(cores) // groups
            return [[CPUDevice(cores[k * per:(k + 1) * per])] for k in range(groups)]
        return [[CPUDevice([cores[k % len(cores)]])] for k in range(groups)]
    if isinstance(devices, str):
        devices = parse_devices(devices)
    devices = list(devices)
    if len(devices) < groups:
        raise CCTError(f"--groups={groups} needs at least {groups} devices to partition; "
                       f"--devices gives {len(devices)} ({', '.join(d.name for d in devices)})")
    return [devices[k * len(devices) // groups:(k + 1) * len(devices) // groups]
            for k in range(groups)]


# A group process holds a Python interpreter with cct, NumPy and its BLAS loaded besides its
# net (measured: about 66 MiB resident with a small net); beyond a few processes per core they
# only take turns.
_PROCESS_BYTES = 64 << 20
_PROCESSES_PER_CORE = 8


def available_memory() -> int:
    """Bytes of memory a new allocation can still get: MemAvailable (free memory plus the
    caches the kernel gives back), else the free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62          # unknown: only the engines' own limits apply


def _blob_bytes(blob) -> int:
    return int(np.prod(blob.shape)) * np.dtype(blob.dtype).itemsize


def check_group_count(groups: int, engine: str, net, iter_size: int = 1,
                      replicas: bool = False) -> None:
    """Refuse a --groups that cannot run here, before anything is built: each group holds a
    replica of the train net below its data layers (its params and their diffs, its blobs'
    data and diffs; a group process also a Python interpreter), the processes engine runs at
    most ``_PROCESSES_PER_CORE`` per core, and a Ray group's batches (an SMA learner's
    replica too) are kept in the driver."""
    if engine == "ray":
        per_group = sum(_blob_bytes(b) for b in _input_tops(net)) * iter_size
        if replicas:
            per_group += 3 * sum(_blob_bytes(b) for b in net.learnable_params)
        what = "its batches (and an SMA learner's replica) in the driver"
    else:
        per_group = 2 * (sum(_blob_bytes(b) for b in net.blobs_list)
                         + sum(_blob_bytes(b) for b in net.learnable_params))
        what = "a replica of the train net (params, blobs, diffs)"
        if engine == "processes":
            per_group += _PROCESS_BYTES
            what += " and a process"
            cores = len(available_cores())
            if groups > _PROCESSES_PER_CORE * cores:
                raise CCTError(f"--groups={groups} with --engine=processes: at most "
                               f"{_PROCESSES_PER_CORE * cores} group processes "
                               f"({_PROCESSES_PER_CORE} per core, {cores} core(s) here; more "
                               f"only take turns on the cores): lower --groups")
    memory = available_memory()
    if groups * per_group > memory:
        raise CCTError(f"--groups={groups} with --engine={engine}: each group needs about "
                       f"{per_group / 2**20:.3g} MiB ({what}), {groups * per_group / 2**30:.3g} "
                       f"GiB in all, but {memory / 2**30:.3g} GiB of memory is available: "
                       f"at most {max(memory // max(per_group, 1), 1)} group(s); lower --groups")


def _input_tops(net) -> List:
    """The data layers' tops: what a group's batch holds."""
    return list(net.source_tops().values())


class Placement:
    """Groups on devices in this process: the threads and simulated engines."""

    def __init__(self, config, solver, feeder, timeout: AnswerTimeout):
        self.feeder = feeder
        self.iter_size = solver.param.iter_size
        self.seed = solver.param.random_seed if solver.param.random_seed >= 0 else None
        self.places: Optional[List[List[Device]]] = None
        self.max_batch: Optional[int] = None      # set once the batches are known
        self.engine = None

    def device_names(self, index: int) -> List[str]:
        """The names of group ``index``'s devices, as --batch-sizes spells them."""
        if self.places is None:
            return []
        return [d.name for d in self.places[index % len(self.places)]]

    def group(self, index: int, batch: Optional[int]):
        place = [] if self.places is None else [
            d.twin() if index >= len(self.places) else d
            for d in self.places[index % len(self.places)]]
        return Group(index, self.feeder, place, self.iter_size, self.seed, batch)

    def make_groups(self, sizes: List[Optional[int]]) -> List:
        return [self.group(k, b) for k, b in enumerate(sizes)]

    def close(self) -> None:
        self.engine.close()


class ThreadPlacement(Placement):
    """Each group on its devices' own thread; the BLAS threads set to the groups' cores for
    the run and given back at its end."""

    def __init__(self, config, solver, feeder, timeout):
        super().__init__(config, solver, feeder, timeout)
        self.engine = ThreadEngine()
        self.places = group_devices(config.groups, config.devices)
        self.blas_threads = BlasThreads([d for p in self.places for d in p])

    def close(self) -> None:
        super().close()
        self.blas_threads.release()


class SimulatedPlacement(Placement):
    """The groups take turns in this thread, each on its own devices when given."""

    def __init__(self, config, solver, feeder, timeout):
        super().__init__(config, solver, feeder, timeout)
        speeds = list(config.simulate_speeds) if config.simulate_speeds is not None else None
        self.engine = SimulatedEngine(config.staleness, config.seed, config.trace, speeds)
        if config.devices is not None:
            self.places = group_devices(config.groups, config.devices)


class ProcessPlacement(Placement):
    """Each group an OS process on its cores, or on one device (its spelling)."""

    def __init__(self, config, solver, feeder, timeout):
        super().__init__(config, solver, feeder, timeout)
        places = group_devices(config.groups, config.devices)
        if any(len(p) > 1 and not all(isinstance(d, CPUDevice) for d in p) for p in places):
            raise CCTError("the processes engine runs each group on CPU cores or on one "
                           "device; a group holding a device and other devices splits its "
                           "batches between them: use --engine=threads for it")
        self.engine = ProcessEngine(timeout)
        self.cores = [[c for d in p if isinstance(d, CPUDevice) for c in d.cores]
                      for p in places]
        # A device group's process builds its net on that device (its spelling).
        self.process_devices = [None if isinstance(p[0], CPUDevice) else p[0].name
                                for p in places]
        for d in (d for p in places for d in p):
            d.close()           # only their cores are used: each group is a process

    def device_names(self, index: int) -> List[str]:
        device = self.process_devices[index % len(self.process_devices)]
        return [device] if device else [f"cpu:{c}" for c in self.cores[index]]

    def group(self, index: int, batch: Optional[int]):
        place = index % len(self.cores)
        return ProcessGroup(index, self.feeder, self.cores[place], self.iter_size, self.seed,
                            batch, max_batch=self.max_batch, device=self.process_devices[place])


class RayPlacement(Placement):
    """Groups and a sharded store as Ray actors; Ray places each group: a CPU group on a node
    with CPUs free, a GPU group on one with a GPU free (--devices says which want a device)."""

    def __init__(self, config, solver, feeder, timeout):
        super().__init__(config, solver, feeder, timeout)
        self.names: List[str] = []
        ray_devices = None
        if config.devices is not None:
            places = group_devices(config.groups, config.devices)
            if any(len(p) > 1 for p in places):
                raise CCTError("--engine=ray runs each group on one device (Ray places "
                               "it): give no more --devices than --groups")
            ray_devices = [None if isinstance(p[0], CPUDevice) else
                           "gpu" if p[0].backend == "gpu" else p[0].name for p in places]
            self.names = [p[0].name for p in places]   # for --batch-sizes
            for d in (d for p in places for d in p):
                d.close()
        from .ray_engine import RayEngine
        self.engine = RayEngine(solver, feeder, config.ray_address, config.ps_shards,
                                config.ray_group_restarts, data=config.ray_data,
                                replicas=config.strategy == "sma", devices=ray_devices,
                                timeout=timeout)

    def device_names(self, index: int) -> List[str]:
        return [self.names[index % len(self.names)]] if self.names else []

    def group(self, index: int, batch: Optional[int]):
        return self.engine.add_group(index, batch)

    def make_groups(self, sizes: List[Optional[int]]) -> List:
        return self.engine.make_groups(sizes)


#: The engines by name (``--engine``): ``threads`` (default), ``processes`` (a group is an OS
#: process with shared memory; killing it costs only its batch), ``simulated`` (deterministic
#: staleness on a virtual clock) and ``ray`` (imported only when asked for).
ENGINES: Dict[str, type] = {"threads": ThreadPlacement, "processes": ProcessPlacement,
                            "simulated": SimulatedPlacement, "ray": RayPlacement}
