"""The strategies as objects: how a run's groups turn gradients into updates.

Each is built in two steps: from the configuration and the solver before any group exists (so
a refused setting costs nothing), then :meth:`start` with the groups a placement built (the
gradient sources), their engine and the batch feeder. ``step(iters)`` makes ``iters`` updates;
``state``/``load_state`` keep what a snapshot needs besides the solver's own state.

* :class:`StoreStrategy`: ``async``, ``hogbatch``, ``adaptive-hogbatch``: the groups pull from
  and push to a :class:`~cct.driver.store.ParameterStore` that applies each gradient with the
  solver's rule; the balance counts each group's updates (and, adaptive, re-sizes batches).
* :class:`ModelAveragingStrategy`: ``sma``: learners with replicas of their own pulled toward a
  central model (Crossbow; cct/driver/sma.py).
"""
from __future__ import annotations

from typing import Callable, Dict, List

from ..devices import CPUDevice
from ..errors import CCTError
from ..glog import info
from .balance import UpdateBalance
from .engines import SimulatedEngine
from .sma import LearnerTuner, ModelAveraging
from .staleness import StalenessStats
from .store import MomentumPolicy, ParameterStore


class StoreStrategy:
    """Asynchronous updates through a parameter store (Omnivore's groups, CPU+GPU Hogbatch)."""

    def __init__(self, config, solver):
        momentum = config.momentum
        if momentum is None:
            momentum = repr(solver.param.momentum)
        try:
            self.policy = MomentumPolicy(momentum, solver.param.momentum,
                                         config.allow_negative_momentum)
        except ValueError:
            raise CCTError(f"--momentum must be 'auto' or a number, got '{momentum}'") from None
        self.config = config
        self.solver = solver
        self.store = ParameterStore(solver, self.policy)
        self.stats = self.store.stats
        self.balance = None
        self.engine = None
        self.groups: List = []

    def start(self, groups: List, placement, feeder, make_group: Callable) -> None:
        engine = placement.engine
        self.groups, self.engine = groups, engine
        if self.config.sync_fc:
            for g in groups:
                g.use_sync_fc(self.store)
            info("driver.cpp:0", "Sync FC: the InnerProduct layers and those above them run "
                 "serially on the store's current weights, updated at once (never stale)")
        clock = engine.now if self.config.simulate_speeds is not None else None
        self.balance = UpdateBalance(groups, feeder,
                                     adaptive=self.config.strategy == "adaptive-hogbatch",
                                     threshold=self.config.threshold, clock=clock)
        self.store.display_hooks.append(self.balance.display)
        info("driver.cpp:0", self.policy.describe())

    def step(self, iters: int) -> None:
        self.solver.start_steps()
        self.engine.run(self.store, self.groups, iters, observer=self.balance)
        self.balance.summary()

    def refresh(self) -> None:
        """The learnable weights come with each pull: nothing of the groups' to restore."""

    def state(self, state_file: str) -> Dict:
        out = {"balance": self.balance.state()}
        if isinstance(self.engine, SimulatedEngine):
            out["simulated"] = self.engine.state(self.groups, state_file)
        return out

    def load_state(self, state: Dict, state_file: str) -> None:
        if "balance" in state:
            self.balance.load_state(state["balance"])
        if isinstance(self.engine, SimulatedEngine) and "simulated" in state:
            self.engine.load_state(state["simulated"], self.groups, state_file, self.store)


class ModelAveragingStrategy:
    """Synchronous model averaging (Crossbow's SMA): see cct/driver/sma.py."""

    def __init__(self, config, solver):
        self.config = config
        self.solver = solver
        self.store = None
        self.balance = None
        # Kept in the snapshot as the store's strategies keep theirs (nothing is stale here).
        self.stats = StalenessStats()
        self.sma = None
        self.groups: List = []
        self._restored = False       # the learners' replicas came with a snapshot

    def start(self, groups: List, placement, feeder, make_group: Callable) -> None:
        config, autotune, engine = self.config, None, placement.engine
        self.groups = groups
        if config.learners == "auto":
            if config.engine == "threads" and not all(
                    isinstance(d, CPUDevice) for p in placement.places for d in p):
                raise CCTError("--learners=auto adds learners on CPU cores (or simulated "
                               "devices); give --devices of cpu cores or a number")
            autotune = LearnerTuner(per_step=len(groups))
        self.sma = ModelAveraging(self.solver, groups, engine, make_group, config.sma_alpha,
                                  config.sma_momentum, config.sync_period, autotune)
        info("driver.cpp:0", self.sma.describe())

    def step(self, iters: int) -> None:
        self.sma.step(iters)

    def refresh(self) -> None:
        """Learners restart from the central model z: a snapshot has none of their replicas
        (a cct snapshot that had them restored them already)."""
        if not self._restored:
            for g in self.groups:
                self.solver.params.copy_weights_to(g.params)
        self._restored = False

    def state(self, state_file: str) -> Dict:
        return {"sma": self.sma.state(state_file)}

    def load_state(self, state: Dict, state_file: str) -> None:
        self.sma.load_state(state["sma"], state_file)
        self._restored = True


#: The strategies by name (``--strategy``); ``sync`` is the solver's own loop, no driver.
STRATEGY_TYPES = {"async": StoreStrategy, "hogbatch": StoreStrategy,
                  "adaptive-hogbatch": StoreStrategy, "sma": ModelAveragingStrategy}
