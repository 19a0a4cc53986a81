"""The driver: parallel strategies on top of the solver (Omnivore's asynchronous compute groups).

* ``sync``: what ``cct train`` does: one update stream, each batch's gradient from the solver's
  own gradient source (the train net, or a HybridScheduler over ``--devices``).
* ``async``: g compute groups around a :class:`~cct.driver.store.ParameterStore`. Each group
  pulls the weights (and the version it read), computes a whole batch's gradient on its own
  copy, and pushes it; the store applies it with the solver's rule and records its staleness
  (versions applied since the read). g = 1 is plain training, loss for loss.

Engines (cct/driver/engines.py): ``threads`` (default), ``processes`` (a group is an OS
process with shared memory; killing it costs only its batch; cct/driver/processes.py) and
``simulated`` (deterministic staleness: round-robin, seeded exponential, replayed). ``--momentum=auto`` sets the explicit
momentum from the measured staleness (cct/driver/staleness.py). From Python::

    solver = cct.get_solver("solver.prototxt")
    driver = cct.driver.AsyncDriver(solver, groups=4, engine="simulated", momentum="auto")
    driver.solve()          # or driver.step(n); solver.snapshot() as usual
    driver.close()
"""
from __future__ import annotations

from typing import List, Optional, Sequence

from ..devices import CPUDevice, Device, available_cores, configure_blas, parse_devices
from ..errors import CCTError
from ..glog import info
from .engines import ENGINES, AllGroupsLost, SimulatedEngine, ThreadEngine, describe
from .groups import BatchFeeder, Group
from .processes import ProcessEngine, ProcessGroup
from .staleness import STALENESS_MODELS, StalenessStats, implicit_momentum, schedule
from .store import MomentumPolicy, ParameterStore

STRATEGIES = ("sync", "async")

__all__ = ["AsyncDriver", "ParameterStore", "MomentumPolicy", "StalenessStats", "Group",
           "ProcessGroup", "BatchFeeder", "ThreadEngine", "ProcessEngine", "SimulatedEngine",
           "AllGroupsLost", "STRATEGIES", "ENGINES", "STALENESS_MODELS", "implicit_momentum",
           "schedule", "group_devices"]


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


class AsyncDriver:
    """Asynchronous compute groups around the solver's parameters (see the module doc). It is
    also the solver's gradient source between its own steps (the final display, tests and
    snapshots read group 0's statistics)."""

    def __init__(self, solver, groups: int = 2, engine: str = "threads", devices=None,
                 staleness: str = "round-robin", momentum: Optional[str] = None,
                 allow_negative_momentum: bool = False, seed: int = 0,
                 trace: Optional[Sequence[int]] = None, sync_fc: bool = False):
        if groups < 1:
            raise CCTError(f"--groups must be at least 1, got {groups}")
        if engine not in ENGINES:
            raise CCTError(f"unknown engine '{engine}'; known: {', '.join(ENGINES)}")
        if engine == "simulated" and devices is not None:
            raise CCTError("the simulated engine runs its groups in this thread: give no "
                           "--devices with --engine=simulated")
        self.solver = solver
        if momentum is None:
            momentum = repr(solver.param.momentum)
        try:
            policy = MomentumPolicy(momentum, solver.param.momentum, allow_negative_momentum)
        except ValueError:
            raise CCTError(f"--momentum must be 'auto' or a number, got '{momentum}'") from None
        self.store = ParameterStore(solver, policy)
        self.feeder = BatchFeeder(solver.net)
        group_seed = solver.param.random_seed if solver.param.random_seed >= 0 else None
        if engine == "threads":
            self.engine = ThreadEngine()
            places = group_devices(groups, devices)
            configure_blas([d for p in places for d in p])
            self.groups = [Group(k, self.feeder, d, solver.param.iter_size, group_seed)
                           for k, d in enumerate(places)]
        elif engine == "processes":
            self.engine = ProcessEngine()
            places = group_devices(groups, devices)
            if not all(isinstance(d, CPUDevice) for p in places for d in p):
                raise CCTError("the processes engine runs CPU groups: give --devices of cpu "
                               "cores only (cpu:N, cpu@I-J)")
            cores = [[c for d in p for c in d.cores] for p in places]
            for d in (d for p in places for d in p):
                d.close()           # only their cores are used: each group is a process
            self.groups = [ProcessGroup(k, self.feeder, c, solver.param.iter_size, group_seed)
                           for k, c in enumerate(cores)]
        else:
            self.engine = SimulatedEngine(staleness, seed, trace)
            self.groups = [Group(k, self.feeder, [], solver.param.iter_size, group_seed)
                           for k in range(groups)]
        if sync_fc:
            if engine == "processes":
                raise CCTError("--sync-fc runs with the threads and simulated engines (the FC "
                               "layers run on the parameter store, in the driver's process)")
            for g in self.groups:
                g.use_sync_fc(self.store)
            info("driver.cpp:0", "Sync FC: the InnerProduct layers and those above them run "
                 "serially on the store's current weights, updated at once (never stale)")
        solver.set_gradient_source(self)
        solver.side_state["driver"] = (self.state, self.load_state)
        describe(self.engine, self.groups)
        info("driver.cpp:0", policy.describe())

    # -- running -----------------------------------------------------------------------------
    def step(self, iters: int) -> None:
        """``iters`` updates from the groups (Solver.step's contract)."""
        self.solver.start_steps()
        try:
            self.engine.run(self.store, self.groups, iters)
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
        return self.solver.net.forward_prefilled()

    def pull_statistics(self) -> None:
        if self.groups:
            self.groups[0].copy_statistics_to(self.solver.net)

    def refresh(self) -> None:
        """The train net's params were restored: the groups' copies of what is not learned
        (lr_mult 0, statistics) follow; learnable weights come with each pull (a simulated
        run's were restored with its snapshot)."""
        for g in self.groups:
            g.copy_statistics_from(self.solver.net)

    def close(self) -> None:
        for g in self.groups:
            g.close()
        self.groups = []

    # -- what snapshots keep -----------------------------------------------------------------
    def state(self, state_file: str) -> dict:
        out = {"staleness": self.store.stats.state(), "engine": self.engine.name}
        if isinstance(self.engine, SimulatedEngine):
            out["simulated"] = self.engine.state(self.groups, state_file)
        return out

    def load_state(self, state: dict, state_file: str) -> None:
        self.store.stats.load_state(state["staleness"])
        if isinstance(self.engine, SimulatedEngine) and "simulated" in state:
            self.engine.load_state(state["simulated"], self.groups, state_file, self.store)
