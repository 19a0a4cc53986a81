"""The solver (Caffe's ``solver.cpp`` with ``sgd_solver.cpp``'s state handling): builds the train
and test nets from a SolverParameter, runs the train/test/display/snapshot loop, and writes and
reads snapshots that Caffe reads and writes.

The update math lives in :mod:`cct.solver_rules`; this module schedules it. One
:class:`Solver` class serves every solver type: ``param.type`` picks a row of the rule table.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from . import blob_memory, rng
from .backend import host as _host, plans, precision
from .errors import CCTError, ProtoError, SourceLost, WeightsError
from .glog import info, logger, warning
from .io import weights
from .io.atomic import atomic_write, remove_stale_temp_files
from .io.prototxt import debug_string, read_net_text, read_solver_text
from .io.solverstate import (is_hdf5, read_solver_state, read_solver_state_hdf5,
                             write_solver_state, write_solver_state_hdf5)
from .io.upgrade import upgrade_net
from .net import TEST, TRAIN, Net
from .params import GradientSource, NetSource, ParamSet
from .proto import caffe_pb2
from .solver_rules import UpdatePipeline, check_solver_param, get_rule, learning_rate

BINARYPROTO = caffe_pb2.SolverParameter.BINARYPROTO
HDF5 = caffe_pb2.SolverParameter.HDF5
SIDE_SUFFIX = ".cct.json"   # cct's own resume extras beside a solver state (rng, data cursors)


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
    """

    def __init__(self, param: caffe_pb2.SolverParameter, source: str = "<solver>", *,
                 action_request: Optional[Callable[[], str]] = None,
                 solver_type: Optional[str] = None, dtype=np.float32, backend: str = "cpu",
                 gradient_source=None, share_blob_diffs: bool = False):
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
        self._check_snapshot_write_permissions()
        if self.param.random_seed >= 0:
            rng.set_random_seed(self.param.random_seed)
        plans.use_machine_cache()  # before the precision: it may hold the bf16 engine
        if self.param.HasField("precision"):
            name = caffe_pb2.SolverParameter.Precision.Name(self.param.precision).lower()
            if backend != "cpu" and name != "float32":
                warning("solver.cpp:0", f"{source}: precision {name} is the CPU backend's; "
                        f"the {backend} backend trains in float32.")
            precision.set_precision(name, source=f"{source}: precision")
        self._weights_files: List[str] = []   # -weights files copied in, named if loss diverges
        self.net: Net = self._init_train_net()
        self.test_nets: List[Net] = self._init_test_nets()
        if share_blob_diffs:
            self._share_blob_diffs()
        info("solver.cpp:57", "Solver scaffolding done.")
        self.iter = 0
        self.current_step = 0
        self.params = ParamSet.of_net(self.net)
        self.pipeline = UpdatePipeline(self.rule, self.param, self.params)
        self.smoothed_loss = self.dtype.type(0)
        self._losses: List = []
        self._iterations_last = 0
        self._start_iter = 0
        self._timer = time.perf_counter()
        self.requested_early_exit = False
        self.last_snapshot: Optional[str] = None   # the last solver state written or restored
        # Each test net's last scores, (output name, value) as the log printed them.
        self.test_scores: Dict[int, List[Tuple[str, float]]] = {}
        self._callbacks: List = []
        self.gradient_source: GradientSource = NetSource(self.net)
        # What drivers on top keep beside a snapshot: name -> (save(state path) -> JSON,
        # load(JSON, state path)); written before the side file, so before the state.
        self.side_state: Dict[str, Tuple[Callable[[str], object],
                                         Callable[[object, str], None]]] = {}
        if gradient_source is not None:
            self.set_gradient_source(gradient_source)

    # -- construction ------------------------------------------------------------------------
    def _share_blob_diffs(self) -> None:
        """The train net's blob diffs in shared memory (cct/blob_memory.py), where nothing but
        the backward pass reads them: not with debug_info (it prints them) nor Python layers
        (they may read any blob), nor on a device backend."""
        if (self.backend != "cpu" or self.param.debug_info
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

    def _check_snapshot_write_permissions(self) -> None:
        p = self.param
        if not p.snapshot:
            return
        if not p.HasField("snapshot_prefix"):
            raise CCTError(f"{self.source}: snapshot is specified ({p.snapshot}) but "
                           f"snapshot_prefix is not; set snapshot_prefix (e.g. "
                           f"\"snapshots/mynet\").")
        probe = self.snapshot_filename(".tempfile", 0)
        try:
            with open(probe, "w"):
                pass
            os.remove(probe)
        except (OSError, ValueError) as e:  # ValueError: a NUL byte in the prefix
            raise CCTError(f"{self.source}: Cannot write to snapshot prefix "
                           f"'{p.snapshot_prefix}' ({getattr(e, 'strerror', None) or e}). Make "
                           f"sure that the directory exists and is writable.") from None

    def _read_net_file(self, path: str) -> caffe_pb2.NetParameter:
        if not os.path.exists(path):
            hint = ""
            beside = os.path.join(os.path.dirname(self.source), path)
            if not os.path.isabs(path) and os.path.exists(beside):
                hint = (f" It exists beside the solver file ({beside}): net paths in a solver "
                        f"are relative to the current directory, as in Caffe; run from "
                        f"'{os.path.dirname(self.source) or '.'}' or fix the path.")
            raise ProtoError(f"{self.source}: net file '{path}' does not exist (current "
                             f"directory: {os.getcwd()}).{hint}")
        return read_net_text(path)

    def _make_net(self, net_param: caffe_pb2.NetParameter, source: str) -> Net:
        return Net(net_param, backend=self.backend, dtype=self.dtype, source=source)

    def _init_train_net(self) -> Net:
        p = self.param
        fields = ("net", "net_param", "train_net", "train_net_param")
        given = [f for f in fields if p.HasField(f)]
        if not given:
            raise CCTError(f"{self.source}: the solver names no net to train; give it one of "
                           f"{', '.join(fields)} (e.g. net: \"train_val.prototxt\").")
        if len(given) > 1:
            raise CCTError(f"{self.source}: the solver names more than one train net "
                           f"({', '.join(given)}); keep exactly one of {', '.join(fields)}.")
        if p.HasField("train_net_param"):
            info("solver.cpp:88", "Creating training net specified in train_net_param.")
            net_param, src = _copy_net(p.train_net_param), f"{self.source} (train_net_param)"
        elif p.HasField("train_net"):
            info("solver.cpp:92", f"Creating training net from train_net file: {p.train_net}")
            net_param, src = self._read_net_file(p.train_net), p.train_net
        elif p.HasField("net_param"):
            info("solver.cpp:96", "Creating training net specified in net_param.")
            net_param, src = _copy_net(p.net_param), f"{self.source} (net_param)"
        else:
            info("solver.cpp:102", f"Creating training net from net file: {p.net}")
            net_param, src = self._read_net_file(p.net), p.net
        state = caffe_pb2.NetState(phase=TRAIN)
        state.MergeFrom(net_param.state)
        state.MergeFrom(p.train_state)
        net_param.state.CopyFrom(state)
        net = self._make_net(net_param, src)
        for model_list in p.weights:
            self._load_net_weights(net, model_list)
        return net

    def _init_test_nets(self) -> List[Net]:
        p, src = self.param, self.source
        has_net_param, has_net_file = p.HasField("net_param"), p.HasField("net")
        num_test_nets = len(p.test_net_param) + len(p.test_net)
        if has_net_param or has_net_file:
            if len(p.test_iter) < num_test_nets:
                raise CCTError(f"{src}: test_iter must be specified for each test network: "
                               f"{num_test_nets} test nets but {len(p.test_iter)} test_iter.")
        elif len(p.test_iter) != num_test_nets:
            raise CCTError(f"{src}: test_iter must be specified for each test network: "
                           f"{num_test_nets} test nets (test_net/test_net_param) but "
                           f"{len(p.test_iter)} test_iter.")
        instances = len(p.test_iter)
        if len(p.test_state) and len(p.test_state) != instances:
            raise CCTError(f"{src}: test_state must be unspecified or specified once per test "
                           f"net: {instances} test nets but {len(p.test_state)} test_state.")
        if instances and p.test_interval <= 0:
            raise CCTError(f"{src}: {instances} test net(s) (test_iter given) need a positive "
                           f"test_interval; set test_interval or remove test_iter.")
        sources: List[str] = []
        params: List[caffe_pb2.NetParameter] = []
        for tp in p.test_net_param:
            sources.append("test_net_param")
            params.append(_copy_net(tp))
        for path in p.test_net:
            sources.append(f"test_net file: {path}")
            params.append(self._read_net_file(path))
        remaining = instances - len(params)
        if remaining and has_net_param:
            sources += ["net_param"] * remaining
            params += [_copy_net(p.net_param) for _ in range(remaining)]
        elif remaining and has_net_file:
            generic = self._read_net_file(p.net)
            sources += [f"net file: {p.net}"] * remaining
            params += [_copy_net(generic) for _ in range(remaining)]
        nets = []
        for i, (net_param, what) in enumerate(zip(params, sources)):
            state = caffe_pb2.NetState(phase=TEST)
            state.MergeFrom(net_param.state)
            if len(p.test_state):
                state.MergeFrom(p.test_state[i])
            net_param.state.CopyFrom(state)
            info("solver.cpp:190", f"Creating test net (#{i}) specified by {what}")
            net = self._make_net(net_param, what.split(": ", 1)[-1])
            for model_list in p.weights:
                self._load_net_weights(net, model_list)
            nets.append(net)
        return nets

    def _load_net_weights(self, net: Net, model_list: str) -> None:
        """Caffe's LoadNetWeights: a comma-separated list of weights files, copied by name."""
        for name in model_list.split(","):
            name = name.strip()
            info("solver.cpp:72", f"Finetuning from {name}")
            net.copy_trained_layers_from(name)
            if name not in self._weights_files:
                self._weights_files.append(name)

    def copy_weights(self, paths: List[str]) -> None:
        """Fine-tuning (``caffe train -weights a.caffemodel,b.caffemodel``): copy the layers
        of each file, by name, into the train net and every test net."""
        for model_list in paths:
            for net in [self.net] + self.test_nets:
                self._load_net_weights(net, model_list)

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
            # The params are those of the last update: keep them before stopping.
            self.requested_early_exit = True
            if self.param.snapshot_prefix:
                self.snapshot()
            raise

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
    @property
    def history(self) -> list:
        """The rule's history arrays in Caffe's solverstate order."""
        return self.pipeline.history

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
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if self.requested_early_exit:
            info("solver.cpp:311", "Optimization stopped early.")
            return
        if p.display and self.iter % p.display == 0:
            loss = self.gradient_source.compute_loss()
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
        while self.iter < stop_iter:
            if not self.begin_iteration():
                break
            self.record_loss(self.compute_gradients())
            self.apply_update()
            if not self.end_iteration():
                break

    # An iteration in pieces, for drivers that compute gradients elsewhere (cct/driver): begin
    # (test when due, callbacks), the gradient, its loss (display), the update, and the end
    # (iter, snapshot, signals). Caffe's log lines come out in Caffe's order either way.
    def start_steps(self) -> None:
        """Reset the smoothed loss and the display timer, as each Caffe Step call does."""
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
            self.test_all()
            if self.requested_early_exit:
                return False
        for on_start, _ in self._callbacks:
            on_start()
        return True

    def compute_gradients(self) -> float:
        """``iter_size`` forward/backward passes of the gradient source into the param diffs;
        returns their mean loss."""
        dt = self.dtype.type
        loss = dt(0)
        for _ in range(self.param.iter_size):
            loss += dt(self._forward_backward())
        return loss / dt(self.param.iter_size)

    def record_loss(self, loss, outputs_of=None) -> None:
        """The iteration's loss: the NaN check, the smoothed loss, the display lines (with
        the train outputs of ``outputs_of``, the train net by default), then the
        on_gradients_ready callbacks."""
        p = self.param
        dt = self.dtype.type
        loss = dt(loss)
        if not math.isfinite(loss):
            self._diverged(loss)
        self._update_smoothed_loss(loss, self._start_iter, p.average_loss)
        if p.display and self.iter % p.display == 0:
            # Caffe's CPU timer counts whole milliseconds.
            lapse = dt(math.floor((time.perf_counter() - self._timer) * 1000.0) / 1000.0)
            per_s = dt(self.iter - self._iterations_last) / (lapse if lapse else dt(1))
            info("solver.cpp:239", f"Iteration {self.iter} ({_g(per_s)} iter/s, "
                 f"{_g(lapse)}s/{p.display} iters), loss = {_g(self.smoothed_loss)}")
            self._timer = time.perf_counter()
            self._iterations_last = self.iter
            self._log_outputs(outputs_of or self.net, "solver.cpp:258", "Train")
        for _, on_gradients_ready in self._callbacks:
            on_gradients_ready()

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

    def _diverged(self, loss) -> None:
        what = "NaN" if math.isnan(loss) else "infinite"
        last = (f"the last good snapshot is {self.last_snapshot}" if self.last_snapshot
                else "no snapshot was written before it")
        advice = self._non_finite_weights_file() or (
            "Lower base_lr, set clip_gradients, or check the input data for NaN/inf values.")
        raise CCTError(f"{self.source}: loss is {what} at iteration {self.iter}; training "
                       f"stopped without writing a snapshot ({last}). {advice}")

    def _non_finite_weights_file(self) -> str:
        """Advice naming the weights file that put NaN/inf values into a train net param that
        still holds them, or '' (then the training itself diverged). Read again only here, when
        the loss has already failed."""
        for name, layer in zip(self.net.layer_names, self.net.layers):
            for i, blob in enumerate(layer.blobs):
                if _finite(blob.data):
                    continue
                for path in self._weights_files:
                    arrays = weights.load_weights(path).get(name, [])
                    if i < len(arrays) and not _finite(arrays[i]):
                        return (f"The weights file '{path}' holds NaN/inf values (layer "
                                f"'{name}' param {i}); fix or replace it.")
        return ""

    def _update_smoothed_loss(self, loss, start_iter: int, average_loss: int) -> None:
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
            idx = (self.iter - start_iter) % average_loss
            self.smoothed_loss += (loss - self._losses[idx]) / dt(average_loss)
            self._losses[idx] = loss

    def _log_outputs(self, net: Net, src: str, kind: str, scores=None, ids=None) -> None:
        """``    Train net output #k: name = v (* w = w*v loss)``, one line per value of every
        output blob (Caffe prints every element)."""
        dt = self.dtype.type
        if scores is None:
            values = [_host(net.blobs_list[b].data).reshape(-1) for b in net.output_blob_indices]
            ids = [j for j, v in enumerate(values) for _ in range(v.size)]
            scores = np.concatenate(values).astype(self.dtype) if values else []
        for k, (j, v) in enumerate(zip(ids, scores)):
            blob_id = net.output_blob_indices[j]
            lw = dt(net.blob_loss_weights[blob_id])
            tail = f" (* {_g(lw)} = {_g(lw * dt(v))} loss)" if lw else ""
            info(src, f"    {kind} net output #{k}: {net.blob_names[blob_id]} = {_g(v)}{tail}")

    def apply_update(self, momentum: Optional[float] = None, params=None, only=None,
                     log_rate: bool = True, pipeline: Optional[UpdatePipeline] = None) -> None:
        """SGDSolver::ApplyUpdate: the rate for this iteration, then the update pipeline on
        the param diffs (does not advance ``iter``, as in Caffe). ``momentum`` replaces the
        solver's for this update (a driver's staleness-corrected value); ``params`` the
        ParamSet it acts on (the train net's weights with another net's diffs); ``only`` the
        positions of the params to update (all by default); ``log_rate`` whether this update
        writes Caffe's lr line (an update of part of the params between iterations does not);
        ``pipeline`` another history to update with (a model replica's own, over its own
        ParamSet: the same rule and rate, another state)."""
        p = self.param
        rate, self.current_step = learning_rate(p, self.iter, self.current_step, self.dtype)
        if log_rate and p.display and self.iter % p.display == 0:
            info("sgd_solver.cpp:112", f"Iteration {self.iter}, lr = {_g(rate)}")
        (pipeline or self.pipeline).apply(rate, self.iter, momentum, params, only)

    def test_all(self) -> None:
        self._pull_statistics()
        for i in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            self.test(i)

    def test(self, test_net_id: int = 0) -> None:
        """Caffe's Solver::Test: mean of every output value over test_iter forward passes."""
        p = self.param
        dt = self.dtype.type
        info("solver.cpp:347", f"Iteration {self.iter}, Testing net (#{test_net_id})")
        net = self.test_nets[test_net_id]
        net.share_trained_layers_with(self.net)
        n_iter = p.test_iter[test_net_id]
        scores = None
        ids: List[int] = []
        loss = dt(0)
        for i in range(n_iter):
            # Caffe drains every pending request here; one poll per test iteration does the
            # same for a caller that reports each signal once, and cannot loop forever on one
            # that keeps answering "snapshot".
            request = self._requested_action()
            if request == "snapshot":
                self.snapshot()
            elif request == "stop":
                self.requested_early_exit = True
            if self.requested_early_exit:
                break
            iter_loss = dt(net.forward_prefilled())
            if p.test_compute_loss:
                loss += iter_loss
            values = [_host(net.blobs_list[b].data).reshape(-1).astype(self.dtype)
                      for b in net.output_blob_indices]
            result = np.concatenate(values) if values else np.zeros(0, self.dtype)
            if scores is None:
                scores = result.copy()
                ids = [j for j, v in enumerate(values) for _ in range(v.size)]
            else:
                scores += result
        if self.requested_early_exit:
            info("solver.cpp:396", "Test interrupted.")
            return
        if p.test_compute_loss:
            loss /= dt(n_iter)
            info("solver.cpp:401", f"Test loss: {_g(loss)}")
        if scores is not None:
            scores = scores / dt(n_iter)
            self._log_outputs(net, "solver.cpp:414", "Test", scores, ids)
            self.test_scores[test_net_id] = [
                (net.blob_names[net.output_blob_indices[j]], float(v))
                for j, v in zip(ids, scores)]

    # -- snapshots ---------------------------------------------------------------------------
    def snapshot_filename(self, extension: str, iter_: Optional[int] = None) -> str:
        it = self.iter if iter_ is None else iter_
        return f"{self.param.snapshot_prefix}_iter_{it}{extension}"

    def snapshot(self) -> str:
        """Write the train net's weights and the solver state (Caffe's Snapshot); returns the
        model file's name. Each file is written to a temporary name and renamed, in the order
        model, side file, state: wherever the writing stops, a new state (what a resume starts
        from) exists only with the model and side file written with it, and a side file
        without its state is never read. (Overwriting another run's snapshot of the same
        name can still pair its old state with the new model, as in Caffe, and with the new
        side file.)"""
        p = self.param
        self._pull_statistics()
        self._remove_stale_temp_files()
        if p.snapshot_format == HDF5:
            model = self.snapshot_filename(".caffemodel.h5")
            info("solver.cpp:474", f"Snapshotting to HDF5 file {model}")
            weights.save_hdf5(self.net, model, p.snapshot_diff)
            state = self.snapshot_filename(".solverstate.h5")
            self._write_side_file(state, model)
            info("sgd_solver.cpp:296", f"Snapshotting solver state to HDF5 file {state}")
            self._write_state_hdf5(state, model)
        else:
            model = self.snapshot_filename(".caffemodel")
            info("solver.cpp:464", f"Snapshotting to binary proto file {model}")
            weights.save_caffemodel(self.net, model, p.snapshot_diff)
            state = self.snapshot_filename(".solverstate")
            self._write_side_file(state, model)
            info("sgd_solver.cpp:284", f"Snapshotting solver state to binary proto file {state}")
            self._write_state_binary(state, model)
        self.last_snapshot = state
        return model

    def _remove_stale_temp_files(self) -> None:
        """Temporary snapshot files left by a process killed while writing (any
        ``<prefix>_iter_*.tmp-<pid>`` whose writer is gone)."""
        prefix = self.param.snapshot_prefix
        for path in remove_stale_temp_files(os.path.dirname(prefix),
                                            os.path.basename(prefix) + "_iter_"):
            info("solver.cpp:0", f"Removed {path}, left by an interrupted snapshot")

    def _write_state_binary(self, path: str, model: str) -> None:
        write_solver_state(path, self.iter, model, self.current_step,
                           [_host(h) for h in self.history])

    def _write_state_hdf5(self, path: str, model: str) -> None:
        write_solver_state_hdf5(path, self.iter, model, self.current_step,
                                [_host(h) for h in self.history])

    def _data_layers(self):
        """(net key, layer name, layer) of every layer that can save its data position."""
        nets = [("train", self.net)] + [(f"test{i}", n) for i, n in enumerate(self.test_nets)]
        for key, net in nets:
            for name, layer in zip(net.layer_names, net.layers):
                if callable(getattr(layer, "data_state", None)):
                    yield key, name, layer

    def _write_side_file(self, state: str, model: str) -> None:
        """cct's extras for an exact resume, beside the state (Caffe's files stay pure)."""
        side = {"format": 1, "iter": self.iter, "learned_net": model,
                "rng": rng.get_rng().bit_generator.state, "data": {}, "plans": plans.table()}
        for key, name, layer in self._data_layers():
            side["data"].setdefault(key, {})[name] = layer.data_state()
        for key, (save, _) in self.side_state.items():
            side[key] = save(state)
        try:
            text = json.dumps(side, default=_json_default)
        except TypeError as e:
            raise CCTError(f"cannot save the data layers' positions beside '{state}': {e} "
                           f"(data_state() must return JSON-compatible values).") from None
        atomic_write(state + SIDE_SUFFIX, lambda tmp: _write_bytes(tmp, text.encode()))

    def restore(self, state_file: str) -> None:
        """Resume from a ``.solverstate`` (binary) or ``.solverstate.h5`` written by Caffe or
        cct: iteration, current_step, the learned weights and the history (and, for cct's own
        snapshots, the random generator and the data layers' positions)."""
        info("caffe.cpp:235", f"Resuming from {state_file}")
        self._restore(state_file)

    def _restore(self, state_file: str) -> None:
        if not os.path.isfile(state_file):
            raise CCTError(f"solver state '{state_file}' does not exist.")
        if is_hdf5(state_file):
            state = read_solver_state_hdf5(state_file)
        else:
            state = read_solver_state(state_file)
        history = state["history"]
        expected = len(self.history)
        if len(history) != expected:
            raise CCTError(f"solver state '{state_file}' holds {len(history)} history blobs; "
                           f"this {self.type} solver keeps {expected} ("
                           f"{self.rule.history_sets} per learnable param x "
                           f"{len(self.net.learnable_params)} params). Was it written by another "
                           f"solver type or for another net? (Incorrect length of history "
                           f"blobs.)")
        for i, (h, mine) in enumerate(zip(history, self.history)):
            if h.size != mine.size:
                raise CCTError(f"solver state '{state_file}': history blob {i} has shape "
                               f"{h.shape} but the net needs {tuple(mine.shape)} there; the "
                               f"state belongs to another net.")
        model = state["learned_net"]
        if model:
            model = _find_learned_net(model, state_file)
        self.iter = state["iter"]
        if model:
            try:
                self.net.copy_trained_layers_from(model)
            except CCTError as e:
                raise WeightsError(f"solver state '{state_file}' names the weights file "
                                   f"'{model}' (learned_net), which cannot be used: {e}") from None
        self.current_step = state["current_step"]
        if not state["hdf5"]:
            info("sgd_solver.cpp:336", "SGDSolver: restoring history")
        for h, mine in zip(history, self.history):
            mine[...] = self.net.backend.xp.asarray(h.reshape(mine.shape), dtype=mine.dtype)
        self._read_side_file(state_file, state)
        self.gradient_source.refresh()  # what a source's replicas keep of their own
        self.last_snapshot = state_file

    def capture(self) -> dict:
        """An in-memory snapshot for a branch that will be thrown away: copies of every train
        net param (learnable or not, BatchNorm's statistics too), the history, ``iter``,
        ``current_step``, the random generator, the data layers' positions, the smoothed
        loss and the iteration of the last display line (whose rate the next one gives).
        Nothing is written to disk; :meth:`restore_capture` puts it all back."""
        self._pull_statistics()
        return {"params": [np.array(_host(p.data), copy=True) for p in self.net.params_list],
                "history": [np.array(_host(h), copy=True) for h in self.history],
                "iter": self.iter, "current_step": self.current_step,
                "rng": rng.get_rng().bit_generator.state,
                "data": {(k, n): layer.data_state() for k, n, layer in self._data_layers()},
                "losses": (list(self._losses), self.smoothed_loss, self._start_iter),
                "displayed": self._iterations_last}

    def restore_capture(self, captured: dict) -> None:
        """Return to a :meth:`capture`: params and history bit for bit, the iteration, the
        random generator and the data layers' positions (their prefetch restarts there)."""
        xp = self.net.backend.xp
        for p, a in zip(self.net.params_list, captured["params"]):
            p.data[...] = xp.asarray(a)
        for h, a in zip(self.history, captured["history"]):
            h[...] = xp.asarray(a)
        self.iter, self.current_step = captured["iter"], captured["current_step"]
        rng.get_rng().bit_generator.state = captured["rng"]
        for key, name, layer in self._data_layers():
            state = captured["data"].get((key, name))
            if state is not None and callable(getattr(layer, "load_data_state", None)):
                layer.load_data_state(state)
        losses, self.smoothed_loss, self._start_iter = captured["losses"]
        self._losses = list(losses)
        self._iterations_last = captured["displayed"]
        self.requested_early_exit = False
        self.gradient_source.refresh()

    def _read_side_file(self, state_file: str, state: dict) -> None:
        """Restore what cct's side file keeps beside the state: the random generator, the
        data layers' positions, the kernel plans. A missing, damaged or mismatched side file
        is logged and never fatal: the run resumes as from a Caffe state, only not bit for
        bit."""
        path = state_file + SIDE_SUFFIX
        side = _load_side_file(path, state)
        if side is None:
            return
        if side.get("rng") is not None:
            generator = rng.get_rng().bit_generator
            before = generator.state
            try:
                generator.state = side["rng"]
            except Exception as e:  # NumPy refuses a damaged state with various errors
                generator.state = before
                _side_warning(path, f"its random generator state is unusable "
                                    f"({type(e).__name__}: {e})")
        if "plans" in side:
            # The kernels' plans round differently: the interrupted run's plans, not this
            # machine's, make the resumed run repeat it to the bit.
            try:
                plans.install(side["plans"])
            except ValueError as e:
                _side_warning(path, f"its kernel plans are unusable ({e})")
        for key, (_, load) in self.side_state.items():
            if key in side:
                try:
                    load(side[key], state_file)
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    _side_warning(path, f"its '{key}' entry is unusable ({type(e).__name__}: "
                                        f"{e})")
        saved = side.get("data", {})
        for key, name, layer in self._data_layers():
            d = saved.get(key, {}).get(name)
            if d is None or not callable(getattr(layer, "load_data_state", None)):
                continue
            before = layer.data_state()
            try:
                layer.load_data_state(d)
            except Exception as e:  # the saved values may be damaged in any way
                layer.load_data_state(before)
                _side_warning(path, f"the data position of layer '{name}' ({key} net) is "
                                    f"unusable ({type(e).__name__}: {e}); it goes on from "
                                    f"where it is")


# ------------------------------------------------------------------------------------------------
# SolverState files
# ------------------------------------------------------------------------------------------------
def _load_side_file(path: str, state: dict) -> Optional[dict]:
    """The side file's contents when they belong to ``state`` and have the layout
    :meth:`Solver._write_side_file` writes (other keys are ignored); otherwise None, logged."""
    if not os.path.isfile(path):
        logger.info(f"{path} is absent (a state written by Caffe, or by cct before side "
                    f"files): the random generator and the data layers start afresh, so the "
                    f"resumed run will not repeat an uninterrupted one bit for bit.")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            side = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        _side_warning(path, f"it cannot be read ({e})")
        return None
    if not isinstance(side, dict):
        _side_warning(path, f"it holds a JSON {type(side).__name__}, not cct's object of "
                            f"format 1")
        return None
    if side.get("format") != 1:
        _side_warning(path, f"its format is {side.get('format')!r}; this cct reads format 1")
        return None
    learned_net = side.get("learned_net")
    if side.get("iter") != state["iter"] or not isinstance(learned_net, str) or \
            os.path.basename(learned_net) != os.path.basename(state["learned_net"]):
        _side_warning(path, f"it was written for iteration {side.get('iter')!r} and weights "
                            f"{learned_net!r}, the state is at iteration {state['iter']} with "
                            f"weights '{state['learned_net']}' (left over from another run?)")
        return None
    data = side.get("data", {})
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        _side_warning(path, "its 'data' entry is not an object of {net: {layer: position}}")
        return None
    return side


def _side_warning(path: str, why: str) -> None:
    logger.warning(f"{path}: {why}; the resumed run will not repeat the interrupted one bit "
                   f"for bit.")


def _find_learned_net(model: str, state_file: str) -> str:
    """The learned_net path as Caffe takes it (relative to the current directory), else
    beside the state file."""
    folder = os.path.dirname(state_file)
    candidates = [model]
    if not os.path.isabs(model):
        candidates += [os.path.join(folder, model), os.path.join(folder, os.path.basename(model))]
    for c in candidates:
        if os.path.isfile(c):
            return c
    raise WeightsError(f"solver state '{state_file}' names the weights file '{model}' "
                       f"(learned_net), which does not exist (looked in the current directory "
                       f"and beside the state: {', '.join(dict.fromkeys(candidates))}).")


def _finite(a) -> bool:
    """Whether every value of a (host or device) array is finite: its min and max are (they
    are NaN or infinite exactly when some value is), which needs no temporary array."""
    return a.size == 0 or (math.isfinite(float(a.min())) and math.isfinite(float(a.max())))


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _json_default(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, bytes):
        return o.decode("latin-1")
    raise TypeError(f"cannot save {type(o).__name__} in {SIDE_SUFFIX}")


def _copy_net(param: caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """A copy of a net embedded in the solver, upgraded like a net read from a file."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    return upgrade_net(out, "<net in solver>")


def solver_from_file(path: str, **kw) -> Solver:
    """Read a solver prototxt (with Caffe's upgrades and default snapshot_prefix) and build
    the solver its ``type`` names."""
    return Solver(read_solver_text(path), path, **kw)


__all__ = ["Solver", "solver_from_file"]
