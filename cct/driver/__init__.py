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

The pieces: a :class:`~cct.driver.config.DriverConfig` (what the flags say), a placement from
the engine registry (cct/driver/placement.py ``ENGINES``: where the groups compute, and the
factory of their gradient sources), a strategy object (cct/driver/strategies.py: how their
gradients become updates) and the batch feeder; the Driver is the loop over them and the
solver's gradient source between its own steps.

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
                               momentum="auto")   # or Driver(solver, DriverConfig(...))
    driver.solve()          # or driver.step(n); solver.snapshot() as usual
    driver.close()
"""
from __future__ import annotations

from typing import List, Optional

from ..glog import info
from ..errors import CCTError
from ..io.atomic import load_arrays, save_arrays
from .balance import UpdateBalance, parse_batch_sizes
from .config import STRATEGIES, DriverConfig
from .engines import AllGroupsLost, AnswerTimeout, SimulatedEngine, ThreadEngine, describe
from .groups import BatchFeeder, Group
from .placement import ENGINES, check_group_count, group_devices
from .processes import ProcessEngine, ProcessGroup
from .sma import LearnerTuner, ModelAveraging
from .staleness import STALENESS_MODELS, StalenessStats, implicit_momentum, schedule
from .store import MomentumPolicy, ParameterStore
from .strategies import STRATEGY_TYPES

__all__ = ["Driver", "AsyncDriver", "DriverConfig", "ParameterStore", "MomentumPolicy",
           "StalenessStats", "Group", "ProcessGroup", "BatchFeeder", "ThreadEngine",
           "ProcessEngine", "SimulatedEngine", "AllGroupsLost", "UpdateBalance",
           "ModelAveraging", "LearnerTuner", "STRATEGIES", "ENGINES", "STALENESS_MODELS",
           "implicit_momentum", "schedule", "group_devices", "parse_batch_sizes"]


class Driver:
    """A parallel strategy over a solver (see the module doc): ``Driver(solver, config)`` or
    ``Driver(solver, strategy=..., groups=..., ...)`` (the DriverConfig's fields; given both,
    the keywords change the config's). It is also the solver's gradient source between its
    own steps (the final display, tests and snapshots read group 0's statistics).
    ``AsyncDriver`` is the same class."""

    def __init__(self, solver, config: Optional[DriverConfig] = None, **settings):
        config = (config or DriverConfig()).replace(**settings)
        config.check(ENGINES)
        config = config.resolved()
        check_group_count(config.groups, config.engine, solver.net, solver.param.iter_size,
                          replicas=config.strategy == "sma")
        timeout = AnswerTimeout(config.group_timeout)   # the processes' and Ray's patience
        self.config = config
        self.solver = solver
        self.strategy = STRATEGY_TYPES[config.strategy](config, solver)
        self.feeder = BatchFeeder(solver.net)
        self.placement = None
        self.groups: List = []
        built = False
        try:       # a setting refused once groups exist: their threads, processes, actors go
            self.placement = ENGINES[config.engine](config, solver, self.feeder, timeout)
            sizes = self._batch_sizes()
            self.placement.max_batch = max(b or self.feeder.batch for b in sizes)
            self.groups = self.placement.make_groups(sizes)
            solver.set_gradient_source(self)
            solver.keep_beside_snapshots("driver", self.state, self.load_state)
            describe(self.engine, self.groups)
            self.strategy.start(self.groups, self.placement, self.feeder, self._group)
            self._log_batches()
            built = True
        finally:
            if not built:
                self.close()

    # What callers read of the pieces (tests, benches, the optimizer).
    engine = property(lambda self: self.placement.engine)
    store = property(lambda self: self.strategy.store)
    balance = property(lambda self: self.strategy.balance)
    sma = property(lambda self: getattr(self.strategy, "sma", None))
    seed = property(lambda self: self.config.seed)

    def _batch_sizes(self) -> List[Optional[int]]:
        """Each group's batch (None: the data layers'), from --batch-sizes."""
        config, groups = self.config, self.config.groups
        sizes = [None] * groups
        if config.batch_sizes is not None:
            sizes = (parse_batch_sizes(config.batch_sizes,
                                       [self.placement.device_names(k) for k in range(groups)])
                     if isinstance(config.batch_sizes, str)
                     else [None if b is None else int(b) for b in config.batch_sizes])
            if len(sizes) != groups:
                raise CCTError(f"{len(sizes)} batch size(s) for {groups} group(s)")
            if any(b is not None and b != self.feeder.batch for b in sizes):
                self.feeder.check_split()
        if config.strategy == "adaptive-hogbatch":
            self.feeder.check_split()
        return sizes

    def _log_batches(self) -> None:
        info("driver.cpp:0", "Batches: " + ", ".join(
            f"group {g.index} {g.batch}" for g in self.groups) + f" (the data layers' batch is "
            f"{self.feeder.batch}; each group takes the next records of the epoch in turn)")
        if self.config.simulate_speeds is not None:
            info("driver.cpp:0", "Simulated device speeds (records per virtual second): "
                 + ", ".join(f"{v:g}" for v in self.config.simulate_speeds))

    def _group(self, index: int, batch: Optional[int] = None):
        """Group ``index`` on its place; a learner added by the SMA autotuner takes the place
        (and batch) of learner ``index`` mod the places."""
        if batch is None and index >= len(self.groups) > 0:
            batch = self.groups[index % len(self.groups)].batch
        return self.placement.group(index, batch)

    # -- running -----------------------------------------------------------------------------
    def step(self, iters: int) -> None:
        """``iters`` updates from the groups (Solver.step's contract)."""
        try:
            self.strategy.step(iters)
        except AllGroupsLost:
            self.solver.stop_after_source_lost()
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
        run's were restored with its snapshot; SMA's learners restart from z)."""
        for g in self.groups:
            g.copy_statistics_from(self.solver.net)
        self.engine.scatter()
        self.strategy.refresh()

    def close(self) -> None:
        """The groups, their engine and what the solver kept for this driver go (the solver's
        next snapshots are a plain run's)."""
        self.solver.forget_beside_snapshots("driver")
        for g in self.groups:
            g.close()
        self.groups = []
        if self.placement is not None:
            self.placement.close()

    # -- what snapshots keep -----------------------------------------------------------------
    @staticmethod
    def records_file(state_file: str) -> str:
        return state_file + ".cct.feeder.npz"

    def state(self, state_file: str) -> dict:
        out = {"staleness": self.strategy.stats.state(), "engine": self.engine.name,
               "strategy": self.config.strategy}
        feeder, rows = self.feeder.state()
        if rows:       # records of the data layers' current batch no group has taken yet
            save_arrays(self.records_file(state_file), rows)
        out["feeder"] = feeder
        out.update(self.strategy.state(state_file))
        return out

    def load_state(self, state: dict, state_file: str) -> None:
        if state.get("strategy", "async") != self.config.strategy:
            raise ValueError(f"the snapshot was taken with --strategy="
                             f"{state.get('strategy', 'async')}, this run is "
                             f"{self.config.strategy}")
        self.strategy.stats.load_state(state["staleness"])
        if "feeder" in state:
            rows = {}
            if state["feeder"].get("left"):
                rows = load_arrays(self.records_file(state_file),
                                   "the records left of the data layers' batch")
            self.feeder.load_state(state["feeder"], rows)
        self.strategy.load_state(state, state_file)


AsyncDriver = Driver
