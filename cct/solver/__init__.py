"""The solver (Caffe's ``solver.cpp`` with ``sgd_solver.cpp``): the train/test/display/snapshot
loop, one iteration at a time, over the pieces that do the rest, each with one job:

* :mod:`cct.solver.nets` builds the train and test nets a SolverParameter names;
* :mod:`cct.solver.testing` runs the test nets (Caffe's Test) and writes the output lines;
* :mod:`cct.solver.checkpoint` writes and reads snapshots that Caffe reads and writes (and
  cct's side file beside them), and in-memory captures;
* :mod:`cct.solver_rules` holds the update (:class:`~cct.solver_rules.SolverUpdate`, whose
  state is the history) and the lr schedule (:class:`~cct.solver_rules.Schedule`).

One :class:`Solver` class serves every solver type: ``param.type`` picks a row of the rule
table. The solver keeps the run's position (``iter``, Caffe's ``current_step``, the smoothed
loss) and passes it down.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from .. import blob_memory
from ..backend import plans
from ..context import RunContext
from ..errors import CCTError, SourceLost
from ..glog import info
from ..io.prototxt import debug_string, read_solver_text
from ..net import Net, PendingLoss, read_losses
from ..params import GradientSource, NetSource, ParamSet
from ..graphed import GraphedSource
from ..proto import caffe_pb2
from ..solver_rules import (Schedule, SolverUpdate, check_solver_param, copy_schedule_fields,
                            get_rule)
from .loss_scale import LossScale
from .checkpoint import (BINARYPROTO, HDF5, SIDE_SUFFIX, Checkpoints,
                         check_snapshot_write_permissions, snapshot_filename)
from .nets import SolverNets
from .testing import Tester, log_outputs

#: a device's losses are read when the log shows one, and at least this often (the NaN check
#: waits for them: a run that diverges stops at most this many iterations later, naming the
#: iteration, without a snapshot of the weights the NaN reached)
READ_LOSSES_EVERY = 50


def _g(x) -> str:
    """A number as C++ iostreams print it (6 significant digits)."""
    return "%g" % float(x)


class Solver:
    """Caffe's Solver/SGDSolver and its subclasses, one class with a rule table.

    ``param`` is a SolverParameter (already upgraded; see :func:`solver_from_file`), ``source``
    names it in messages (the solver file). ``action_request()``, if given, is polled after
    every iteration and before every test iteration and returns ``"none"``, ``"stop"`` or
    ``"snapshot"`` (Caffe's SolverAction; like Caffe's signal handler it should report each
    request once). ``solver_type`` overrides ``param.type`` (pycaffe's
    ``caffe.AdamSolver(file)`` is Adam whatever the file says).

    The lr policy's fields are read once, into :attr:`schedule`; change the rate with
    :meth:`set_schedule` (which writes them back into ``param``), not by writing ``param``.

    ``context`` is the run's (cct/context.py: seed, deterministic plans, precision), made and
    applied by whoever started the run (``cct train``); without one the solver makes it from
    ``param`` and applies it, as Caffe's Solver constructor seeds the process's generator
    (pycaffe's ``caffe.SGDSolver(file)``).
    """

    def __init__(self, param: caffe_pb2.SolverParameter, source: str = "<solver>", *,
                 action_request: Optional[Callable[[], str]] = None,
                 solver_type: Optional[str] = None, dtype=np.float32, backend: str = "cpu",
                 gradient_source=None, share_blob_diffs: bool = False,
                 context: Optional[RunContext] = None):
        info("solver.cpp:45", "Initializing solver from parameters: \n"
             + debug_string(param).rstrip("\n"))
        self.param = caffe_pb2.SolverParameter()
        self.param.CopyFrom(param)
        self.source = source
        self.action_request = action_request
        self.dtype = np.dtype(dtype)
        self.backend = backend
        self.type = solver_type or self.param.type
        self.rule = get_rule(self.type, source)
        self._check_param()
        check_snapshot_write_permissions(self.param, source)
        self.context = context or RunContext.of_solver(self.param, source, backend)
        if context is None:
            self.context.apply()
        self._nets = SolverNets(self.param, source, backend, self.dtype)
        self.net: Net = self._nets.train_net()
        self.test_nets: List[Net] = self._nets.test_nets()
        if share_blob_diffs:
            self._share_blob_diffs()
        info("solver.cpp:57", "Solver scaffolding done.")
        self.iter = 0
        self.current_step = 0
        self.params = ParamSet.of_net(self.net)
        self.update = SolverUpdate(self.rule, self.param)
        self.history: List = self.update.init(self.params)   # Caffe's solverstate order
        self.schedule = Schedule(self.param, self.dtype)
        self.smoothed_loss = self.dtype.type(0)
        self._losses: List = []
        # A device net's losses stay there until the log shows one (NetSource's defer):
        # (iteration, its iter_size PendingLoss values), read in one copy.
        self._pending_losses: List = []
        self._iterations_last = 0
        self._start_iter = 0
        self._timer = time.perf_counter()
        self._one_step = False      # steps_as_one
        self.requested_early_exit = False
        self.last_snapshot: Optional[str] = None   # the last solver state written or restored
        # Each test net's last scores, (output name, value) as the log printed them.
        self.test_scores: Dict[int, List[Tuple[str, float]]] = {}
        self._callbacks: List = []
        self.gradient_source: GradientSource = self._own_source()
        # What drivers on top keep beside a snapshot: name -> (save(state path) -> JSON,
        # load(JSON, state path)); written before the side file, so before the state.
        self.side_state: Dict[str, Tuple[Callable[[str], object],
                                         Callable[[object, str], None]]] = {}
        self._tester = Tester(self.param, self.net, self.test_nets, self.dtype)
        self._checkpoints = Checkpoints(self.param, source, self.net, self.test_nets,
                                        self.history, self.rule, self.side_state)
        # fp16 on a device (the run's, or pycaffe's set_precision before): backward from a
        # scaled loss (cct/solver/loss_scale.py).
        self.loss_scale: Optional[LossScale] = None
        if self.net.backend.name != "cpu" and self.net.backend.precision() == "fp16":
            self.loss_scale = LossScale(self.net, source)
            self.keep_beside_snapshots("loss_scale", self.loss_scale.state,
                                       self.loss_scale.load_state)
        if gradient_source is not None:
            self.set_gradient_source(gradient_source)

    # -- construction ------------------------------------------------------------------------
    def _share_blob_diffs(self) -> None:
        """The train net's blob diffs in shared memory (cct/blob_memory.py), where nothing but
        the backward pass reads them: not with debug_info (it prints them) nor Python layers
        (they may read any blob). On every backend: a GPU's memory is the scarcer."""
        if (self.param.debug_info
                or any(layer.type == "Python" for layer in self.net.layers)):
            return
        own, shared = blob_memory.share_blob_diffs(self.net)
        if own:
            info("blob_memory.py:0", f"Blob diffs share memory: {shared / 2 ** 20:.1f} MB instead "
                 f"of {own / 2 ** 20:.1f} MB")

    def _check_param(self) -> None:
        p, src = self.param, self.source
        if p.average_loss < 1:
            raise CCTError(f"{src}: average_loss must be at least 1 (got {p.average_loss}).")
        if p.iter_size < 1:
            raise CCTError(f"{src}: iter_size must be at least 1 (got {p.iter_size}).")
        check_solver_param(p, self.rule, src)

    def copy_weights(self, paths: List[str]) -> None:
        """Fine-tuning (``caffe train -weights a.caffemodel,b.caffemodel``): copy the layers
        of each file, by name, into the train net and every test net."""
        for model_list in paths:
            for net in [self.net] + self.test_nets:
                self._nets.load_weights(net, model_list)

    def set_gradient_source(self, source: GradientSource) -> None:
        """Compute each iteration's gradient with ``source`` (over the train net's params: a
        HybridScheduler over devices, cct/scheduler.py) from the next iteration on; the one it
        replaces keeps nothing back (its statistics are pulled) and is closed."""
        self.gradient_source.pull_statistics()
        self.gradient_source.close()
        self.gradient_source = source

    def _forward_backward(self) -> float:
        try:
            return self.gradient_source.compute_gradients()
        except SourceLost:
            self.stop_after_source_lost()
            raise

    def stop_after_source_lost(self) -> None:
        """The gradient source is gone for good (every device, every group of a driver): the
        params are those of the last update; keep them in a snapshot (when the solver takes
        snapshots) and stop."""
        self.requested_early_exit = True
        if self.param.snapshot_prefix:
            self.snapshot()

    def keep_beside_snapshots(self, name: str, save: Callable[[str], object],
                              load: Callable[[object, str], None]) -> None:
        """What a driver on top keeps in the side file beside each snapshot under ``name``:
        ``save(state path)`` returns JSON (written before the side file, so before the
        state), ``load(JSON, state path)`` takes it back on restore."""
        self.side_state[name] = (save, load)

    def forget_beside_snapshots(self, name: str) -> None:
        """Take back what :meth:`keep_beside_snapshots` added (a driver thrown away)."""
        self.side_state.pop(name, None)

    def _own_source(self) -> GradientSource:
        """The train net computing its gradients: on a device, its losses left there, and its
        iteration replayed as a CUDA graph unless the run's context says not to."""
        if self.net.backend.name == "cpu":
            return NetSource(self.net)
        if self.context.cuda_graphs == "off":
            return NetSource(self.net, defer=True)
        return GraphedSource(self.net)

    def _pull_statistics(self) -> None:
        self.gradient_source.pull_statistics()

    def close(self) -> None:
        """Stop the nets' data prefetch threads and close their databases."""
        self.gradient_source.close()
        self.gradient_source = NetSource(self.net)
        for net in [self.net] + self.test_nets:
            close = getattr(net, "close", None)
            if callable(close):
                close()

    # -- pycaffe-style accessors -------------------------------------------------------------
    def add_callback(self, on_start: Callable[[], None],
                     on_gradients_ready: Callable[[], None]) -> None:
        """pycaffe's ``Solver.add_callback``: called before each iteration's forward pass and
        after its backward pass (before the update)."""
        self._callbacks.append((on_start, on_gradients_ready))

    def remove_callback(self, on_start: Callable[[], None],
                        on_gradients_ready: Callable[[], None]) -> None:
        """Take back a pair :meth:`add_callback` added (a tool that planned a run and leaves
        it, as the optimizer's momentum probes do); a pair not there is no error."""
        pair = (on_start, on_gradients_ready)
        self._callbacks = [c for c in self._callbacks if c != pair]

    # -- the loop ----------------------------------------------------------------------------
    def _requested_action(self) -> str:
        if self.action_request is None:
            return "none"
        return self.action_request() or "none"

    def solve(self, resume_file: Optional[str] = None,
              step: Optional[Callable[[int], None]] = None) -> None:
        """Caffe's Solver::Solve: optionally restore, step to max_iter, snapshot, and run the
        final display/test passes. ``step(iters)`` replaces :meth:`step` (a driver whose
        updates come from several groups, cct/driver)."""
        p = self.param
        info("solver.cpp:289", f"Solving {self.net.name}")
        info("solver.cpp:290", f"Learning Rate Policy: {p.lr_policy}")
        self.requested_early_exit = False
        if resume_file:
            info("solver.cpp:296", f"Restoring previous solver status from {resume_file}")
            self._restore(resume_file)
        start_iter = self.iter
        (step or self.step)(p.max_iter - self.iter)
        self.read_pending_losses()
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if self.requested_early_exit:
            info("solver.cpp:311", "Optimization stopped early.")
            return
        if p.display and self.iter % p.display == 0:
            loss = read_losses([self.gradient_source.compute_loss()])[0]
            self._update_smoothed_loss(loss, start_iter, p.average_loss)
            info("solver.cpp:327", f"Iteration {self.iter}, loss = {_g(self.smoothed_loss)}")
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        info("solver.cpp:332", "Optimization Done.")

    def step(self, iters: int) -> None:
        """Caffe's Solver::Step: ``iters`` iterations of test (when due), forward/backward
        ``iter_size`` times, display, update, snapshot (when due)."""
        self.start_steps()
        stop_iter = self.iter + iters
        cleared = False   # the diffs left zero by the last update (_apply_update)
        while self.iter < stop_iter:
            if not self.begin_iteration(clear_diffs=not cleared):
                break
            self.record_loss(self.compute_gradients())
            cleared = self._apply_update(clear_diffs=self._update_may_clear(stop_iter))
            if not self.end_iteration():
                break
        self.read_pending_losses()

    def _update_may_clear(self, stop_iter: int) -> bool:
        """Whether this iteration's update may leave the diffs zero rather than holding the
        update values, sparing the next iteration's clear a pass over every diff (CaffeNet's
        244 MB: 8 ms of a 400 ms iteration on a Zen 4). Only where nothing can read the
        values before that clear: another iteration of this step follows (a pycaffe caller
        reads the diffs after step()), no snapshot writes the diffs (snapshot_diff), and the
        diffs are the train net's own, on the CPU (not a driver's or device's gradient
        source). Caffe's on_start callbacks and tests run after the clear either way. A stop
        asked for through ``action_request`` (the command line's signals) can end the step
        after such an update: the diffs are then zero, where that run reads none."""
        return (self.iter + 1 < stop_iter and not self.param.snapshot_diff
                and self.net.backend.name == "cpu"
                and type(self.gradient_source) is NetSource)

    # An iteration in pieces, for drivers that compute gradients elsewhere (cct/driver): begin
    # (test when due, callbacks), the gradient, its loss (display), the rate and the update,
    # and the end (iter, snapshot, signals). Caffe's log lines come out in Caffe's order
    # either way.
    @contextlib.contextmanager
    def steps_as_one(self):
        """While inside, step calls go on from one to the next as pieces of one Caffe Step (a
        caller that trains in chunks, the optimizer between its re-tunes): no reset of the
        smoothed loss and the display timer (:meth:`start_steps`) but the caller's own, so the
        display lines and the smoothed loss (what a target loss is checked against) read as
        one ``caffe train`` Step's."""
        outer, self._one_step = self._one_step, True
        try:
            yield
        finally:
            self._one_step = outer

    def start_steps(self, own: bool = False) -> None:
        """Reset the smoothed loss and the display timer, as each Caffe Step call does (not
        inside :meth:`steps_as_one` unless ``own``: the caller's Step starting)."""
        if self._one_step and not own:
            return
        self._start_iter = self.iter
        self._losses = []
        self.smoothed_loss = self.dtype.type(0)
        self._timer = time.perf_counter()

    def begin_iteration(self, clear_diffs: bool = True) -> bool:
        """Clear the diffs (unless the update will read another's), test when due, call the
        on_start callbacks; False when a request to stop came during the test."""
        p = self.param
        if clear_diffs:
            self.net.clear_param_diffs()
        if (p.test_interval and self.iter % p.test_interval == 0
                and (self.iter > 0 or p.test_initialization)):
            self.read_pending_losses()   # a NaN before it stops the run before the test
            self.test_all()
            if self.requested_early_exit:
                return False
        self.call_on_start()
        return True

    def call_on_start(self) -> None:
        """The on_start callbacks (an iteration's start, after its test): also for a snapshot
        written out of the loop (the optimizer's applied probe), which the run summary counts."""
        for on_start, _ in self._callbacks:
            on_start()

    def compute_gradients(self):
        """``iter_size`` forward/backward passes of the gradient source into the param diffs;
        returns their mean loss, or on a device the list of their losses still there (for
        :meth:`record_loss`, which reads them when the log needs them)."""
        losses = [self._forward_backward() for _ in range(self.param.iter_size)]
        if any(isinstance(x, PendingLoss) for x in losses):
            return losses
        return self._mean_loss(losses)

    def _mean_loss(self, losses):
        dt = self.dtype.type
        loss = dt(0)
        for x in losses:
            loss += dt(x)
        return loss / dt(self.param.iter_size)

    def record_loss(self, loss, outputs_of=None) -> None:
        """The iteration's loss: the NaN check, the smoothed loss, the display lines (with
        the train outputs of ``outputs_of``, the train net by default), then the
        on_gradients_ready callbacks. A device's losses (the list :meth:`compute_gradients`
        gives there) wait, and are read with the next display line (or test, snapshot, or
        READ_LOSSES_EVERY iterations on), each checked under its own iteration."""
        p = self.param
        display = p.display and self.iter % p.display == 0
        if isinstance(loss, list):
            self._pending_losses.append((self.iter, loss))
            if display or len(self._pending_losses) >= READ_LOSSES_EVERY:
                self.read_pending_losses()
        else:
            self.read_pending_losses()
            self._take_loss(loss, self.iter)
        if display:
            dt = self.dtype.type
            # Caffe's CPU timer counts whole milliseconds.
            lapse = dt(math.floor((time.perf_counter() - self._timer) * 1000.0) / 1000.0)
            per_s = dt(self.iter - self._iterations_last) / (lapse if lapse else dt(1))
            info("solver.cpp:239", f"Iteration {self.iter} ({_g(per_s)} iter/s, "
                 f"{_g(lapse)}s/{p.display} iters), loss = {_g(self.smoothed_loss)}")
            self._timer = time.perf_counter()
            self._iterations_last = self.iter
            log_outputs(outputs_of or self.net, self.dtype, "solver.cpp:258", "Train")
        for _, on_gradients_ready in self._callbacks:
            on_gradients_ready()

    def _take_loss(self, loss, iteration: int) -> None:
        """Iteration ``iteration``'s loss, read: the NaN check and the smoothed loss."""
        loss = self.dtype.type(loss)
        if not math.isfinite(loss):
            self._diverged(loss, iteration)
        self._update_smoothed_loss(loss, self._start_iter, self.param.average_loss, iteration)

    def read_pending_losses(self) -> None:
        """Read the losses a device left there (one copy) and take them in order: a NaN or a
        bad label stops the run here, naming the iteration it came from."""
        if not self._pending_losses:
            return
        pending, self._pending_losses = self._pending_losses, []
        values = read_losses([x for _, losses in pending for x in losses])
        at = 0
        for iteration, losses in pending:
            self._take_loss(self._mean_loss(values[at:at + len(losses)]), iteration)
            at += len(losses)

    def end_iteration(self) -> bool:
        """Count the update, keep the kernel plans, snapshot when due or asked; False when
        asked to stop."""
        p = self.param
        self.iter += 1
        plans.persist()
        request = self._requested_action()
        if (p.snapshot and self.iter % p.snapshot == 0) or request == "snapshot":
            self.snapshot()
        if request == "stop":
            self.requested_early_exit = True
            return False
        return True

    def _diverged(self, loss, iteration: int) -> None:
        what = "NaN" if math.isnan(loss) else "infinite"
        last = (f"the last good snapshot is {self.last_snapshot}" if self.last_snapshot
                else "no snapshot was written before it")
        advice = self._nets.non_finite_weights_file(self.net) or (
            "Lower base_lr, set clip_gradients, or check the input data for NaN/inf values.")
        raise CCTError(f"{self.source}: loss is {what} at iteration {iteration}; training "
                       f"stopped without writing a snapshot ({last}). {advice}")

    def _update_smoothed_loss(self, loss, start_iter: int, average_loss: int,
                              iteration: Optional[int] = None) -> None:
        """Caffe's UpdateSmoothedLoss, in Dtype: a running mean of the last ``average_loss``
        losses, updated incrementally (so it drifts from the exact mean in the last digits,
        exactly as Caffe's does)."""
        dt = self.dtype.type
        loss = dt(loss)
        if len(self._losses) < average_loss:
            self._losses.append(loss)
            size = len(self._losses)
            self.smoothed_loss = (self.smoothed_loss * dt(size - 1) + loss) / dt(size)
        else:
            idx = ((self.iter if iteration is None else iteration) - start_iter) % average_loss
            self.smoothed_loss += (loss - self._losses[idx]) / dt(average_loss)
            self._losses[idx] = loss

    # -- the rate and the update -------------------------------------------------------------
    def set_schedule(self, schedule: Schedule) -> None:
        """Train with ``schedule``'s rates from the next update on (a tuner's base_lr:
        ``solver.set_schedule(solver.schedule.with_base_lr(lr))``). ``param`` takes its
        policy fields, so that it keeps saying what the solver trains with; ``iter`` and
        ``current_step`` go on as they are."""
        self.schedule = schedule
        copy_schedule_fields(schedule.param, self.param)

    def learning_rate(self, log: bool = True):
        """Caffe's GetLearningRate for this iteration: the schedule's rate at ``iter``, with
        ``current_step`` advanced as the policy says; with ``log``, Caffe's lr line when the
        iteration is displayed (an update of part of the params between iterations, or
        another replica's update in the same iteration, leaves it out)."""
        p = self.param
        rate, self.current_step = self.schedule(self.iter, self.current_step)
        if log and p.display and self.iter % p.display == 0:
            info("sgd_solver.cpp:112", f"Iteration {self.iter}, lr = {_g(rate)}")
        return rate

    def apply_update(self, momentum: Optional[float] = None) -> None:
        """SGDSolver::ApplyUpdate (pycaffe's ``solver.apply_update()``): the rate for this
        iteration, then the update on the train net's params and the history (does not
        advance ``iter``, as in Caffe). ``momentum`` replaces the param's for this update (a
        custom loop's staleness correction). Another parameter set or history, part of the
        params, no lr line: call :attr:`update` with :meth:`learning_rate`'s rate. Under a
        loss scale (fp16) the gradients are divided by it first, and an update whose gradients
        overflowed is skipped (the iteration still counts, as its rate was read)."""
        self._apply_update(momentum)

    def _apply_update(self, momentum: Optional[float] = None, clear_diffs: bool = False) -> bool:
        """:meth:`apply_update`, with :meth:`SolverUpdate.apply`'s ``clear_diffs``; returns
        whether the diffs were left zero."""
        rate = self.learning_rate()
        if self.loss_scale is not None and not self.loss_scale.unscale(self.iter):
            return False
        return self.update.apply(self.history, self.params, rate, self.iter, momentum,
                                 clear_diffs=clear_diffs)

    # -- testing -----------------------------------------------------------------------------
    def test_all(self) -> None:
        self._pull_statistics()
        for i in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            self.test(i)

    def test(self, test_net_id: int = 0) -> None:
        """Caffe's Solver::Test: mean of every output value over test_iter forward passes."""
        scores = self._tester.test(test_net_id, self.iter, self._poll_during_test,
                                   lambda: self.requested_early_exit)
        if scores is not None:
            self.test_scores[test_net_id] = scores

    def _poll_during_test(self) -> None:
        # Caffe drains every pending request here; one poll per test iteration does the same
        # for a caller that reports each signal once, and cannot loop forever on one that
        # keeps answering "snapshot".
        request = self._requested_action()
        if request == "snapshot":
            self.snapshot()
        elif request == "stop":
            self.requested_early_exit = True

    # -- snapshots ---------------------------------------------------------------------------
    def snapshot_filename(self, extension: str, iter_: Optional[int] = None) -> str:
        return snapshot_filename(self.param, extension, self.iter if iter_ is None else iter_)

    def snapshot(self) -> str:
        """Write the train net's weights and the solver state (Caffe's Snapshot, see
        :meth:`Checkpoints.write <cct.solver.checkpoint.Checkpoints.write>`); returns the model
        file's name."""
        self.read_pending_losses()   # no snapshot of weights a NaN loss has reached
        self._pull_statistics()
        model, self.last_snapshot = self._checkpoints.write(self.iter, self.current_step)
        return model

    def restore(self, state_file: str) -> None:
        """Resume from a ``.solverstate`` (binary) or ``.solverstate.h5`` written by Caffe or
        cct: iteration, current_step, the learned weights and the history (and, for cct's own
        snapshots, the random generator and the data layers' positions)."""
        info("caffe.cpp:235", f"Resuming from {state_file}")
        self._restore(state_file)

    def _restore(self, state_file: str) -> None:
        # In Caffe's order: the drivers' side-state loaders read the restored iteration.
        checkpoints = self._checkpoints
        state = checkpoints.read_state(state_file)
        self.iter = state["iter"]
        checkpoints.load_learned_net(state)
        self.current_step = state["current_step"]
        checkpoints.load_history(state)
        checkpoints.read_side_file(state)
        self.gradient_source.refresh()  # what a source's replicas keep of their own
        self.last_snapshot = state_file

    def capture(self) -> dict:
        """An in-memory snapshot for a branch that will be thrown away: copies of every train
        net param (learnable or not, BatchNorm's statistics too), the history, ``iter``,
        ``current_step``, the random generator, the data layers' positions, the smoothed
        loss and the iteration of the last display line (whose rate the next one gives).
        Nothing is written to disk; :meth:`restore_capture` puts it all back (the display
        timer too: as far on as it was)."""
        self.read_pending_losses()
        self._pull_statistics()
        captured = self._checkpoints.capture()
        captured.update({"iter": self.iter, "current_step": self.current_step,
                         "losses": (list(self._losses), self.smoothed_loss, self._start_iter),
                         "displayed": (self._iterations_last,
                                       time.perf_counter() - self._timer)})
        return captured

    def restore_capture(self, captured: dict, test_data: bool = True) -> None:
        """Return to a :meth:`capture`: params and history bit for bit, the iteration, the
        random generator and the data layers' positions (their prefetch restarts there). With
        ``test_data`` False the test nets' data layers stay where they are: the tests run since
        the capture belong to the run (the optimizer's kept probe, cct/optimizer/plan.py)."""
        self._checkpoints.restore_capture(captured, test_data)
        self.iter, self.current_step = captured["iter"], captured["current_step"]
        losses, self.smoothed_loss, self._start_iter = captured["losses"]
        self._losses = list(losses)
        self._pending_losses = []   # the abandoned branch's
        # the display timer as far on as it was: the next display's rate counts the
        # iterations since the last display line at the speed they ran, not the time away
        self._iterations_last, lapse = captured["displayed"]
        self._timer = time.perf_counter() - lapse
        self.requested_early_exit = False
        self.gradient_source.refresh()


def solver_from_file(path: str, **kw) -> Solver:
    """Read a solver prototxt (with Caffe's upgrades and default snapshot_prefix) and build
    the solver its ``type`` names."""
    return Solver(read_solver_text(path), path, **kw)


__all__ = ["Solver", "solver_from_file", "BINARYPROTO", "HDF5", "SIDE_SUFFIX"]
