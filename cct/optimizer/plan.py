"""The optimizer: strategy, groups, batch, learning rate and momentum for the shortest time to a
target, chosen from measurements taken inside the run, re-tuned while it goes on.

Time to target = HE x iterations to target (Omnivore's hardware and statistical efficiency).

* **Candidates** are (strategy, groups, batch per group, lr multiple, momentum). One group with
  the data layers' batch is the solver alone (``sync``); more groups, or another batch, run on
  a :class:`~cct.driver.Driver` (``async``; ``hogbatch`` when the batch differs) built on the
  same solver.
* **HE** (seconds per iteration) is measured once per (strategy, groups, batch): a few warm-up
  iterations, then a few timed ones over whole rounds of the groups, on a branch that is
  thrown away (the plan's first, the solver's own settings, is kept: their first probe goes
  on from it); each probe's own iterations refine it (the median of all: the run's first
  measurement is its first iterations, slower than the rest, and made two 1-core groups look
  10% faster than one 2-core group where they were not). The same run measures the
  staleness of a driven configuration: its implicit momentum E[tau]/(1+E[tau]) moved the
  momentum search's centre (negative values allowed). On the simulated engine the groups run
  one after another in this thread, so its HE is that of one group: the simulated engine is
  for statistical efficiency (tests, planning), not for speed.
* **SE probes** are short runs that branch from :meth:`Solver.capture` (weights, history,
  iteration, random generator, data position); the run returns to the capture afterwards.
  Nothing is written to disk (tests and snapshots are off during a probe; its display lines
  are held back). Every probe starts from the same point and sees the same batches, so probes
  are paired. Each probe's losses are fitted with :mod:`.curve`'s power law and the fit
  predicts the iterations to the reference loss: the target loss, or, without one (or with a
  target accuracy, which a probe does not measure), 0.9 x the lowest fitted loss at any
  probe's end. Predicted seconds = HE x predicted iterations; the fewest wins, ties (flat
  curves: inf) going to the lower level of the probe's second half (paired: the same
  batches).
* **Successive halving**: the first round probes every candidate for a short while (the probe
  share of the run spread over the rounds, at least MIN_PROBE iterations); then the better
  half, less any candidate predicted at over CONTENDER x the leader's time, goes on from where
  its probe ended for as many iterations again, until one is left or the probes have cost the
  probe share. The winner's probe is kept: training goes on from its end and its held display
  lines are written, so its iterations are not spent twice. A kept probe never passes the end
  of the current step, nor a test or a snapshot (it would skip them) but on a plateau
  (below): its long probes stop at each one's iteration for a capture and go on, and the
  winner's are written and run when it is applied, each from its state there and in its
  place in the log (:meth:`Optimizer._apply`), none for a probe thrown away; probe ends beyond
  BRANCH_MEMORY bytes are not kept (a longer probe then starts again).
* **Search and pruning** follow Omnivore's cold start (../shared/research/omnivore.md
  section 1.4) where it is sound: groups from 1 upward, skipping (not stopping at, as Omnivore
  does) a group count whose HE is not 10% better than the last probed one's, by the medians
  and in the fastest whole rounds seen (:meth:`Optimizer._quietest`: one measurement of more
  groups is a moment of the machine's load); for one group an
  lr search at the solver's momentum (x3 up from base_lr while each step ranks better, else /3
  down: Omnivore's four decades in fewer probes and without its fixed ceiling), then momenta
  around the solver's at the search's two best lrs; for more groups
  the previous optimum's lr and a third of it, with momenta around the staleness-corrected
  centre; nothing at or above a diverged (lr, momentum); for more groups nothing above the
  previous optimum's lr and nothing lower in both lr and momentum. Unlike Omnivore, nothing
  restarts and candidates are compared by a predicted time, not by equal-time losses.
* **No evidence, no spending** (issue 33). A plateau (the solver's own first probe does not
  fall: :func:`.curve.leaving`, a drop of its last fifth below its first beyond 2% and three
  standard errors) makes probes of any length rank by noise: CIFAR10-quick sits at 2.303 for
  110 iterations at lr 0.009 and over 400 at 0.001. The solver's own probe goes on first,
  doubling, to TRUNK first probes (:meth:`Optimizer._trunk`): it is training, so when it
  leaves the plateau nothing was spent and its settings stand. When it does not: leaving
  takes fewer iterations the
  larger the step, up to the step that diverges, so the lr search becomes an escape: the
  ladder x LR_STEP upward to the first lr that diverges, then the largest lr still alive goes
  on, its probe doubling from where it ended, until it falls (it wins; its probe is
  training), diverges (the next lower goes on; a rise above the plateau beyond its noise
  counts: :func:`_hurt`) or the probe share is spent; nothing fell: the solver's own
  settings, from the end of their probe. The momenta are left to the re-tunes then, which
  start past the plateau. Ties elsewhere (flat curves, losses within LOSS_TIE) go to the
  solver's lr as before. The probes not kept cost at most the probe share of the horizon.
  Settings at the edge of stability stand: when x LR_STEP the solver's lr diverges and a
  third of it ranks behind, no momentum grid follows (``Plan.edge``). LeNet at lr 0.09
  momentum 0.675 (the plan's own choice as the solver's settings) spent four momentum probes
  choosing those settings again: 10-20% of a 500-900-iteration run, against which a plan
  planning at iteration 0 cannot know the run is short.
* **Multi-group candidates** are predicted from their one-group twin at momentum + the
  implicit momentum measured with their HE (:meth:`Optimizer._extrapolate`): their own
  20-iteration probes mostly predict "never" (staleness g - 1 from the first update: their
  curves bend later). Only the best-predicted candidate of a group count is probed
  (:meth:`Optimizer._borrow`); it stands for the count in the halving, whose longer probes
  then speak for themselves, and a borrowed prediction never wins on its own
  (:meth:`Optimizer._halve`). Without a twin (Adam's beta1 is no velocity) each is probed.
* **Re-tuning** every ``retune_every`` iterations (default an epoch or a tenth of max_iter,
  but never so often that a re-tune's first round costs more than the probe share of the
  interval), or when the measured seconds per iteration drift by more than 25% from the
  chosen candidate's HE, probes the current lr and a third of it (with several groups, with
  momenta around the current one: one group keeps the plan's momentum, so that its two
  probes let re-tunes come three times as often; what changes late in a run is the lr's
  noise floor, measured: LeNet with Adam at lr 0.003 hovered at 97% until a re-tune at
  iteration 400 took lr 0.001) at the current group count, halving as the plan does, and
  (Omnivore's steady state) halves the groups when the best momentum is not positive.
  A prediction without evidence (a slope within two standard errors of flat) is no
  prediction: it ties with the flat ones, and the paired losses of the probes' second halves
  decide. lr changes are a multiple
  of the solver's base_lr; momentum and groups are applied by rebuilding the driver on the
  same solver, in the same process.
* **Recovery**: a probe is short, and a step size can look best for 20 iterations and blow up
  at 200. When the loss diverges in training, the run goes back to the last state whose
  chunk of iterations did not raise the loss and goes on with the lr divided by LR_STEP and
  the momentum at most the solver's (logged; at most MAX_RECOVERIES times, then the
  divergence is the solver's error as without the optimizer).

Approximations, said once: a driver rebuilt for a probe or a re-tune drops the records of the
data layers' current batch that its predecessor had not handed out (a few records of the
epoch are skipped); HE measured over a few iterations includes the noise of a shared machine;
the power law is a ranking device (see :mod:`.curve`).
"""
from __future__ import annotations

import math
import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple


from ..errors import CCTError
from ..glog import held, info, quiet, release
from ..params import NetSource
from ..scheduler import gradient_source
from . import report
from .report import num_text
from .curve import DIVERGENCE_RATIO, CurveFit, fit_power_law, leaving

SRC = "optimizer.py:0"
LR_STEP = 3.0           # the cold start's lr search: x3 up (or /3 down) while it pays,
LR_STEPS = 4            # at most this many steps each way
MOMENTUM_OFFSETS = (-0.225, 0.0, 0.225)
HE_GAIN = 0.10          # Omnivore's "FC saturation": more groups must cut HE by 10%
DRIFT = 0.25            # re-tune when seconds/iteration drift by more than this
MU_RANGE = (-0.9, 0.99)
FLAT = 100               # predictions beyond this many runs of max_iter count as never
LOSS_TIE = 0.01          # probes' levels (_settled) closer than this (relative) are a tie
CONTENDER = 3.0          # a candidate predicted over this multiple of the leader's time drops out
MIN_PROBE = 20           # iterations: shorter probes rank candidates by noise
MAX_RECOVERIES = 3       # divergences in training the optimizer steps back from
BRANCH_MEMORY = 1 << 30  # bytes of probe ends (weights and history) kept to go on from
TWIN_MU = 0.15           # the farthest a one-group twin's momentum may be (_extrapolate)
HURT_SIGMAS = 6          # a rung this many standard deviations over a plateau has left it upward
TRUNK = 2 * LR_STEPS     # first probes' length the solver's own lr gets on a plateau (_trunk):
                         # the escape's ladder, each rung probed and doubled once


@dataclass
class Candidate:
    """One configuration and what was measured and predicted for it."""
    strategy: str
    groups: int
    batch: int
    lr: float                 # the base_lr it trains with
    momentum: float
    he: Optional[float] = None          # seconds per iteration
    fit: Optional[CurveFit] = None
    iters: Optional[float] = None       # predicted iterations to the reference loss
    seconds: Optional[float] = None     # predicted seconds to it
    status: str = "not probed"
    probed: int = 0                     # iterations its probes ran, in all
    probe_seconds: float = 0.0          # wall time they took
    # Where its probe ended (Solver.capture), its losses and held log lines: a probe that
    # goes on continues from there, and the winner's training does.
    losses: List[float] = field(default_factory=list, repr=False)
    state: Optional[dict] = field(default=None, repr=False)
    lines: list = field(default_factory=list, repr=False)
    basis: str = ""            # where ``iters`` comes from when not its own probe's fit
    # The snapshots and tests due inside its kept probe (the plateau's long probes pass them:
    # _branch): where each falls in ``lines``, the run's capture at its iteration, and which
    # of the two is due there, for _apply to write and run.
    due: List[Tuple[int, dict, bool, bool]] = field(default_factory=list, repr=False)
    # Where one group computes (a devices spelling for the hybrid scheduler, or one device);
    # None: the solver's own nets, where cct train placed them (:meth:`Optimizer.race_places`)
    place: Optional[str] = None

    @property
    def config(self) -> Tuple[str, int, int, Optional[str]]:
        return (self.strategy, self.groups, self.batch, self.place)

    def describe(self) -> str:
        where = f" on {self.place}" if self.place else ""
        return (f"{self.strategy}{where} groups {self.groups} batch {self.batch} lr "
                f"{self.lr:.4g} momentum {self.momentum:.4g}")

    def drop_branch(self) -> None:
        self.state, self.lines, self.due = None, [], []


class Branch(NamedTuple):
    """What a branch of the run left: the (time, smoothed loss) of each iteration, whether it
    diverged, and, when asked to keep it, its end (Solver.capture) and its held log lines;
    ``cut`` when it stopped early, its loss past the plateau escape's ceiling; ``due``: the
    snapshots and tests it passed (_branch), each as (its place in ``lines``, the capture at
    its iteration, a snapshot due, a test due)."""
    record: List[Tuple[float, float]]
    diverged: bool
    state: Optional[dict] = None
    lines: list = []
    cut: bool = False
    due: list = []


@dataclass
class Plan:
    candidates: List[Candidate] = field(default_factory=list)
    winner: Optional[Candidate] = None
    reference_loss: Optional[float] = None
    reason: str = ""
    probe_iters: int = 0
    probe_seconds: float = 0.0
    rounds: List[str] = field(default_factory=list)    # "12 x 20", "6 x 40", ...
    stopped: str = ""          # why the halving stopped before one candidate was left
    plateau: str = ""          # what the plateau search did (module doc), when it ran
    edge: str = ""             # why the lr search left the solver's settings standing
    left_alone: Optional[Candidate] = None    # the solver's own probe, off a plateau by itself
    places: List[Tuple[str, float]] = field(default_factory=list)   # one group's, by HE

    def table(self) -> List[str]:
        """The log's rows: each candidate with its evidence (:func:`.report.table`)."""
        return report.table(self)


#: what "momentum" may be, by solver type: SGD's and Nesterov's a velocity's decay (negative
#: values for asynchrony's sake); AdaDelta's a moving average's decay and Adam's beta1, in
#: [0, 1); AdaGrad and RMSProp take none (Caffe refuses any but 0)
MU_RANGES = {"SGD": MU_RANGE, "Nesterov": MU_RANGE, "AdaDelta": (0.0, 0.99), "Adam": (0.0, 0.99),
             "AdaGrad": (0.0, 0.0), "RMSProp": (0.0, 0.0)}
#: the types whose momentum is a velocity's decay: asynchrony's implicit momentum (Mitliagkas
#: et al.) is a result about those; for the others nobody has measured it
VELOCITY = ("SGD", "Nesterov")


def _clip_mu(mu: float, bounds: Tuple[float, float] = MU_RANGE) -> float:
    return round(min(bounds[1], max(bounds[0], mu)), 4)


class Optimizer:
    """Plans and drives a solver's training (see the module doc). ``engine`` and ``devices``
    are the driver's for configurations of several groups; ``groups`` the group counts to
    consider (default 1, 2, 4, ... up to the cores or devices); ``he_model`` maps a candidate
    and the seconds per iteration measured here to the HE to plan with (a cluster's, from
    :class:`~.cluster.ClusterModel`)."""

    def __init__(self, solver, *, target_loss: Optional[float] = None,
                 target_accuracy: Optional[float] = None, budget: Optional[float] = None,
                 probe_share: float = 0.1, engine: str = "threads", devices=None,
                 groups: Optional[Sequence[int]] = None, batches: Optional[Sequence[int]] = None,
                 lr_multiples: Optional[Sequence[float]] = None,
                 momentum_offsets: Sequence[float] = MOMENTUM_OFFSETS,
                 probe_iters: Optional[int] = None, retune_every: Optional[int] = None,
                 he_iters: int = 6, staleness: str = "round-robin",
                 he_model: Optional[Callable[[Candidate, float], float]] = None,
                 plot: Optional[str] = None, driver_config=None):
        if target_loss is not None and target_accuracy is not None:
            raise CCTError("give --target-loss or --target-accuracy, not both")
        if not 0 < probe_share < 1:
            raise CCTError(f"--probe-share must be between 0 and 1, got {probe_share}")
        # NaN fails every comparison: each check is written so that it is refused.
        if target_accuracy is not None and not 0 < target_accuracy <= 1:
            raise CCTError(f"--target-accuracy must be in (0, 1] (the first test net's "
                           f"accuracy to stop at), got {target_accuracy}")
        if target_loss is not None and not 0 < target_loss < math.inf:
            raise CCTError(f"--target-loss must be a positive finite loss, got {target_loss}")
        if budget is not None and not 0 < budget < math.inf:
            raise CCTError(f"--budget must be a positive finite number of seconds, got {budget}")
        if retune_every is not None and not retune_every >= 0:
            raise CCTError(f"--retune-every must be at least 0 iterations (0: the default "
                           f"interval), got {retune_every}")
        self.solver = solver
        self.target_loss = target_loss
        self.target_accuracy = target_accuracy
        self.budget = budget
        self.probe_share = probe_share
        self.engine = engine
        self.devices = devices
        self.base_lr = float(solver.param.base_lr)
        self.base_momentum = float(solver.param.momentum)
        self.lr_floor = self.base_lr      # re-tunes go no lower (:meth:`retune`)
        self.data_batch = _data_batch(solver.net)
        self.groups = sorted(set(groups or _default_groups(engine, devices)))
        self.batches = list(batches or [self.data_batch])
        self.lr_multiples = sorted(lr_multiples) if lr_multiples else None
        self.momentum_offsets = sorted(momentum_offsets)
        self.probe_iters = probe_iters
        self.retune_every = retune_every
        self.he_iters = max(2, he_iters)
        self.staleness = staleness
        self.he_model = he_model
        # The run's own DriverConfig, whose settings its probes' drivers share (--seed,
        # --sync-fc ...: a probe of another configuration than the run's measures another
        # staleness); each probe replaces what its candidate says.
        from ..driver import DriverConfig
        self.driver_config = driver_config or DriverConfig()
        # where start() draws its plan's probes (report.plot), refused now, before any probe
        self.plot = report.check_plot_path(plot) if plot else None
        self.he: Dict[tuple, float] = {}
        self._rates: Dict[tuple, List[float]] = {}      # HE's measurements (_refine_he)
        self._fast: Dict[tuple, float] = {}     # the fastest whole round of each (_quietest)
        self.implicit: Dict[tuple, float] = {}
        # One group's places (race_places): the solver's own nets, each device alone, and the
        # hybrid split over all of them; the fastest trains every one-group candidate.
        self.places, self.own_place = _one_group_places(solver, devices)
        self.sync_place: Optional[str] = None
        self._source_place: object = _UNSET      # the place the gradient source has now
        self.current: Optional[Candidate] = None
        self.driver = None
        self.plan: Optional[Plan] = None
        self.reached: Optional[str] = None
        self.retunes = 0
        self.recoveries = 0
        self._good: Optional[dict] = None    # the last state a training chunk began healthy
        self._healthy = True
        self._probing = False
        self._fresh = False
        self._record: Optional[List[Tuple[float, float]]] = None
        # While the plateau escape runs, a probe whose loss passes this stops at the end of
        # that iteration (_hurt would drop it anyway: its remaining iterations are waste).
        self._ceiling: Optional[float] = None
        self._over = False          # the probe now running passed it: _action stops it
        self._held: List[str] = []  # the user's requests made during probes (_action)
        self._next_retune: Optional[int] = None     # the iteration the next one is due (step)
        self._warm: Optional[tuple] = None  # a kept HE branch the next probe begins as (probe)
        self._user_action = solver.action_request
        solver.action_request = self._action
        solver.add_callback(self._on_start, self._on_gradients_ready)

    # -- hooks on the solver -----------------------------------------------------------------
    def _action(self) -> str:
        user = (self._user_action() if self._user_action is not None else None) or "none"
        if self._probing:
            # A request (SIGINT's stop, SIGHUP's snapshot) is the run's, not a probe's: a
            # snapshot of a branch is not the run's state, and the capture a probe returns to
            # forgets a stop. Held, it takes effect at the first iteration of training.
            if user != "none":
                self._held.append(user)
            return "stop" if self._over else "none"
        if user == "none" and self._held:
            user = self._held.pop(0)
        if self.reached and user == "none":
            return "stop"
        return user

    def _on_start(self) -> None:
        s = self.solver
        if self._probing or self.target_accuracy is None or self.reached:
            return
        if s.iter and s.param.test_interval and s.iter % s.param.test_interval == 0:
            acc = _accuracy(s.test_scores)
            if acc is not None and acc >= self.target_accuracy:
                self._reach(f"target accuracy {self.target_accuracy:g} reached at iteration "
                            f"{s.iter} (test accuracy {acc:.4g})")

    def _on_gradients_ready(self) -> None:
        s = self.solver
        if self._record is not None:
            self._record.append((time.perf_counter(), float(s.smoothed_loss)))
        if self._probing and self._ceiling is not None and \
                float(s.smoothed_loss) > self._ceiling:
            self._over = True
        if self._probing or self.target_loss is None or self.reached:
            return
        if float(s.smoothed_loss) <= self.target_loss:
            self._reach(f"target loss {self.target_loss:g} reached at iteration {s.iter} "
                        f"(smoothed loss {float(s.smoothed_loss):.4g})")

    def _reach(self, what: str) -> None:
        """Stop the run: at the end of this iteration, as Caffe's stop request does (the
        update done, the iteration counted), so the run stops at the next iteration number,
        which the snapshot after training is named by; :meth:`solve` says which."""
        self.reached = what
        info(SRC, f"Optimizer: {what}; stopping when this iteration ends.")

    # -- configurations ----------------------------------------------------------------------
    def configure(self, cand: Candidate) -> None:
        """Make the solver train as ``cand`` says, in this process: the solver alone, or a
        driver (the previous one closed) on the same solver."""
        s = self.solver
        s.set_schedule(s.schedule.with_base_lr(cand.lr))
        if cand.strategy == "sync":
            s.param.momentum = cand.momentum
            if self.driver is not None or self._source_place != cand.place or (
                    cand.place is None and not isinstance(s.gradient_source, NetSource)):
                # closes the driver or the scheduler of another place
                s.set_gradient_source(NetSource(s.net) if cand.place is None
                                      else gradient_source(s.net, cand.place))
                self._source_place = cand.place
            self.driver = None
        else:
            from ..driver import Driver
            s.param.momentum = self.base_momentum
            sizes = None if cand.batch == self.data_batch else [cand.batch] * cand.groups
            self.driver = None
            self.driver = Driver(s, self.driver_config.replace(
                groups=cand.groups, engine=self.engine, devices=self.devices,
                staleness=self.staleness, momentum=repr(cand.momentum),
                allow_negative_momentum=True, strategy=cand.strategy, batch_sizes=sizes))
            self._source_place = _UNSET
        self.current = cand
        self._fresh = True      # its first chunk carries warm-up: no drift check on it

    def _candidate(self, groups: int, batch: int, lr: float, mu: float) -> Candidate:
        strategy = ("sync" if groups == 1 and batch == self.data_batch else
                    "async" if batch == self.data_batch else "hogbatch")
        return Candidate(strategy, groups, batch, lr,
                         _clip_mu(mu, MU_RANGES.get(self.solver.type, MU_RANGE)),
                         place=self.sync_place if strategy == "sync" else None)

    def race_places(self, plan: Plan) -> None:
        """Where one group trains, chosen by HE alone: the solver's own nets, each device by
        itself and the hybrid split of each batch over all of them make the same update from
        the same batch (the rule, the rate, the gradient's sum), so their iterations to any
        loss are the same and no SE probe is spent telling them apart; the fastest trains
        every one-group candidate (CPU+GPU: the GPU alone or the hybrid, measured)."""
        if len(self.places) < 2 or plan.places:
            return
        for place in self.places:
            c = Candidate("sync", 1, self.data_batch, self.base_lr, self.base_momentum,
                          place=place)
            plan.places.append((place or self.own_place, self.measure_he(c)))
        best = min(range(len(self.places)), key=lambda k: plan.places[k][1])
        self.sync_place = self.places[best]

    def _step(self, iters: int) -> None:
        if self.driver is not None:
            self.driver.step(iters)
        else:
            self.solver.step(iters)

    # -- branches ----------------------------------------------------------------------------
    def _branch(self, cand: Candidate, iters: int, seconds: Optional[float] = None,
                start: Optional[dict] = None, keep: bool = False,
                due: bool = False) -> Branch:
        """Run ``cand`` for ``iters`` iterations (with ``seconds``: chunks of ``iters`` until
        that much wall time has passed, Omnivore's probes) on a branch of the run, from
        ``start`` (a capture where an earlier branch ended) or from where the run is, and leave
        the run as it was. With ``keep`` the branch's end and its log lines are kept (display
        on, lines held), so that training can go on from there.

        With ``keep`` and ``due`` it may pass the run's snapshots and tests: none is written or
        run on a branch (a probe thrown away would cost a test, and write files that are not
        the run's; its scores would reach the run's observers, the run summary's best among
        them); the branch stops at each one's iteration for a capture and goes on, and
        :meth:`_apply` writes and runs those of the probe it applies there, in the log's
        order (_step_past_due)."""
        s = self.solver
        saved = {k: getattr(s.param, k) for k in ("test_interval", "display", "snapshot",
                                                  "momentum", "snapshot_after_train")}
        schedule = s.schedule
        captured = s.capture()
        self._probing = True
        self._record = []
        diverged = short = False
        state = None
        lines: list = []
        passed: list = []
        passing = keep and due and seconds is None
        # A probe is one Step from its start through every piece and extension (the solver's
        # steps_as_one): its smoothed losses and held display lines read as the run's would.
        with s.steps_as_one():
            try:
                s.param.test_interval = 0
                s.param.snapshot = 0
                if not keep:
                    s.param.display = 0
                with quiet():
                    if start is not None:
                        s.restore_capture(start)
                    else:
                        s.start_steps(own=True)
                    self.configure(cand)
                with (held() if keep else quiet()) as lines:
                    try:
                        began = time.perf_counter()
                        if passing:
                            short = self._step_past_due(
                                iters, int(saved["test_interval"]), int(saved["snapshot"]),
                                start is not None, lines, passed, len(cand.due))
                        else:
                            self._step(iters)
                        while seconds is not None and time.perf_counter() - began < seconds:
                            self._step(iters)
                    except CCTError as e:
                        if "loss is" not in str(e):
                            raise
                        diverged = True
                if keep and not diverged:
                    state = s.capture()
                else:
                    passed = []
                with quiet():
                    if self.driver is not None:
                        stats = self.driver.store.stats
                        self.implicit[cand.config] = stats.mean() / (1.0 + stats.mean())
                        s.set_gradient_source(NetSource(s.net))     # closes the driver
                        self._source_place = None
                        self.driver = None
                    # a one-group place's scheduler stays for the next probe there (configure)
            finally:
                record, self._record = self._record, None
                cut, self._over = self._over or short, False
                for k, v in saved.items():
                    setattr(s.param, k, v)
                s.set_schedule(schedule)
                s.restore_capture(captured)
                self._probing = False
        return Branch(record, diverged, state, list(lines or []), cut, passed)

    def _step_past_due(self, iters: int, ti: int, si: int, own_first: bool, lines: list,
                       due: list, held: int) -> bool:
        """``iters`` iterations of a branch (its snapshot and test intervals off) in pieces that
        end where the run's snapshot (every ``si``) or test (every ``ti``) falls, each noted in
        ``due`` as (its place in the held ``lines``, the capture there, a snapshot due, a test
        due), in Caffe's order: a snapshot ends an iteration (at the branch's end too), a test
        begins one (not at its end: the run's next step, or the probe going on, begins there;
        at its first only when ``own_first``, a probe going on from ``start``: where the run
        is, it is the run's). True when it stopped short because a capture would not fit
        BRANCH_MEMORY beside the ``held`` ones of the probe's earlier pieces, the run's
        capture, the branch's end and one other probe's: at a test, or one iteration before a
        snapshot (the run's own step then writes it), so that none is lost."""
        s = self.solver
        first, stop = s.iter, s.iter + iters

        def fits() -> bool:
            return self._fit_in_memory(held + len(due) + 4)

        while True:
            at = s.iter
            snap = bool(si) and at % si == 0 and at != first
            test = bool(ti) and at < stop and at % ti == 0 and \
                (at > 0 or s.param.test_initialization) and (own_first or at != first)
            if snap or test:
                if not fits():
                    return True         # a test's (a snapshot had room: below)
                due.append((len(lines), s.capture(), snap, test))
            if at >= stop or self._over:
                return False
            end = min([stop] + [(at // k + 1) * k for k in (ti, si) if k])
            short = bool(si) and end % si == 0 and not fits()
            if short:
                end -= 1
            if end > at:
                self._step(end - at)
            if short or s.iter == at:
                return True     # (no iteration ran: stopped short all the same)

    def measure_he(self, cand: Candidate, keep: bool = False) -> float:
        """Seconds per iteration of ``cand``'s (strategy, groups, batch), cached: two warm-up
        iterations, then ``he_iters`` timed ones (at least a round of every group: as
        Omnivore's second half of its display lines), counted over whole rounds of the groups.
        Groups that run in step update in bursts of one each: a span from the second update of
        a burst to the first of another counted two groups' 4 gaps as 5 (measured here: LeNet's
        two 1-core groups at 5.2 ms per update over 6 updates, where their 40-update probes
        ran at 6.6-7.2 ms), and a 10% gain (HE_GAIN) was then noise."""
        key = cand.config
        if key not in self.he:
            branch = self._branch(cand, 2 + max(self.he_iters, cand.groups + 1), keep=keep)
            record = branch.record
            if branch.state is not None:
                # kept (the plan's first measurement: the solver's own settings): the first
                # probe of the same settings goes on from its end (probe) instead of
                # running those iterations again; on CIFAR10-quick 0.2 s of a 5 s run
                self._warm = (key, cand.lr, cand.momentum, branch)
            rate = _rate(record, cand.groups, 1)
            if rate is None:
                times = [t for t, _ in record]
                rate = ((times[-1] - times[0]) / (len(times) - 1) if len(times) >= 2
                        else math.inf)
            self._rates[key] = [rate]
            self._set_he(cand, rate)
            self._note_fastest(key, record, cand.groups)
            self.implicit.setdefault(key, 0.0)
        cand.he = self.he[key]
        return cand.he

    def _quietest(self, cand: Candidate) -> Optional[float]:
        """The HE of the fastest whole round of ``cand``'s configuration in its HE measurement
        and every probe (:func:`_fastest_round`): its speed in the machine's quietest moment."""
        fast = self._fast.get(cand.config)
        if fast is None:
            return None
        return self.he_model(cand, fast) if self.he_model is not None else fast

    def _set_he(self, cand: Candidate, measured: float) -> None:
        self.he[cand.config] = (self.he_model(cand, measured) if self.he_model is not None
                                else measured)

    def _refine_he(self, cand: Candidate, record: List[Tuple[float, float]]) -> None:
        """A probe's own iterations refine the HE of its configuration: the median of the
        measurement and of every probe's rate (past its first two iterations, whole rounds).
        The first measurement of a run is its very first iterations: measured here, LeNet's
        one group at 8.3 ms per iteration there and 6.5-6.9 ms in its probes, which had two
        1-core groups (6.2 ms) pass HE_GAIN against it."""
        key = cand.config
        rate = _rate(record, cand.groups, MIN_PROBE // 2)
        if rate is None or key not in self._rates:
            return
        self._rates[key].append(rate)
        self._set_he(cand, statistics.median(self._rates[key]))
        self._note_fastest(key, record, cand.groups)

    def _note_fastest(self, key: tuple, record: List[Tuple[float, float]],
                      groups: int) -> None:
        fast = _fastest_round(record, groups)
        if fast is not None:
            self._fast[key] = min(fast, self._fast.get(key, fast))

    def probe(self, cand: Candidate, iters: int, keep: bool = False,
              due: bool = False) -> Candidate:
        """An SE probe of ``cand`` (see the module doc), or ``iters`` more of it when it was
        probed before: from where its probe ended when that was kept, else again from the run's
        position, longer. Fills ``fit`` and ``status``; with ``keep`` its end is kept (and
        with ``due`` it may pass the run's snapshots and tests: :meth:`_branch`). A first probe of the
        settings whose HE branch was kept (:meth:`measure_he`) begins as that branch and runs
        the rest of ``iters``."""
        warm = self._warm
        if warm is not None and not cand.probed and \
                warm[:3] == (cand.config, cand.lr, cand.momentum):
            b, self._warm = warm[3], None
            cand.losses, cand.state, cand.lines = [v for _, v in b.record], b.state, list(b.lines)
            cand.probed = len(b.record)
            cand.probe_seconds += b.record[-1][0] - b.record[0][0] if b.record else 0.0
            iters = max(1, iters - cand.probed)
        start = cand.state
        if cand.probed and start is None:
            iters += cand.probed
            cand.probed, cand.losses, cand.lines, cand.due = 0, [], [], []
        began = time.perf_counter()
        branch = self._branch(cand, iters, start=start, keep=keep, due=due)
        cand.probe_seconds += time.perf_counter() - began
        cand.probed += len(branch.record) if branch.cut else iters
        if not branch.diverged and not branch.due:       # a capture's time is in its gaps
            self._refine_he(cand, branch.record)
        cand.losses += [v for _, v in branch.record]
        cand.state = branch.state
        cand.due += [(len(cand.lines) + k, *rest) for k, *rest in branch.due]
        cand.lines += branch.lines
        cand.fit = fit_power_law(cand.losses, self.solver.iter)
        if branch.diverged or cand.fit.diverged:
            cand.fit.diverged = True
            cand.status = "pruned: diverged"
            cand.drop_branch()
        else:
            cand.status = "kept"
        return cand

    def _fit_in_memory(self, states: int) -> bool:
        """Whether ``states`` captures of the run (weights and history) fit BRANCH_MEMORY."""
        s = self.solver
        one = (sum(int(p.data.nbytes) for p in s.net.params_list)
               + sum(int(h.nbytes) for h in s.history))
        return states * one <= BRANCH_MEMORY

    def _limit(self, stop: Optional[int] = None, due: bool = True) -> int:
        """The last iteration a kept probe may end at: one that skips no test or snapshot of
        the run (unless ``due`` is False: a probe that passes them, _branch) and ends inside
        the current step (``stop``) and max_iter."""
        s, p = self.solver, self.solver.param
        last = min(int(p.max_iter), stop if stop is not None else int(p.max_iter))
        if not due:
            return last
        if p.test_interval:
            last = min(last, (s.iter // p.test_interval + 1) * p.test_interval)
        if p.snapshot:
            last = min(last, (s.iter // p.snapshot + 1) * p.snapshot - 1)
        return last

    def _apply(self, cand: Candidate) -> None:
        """Train as ``cand`` from here, or from where its kept probe ended: then the test due
        now runs first (on the weights it is due for), the probe's held log lines are written,
        the snapshots and tests due inside it (_branch) are written and run where they fall,
        each from the probe's state at its iteration, and the run goes on from the probe's
        end. A test at the target accuracy, or a stop requested during one, ends the run at
        that test's iteration, as it would without the probe."""
        s = self.solver
        if cand.state is not None:
            first, written = s.iter, 0
            for k, at, snap, test in [(0, None, False, True)] + cand.due:
                release(cand.lines[written:k])
                written = k
                if at is not None:
                    s.restore_capture(at, test_data=False)  # the tests so far are the run's
                if snap:
                    s.snapshot()
                    if not test:
                        s.call_on_start()       # the run summary counts it
                if test and not self._test_due():
                    if at is not None:
                        info(SRC, f"Optimizer: the run ends at iteration {s.iter}, where the "
                             f"winner's probe passed this test (its later iterations are not "
                             f"kept)")
                    self.configure(cand)
                    return
            s.restore_capture(cand.state, test_data=False)
            release(cand.lines[written:])
            done = [f"{n} {what}{'s' if n > 1 else ''}" for what, n in (
                ("snapshot", sum(d[2] for d in cand.due)), ("test", sum(d[3] for d in cand.due)))
                if n]
            info(SRC, f"Optimizer: training goes on from the winner's probe: iterations "
                 f"{first} to {s.iter} are its" + (f" (its {' and '.join(done)} written and "
                                                  f"run in their place above)" if done else ""))
        self.configure(cand)

    def _test_due(self) -> bool:
        """The test due at the run's iteration, if one is, and the iteration's callbacks after
        it (the solver's begin_iteration: the target check, the run summary); False when the
        run ends there: the target came with it or a stop was requested during it."""
        s, p = self.solver, self.solver.param
        if not (p.test_interval and s.iter % p.test_interval == 0
                and (s.iter > 0 or p.test_initialization)):
            return True
        if not s.begin_iteration(clear_diffs=False) or self.reached:
            s.requested_early_exit = True
            return False
        return True

    # -- the plan ----------------------------------------------------------------------------
    def _probe_iters(self, probes: int, seconds: float, he: float) -> int:
        """The first round's probe length: the probe share of ``seconds`` spread over the
        probes of every round of the halving (each round costs about the first's)."""
        if self.probe_iters:
            return int(self.probe_iters)
        rounds = 1 + math.ceil(math.log2(max(1, probes)))
        n = int(self.probe_share * seconds / (max(1, probes) * rounds) / max(he, 1e-9))
        return max(MIN_PROBE, min(200, n))

    def _horizon(self, he: float) -> float:
        """Seconds the rest of the run would take at ``he`` s/iter (or the --budget)."""
        s = self.solver
        return self.budget if self.budget else max(1, s.param.max_iter - s.iter) * he

    def make_plan(self, limit: Optional[int] = None, stop: Optional[int] = None) -> Plan:
        """The cold-start search (module doc): measure, probe, prune, halve, choose. A kept
        probe ends inside the current step (``stop``) and before the run's next test or
        snapshot (:meth:`_limit`), but for the plateau's (:meth:`_trunk`, :meth:`_escape`),
        which pass them; or at iteration ``limit`` at most, when given, every one."""
        began = time.perf_counter()
        limit, reach = ((limit, limit) if limit is not None else
                        (self._limit(stop), self._limit(stop, due=False)))
        plan = Plan()
        if self.plan is not None:
            plan.places = self.plan.places      # raced once: a re-plan keeps the choice
        self.race_places(plan)
        start_lr = self.base_lr if self.current is None else self.current.lr
        first = self._candidate(1, self.batches[0], start_lr, self.base_momentum)
        he1 = self.measure_he(first, keep=self._fit_in_memory(1) and
                              self.solver.iter + MIN_PROBE <= limit)
        # A group count's grid is five probes after pruning; where its candidates have
        # one-group twins (_borrow) one is probed, and the share left goes to the halving's
        # longer rounds.
        n_probes = (len(self.lr_multiples or (1, 1, 1)) + 2 * (len(self.momentum_offsets) - 1)) * \
            len(self.batches) + 5 * (len(self.groups) - 1)
        plan.probe_iters = self._probe_iters(n_probes, self._horizon(he1), he1)
        spend = self.probe_share * self._horizon(he1)

        def probe_all(grid, he, prev, centre, diverged_at):
            for c in grid:
                c.he = he
                kept = sum(k.state is not None for k in plan.candidates)
                keep = self._fit_in_memory(kept + 1) and \
                    self.solver.iter + plan.probe_iters <= limit
                self._probe_unless_pruned(c, prev, centre, diverged_at, plan.probe_iters, keep)
                plan.candidates.append(c)

        prev: Optional[Candidate] = None
        prev_he: Optional[float] = None
        for g in self.groups:
            for batch in self.batches:
                centre_c = self._candidate(g, batch, start_lr, self.base_momentum)
                he = self.measure_he(centre_c)
                diverged_at: List[Tuple[float, float]] = []
                if prev is None:
                    # Omnivore's cold start: an lr search at the solver's momentum, then the
                    # momenta around it at the two best lrs of the search.
                    centre = self.base_momentum
                    if self.lr_multiples:
                        sweep = _unique([self._candidate(g, batch, start_lr * m, centre)
                                         for m in self.lr_multiples])
                        probe_all(sweep, he, None, centre, diverged_at)
                    else:
                        sweep = self._lr_search(plan, g, batch, start_lr, centre,
                                                lambda c: probe_all([c], he, None, centre,
                                                                    diverged_at),
                                                began, spend, reach)
                    self._score(plan, [c for c in sweep if c.status == "kept"])
                    ranked = sorted((c for c in sweep if c.status == "kept"),
                                    key=self._rank)
                    # On a plateau the momenta would have to leave it too, each probe as long
                    # as the escape: they are left to the re-tunes, which start past it. At
                    # the edge (_lr_search) the solver's settings stand.
                    grid = [] if plan.plateau or plan.edge else \
                        _unique([self._candidate(g, batch, c.lr, centre + o)
                                 for c in ranked[:2] for o in self.momentum_offsets
                                 if o != 0.0])
                    probe_all(grid, he, None, centre, diverged_at)
                    grid = sweep + grid
                else:
                    # The same total momentum (explicit + implicit) as the optimum with fewer
                    # groups: that one's own implicit momentum goes back in before this
                    # count's comes off (subtracting only this count's counted the fewer
                    # groups' staleness twice: eight groups centred near -0.8).
                    centre = (prev.momentum + self.implicit.get(prev.config, 0.0)
                              - self.implicit.get(centre_c.config, 0.0))
                    if self.solver.type not in VELOCITY:
                        centre = prev.momentum      # Adam's beta1 is no velocity (VELOCITY)
                    grid = _unique([self._candidate(g, batch, lr, centre + o)
                                    for lr in (prev.lr / 3.0, prev.lr)
                                    for o in self.momentum_offsets])
                    if prev_he is not None:
                        prev_he = self.he.get(prev.config, prev_he)     # refined by probes
                    # A group count must be HE_GAIN faster both typically (the medians) and in
                    # the machine's quietest moments (the fastest rounds): against the median
                    # alone, a machine loaded now and then let two groups through on
                    # CIFAR10-quick in two plans of four (one group's median 0.0404 s/iter over
                    # its loaded probes, two groups measured once at 0.0365, in a quiet
                    # moment; a core busy 0.7 s in every 1.2), and their probes and the
                    # halving's round made that run 0.44x the solver's own settings.
                    quiet = (self._quietest(centre_c), self._quietest(prev))
                    if g > 1 and prev_he is not None and (he > prev_he / (1 + HE_GAIN) or (
                            None not in quiet and quiet[0] > quiet[1] / (1 + HE_GAIN))):
                        if he <= prev_he / (1 + HE_GAIN):
                            he_shown, prev_shown = quiet
                            how = " in their fastest rounds"
                        else:
                            he_shown, prev_shown, how = he, prev_he, ""
                        # Omnivore stops adding groups here; measuring HE costs seconds, so
                        # the larger counts are still measured (HE need not be monotone in g:
                        # a cluster's fixed per-update costs weigh less with more groups).
                        for c in grid:
                            c.he = he
                            c.status = (f"pruned: HE {he_shown:.3g} s/iter not {HE_GAIN:.0%} "
                                        f"better than {prev_shown:.3g} with fewer groups{how}")
                        plan.candidates.extend(grid)
                        continue
                    stand_in = self._borrow(plan, grid, he, prev, centre, diverged_at) \
                        if g > 1 else None
                    if stand_in is None:
                        probe_all(grid, he, prev, centre, diverged_at)
                    else:
                        at = len(plan.candidates)
                        if stand_in.status == "not probed":
                            probe_all([stand_in], he, prev, centre, diverged_at)
                        plan.candidates[at:] = grid
                best_here = self._score(plan, [c for c in grid if c.status == "kept"])
                if best_here is not None and batch == self.batches[0]:
                    prev, prev_he = best_here, he
        kept = [c for c in plan.candidates if c.status == "kept"]
        if not kept:
            raise CCTError("optimizer: every probe diverged or was pruned; lower base_lr in "
                           "the solver or give a target the probes can reach")
        plan.winner = self._halve(plan, kept, began, spend, limit)
        plan.winner.status = "chosen"
        for c in plan.candidates:
            c.he = self.he.get(c.config, c.he)      # the table shows the refined HE
            if c is not plan.winner:
                c.drop_branch()
        plan.reason = self._reason(plan)
        plan.probe_seconds = time.perf_counter() - began
        self._warm = None
        self.plan = plan
        return plan

    def _lr_search(self, plan: Plan, g: int, batch: int, lr: float, mu: float,
                   probe: Callable[[Candidate], None], began: float = 0.0,
                   spend: float = math.inf, reach: Optional[int] = None) -> List[Candidate]:
        """The lr at momentum ``mu``: from ``lr``, up by LR_STEP while each step ranks better
        than the best so far (at most LR_STEPS steps), else down the same way: a grid of four
        decades in three to five probes, and no ceiling at 3x the solver's lr. When the first
        probe shows no fall (:func:`leaving`), the run is on a plateau: :meth:`_trunk`, then
        :meth:`_escape`, their probes going on to iteration ``reach`` at most (default
        :meth:`_limit`)."""
        first = self._candidate(g, batch, lr, mu)
        probe(first)
        directions = (LR_STEP, 1.0 / LR_STEP)
        if first.status == "kept" and not leaving(first.losses):
            reach = self._limit() if reach is None else reach
            if self._trunk(plan, first, began, spend, reach):
                return [first]
            if first.status == "kept":
                return self._escape(plan, first, probe, began, spend, reach)
            directions = (1.0 / LR_STEP,)   # the solver's lr rose off the plateau: go down
        tried, best = [first], first
        for step in directions:
            at = lr
            for _ in range(LR_STEPS):
                at *= step
                c = self._candidate(g, batch, at, mu)
                probe(c)
                tried.append(c)
                if c.status != "kept" or best.status != "kept":
                    break
                self._score(plan, [t for t in tried if t.status == "kept"])
                if self._rank(c) >= self._rank(best):
                    break
                best = c
            if best is not first:
                break
        up = [c for c in tried if c.lr > first.lr and c.status != "kept"]
        down = [c for c in tried if c.lr < first.lr and c.status == "kept"]
        if best is first and up and down:
            plan.edge = (f"the lr search left the solver's lr {first.lr:.4g} standing: "
                         f"lr {up[0].lr:.4g} diverged and lr {down[0].lr:.4g} ranked "
                         f"behind; no momentum grid (the settings are at the edge of "
                         f"stability already)")
        return sorted(tried, key=lambda c: c.lr)

    @contextmanager
    def _capped(self, ceiling: float):
        """While the plateau's probes run, one whose loss passes ``ceiling`` stops at the end
        of that iteration (_action): what it would run on is waste (_hurt drops it)."""
        self._ceiling = ceiling if math.isfinite(ceiling) else None
        try:
            yield
        finally:
            self._ceiling = None

    def _trunk(self, plan: Plan, first: Candidate, began: float, spend: float,
               reach: int) -> bool:
        """A plateau: the solver's own probe goes on first, doubling from where it ended, to
        TRUNK probes' length. It is training (kept), so when it leaves the plateau nothing was
        spent, and its settings stand (True); when it does not, the escape (:meth:`_escape`)
        pays what the trunk ran on top of its own cost. The ski-rental bound: the trunk runs
        about what the escape's ladder costs at least, so a plateau costs at most about twice
        the better of the two. Measured on CIFAR10-quick: at lr 0.009 (momentum 0.9) the
        solver's own probe leaves at iteration 110 and nothing the escape probes beats it (the
        ladder's x3 rung needs 73 iterations to show it fails, and the ladder cost 0.6x of the
        solver's time to the target); at Caffe's lr 0.001 the solver's lr is still at 2.290 at
        iteration 390, and the escape's lr 0.009 reaches the target at 200. A trunk that rises
        off the plateau (:func:`_hurt`) is the solver's lr diverging: False, not kept.

        It goes on to iteration ``reach`` at most, passing the run's tests and snapshots
        (_branch: they run and are written when it is applied): the next test had cut it at
        100 iterations where CIFAR10-quick tested every 100, and the escape after it (0.64x
        the solver's own settings at lr 0.009; a snapshot every 100, 0.65x)."""
        level, ceiling = _plateau(first)
        home = self.solver.iter
        with self._capped(ceiling):
            while first.status == "kept" and not leaving(first.losses):
                more = min(first.probed, TRUNK * plan.probe_iters - first.probed,
                           reach - home - first.probed)
                if more < 1 or _spent(began, [first]) >= spend:
                    return False
                had = first.probed
                self.probe(first, more, keep=self._fit_in_memory(1), due=True)
                _hurt(first, level, ceiling)
                reach = _short(first, had, more, home, reach)
        if first.status != "kept":
            return False
        plan.plateau = (f"plateau at lr {first.lr:.4g}: the solver's lr left it within "
                        f"{first.probed} iterations; its settings stand (its probe is "
                        f"training; the re-tunes probe around them past the plateau)")
        plan.left_alone = first
        return True

    def _escape(self, plan: Plan, first: Candidate, probe: Callable[[Candidate], None],
                began: float, spend: float, reach: int) -> List[Candidate]:
        """A plateau (the solver's own probe does not fall): probes of any length rank by
        noise there, and every candidate must leave the plateau before its curve says
        anything. Leaving takes fewer iterations the larger the step, up to the step that
        diverges; so: the lr ladder upward from the solver's (x LR_STEP, at most LR_STEPS
        steps, ending at the first that diverges), then the largest lr that has not diverged
        goes on, doubling its probe from where it ended, until it falls (it then ranks first
        and its probe is training), diverges (the next lower goes on), or the probes have
        cost the probe share (``spend`` seconds since ``began``) or would pass ``reach`` (the
        doubling passes the run's tests and snapshots, as the trunk does; the rungs' first
        probes are ``probe``'s, which stop before the next).
        What is left without a fall keeps the solver's lr, the tie rule of :func:`_rank`:
        no evidence, no change."""
        g, batch, mu = first.groups, first.batch, first.momentum
        level, ceiling = _plateau(first)
        with self._capped(ceiling):
            ladder, at = [first], first.lr
            for _ in range(LR_STEPS):
                at *= LR_STEP
                c = self._candidate(g, batch, at, mu)
                probe(c)
                ladder.append(c)
                _hurt(c, level, ceiling)
                if c.status != "kept":
                    break
                if leaving(c.losses):
                    break
            home = self.solver.iter
            alive = sorted((c for c in ladder if c.status == "kept"), key=lambda c: -c.lr)
            log = []
            while alive and not leaving(alive[0].losses):
                top = alive[0]
                more = min(top.probed, reach - home - top.probed)
                if _spent(began, ladder) >= spend or more < 1:
                    log.append(f"stopped at lr {top.lr:.4g} after {top.probed} iterations ("
                               + ("the probes' share spent" if more >= 1 else
                                  f"a longer probe would pass iteration {reach}") + ")")
                    break
                had = top.probed
                self.probe(top, more, keep=self._fit_in_memory(2), due=True)
                _hurt(top, level, ceiling)
                reach = _short(top, had, more, home, reach)
                if top.status != "kept":
                    log.append(f"lr {top.lr:.4g} diverged at {top.probed} iterations")
                    alive.pop(0)
        if alive and leaving(alive[0].losses):
            w = alive[0]
            for c in ladder:
                if c is not w and c.status == "kept":
                    c.status = (f"pruned: on the plateau after {c.probed} iterations; lr "
                                f"{w.lr:.4g} left it after {w.probed}")
                    c.drop_branch()
            plan.plateau = (f"plateau at lr {first.lr:.4g}: lr {w.lr:.4g} left it within "
                            f"{w.probed} iterations" + ("; " + "; ".join(log) if log else ""))
        else:
            plan.plateau = (f"plateau at lr {first.lr:.4g}: no lr up to "
                            f"{ladder[-1].lr:.4g} left it" + ("; " + "; ".join(log) if log
                                                              else "")
                            + "; training with the solver's settings")
            for c in ladder:
                if c is not first and c.status == "kept":
                    c.status = f"pruned: on the plateau after {c.probed} iterations"
                    c.drop_branch()
        return sorted(ladder, key=lambda c: c.lr)

    def _halve(self, plan: Plan, live: List[Candidate], began: float, spend: float,
               limit: int) -> Candidate:
        """Successive halving: rank the candidates by predicted seconds; the better half, less
        those predicted over CONTENDER x the leader's time, goes on for as many iterations
        again as it has had (from where its probe ended), until one is left, the probes have
        cost ``spend`` seconds beyond the leader's own probe (which training keeps), or a kept
        probe would pass ``limit``. The leader wins.

        A prediction borrowed from a one-group twin (:meth:`_extrapolate`) keeps a candidate
        in the halving, so that its probe grows long enough to speak for itself, but wins
        nothing on its own: the bar for pruning is the best candidate predicted from its own
        probe, which always goes on, and the winner is the best of those (asynchrony is not
        exactly momentum: at LeNet's edge of stability, four groups at lr 0.09 diverged where
        their twin, one group at lr 0.09 momentum 0.675, was the fastest run of the grid)."""
        home = self.solver.iter
        while True:
            plan.rounds.append(f"{len(live)} x {live[0].probed}")
            self._score(plan, live)
            live.sort(key=self._rank)
            own = [c for c in live if not c.basis]
            leader = own[0] if own else live[0]
            if len(live) == 1:
                return leader
            spent = time.perf_counter() - began - leader.probe_seconds
            more = min(leader.probed, limit - home - leader.probed)
            if spent >= spend:
                plan.stopped = (f"the probes' share of the run ({spend:.3g} s) was spent after "
                                f"{leader.probed} iterations each")
                return leader
            if more < 1:
                plan.stopped = (f"a longer probe would pass iteration {limit} (a test, a "
                                f"snapshot or the step's end)")
                return leader
            better = [c for c in live[:(len(live) + 1) // 2]
                      if c.seconds <= CONTENDER * leader.seconds]
            if leader not in better:
                better.append(leader)
            for c in live:
                if c not in better:
                    c.status = (f"pruned: behind after {c.probed} iterations (predicted "
                                f"{num_text(c.seconds, '.3g')} s, the leader "
                                f"{num_text(leader.seconds, '.3g')})")
                    c.drop_branch()
            if len(better) == 1:
                plan.stopped = (f"no other candidate predicted within {CONTENDER:g}x the "
                                f"leader's time after {leader.probed} iterations")
                return leader
            keep = self._fit_in_memory(len(better))
            for c in better:
                n = min(c.probed, limit - home - c.probed)      # as many again
                if n >= 1:
                    self.probe(c, n, keep=keep)
            live = [c for c in better if c.status == "kept"]
            if not live:
                raise CCTError("optimizer: every probe diverged when it went on; lower base_lr "
                               "in the solver")

    def _borrow(self, plan: Plan, grid: List[Candidate], he: float, prev: Candidate,
                centre: float, diverged_at: List[Tuple[float, float]]) -> Optional[Candidate]:
        """Issue 33, item 3: a group count's candidates predicted from their one-group twins
        (:meth:`_extrapolate`, the implicit momentum measured with the HE) instead of a probe
        each: their own 20-iteration probes rarely leave the staleness' first transient (LeNet,
        two groups: 27-490 iterations predicted where the twin's said 2-13). The best of them
        (fewest predicted seconds) is returned to be probed, standing for the count in the
        halving, whose longer probes let it speak for itself; the rest keep their borrowed
        prediction in the table, unprobed. One predicted over CONTENDER x the plan's leader is
        not probed either (the halving's first round would drop it). None when no candidate
        has a twin (Adam's beta1, momenta far from every probed one): then each is probed."""
        leader = self._score(plan, [c for c in plan.candidates if c.status == "kept"])
        flat = FLAT * max(1, int(self.solver.param.max_iter))
        ref = plan.reference_loss
        live = []
        for c in grid:
            c.he = he
            why = self._pruned(c, prev, centre, diverged_at)
            if why:
                c.status = "pruned: " + why
                continue
            c.iters, c.basis = None, ""
            if ref is not None:
                self._extrapolate(plan, c, ref, flat)
            if c.basis:
                c.seconds = c.iters * he
                live.append(c)
        if not live:
            return None
        best = min(live, key=lambda c: (c.seconds, self._rank(c)))
        bar = CONTENDER * leader.seconds if leader is not None and leader.seconds else math.inf
        for c in live:
            if c is best and c.seconds <= bar:
                continue
            c.status = (f"not probed: predicted {num_text(c.seconds, '.3g')} s from its twin; "
                        + (f"over {CONTENDER:g}x the leader's {num_text(leader.seconds, '.3g')}"
                           " s" if c.seconds > bar else f"{best.describe()} stands for "
                           f"{c.groups} groups"))
        for c in grid:
            if c.status == "not probed" and c not in live:
                c.status = "not probed: no one-group twin to predict it from"
        return best

    def _probe_unless_pruned(self, c: Candidate, prev: Optional[Candidate], centre: float,
                             diverged_at: List[Tuple[float, float]], iters: int,
                             keep: bool = False) -> None:
        """Mark ``c`` pruned (and why), or probe it, noting where probes diverged."""
        why = self._pruned(c, prev, centre, diverged_at)
        if why:
            c.status = "pruned: " + why
            return
        self.probe(c, iters, keep)
        if c.fit.diverged:
            diverged_at.append((c.lr, c.momentum))

    def _pruned(self, c: Candidate, prev: Optional[Candidate], centre: float,
                diverged_at: List[Tuple[float, float]]) -> str:
        for lr, mu in diverged_at:
            if c.lr >= lr and c.momentum >= mu:
                return f"at or above the diverged lr {lr:.4g} momentum {mu:.4g}"
        if prev is not None:
            if c.lr > prev.lr * (1 + 1e-9):
                return "lr above the optimum with fewer groups"
            if c.lr < prev.lr * (1 - 1e-9) and c.momentum < centre - 1e-9:
                return "too low: lr and momentum both below the optimum's"
        return ""

    def _score(self, plan: Plan, kept: List[Candidate]) -> Optional[Candidate]:
        """Predicted iterations and seconds to the reference loss; the best of ``kept``."""
        if not kept:
            return None
        everything = [c for c in plan.candidates if c.status == "kept"] or kept
        if self.target_loss is not None:
            ref = self.target_loss
        else:
            # The models' own values at the probes' ends: a reference below them all is one
            # every model still has to reach, whatever the lag of the smoothed losses; and
            # below the smoothed losses too, which iterations_to takes as reached when at or
            # under it: a noisy one under 0.9 x its model had the winner "there in 0
            # iterations", and every other candidate infinitely slower.
            ref = 0.9 * min(_probe_end(c.fit) for c in everything)
        plan.reference_loss = ref
        flat = FLAT * max(1, int(self.solver.param.max_iter))
        for c in kept:
            c.he = self.he.get(c.config, c.he)      # refined by the probes (_refine_he)
            c.iters = c.fit.iterations_to(ref)
            if c.iters > flat:          # a curve this flat says "not in this run"; its digits
                c.iters = math.inf      # are noise, not a ranking
            elif c.iters > 0 and not c.fit.falling:
                # No evidence, no prediction: a slope within two standard errors of flat
                # predicts anything (a re-tune late in an Adam run had c = 33 +- 110 win over
                # flat curves); it ties with them, and the paired losses decide.
                c.iters = math.inf
            c.basis = ""
            if c.groups > 1 and math.isinf(c.iters):
                self._extrapolate(plan, c, ref, flat)
            c.seconds = c.iters * c.he if math.isfinite(c.iters) else math.inf
        return min(kept, key=self._rank)

    def _extrapolate(self, plan: Plan, c: Candidate, ref: float, flat: float) -> None:
        """A driven candidate whose own short probe predicts "never" (a 20-iteration probe of
        4 or 8 groups rarely leaves the staleness' first transient, while the runs behind it
        take 400-1,260 iterations) is predicted from the synchronous probe it stands for:
        asynchrony acts as implicit momentum (Mitliagkas et al.), so g groups at (lr, mu) go as
        one group at (lr, mu + the implicit momentum measured for them). The twin is the
        probed one-group candidate at the same lr and batch with the nearest momentum, within
        TWIN_MU; its iterations to the reference from the plan's start, less what ``c`` has
        already run, are ``c``'s, and ``basis`` says so."""
        if self.solver.type not in VELOCITY:
            return
        mu = c.momentum + self.implicit.get(c.config, 0.0)
        twins = [t for t in plan.candidates
                 if t.groups == 1 and t.batch == c.batch and t.fit is not None
                 and not t.fit.diverged and abs(math.log(t.lr / c.lr)) < 1e-6
                 and abs(t.momentum - mu) <= TWIN_MU]
        if not twins:
            return
        t = min(twins, key=lambda t: abs(t.momentum - mu))
        iters = t.fit.iterations_to(ref)
        if not iters <= flat:
            return
        c.iters = max(0.0, t.probed + iters - c.probed)
        c.basis = (f"extrapolated from one group at lr {t.lr:.4g} momentum {t.momentum:.4g} "
                   f"(momentum {c.momentum:.4g} + implicit "
                   f"{self.implicit.get(c.config, 0.0):.3g})")

    def _rank(self, c: Candidate):
        return _rank(c, self.base_lr)

    def _reason(self, plan: Plan) -> str:
        w = plan.winner
        ref = (f"target loss {self.target_loss:g}" if self.target_loss is not None
               else f"reference loss {plan.reference_loss:.4g} (0.9 x the lowest fitted loss "
                    f"at a probe's end)")
        # The iterations are counted from the winner's probe's end (what the ranking
        # compares); the line gives the iteration of the run they lead to, which a reader can
        # hold against the log, not a bare count ("x 2 iterations", for a run of hundreds).
        end = w.fit.t_last
        if w is plan.left_alone and (w.iters is None or not math.isfinite(w.iters)):
            # a curve with a plateau and then a fall fits no power law: the fit says "flat"
            line = (f"{w.describe()} wins: the solver's own settings left the plateau by "
                    f"themselves (its probe, to iteration {end}, is training); no other "
                    f"lr was probed against them")
        elif w.iters is None or not math.isfinite(w.iters):
            line = (f"{w.describe()} wins: no probe is predicted to reach the {ref} in this "
                    f"run (flat loss curves); it ranks first by its loss "
                    f"{_settled(w):.4g} over its probe's second half, to iteration {end}")
        elif w.iters == 0:
            line = (f"{w.describe()} wins: predicted at the {ref} already: its probe reached "
                    f"it (smoothed loss {w.fit.last:.4g} at iteration {end})")
        else:
            at = math.ceil(end + w.iters)
            line = (f"{w.describe()} wins: predicted to reach the {ref} at iteration {at}, "
                    f"{at - end} iterations after its probe's end at iteration {end} "
                    f"({num_text(w.seconds, '.3g')} s at {num_text(w.he, '.3g')} s/iter)")
        if w.basis:
            line += f", {w.basis}"
        others = sorted((c for c in plan.candidates if c.status == "kept"),
                        key=lambda c: c.seconds)
        if others:
            o = others[0]
            line += f"; next best {o.describe()} at {num_text(o.seconds, '.3g')} s"
            if w.seconds and math.isfinite(w.seconds) and math.isfinite(o.seconds):
                line += f" ({o.seconds / w.seconds:.2f}x)"
        return line

    def log_plan(self, plan: Plan) -> None:
        ref = (f"target loss {self.target_loss:g}" if self.target_loss is not None else
               f"reference loss {num_text(plan.reference_loss, '.4g')}")
        info(SRC, f"Optimizer plan at iteration {self.solver.iter}: {len(plan.candidates)} "
             f"candidates, probes of {plan.probe_iters} iterations, the better half going on "
             f"for as many again each round ({', '.join(plan.rounds)}"
             f"{'; stopped: ' + plan.stopped if plan.stopped else ''}), predicted to the "
             f"{ref}; planning took {plan.probe_seconds:.3g} s")
        for row in plan.table():
            info(SRC, "  " + row)
        if plan.places:
            info(SRC, "Optimizer: " + report.places_line(plan, self.sync_place or
                                                         self.own_place))
        if plan.plateau:
            info(SRC, f"Optimizer: {plan.plateau}")
        if plan.edge:
            info(SRC, f"Optimizer: {plan.edge}")
        info(SRC, f"Optimizer: {plan.reason}")

    # -- training ----------------------------------------------------------------------------
    def start(self, limit: Optional[int] = None, stop: Optional[int] = None) -> Plan:
        """Plan (``limit`` and ``stop`` as in :meth:`make_plan`), log the plan, and train as
        the winner says from here on (from the end of its probe when that was kept)."""
        plan = self.make_plan(limit, stop)
        self.lr_floor = min(self.lr_floor, plan.winner.lr)
        self.log_plan(plan)
        if self.plot:
            report.plot(plan, self.plot)
            info(SRC, f"Optimizer: the probes' loss curves are in {self.plot}")
        self._apply(plan.winner)
        plan.winner.drop_branch()
        self._next_retune = None            # counted from here (step)
        return plan

    def solve(self, resume_file: Optional[str] = None) -> None:
        """Plan, then train to max_iter (or the target), re-tuning on the way. The plan comes
        in the first step, after Caffe's "Solving" lines, so that the log reads in order."""
        s = self.solver
        if resume_file:
            s.restore(resume_file)
        planned = False

        def step(iters: int) -> None:
            nonlocal planned
            if not planned:
                planned = True
                stop = s.iter + iters
                s.start_steps()     # Caffe's one Step; the plan's kept probe its beginning
                self.start(stop=stop)
                self.step(stop - s.iter, fresh=False)
                return
            self.step(iters)

        try:
            s.solve(step=step)
        finally:
            if self.driver is not None:
                s.set_gradient_source(NetSource(s.net))
                self.driver = None
        if self.reached:
            info(SRC, f"Optimizer: stopped early at iteration {s.iter}: {self.reached}")

    def _retune_every(self) -> int:
        """--retune-every, else an epoch (or a tenth of max_iter), but never so often that a
        re-tune's first round of probes costs more than the probe share of the interval."""
        if self.retune_every:
            return int(self.retune_every)
        epoch = _epoch_iterations(self.solver.net, self.data_batch)
        every = epoch or max(1, self.solver.param.max_iter // 10)
        first_round = 2 * len(self._retune_offsets()) * (self.probe_iters or MIN_PROBE)
        return max(every, math.ceil(first_round / self.probe_share))

    def _retune_offsets(self, cur: Optional[Candidate] = None) -> Sequence[float]:
        """The momentum offsets a re-tune probes: with one group none (the momentum was chosen
        by the plan; what changes late in a run is the lr's noise floor, and the two probes of
        lr and lr/3 alone let re-tunes come three times as often for the same share), with
        several the plan's, whose best momentum says whether to halve the groups."""
        cur = cur or self.current
        return self.momentum_offsets if cur is not None and cur.groups > 1 else (0.0,)

    def step(self, iters: int, fresh: bool = True) -> None:
        """Solver.step's contract: ``iters`` iterations in chunks, re-tuning between them. The
        chunks are one Caffe Step (Solver.steps_as_one): a new one unless ``fresh`` is False
        (:meth:`solve`'s, begun before the plan); a chunk that began a Step of its own reset
        the smoothed loss, so that with average_loss 40 (GoogLeNet's solvers) a target loss
        was checked, after each chunk's start, against one batch's loss."""
        s = self.solver
        if fresh:
            s.start_steps()
        with s.steps_as_one():
            self._steps(iters)

    def _steps(self, iters: int) -> None:
        s = self.solver
        stop = s.iter + iters
        every = self._retune_every()
        check = max(10, min(every, 100))
        # A due re-tune carries over from one call to the next: a caller stepping 100 at a
        # time (a Python loop of step(100), the bench's evaluations) ends a call on each
        # re-tune's iteration, and a boundary counted from each call's own start was never
        # reached (LeNet with Adam: no re-tune in 2,600 iterations, hovering at 94-98%).
        if self._next_retune is None:
            self._next_retune = (s.iter // every + 1) * every
        while s.iter < stop and not s.requested_early_exit and not self.reached:
            if s.iter >= self._next_retune:
                self.retune(f"every {every} iterations", self._limit(stop))
                self._next_retune = (s.iter // every + 1) * every   # past a kept probe's end
                continue
            n = min(stop, self._next_retune, s.iter + check) - s.iter
            began, first = time.perf_counter(), s.iter
            if not self._chunk(n):
                continue
            done = s.iter - first
            ti = s.param.test_interval
            tested = ti and (first // ti != s.iter // ti or first % ti == 0)
            if s.requested_early_exit or self.reached or s.iter >= stop:
                break
            if s.iter >= self._next_retune:
                continue                    # the re-tune, at the loop's top
            if self._fresh:
                self._fresh = False
            elif done and not tested and self.current and self.current.he:
                per = (time.perf_counter() - began) / done
                if abs(per - self.current.he) > DRIFT * self.current.he:
                    self.he.pop(self.current.config, None)
                    self.retune(f"measured {per:.3g} s/iter drifted more than {DRIFT:.0%} "
                                f"from {self.current.he:.3g}", self._limit(stop))
            self._next_retune = max(self._next_retune, (s.iter // every + 1) * every)

    def _chunk(self, n: int) -> bool:
        """``n`` iterations of the current configuration. When its loss diverges (a probe is
        short: a step size can look best for 20 iterations and blow up at 200), the run goes
        back to the last state whose chunk did not raise the loss, and on with the lr divided
        by LR_STEP and the momentum at most the solver's; False then. At most MAX_RECOVERIES
        times in a run, and only while two states fit in BRANCH_MEMORY; past that the
        divergence is the solver's error, as without the optimizer."""
        s = self.solver
        guard = self.recoveries < MAX_RECOVERIES and self._fit_in_memory(2)
        if guard and (self._healthy or self._good is None):
            self._good = s.capture()        # the previous chunk kept the loss down
        before = float(s.smoothed_loss)
        try:
            self._step(n)
        except CCTError as e:
            if not guard or "loss is" not in str(e):
                raise
            self._recover(s.iter)
            return False
        after = float(s.smoothed_loss)
        self._healthy = math.isfinite(after) and not (
            math.isfinite(before) and before > 0 and after > DIVERGENCE_RATIO * before)
        return True

    def _recover(self, at: int) -> None:
        s, cur = self.solver, self.current
        s.restore_capture(self._good)
        self._healthy = True
        self.recoveries += 1
        calmer = self._candidate(cur.groups, cur.batch, cur.lr / LR_STEP,
                                 min(cur.momentum, self.base_momentum))
        calmer.he = cur.he
        self.lr_floor = min(self.lr_floor, calmer.lr)
        info(SRC, f"Optimizer: the loss diverged at iteration {at} with {cur.describe()}; back "
             f"to iteration {s.iter} with lr {calmer.lr:.4g}, momentum {calmer.momentum:.4g} "
             f"(recovery {self.recoveries} of at most {MAX_RECOVERIES})")
        self.configure(calmer)

    def retune(self, why: str, limit: Optional[int] = None) -> Candidate:
        """Omnivore's steady state, in process: probe the current lr and a third of it with
        momenta around the current one, halving as the plan does (the probes cost at most the
        probe share of the next re-tune interval beyond the first round); halve the groups
        when the best momentum is not positive. Applies and logs the choice; training goes on
        from the winner's probe when it was kept (``limit`` as in :meth:`make_plan`)."""
        s = self.solver
        began = time.perf_counter()
        limit = self._limit() if limit is None else limit
        cur = self.current
        plan = Plan()
        he = self.measure_he(cur)
        # Not below the lr floor: 20-iteration probes late in a run favour the smaller step
        # (its noise is lower at once; its slower progress shows only later: the short-horizon
        # bias), and a re-tune every few hundred iterations ratcheted LeNet-Adam's lr from
        # 0.003 to 1e-7 in nine steps, stuck at 96%. The floor is the solver's own lr (or the
        # plan's, or a recovery's, when lower): the user's setting is the safe one.
        lrs = [cur.lr] if cur.lr / 3.0 < self.lr_floor * (1 - 1e-9) else [cur.lr / 3.0, cur.lr]
        grid = _unique([self._candidate(cur.groups, cur.batch, lr, cur.momentum + o)
                        for lr in lrs for o in self._retune_offsets(cur)])
        if len(grid) == 1:
            self.retunes += 1
            info(SRC, f"Optimizer re-tune at iteration {s.iter} ({why}): nothing to probe: lr "
                 f"{cur.lr:.4g} is at the floor {self.lr_floor:.4g} (the solver's, the plan's "
                 f"or a recovery's lr, whichever is lowest); keeping {cur.describe()}")
            return cur
        interval = self._retune_every() * he
        plan.probe_iters = self._probe_iters(len(grid), interval, he)
        keep = s.iter + plan.probe_iters <= limit and \
            self._fit_in_memory(len(grid))
        diverged_at: List[Tuple[float, float]] = []
        for c in grid:
            c.he = he
            self._probe_unless_pruned(c, None, cur.momentum, diverged_at, plan.probe_iters,
                                      keep)
            plan.candidates.append(c)
        live = [c for c in plan.candidates if c.status == "kept"]
        if not live:
            info(SRC, f"Optimizer re-tune at iteration {s.iter} ({why}): every probe diverged; "
                 f"keeping {cur.describe()}")
            self.configure(cur)
            return cur
        best = self._halve(plan, live, began, self.probe_share * interval, limit)
        for c in plan.candidates:
            if c is not best:
                c.drop_branch()
        if best.momentum <= 0 and best.groups > 1:
            halved = self._candidate(max(1, best.groups // 2), best.batch, best.lr,
                                     best.momentum + self.implicit.get(best.config, 0.0))
            self.measure_he(halved)
            note = f"; best momentum {best.momentum:.3g} <= 0: halving the groups"
            best.drop_branch()
            best = halved
        else:
            note = ""
        self.retunes += 1
        info(SRC, f"Optimizer re-tune at iteration {s.iter} ({why}): lr {cur.lr:.4g} -> "
             f"{best.lr:.4g}, momentum {cur.momentum:.4g} -> {best.momentum:.4g}, groups "
             f"{cur.groups} -> {best.groups} (pid {os.getpid()}); probes "
             f"{', '.join(plan.rounds)}{note}")
        for row in plan.table():
            info(SRC, "  " + row)
        self._apply(best)
        best.drop_branch()
        return best

    def close(self) -> None:
        if self.driver is not None:
            self.solver.set_gradient_source(NetSource(self.solver.net))
            self.driver = None
        self.solver.action_request = self._user_action
        self.solver.remove_callback(self._on_start, self._on_gradients_ready)


# -- helpers -----------------------------------------------------------------------------------
def _rank(c: Candidate, base_lr: float) -> Tuple[float, float, float, float]:
    """Fewest predicted seconds first; on a tie (curves still flat: inf; or the reference
    already reached: 0) the lower level of the probe's second half (:func:`_settled`), the
    probes being paired (the same start, the same batches), levels within LOSS_TIE of each
    other counting as equal; then,
    the probes having said nothing, the lr nearest the solver's own (a plateau does not say
    which step will leave it), the larger first."""
    last = _settled(c)
    bucket = (math.floor(math.log(last) / math.log1p(LOSS_TIE)) if math.isfinite(last)
              else math.inf)
    return (c.seconds, bucket, abs(math.log(c.lr / base_lr)), -c.lr)


def _spent(began: float, probed: List[Candidate]) -> float:
    """What the probes have cost: the wall time since ``began``, or their iterations' worth at
    the measured HE where that is more (a probe's own clock can miss what its branch cost
    around it)."""
    return max(time.perf_counter() - began, sum(c.probed * (c.he or 0.0) for c in probed))


def _plateau(first: Candidate) -> Tuple[float, float]:
    """The plateau's level (the solver's own probe's mean loss) and its ceiling: what a rung
    may rise above it by and still be on it (:func:`_hurt`)."""
    level = statistics.fmean(first.losses) if first.losses else math.nan
    ceiling = level + max(LOSS_TIE * level, HURT_SIGMAS * (
        statistics.pstdev(first.losses) if len(first.losses) > 1 else 0.0))
    return level, ceiling


def _short(c: Candidate, had: int, more: int, home: int, reach: int) -> int:
    """How far the plateau's probes may still go once ``c`` went on from ``had`` iterations
    for ``more`` (from ``home``) and :func:`_hurt` judged it: ``reach``, or where ``c`` stopped
    when it stopped short and stands (at a test whose capture would not fit BRANCH_MEMORY:
    _branch; one cut by the plateau's ceiling is pruned), so that none goes on from there."""
    return home + c.probed if c.status == "kept" and c.probed - had < more else reach


def _hurt(c: Candidate, level: float, ceiling: float) -> None:
    """On a plateau the losses sit at its level (CIFAR10-quick: 2.303, chance, within 0.1-0.4%
    over 100 iterations): a rung whose loss rose past ``ceiling`` (the level plus a 1% tie
    or HURT_SIGMAS of the solver's own plateau losses, whichever is more) predicts worse than
    the plateau; it has diverged for the escape even when it came back, or dips below. Measured
    on CIFAR10-quick from lr 0.009 (momentum 0.9), whose own probe leaves at iteration 110:
    lr 0.729 and 0.243 rose 1% above 2.303 within 5 iterations, 0.081 within 21 (then to 9.1
    and back to 2.30), 0.027 dipped to 1.31 at 70 and was back at 2.35 by 76, where it stayed;
    none left. At the former bar (1.5x the level) lr 0.729, noisy at 2.30-2.42, stayed
    "alive" and the escape spent its whole share (20 s) doubling it, where the solver's own
    settings took 5 s to the target."""
    if c.status != "kept" or not (math.isfinite(level) and math.isfinite(ceiling)):
        return
    over = [(t, v) for t, v in enumerate(c.losses, 1) if math.isfinite(v) and v > ceiling]
    if over:
        t, v = over[0]
        c.status = (f"pruned: diverged (loss {v:.4g} at its iteration {t}, over the plateau's "
                    f"{level:.4g} by more than its noise)")
        if c.fit is not None:
            c.fit.diverged = True
        c.drop_branch()


def _settled(c: Candidate) -> float:
    """The level a probe's losses sit at: the mean of its second half. Its smoothed loss at the
    end averages a fifth of it, four batches' losses when Caffe's average_loss is 1
    (lenet_solver's): at LeNet's re-tunes those decided between lr 0.09 and 0.03 (0.0406
    against 0.0224, 0.0522 against 0.0523), by the batches' noise more than by the steps."""
    tail = [v for v in c.losses[len(c.losses) // 2:] if math.isfinite(v)]
    if len(tail) >= 2:
        level = sum(tail) / len(tail)
    else:
        level = c.fit.last if c.fit else math.inf
    return level if level > 0 else math.inf


def _round_ends(record: List[Tuple[float, float]], groups: int) -> Tuple[List[float], int]:
    """The times of a branch's record past its first two iterations at which whole rounds of
    the groups end (every g-th from the first), and g."""
    g = max(1, groups)
    return [t for t, _ in record[2:]][::g], g


def _rate(record: List[Tuple[float, float]], groups: int, least: int) -> Optional[float]:
    """Seconds per iteration of a branch's record past its first two iterations, counted over
    whole rounds of the groups (at least ``least`` gaps and a round); None when too short."""
    ends, g = _round_ends(record, groups)
    gaps = (len(ends) - 1) * g
    if gaps < max(least, 1) or gaps < g:
        return None
    return (ends[-1] - ends[0]) / gaps


def _fastest_round(record: List[Tuple[float, float]], groups: int) -> Optional[float]:
    """Seconds per iteration of a branch's fastest whole round of the groups (past its first
    two iterations, rounds counted from there as :func:`_rate` counts them); None when it has
    no round."""
    ends, g = _round_ends(record, groups)
    return min((b - a) / g for a, b in zip(ends, ends[1:])) if len(ends) > 1 else None


def _probe_end(fit: CurveFit) -> float:
    """The lower of the model's value and the smoothed loss at a probe's end; a model value
    that underflowed to 0 is no reference (the smoothed loss is)."""
    model = fit.loss_at(fit.t_last)
    return min(model, fit.last) if model > 0 and fit.last > 0 else fit.last


def _unique(cands: List[Candidate]) -> List[Candidate]:
    """The candidates in order, one per (config, lr, momentum) (clipping can repeat one)."""
    seen, out = set(), []
    for c in cands:
        key = (c.config, round(c.lr, 12), c.momentum)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _data_batch(net) -> int:
    return next((int(top.shape[0]) for top in net.source_tops().values() if top.shape), 1)


def _epoch_iterations(net, batch: int) -> Optional[int]:
    """Iterations of one epoch when a data layer knows its record count, else None."""
    for i in net.source_layers():
        layer = net.layers[i]
        n = getattr(layer, "num_records", None)
        if isinstance(n, int) and n > 0:
            return max(1, n // max(1, batch))
    return None


_UNSET = object()


def _one_group_places(solver, devices) -> Tuple[List[Optional[str]], str]:
    """One group's places over ``devices`` (see :meth:`Optimizer.race_places`): None (the
    solver's own nets), each device by itself unless it is where those nets live, and all of
    them as a hybrid ([None] for one device or none); and the name of the solver's own."""
    names = [] if devices is None else (
        [n.strip() for n in devices.split(",") if n.strip()] if isinstance(devices, str)
        else [d.name for d in devices])
    # The solver's nets live on the first device with memory of its own when there is one
    # (cct train's master_place): that device alone is the solver's own place.
    master = next((n for n in names if not n.startswith("cpu")), None) \
        if solver.backend != "cpu" else None
    own = f"{master or solver.backend} (the solver's nets)"
    if len(names) < 2:
        return [None], own
    singles = list(dict.fromkeys(n for n in names if n != master))
    return [None] + singles + [",".join(names)], own


def _default_groups(engine: str, devices) -> List[int]:
    if devices is not None:
        from ..devices import parse_devices
        n = len(parse_devices(devices) if isinstance(devices, str) else list(devices))
    elif engine == "simulated":
        n = 4
    else:
        from ..devices import available_cores
        n = len(available_cores())
    out, g = [], 1
    while g <= max(1, n):
        out.append(g)
        g *= 2
    return out


def _accuracy(test_scores) -> Optional[float]:
    """The first test net's first output named like an accuracy."""
    for _, scores in sorted(test_scores.items()):
        for name, value in scores:
            if "acc" in name.lower():
                return float(value)
    return None
