"""The driver: parallel strategies on top of the solver (Omnivore's asynchronous compute groups
and their relatives).

* ``sync``: what ``cct train`` does: one update stream, each batch's gradient from the solver's
  own gradient source (the train net, or a HybridScheduler over ``--devices``).
* ``async``: g compute groups around a :class:`~cct.driver.store.ParameterStore`. Each group
  pulls the weights (and the version it read), computes a whole batch's gradient on its own
  copy, and pushes it; the store applies it with the solver's rule and records its staleness
  (versions applied since the read). g = 1 is plain training, loss for loss.
* ``hogbatch`` / ``adaptive-hogbatch``: async with a batch per group (CPU+GPU Hogbatch); the
  adaptive one re-sizes the batches so the groups update at the same rate (balance.py).
* ``sma``: Crossbow's synchronous model averaging: learners with replicas of their own pulled
  toward a central model (sma.py).

Engines (cct/driver/engines.py): ``threads`` (default), ``processes`` (a group is an OS
process with shared memory; killing it costs only its batch; processes.py), ``simulated``
(deterministic staleness: round-robin, seeded exponential, replayed, or devices of given
speeds on a virtual clock) and ``ray`` (groups and a sharded store as Ray actors;
ray_engine.py, imported only then). ``momentum="auto"`` sets the explicit momentum of each
update by the rule: the solver's momentum minus the implicit momentum of the measured
staleness (store.py MomentumPolicy), the prior that ``cct train --momentum=auto`` starts from:
the command line measures the choice by probes (cct/optimizer/momentum.py) and passes the
number it chose. ``--groups`` is checked against the memory (and, for
processes, the cores) before anything is built; the processes and Ray engines wait for a
group's answer no longer than ``group_timeout`` seconds (by default a multiple of the slowest
step seen, engines.py AnswerTimeout) and drop one that does not answer as a dead one. From
Python::

    solver = cct.get_solver("solver.prototxt")
    driver = cct.driver.Driver(solver, strategy="async", groups=4, engine="simulated",
                               momentum="auto")
    driver.solve()          # or driver.step(n); solver.snapshot() as usual
    driver.close()
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence

import numpy as np

from ..devices import (CPUDevice, Device, available_cores, configure_blas, parse_devices,
                       restore_blas)
from ..errors import CCTError
from ..glog import info
from ..io.atomic import load_arrays, save_arrays
from .balance import UpdateBalance, parse_batch_sizes
from .engines import (ENGINES, AllGroupsLost, AnswerTimeout, SimulatedEngine, ThreadEngine,
                      describe)
from .groups import BatchFeeder, Group
from .processes import ProcessEngine, ProcessGroup
from .sma import LearnerTuner, ModelAveraging
from .staleness import STALENESS_MODELS, StalenessStats, implicit_momentum, schedule
from .store import MomentumPolicy, ParameterStore

STRATEGIES = ("sync", "async", "hogbatch", "adaptive-hogbatch", "sma")

__all__ = ["Driver", "AsyncDriver", "ParameterStore", "MomentumPolicy", "StalenessStats",
           "Group", "ProcessGroup", "BatchFeeder", "ThreadEngine", "ProcessEngine",
           "SimulatedEngine", "AllGroupsLost", "UpdateBalance", "ModelAveraging",
           "LearnerTuner", "STRATEGIES", "ENGINES", "STALENESS_MODELS", "implicit_momentum",
           "schedule", "group_devices", "parse_batch_sizes"]


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


class Driver:
    """A parallel strategy over a solver (see the module doc). It is also the solver's gradient
    source between its own steps (the final display, tests and snapshots read group 0's
    statistics). ``AsyncDriver`` is the same class."""

    def __init__(self, solver, groups: Optional[int] = 2, engine: str = "threads", devices=None,
                 staleness: str = "round-robin", momentum: Optional[str] = None,
                 allow_negative_momentum: bool = False, seed: int = 0,
                 trace: Optional[Sequence[int]] = None, sync_fc: bool = False,
                 strategy: str = "async", batch_sizes=None, threshold: float = 0.05,
                 learners=None, sma_alpha: Optional[float] = None, sma_momentum: float = 0.0,
                 sync_period: int = 1, simulate_speeds: Optional[Sequence[float]] = None,
                 ray_address: Optional[str] = None, ps_shards="auto",
                 ray_group_restarts: int = 3, ray_data: str = "ship",
                 group_timeout: Optional[float] = None):
        if strategy not in STRATEGIES or strategy == "sync":
            raise CCTError(f"the driver runs strategies {', '.join(STRATEGIES[1:])}, not "
                           f"'{strategy}' (sync is the solver's own solve())")
        if engine not in ENGINES:
            raise CCTError(f"unknown engine '{engine}'; known: {', '.join(ENGINES)}")
        if simulate_speeds is not None and engine != "simulated":
            raise CCTError("--simulate-speeds sets the simulated engine's device speeds: add "
                           "--engine=simulated")
        if groups is None:
            # One group per device: the papers' setting (CPU+GPU Hogbatch, Omnivore's CPU and
            # GPU groups). A group holding several devices, its batch split between them, is
            # asked for by name: --groups.
            if isinstance(devices, str):
                devices = parse_devices(devices)
            groups = len(devices) if devices else 1
            if devices and len(devices) > 1:
                info("driver.cpp:0", f"One compute group per device: "
                     f"{', '.join(d.name for d in devices)} (--groups=1 makes them one group "
                     f"that splits each batch between them)")
        self.solver = solver
        self.strategy = strategy
        self.engine_name = engine
        self.devices = devices
        self.seed = seed
        self.speeds = list(simulate_speeds) if simulate_speeds is not None else None
        self.group_seed = solver.param.random_seed if solver.param.random_seed >= 0 else None
        autotune = None
        if strategy == "sma":
            if sync_fc:
                raise CCTError("--sync-fc is for the parameter store's strategies, not sma")
            if momentum is not None:
                raise CCTError("--momentum sets the parameter store's momentum; with sma the "
                               "learners use the solver's and the central model "
                               "--sma-momentum")
            if learners == "auto":
                if self.speeds:
                    count = len(self.speeds)
                elif engine == "ray":      # Ray's CPUs are the cluster's: one per --groups
                    count = groups
                elif devices is None:
                    count = len(available_cores())
                else:
                    count = len(parse_devices(devices) if isinstance(devices, str) else devices)
            else:
                count = int(learners if learners is not None else groups)
            groups = count
        if groups < 1:
            raise CCTError(f"--groups must be at least 1, got {groups}")
        check_group_count(groups, engine, solver.net, solver.param.iter_size,
                          replicas=strategy == "sma")
        # How long the processes and Ray engines wait for a group's answer (engines.py).
        timeout = AnswerTimeout(group_timeout)
        if self.speeds is not None and strategy != "sma" and len(self.speeds) != groups:
            raise CCTError(f"--simulate-speeds gives {len(self.speeds)} speed(s) for {groups} "
                           f"group(s): give one per group")
        if momentum is None:
            momentum = repr(solver.param.momentum)
        try:
            policy = MomentumPolicy(momentum, solver.param.momentum, allow_negative_momentum)
        except ValueError:
            raise CCTError(f"--momentum must be 'auto' or a number, got '{momentum}'") from None
        self.store = ParameterStore(solver, policy)
        self.feeder = BatchFeeder(solver.net)
        self.iter_size = solver.param.iter_size
        self.places = None
        self.blas_threads_before = None
        if engine == "threads":
            self.engine = ThreadEngine()
            self.places = group_devices(groups, devices)
            self.blas_threads_before = configure_blas([d for p in self.places for d in p])
        elif engine == "processes":
            self.engine = ProcessEngine(timeout)
            places = group_devices(groups, devices)
            if any(len(p) > 1 and not all(isinstance(d, CPUDevice) for d in p)
                   for p in places):
                raise CCTError("the processes engine runs each group on CPU cores or on one "
                               "device; a group holding a device and other devices splits its "
                               "batches between them: use --engine=threads for it")
            self.cores = [[c for d in p if isinstance(d, CPUDevice) for c in d.cores]
                          for p in places]
            # A device group's process builds its net on that device (its spelling).
            self.process_devices = [None if isinstance(p[0], CPUDevice) else p[0].name
                                    for p in places]
            for d in (d for p in places for d in p):
                d.close()           # only their cores are used: each group is a process
        elif engine == "ray":
            ray_devices = None
            if devices is not None:
                # Ray places each group: a CPU group on a node with CPUs free, a GPU group on
                # one with a GPU free; --devices says which groups want a device.
                places = group_devices(groups, devices)
                if any(len(p) > 1 for p in places):
                    raise CCTError("--engine=ray runs each group on one device (Ray places "
                                   "it): give no more --devices than --groups")
                ray_devices = [None if isinstance(p[0], CPUDevice) else
                               "gpu" if p[0].backend == "gpu" else p[0].name for p in places]
                self.ray_names = [p[0].name for p in places]   # for --batch-sizes
                for d in (d for p in places for d in p):
                    d.close()
            from .ray_engine import RayEngine
            if ray_data == "local" and strategy == "adaptive-hogbatch":
                raise CCTError("--ray-data=local fixes each group's batch in its data layer: "
                               "adaptive-hogbatch needs --ray-data=ship")
            self.engine = RayEngine(solver, self.feeder, ray_address, ps_shards,
                                    ray_group_restarts, data=ray_data,
                                    replicas=strategy == "sma", devices=ray_devices,
                                    timeout=timeout)
        else:
            self.engine = SimulatedEngine(staleness, seed, trace, self.speeds)
            if devices is not None:  # the groups take turns, each on its own device
                self.places = group_devices(groups, devices)
        self.groups: List = []
        self.sma = None
        self.balance = None
        self._restored = False       # the learners' replicas came with a snapshot
        built = False
        try:       # a setting refused once groups exist: their threads, processes, actors go
            sizes = [None] * groups
            if batch_sizes is not None:
                sizes = (parse_batch_sizes(batch_sizes, [self._device_names(k)
                                                         for k in range(groups)])
                         if isinstance(batch_sizes, str)
                         else [None if b is None else int(b) for b in batch_sizes])
                if len(sizes) != groups:
                    raise CCTError(f"{len(sizes)} batch size(s) for {groups} group(s)")
                if any(b is not None and b != self.feeder.batch for b in sizes):
                    self.feeder.check_split()
            if strategy == "adaptive-hogbatch":
                self.feeder.check_split()
            self.max_batch = max(b or self.feeder.batch for b in sizes)
            if engine == "ray":
                self.groups = self.engine.make_groups(sizes)
            else:
                self.groups = [self._group(k, b) for k, b in enumerate(sizes)]
            if sync_fc:
                if engine in ("processes", "ray"):
                    raise CCTError("--sync-fc runs with the threads and simulated engines (the FC "
                                   "layers run on the parameter store, in the driver's process)")
                for g in self.groups:
                    g.use_sync_fc(self.store)
                info("driver.cpp:0", "Sync FC: the InnerProduct layers and those above them run "
                     "serially on the store's current weights, updated at once (never stale)")
            solver.set_gradient_source(self)
            solver.side_state["driver"] = (self.state, self.load_state)
            describe(self.engine, self.groups)
            if strategy == "sma":
                if learners == "auto":
                    if engine == "threads" and not all(isinstance(d, CPUDevice)
                                                       for p in self.places for d in p):
                        raise CCTError("--learners=auto adds learners on CPU cores (or simulated "
                                       "devices); give --devices of cpu cores or a number")
                    autotune = LearnerTuner(per_step=len(self.groups))
                self.sma = ModelAveraging(solver, self.groups, self.engine, self._group,
                                          sma_alpha, sma_momentum, sync_period, autotune)
                info("driver.cpp:0", self.sma.describe())
            else:
                clock = self.engine.now if self.speeds else None
                self.balance = UpdateBalance(self.groups, self.feeder,
                                             adaptive=strategy == "adaptive-hogbatch",
                                             threshold=threshold, clock=clock)
                self.store.display_hooks.append(self.balance.display)
                info("driver.cpp:0", policy.describe())
            info("driver.cpp:0", "Batches: " + ", ".join(
                f"group {g.index} {g.batch}" for g in self.groups) + f" (the data layers' batch is "
                f"{self.feeder.batch}; each group takes the next records of the epoch in turn)")
            if self.speeds:
                info("driver.cpp:0", "Simulated device speeds (records per virtual second): "
                     + ", ".join(f"{v:g}" for v in self.speeds))
            built = True
        finally:
            if not built:
                self.close()

    def _device_names(self, index: int) -> List[str]:
        if self.places is not None:
            return [d.name for d in self.places[index % len(self.places)]]
        if getattr(self, "ray_names", None):
            return [self.ray_names[index % len(self.ray_names)]]
        if self.engine_name == "processes":
            device = self.process_devices[index % len(self.process_devices)]
            return [device] if device else [f"cpu:{c}" for c in self.cores[index]]
        return []

    def _group(self, index: int, batch: Optional[int] = None):
        """Group ``index`` on its place (devices, cores or this thread); a learner added by
        the SMA autotuner takes the place (and batch) of learner ``index`` mod the places."""
        if batch is None and index >= len(self.groups) > 0:
            batch = self.groups[index % len(self.groups)].batch
        if self.engine_name == "threads":
            place = self.places[index % len(self.places)]
            if index >= len(self.places):
                place = [d.twin() for d in place]   # its own thread, the same cores or GPU
            return Group(index, self.feeder, place, self.iter_size, self.group_seed, batch)
        if self.engine_name == "ray":
            return self.engine.add_group(index, batch)
        if self.engine_name == "processes":
            place = index % len(self.cores)
            return ProcessGroup(index, self.feeder, self.cores[place], self.iter_size,
                                self.group_seed, batch, max_batch=self.max_batch,
                                device=self.process_devices[place])
        place = [] if self.places is None else [d.twin() if index >= len(self.places) else d
                                                for d in self.places[index % len(self.places)]]
        return Group(index, self.feeder, place, self.iter_size, self.group_seed, batch)

    # -- running -----------------------------------------------------------------------------
    def step(self, iters: int) -> None:
        """``iters`` updates from the groups (Solver.step's contract)."""
        try:
            if self.sma is not None:
                self.sma.step(iters)
            else:
                self.solver.start_steps()
                self.engine.run(self.store, self.groups, iters, observer=self.balance)
                self.balance.summary()
        except AllGroupsLost:
            s = self.solver
            s.requested_early_exit = True
            if s.param.snapshot_prefix:
                s.snapshot()
            raise

    def solve(self, resume_file: Optional[str] = None) -> None:
        self.solver.solve(resume_file, step=self.step)

    # -- the solver's gradient source between steps ------------------------------------------
    def compute_gradients(self) -> float:
        """A plain ``solver.step`` on a driven solver: the train net itself, synchronous."""
        return self.solver.net.forward_backward()

    def compute_loss(self) -> float:
        """The final display's loss, on the train net (the store's weights), as Caffe's."""
        self.engine.gather()
        return self.solver.net.forward_prefilled()

    def pull_statistics(self) -> None:
        """The running statistics (BatchNorm's) of the first group that has computed a step:
        until a group has, its copy holds what it started from (a snapshot due while group 0
        still runs its first step would otherwise save zeros)."""
        self.engine.gather()
        if self.groups:
            done = [g for g in self.groups if g.steps_done > 0]
            (done or self.groups)[0].copy_statistics_to(self.solver.net)

    def refresh(self) -> None:
        """The train net's params were restored: the groups' copies of what is not learned
        (lr_mult 0, statistics) follow; learnable weights come with each pull (a simulated
        run's were restored with its snapshot)."""
        for g in self.groups:
            g.copy_statistics_from(self.solver.net)
        self.engine.scatter()
        if self.sma is not None and not self._restored:
            for g in self.groups:     # learners restart from z: the snapshot has none of theirs
                self.solver.params.copy_weights_to(g.params)
        self._restored = False

    def close(self) -> None:
        for g in self.groups:
            g.close()
        self.groups = []
        self.engine.close()
        if self.blas_threads_before is not None:
            restore_blas(self.blas_threads_before)
            self.blas_threads_before = None

    # -- what snapshots keep -----------------------------------------------------------------
    @staticmethod
    def records_file(state_file: str) -> str:
        return state_file + ".cct.feeder.npz"

    def state(self, state_file: str) -> dict:
        out = {"staleness": self.store.stats.state(), "engine": self.engine.name,
               "strategy": self.strategy}
        feeder, rows = self.feeder.state()
        if rows:       # records of the data layers' current batch no group has taken yet
            save_arrays(self.records_file(state_file), rows)
        out["feeder"] = feeder
        if self.sma is not None:
            out["sma"] = self.sma.state(state_file)
        else:
            out["balance"] = self.balance.state()
            if isinstance(self.engine, SimulatedEngine):
                out["simulated"] = self.engine.state(self.groups, state_file)
        return out

    def load_state(self, state: dict, state_file: str) -> None:
        if state.get("strategy", "async") != self.strategy:
            raise ValueError(f"the snapshot was taken with --strategy="
                             f"{state.get('strategy', 'async')}, this run is {self.strategy}")
        self.store.stats.load_state(state["staleness"])
        if "feeder" in state:
            rows = {}
            if state["feeder"].get("left"):
                rows = load_arrays(self.records_file(state_file),
                                   "the records left of the data layers' batch")
            self.feeder.load_state(state["feeder"], rows)
        if self.sma is not None:
            self.sma.load_state(state["sma"], state_file)
            self._restored = True
            return
        if "balance" in state:
            self.balance.load_state(state["balance"])
        if isinstance(self.engine, SimulatedEngine) and "simulated" in state:
            self.engine.load_state(state["simulated"], self.groups, state_file, self.store)


AsyncDriver = Driver
