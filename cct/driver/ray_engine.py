"""The Ray engine: the driver's groups as Ray actors and its parameter store split into shards,
each an actor, so the same strategies run across machines (``--engine=ray``).

* **Store shards** (:class:`StoreShard`): the learnable params cut, in the net's order, into
  ``--ps-shards`` contiguous parts of about equal bytes. A shard keeps its params and their
  history and applies each pushed gradient with the solver's own rule (the same
  ``SolverUpdate``, fed the rate, iteration and momentum the driver's solver computed), so
  the update is the one-process update, param for param. A push carries (group, sequence
  number) and a retried push is applied once. Every ``checkpoint_every`` updates a shard writes
  its params, history and version beside the snapshots; restarted after a failure
  (``max_restarts=-1``) it reloads that checkpoint, and the driver logs how many of its updates
  were lost.
* **Groups** (:class:`GroupWorker`): a net with Input layers where the train net has data
  layers, built in the actor's process, with the actor's cores (``num_cpus``). A step takes
  the shards' weights (object refs, fetched by the actor from the object store: the driver
  never copies weights) and the batch, and returns the loss, the outputs and one gradient
  part per shard as separate objects; the driver hands those refs on to the shards without
  fetching them. A group actor that dies is restarted by Ray (``--ray-group-restarts``) and
  given the next batch; after its restarts it is dropped and the others go on.
* **Data** (``--ray-data``): ``ship`` (default): the driver's data layers read the database
  and ship each group its batch through the object store (the database need only be
  readable where the driver runs), in the order groups ask, as the other engines do;
  ``local``: each group's own Data layer reads the LMDB where the group runs, group k of g
  starting k/g of the way into it (every node must see the path; batches stay fixed).
* **SMA** (``replicas=True``): the learners' replicas, their histories, the central model and
  the averaging stay in the driver, where cct/driver/sma.py runs them as on every engine; a
  round ships each learner actor its replica's weights and takes back one gradient, and there
  are no store shards. A learner added by ``--learners=auto`` beyond the first ones reserves
  no CPU of its own: it shares the cluster's cores, as added learners share their device's
  elsewhere (an actor asking for a core that is not free would wait for it forever).

The driver's solver keeps the loop (tests, display, lr policy, snapshots): before a test or a
snapshot the shards' params and history are gathered into it, so snapshots are ordinary Caffe
files; a restore sends them back to the shards. Ray is imported only here, only when asked.

``--ray-address`` is checked for its form (host:port, or ``auto``) and the connection bounded
(``_CONNECT_SECONDS``): Ray itself retries an address that does not answer for ever. Every
wait for a group or a shard is bounded by the engine's answer timeout (engines.py): a group
that does not answer is dropped as a dead one is; a shard that does not answer stops the run
(its params are nowhere else). The actors ignore SIGINT and SIGHUP, which a terminal sends to
its whole process group (a local Ray's workers are in the driver's): the driver acts on them.
"""
from __future__ import annotations

import logging
import math
import os
import re
import signal
import socket
import threading
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..backend import copy as copy_array, host
from ..errors import CCTError
from ..glog import info, warning
from ..install import install_hint
from ..params import ParamSet, statistics_positions
from .engines import AnswerTimeout, Engine, NoAnswer, _results, wait_any
from .groups import show_outputs, unlearned_params

SRC = "driver.cpp:0"
_RESTART_SECONDS = 300       # how long a group actor may take to come back after a failure
# How long connecting to --ray-address may take: a cluster answers in seconds; Ray itself would
# retry an address that does not answer (unroutable, firewalled) for ever.
_CONNECT_SECONDS = 60
_ADDRESS = re.compile(r"^(ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):(\d{1,5})$")


def import_ray():
    try:
        import ray
    except ImportError:
        raise CCTError(f"--engine=ray needs Ray, which is not installed: {install_hint('ray')} "
                       f"(or pip install ray)") from None
    return ray


def _ignore_terminal_signals() -> None:
    """An actor's process: the driver acts on a terminal's SIGINT and SIGHUP (see the module
    doc), Ray's workers would die of them."""
    for name in ("SIGINT", "SIGHUP"):
        if hasattr(signal, name) and threading.current_thread() is threading.main_thread():
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def check_address(address: str) -> None:
    """``--ray-address``'s form: 'auto' or host:port (ray://host:port for Ray Client)."""
    m = _ADDRESS.match(address)
    if address != "auto" and not (m and 0 < int(m.group(3)) < 65536):
        raise CCTError(f"--ray-address must be host:port (the head node's GCS address, e.g. "
                       f"10.0.0.1:6379, as 'ray start --head' prints it) or 'auto' (the cluster "
                       f"started on this machine), got '{address}'")


def connect(ray, address: Optional[str], **kw) -> None:
    """``ray.init``, every failure one CCTError naming the flag and the address, and no more
    than ``_CONNECT_SECONDS``: a host:port is probed first (a refused or unroutable address
    fails here, without Ray's retries), then Ray is given the rest of the time."""
    if address is None:
        ray.init(**kw)
        return
    check_address(address)
    deadline = time.monotonic() + _CONNECT_SECONDS
    fix = ("start the cluster ('ray start --head' on the head node) or give its address; "
           "without --ray-address a local Ray is started")
    m = _ADDRESS.match(address)
    if m:
        host = m.group(2).strip("[]")
        try:
            socket.create_connection((host, int(m.group(3))), timeout=_CONNECT_SECONDS).close()
        except OSError as e:
            raise CCTError(f"--ray-address={address}: cannot connect "
                           f"({e.strerror or type(e).__name__}); {fix}") from None
    outcome: Dict = {}

    def init():
        try:
            ray.init(address=address, **kw)
        except BaseException as e:      # reported in the driver's thread
            outcome["error"] = e
        outcome["done"] = True

    thread = threading.Thread(target=init, name="cct-ray-connect", daemon=True)
    thread.start()
    thread.join(max(deadline - time.monotonic(), 0.0))
    if "done" not in outcome:
        raise CCTError(f"--ray-address={address}: no Ray cluster answered within "
                       f"{_CONNECT_SECONDS} s; {fix}")
    if "error" in outcome:
        e = outcome["error"]
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CCTError(f"--ray-address={address}: Ray could not connect ({first}); "
                       f"{fix}") from None


def shard_bounds(nbytes: Sequence[int], shards: int) -> List[List[int]]:
    """Param positions of each shard: contiguous runs of about total/shards bytes each (a
    param is never split; no shard is empty, so there are at most as many as params). A
    param goes to the shard whose byte range holds its middle, moving on by at most one
    shard per param and early enough to leave one param to every later shard."""
    n = len(nbytes)
    shards = max(1, min(shards, n))
    total = float(sum(nbytes)) or 1.0
    out: List[List[int]] = []
    done = 0.0
    for i, size in enumerate(nbytes):
        ideal = int((done + size / 2.0) / total * shards)
        prev = len(out) - 1
        k = min(max(ideal, prev, shards - (n - i)), prev + 1, shards - 1)
        if k > prev:
            out.append([])
        out[k].append(i)
        done += size
    return out


def auto_shards(model_bytes: int, step_seconds: float, bandwidth: float) -> int:
    """Zou et al.'s rule: enough shards that pulling and pushing the model (2 x its bytes),
    spread over the shards' links, hides under one step of a group: ceil(2M / (B T))."""
    if step_seconds <= 0 or bandwidth <= 0:
        return 1
    return max(1, math.ceil(2.0 * model_bytes / (bandwidth * step_seconds)))


# -- the actors (plain classes; ray.remote wraps them in RayEngine) ------------------------------
class StoreShard:
    """A part of the parameter store: see the module doc."""

    def __init__(self, index: int, solver_bytes: bytes, solver_type: str,
                 shapes: List[tuple], dtype: str, lr_mult: List[float],
                 decay_mult: List[float], checkpoint: str, checkpoint_every: int):
        import ray

        from ..backend import get as get_backend
        from ..params import ParamSet, StoreBlob
        _ignore_terminal_signals()
        from ..proto import caffe_pb2
        from ..solver_rules import SolverUpdate, get_rule
        param = caffe_pb2.SolverParameter.FromString(solver_bytes)
        param.clip_gradients = -1            # the groups clip, knowing the whole gradient
        self.index = index
        # Its weights come with :meth:`set_weights`, not as constructor arguments: Ray keeps
        # those for a restart, in the object store when large, and says at error level that
        # it may lose them; a restarted shard reloads its checkpoint instead.
        self.params = ParamSet([StoreBlob(np.zeros(s, np.dtype(dtype))) for s in shapes],
                               lr_mult, decay_mult, get_backend("cpu"))
        self.update = SolverUpdate(get_rule(solver_type), param)
        self.history = self.update.init(self.params)
        self.dtype = self.params.blobs[0].data.dtype.type
        self.version = 0
        self.seqs: Dict[int, int] = {}
        self.checkpoint = checkpoint
        self.every = checkpoint_every
        self.restored_from: Optional[int] = None
        if (ray.get_runtime_context().was_current_actor_reconstructed
                and os.path.exists(checkpoint)):
            self._load_checkpoint()

    def set_weights(self, weights) -> None:
        """The run's first weights, checkpointed at once: a shard restarted before its first
        checkpoint would otherwise have none."""
        for b, w in zip(self.params.blobs, weights):
            b.data[...] = w
        if self.every:
            self._write_checkpoint()

    def push(self, group: int, seq: int, grads, rate: float, iter_: int,
             momentum: Optional[float]) -> int:
        if self.seqs.get(group, -1) >= seq:
            return self.version                  # a retried push, applied already
        for b, g in zip(self.params.blobs, grads):
            b.diff[...] = g
        self.update.apply(self.history, self.params, self.dtype(rate), iter_, momentum)
        self.seqs[group] = seq
        self.version += 1
        if self.every and self.version % self.every == 0:
            self._write_checkpoint()
        return self.version

    def weights(self) -> List[np.ndarray]:
        return [b.data for b in self.params.blobs]

    def state(self):
        return ([b.data for b in self.params.blobs], list(self.history), self.version)

    def load(self, weights, history, version: int) -> int:
        for b, w in zip(self.params.blobs, weights):
            b.data[...] = w
        for h, s in zip(self.history, history):
            h[...] = s
        self.version = int(version)
        self.seqs = {}
        return self.version

    def where(self):
        import ray
        return os.getpid(), ray.get_runtime_context().get_node_id()[:8], self.version, \
            self.restored_from

    def _write_checkpoint(self) -> None:
        from ..io.atomic import save_arrays
        arrays = {f"w{i}": b.data for i, b in enumerate(self.params.blobs)}
        arrays.update({f"h{i}": h for i, h in enumerate(self.history)})
        arrays["version"] = np.array(self.version)
        arrays["seqs"] = np.array(sorted(self.seqs.items()), dtype=np.int64).reshape(-1, 2)
        save_arrays(self.checkpoint, arrays)

    def _load_checkpoint(self) -> None:
        from ..io.atomic import load_arrays
        saved = load_arrays(self.checkpoint, f"store shard {self.index}'s checkpoint")
        for i, b in enumerate(self.params.blobs):
            b.data[...] = saved[f"w{i}"]
        for i, h in enumerate(self.history):
            h[...] = saved[f"h{i}"]
        self.version = int(saved["version"])
        self.seqs = {int(g): int(s) for g, s in saved["seqs"]}
        self.restored_from = self.version


class GroupWorker:
    """A compute group in its own process: see the module doc."""

    def __init__(self, index: int, net_bytes: bytes, dtype: str, seed: Optional[int],
                 bounds: List[List[int]], clip: float, threads: int, context,
                 part: Optional[float] = None, device: Optional[str] = None):
        from ..native import _C
        from .groups import process_group_net
        _ignore_terminal_signals()
        _C.set_num_threads(threads)
        # a device group: Ray gave the actor its GPU as GPU 0 (``device`` "gpu0")
        self.net = process_group_net(net_bytes, dtype, seed, index, device, context,
                                     f"<group {index}>")
        self.inputs = self.net.input_blobs()
        self.outputs = self.net.output_blobs()
        self.bounds = bounds
        self.own = set(statistics_positions(self.net))   # its running statistics: not pulled
        self.clip = clip
        self.local = part is not None
        if self.local:                 # its own part of the database, read on this node
            for layer in self.net.layers:
                if callable(getattr(layer, "data_state", None)):
                    state = layer.data_state()
                    state.update(position=int(part * _entries(layer)), key="", records=0)
                    layer.load_data_state(state)

    def where(self):
        import ray
        return os.getpid(), ray.get_runtime_context().get_node_id()[:8]

    def statistics(self) -> List[np.ndarray]:
        """What no update touches (BatchNorm's running averages), for the driver's net."""
        return [np.array(host(p.data)) for p in unlearned_params(self.net)]

    def load_statistics(self, arrays: List[np.ndarray]) -> None:
        for p, a in zip(unlearned_params(self.net), arrays):
            copy_array(p.data, a)

    def step(self, table, batches, *shard_weights):
        """(loss, outputs), then the gradient of each shard's params."""
        from ..backend import plans
        if table is not None:
            plans.install(table)
        params = self.net.learnable_params
        for positions, weights in zip(self.bounds, shard_weights):
            for i, w in zip(positions, weights):
                if i not in self.own:
                    copy_array(params[i].data, w)
        self.net.clear_param_diffs()
        loss = 0.0
        for batch in batches:
            for blob, x in zip(self.inputs, batch or ()):
                if blob.shape != x.shape:
                    blob.reshape(x.shape)
                copy_array(blob.data, x)
            loss += self.net.forward_backward()     # local data: its data layers read
        if self.clip >= 0:                     # Caffe's ClipGradients, over the whole net
            norm = math.sqrt(sum(float(np.dot(p.diff.ravel(), p.diff.ravel())) for p in params))
            if norm > self.clip:
                for p in params:
                    p.diff *= self.clip / norm
        plans.persist()
        head = (loss / len(batches), [np.array(host(o.data)) for o in self.outputs],
                self.where())
        # Host arrays into Ray's object store (a device group's gradient: one copy out).
        return (head,) + tuple([host(params[i].diff) for i in positions]
                               for positions in self.bounds)


def _entries(layer) -> int:
    """The records of a Data layer's LMDB (what a group's part is a share of)."""
    p = layer.layer_param.data_param
    if p.backend != p.LMDB:
        raise CCTError(f"--ray-data=local splits LMDB databases; layer '{layer.layer_param.name}'"
                       f" reads LevelDB: use --ray-data=ship")
    return len(layer.cursor)


# -- the driver's side -------------------------------------------------------------------------
class RemoteGradients:
    """What a Ray group's step left in the object store, as the store's push sees it:
    :meth:`apply_remotely` sends each shard its part (refs, not arrays) with the rate,
    iteration and momentum the solver computed, and the shards update (cct/driver/store.py)."""

    def __init__(self, engine: "RayEngine", group: "RayGroup"):
        self.engine = engine
        self.group = group

    def apply_remotely(self, rate, iter_, momentum=None, only=None) -> None:
        g = self.group
        for shard, ref in zip(self.engine.shards, g.grad_refs):
            shard.push.remote(g.index, g.seq, ref, float(rate), int(iter_), momentum)
        g.grad_refs = []


class RayGroup:
    """The driver's handle on one group actor."""

    def __init__(self, engine: "RayEngine", index: int, batch: int, restarts: int,
                 cpus: float):
        self.engine = engine
        self.index = index
        self.batch = batch
        self.last_batch = batch
        self.read_version = 0
        self.seconds = 0.0
        self.steps_done = 0   # its actor's net has running statistics once this is > 0
        self.seq = 0
        self.restarts_left = restarts
        self.grad_refs: List = []
        self.head = None                # the step in flight's (loss, outputs) ref
        self.sent_plans = False
        self.started = 0.0
        self.net = engine.master        # whose output blobs the log reads back
        self.pushed = None
        # SMA's learner: its replica (weights, and the gradient its actor sends back) is here.
        self.replica = ParamSet.copy_of(engine.solver.params) if engine.replicas else None
        self.params = self.replica if self.replica is not None else RemoteGradients(engine, self)
        self.actor = engine.new_group_actor(index, batch, cpus)
        self.pid, self.node = engine.get(self.actor.where.remote(), f"group {index}'s actor",
                                         "Ray did not place or start it: are the cluster's "
                                         "CPUs (or GPUs) taken?")
        self.inputs = [[np.empty((batch,) + tuple(t.shape[1:]), t.dtype.type)
                        for t in engine.feeder.tops] for _ in range(engine.iter_size)]

    @property
    def name(self) -> str:
        device = self.engine.device_of(self.index)
        where = f", {device}" if device else ""
        return f"group {self.index} (pid {self.pid}, node {self.node}{where})"

    def start(self):
        """Send the next step: the shards' current weights (refs) and the next batch."""
        e = self.engine
        self.started = time.perf_counter()
        self.read_version = e.version()
        self.last_batch = self.batch
        if e.local_data:            # the actor's data layers read its part of the database
            batches = [None] * e.iter_size
            e.feeder.records[self.index] += self.batch * e.iter_size
        else:
            for arrays in self.inputs:
                if arrays[0].shape[0] != self.batch:
                    arrays[:] = [np.empty((self.batch,) + a.shape[1:], a.dtype)
                                 for a in arrays]
                e.feeder.feed_arrays(arrays, self.batch, self.index)
            batches = self.inputs
        if self.replica is not None:
            weights = [e.ray.put(self.replica.weights())]
        else:
            weights = [s.weights.remote() for s in e.shards]
        table = None if self.sent_plans else e.plan_table()
        self.sent_plans = True
        refs = self.actor.step.options(num_returns=1 + len(e.bounds)).remote(
            table, batches, *weights)
        self.head, self.pending_grads = refs[0], refs[1:]
        self.seq += 1
        return self.head

    def result(self) -> Optional[float]:
        """The step's loss; None when the actor died and was restarted (start it again)."""
        e = self.engine
        errors = e.ray.exceptions
        limit = e.timeout()
        try:
            loss, outputs, where = e.ray.get(
                self.head, timeout=max(self.started + limit - time.perf_counter(), 0.0))
        except errors.GetTimeoutError:
            raise NoAnswer(f"the actor did not answer within {limit:g} s of its step's start "
                           f"(hung, or its node unreachable; -group-timeout sets the limit)"
                           ) from None
        except errors.RayTaskError as err:        # raised by the step's own code
            if isinstance(err.cause, CCTError):
                raise err.cause from None        # the user's net or data: stop the run
            raise RuntimeError(f"its step failed: {type(err.cause).__name__}: "
                               f"{err.cause}") from None
        except errors.RayError as err:            # the actor (or its node) died meanwhile
            if self.restarts_left <= 0:
                raise RuntimeError(f"the actor died and has no restarts left: "
                                   f"{type(err).__name__}") from None
            where = self._where_after_restart(err)
            if tuple(where) == (self.pid, self.node):
                # The actor lives: a store shard it read its weights from died under the step.
                warning(SRC, f"{self.name}: its step lost its weights ({type(err).__name__}: a "
                        f"store shard restarting); its batch is lost")
                return None
            self._restarted(where, f"its batch is lost ({type(err).__name__})")
            return None
        if tuple(where) != (self.pid, self.node):
            # It died between steps; Ray restarted it and the step ran there.
            self._restarted(where, "no batch was lost")
        self.seconds = time.perf_counter() - self.started
        e.timeout.seen(self.seconds)
        self.grad_refs = list(self.pending_grads)
        if self.replica is not None:
            self.replica.set_gradients(e.get(self.grad_refs.pop(), f"{self.name}'s gradient"))
        self.steps_done += 1
        show_outputs(e.master, outputs)
        return loss

    def _where_after_restart(self, err) -> tuple:
        """Where Ray brought the actor back. A call made while it is still restarting may fail
        too (ActorUnavailableError, or ActorDiedError before Ray has noticed the death): ask
        again until it answers or the restart deadline passes."""
        errors = self.engine.ray.exceptions
        deadline = time.monotonic() + _RESTART_SECONDS
        while True:
            try:
                left = max(deadline - time.monotonic(), 1.0)
                return self.engine.ray.get(self.actor.where.remote(), timeout=left)
            except errors.RayError as again:
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"the actor died ({type(err).__name__}) and did not "
                                       f"come back in {_RESTART_SECONDS} s: "
                                       f"{type(again).__name__}") from None
                time.sleep(0.2)

    def _restarted(self, where, lost: str) -> None:
        old = self.pid
        self.restarts_left -= 1
        self.pid, self.node = where
        self.sent_plans = False
        warning(SRC, f"group {self.index}: the actor (pid {old}) died; Ray restarted it as pid "
                f"{self.pid} on node {self.node} ({max(self.restarts_left, 0)} restart(s) "
                f"left); {lost}")

    def copy_statistics_to(self, master) -> None:
        """What only the actor's net holds (BatchNorm's running averages) back into the
        train net, for tests and snapshots."""
        ours = unlearned_params(master)
        if ours:
            arrays = self.engine.get(self.actor.statistics.remote(),
                                     f"{self.name}'s running statistics")
            for p, a in zip(ours, arrays):
                p.data[...] = a

    def copy_statistics_from(self, master) -> None:
        """The train net's (restored) unlearned params into the actor's net."""
        ours = unlearned_params(master)
        if ours:
            self.engine.get(self.actor.load_statistics.remote(
                [np.array(p.data) for p in ours]), f"{self.name}'s restored statistics")

    def close(self) -> None:
        try:
            self.engine.ray.kill(self.actor)
        except Exception:           # already gone
            pass


class RayEngine(Engine):
    """The engine interface (``run``) over Ray actors; see the module doc."""

    name = "ray"

    def __init__(self, solver, feeder, address: Optional[str] = None, shards="auto",
                 group_restarts: int = 3, checkpoint_every: int = 100,
                 cpus_per_group: float = 1.0, data: str = "ship", replicas: bool = False,
                 devices: Optional[Sequence[Optional[str]]] = None,
                 timeout: Optional[AnswerTimeout] = None):
        if data not in ("ship", "local"):
            raise CCTError(f"--ray-data must be ship (the driver reads the database and ships "
                           f"batches) or local (each group reads its part where it runs), got "
                           f"'{data}'")
        self.local_data = data == "local"
        if address:
            check_address(address)
        self.timeout = timeout or AnswerTimeout()
        self.ray = import_ray()
        self.solver = solver
        self.feeder = feeder
        self.master = solver.net
        self.iter_size = solver.param.iter_size
        self.started_ray = self._start_ray(address)
        self.group_restarts = group_restarts
        self.cpus = cpus_per_group
        # Per group: None (CPUs, placed by Ray) or a device spelling (a GPU asked of Ray,
        # which the actor sees as GPU 0; the stand-in).
        self.devices = list(devices) if devices else None
        self.checkpoint_every = checkpoint_every
        self.replicas = replicas
        self._start_store(solver.params, shards)
        if self.local_data:
            info(SRC, "Data: each group's own data layers read its part of the database where "
                 "it runs (group k of g starts k/g of the way in; every node must see the "
                 "database path)")
        else:
            info(SRC, "Data: the driver's data layers read the database and ship each group "
                 "its batch through the object store")
        self._plans = None

    def _start_ray(self, address: Optional[str]) -> bool:
        """Connect to ``address``, or start a local Ray, unless one runs; whether this engine
        started it (and so shuts it down)."""
        ray, started = self.ray, False
        if not ray.is_initialized():
            # Ray's own start-up lines would interleave with Caffe's log: errors only.
            kw = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
            if address:
                connect(ray, address, **kw)
            else:
                ray.init(object_store_memory=1 << 30, **kw)
            started = True
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        where = (f"connected to {address}" if address else
                 "a local Ray started" if started else "the Ray already running")
        info(SRC, f"Ray {ray.__version__}: {where}; {len(nodes)} node(s), "
             f"{int(ray.cluster_resources().get('CPU', 0))} CPU(s)")
        return started

    def _start_store(self, params, shards) -> None:
        """The store's shards as actors, each a contiguous run of params of about equal bytes
        (SMA: none, its central model stays in the driver)."""
        nbytes = [int(np.prod(b.shape)) * np.dtype(b.dtype).itemsize for b in params.blobs]
        self.model_bytes = sum(nbytes)
        if self.replicas:
            self.n_shards = 0
            self.bounds = [list(range(len(nbytes)))]    # a learner's gradient: one part
            info(SRC, "SMA on Ray: the learners' replicas, the central model and the averaging "
                 "stay in the driver; each round ships every learner actor its replica's "
                 f"weights ({self.model_bytes} bytes) and takes its gradient back; no store "
                 "shards")
        else:
            self.n_shards = self._shard_count(shards)
            self.bounds = shard_bounds(nbytes, self.n_shards)
        self.shards = [self._new_shard(k, pos) for k, pos in enumerate(self.bounds[
            :self.n_shards])]
        self.places = [self.get(s.where.remote(), f"store shard {k}")[:2]
                       for k, s in enumerate(self.shards)]
        for k, (pos, (pid, node)) in enumerate(zip(self.bounds, self.places)):
            info(SRC, f"Store shard {k} (pid {pid}, node {node}): params {pos[0]}-{pos[-1]}, "
                 f"{sum(nbytes[i] for i in pos)} bytes")
        self.shard_pids = [pid for pid, _ in self.places]

    # -- construction --------------------------------------------------------------------------
    def _shard_count(self, shards) -> int:
        if shards != "auto":
            try:
                n = int(shards)
            except (TypeError, ValueError):
                raise CCTError(f"--ps-shards must be a count or 'auto', got '{shards}'") from None
            if n < 1:
                raise CCTError(f"--ps-shards must be at least 1, got {n}")
            return n
        step = self._step_seconds()
        bandwidth = self._bandwidth()
        n = min(auto_shards(self.model_bytes, step, bandwidth),
                len(self.solver.params.blobs))
        info(SRC, f"--ps-shards=auto: model {self.model_bytes} bytes, a group's step "
             f"{step * 1000:.3g} ms (timed here), object-store bandwidth {bandwidth / 1e9:.3g} "
             f"GB/s (measured): ceil(2 x bytes / (bandwidth x step)) = {n} shard(s)")
        return n

    def _step_seconds(self) -> float:
        """One forward/backward of the train net here, above its data layers (whose tops are
        timed as they are: the data is not read, so the groups' batches stay the run's), the
        best of two after one untimed."""
        net = self.master
        first = max(self.feeder.sources, default=-1) + 1
        last = len(net.layers) - 1
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            net.forward_from_to(first, last)
            net.backward_from_to(last, first)
            times.append(time.perf_counter() - t0)
        net.clear_param_diffs()
        return min(times[1:])

    def _bandwidth(self) -> float:
        """Bytes per second of putting a model-sized array into the object store and getting
        it back (a lower bound of what a node's link gives on one machine)."""
        ray = self.ray
        a = np.ones(max(self.model_bytes // 4, 1 << 22), np.float32)   # at least 16 MiB
        best = math.inf
        for _ in range(3):          # the first put also maps the store's pages
            t0 = time.perf_counter()
            ref = ray.put(a)
            np.array(ray.get(ref), copy=True)
            best = min(best, time.perf_counter() - t0)
            del ref
        return 2 * a.nbytes / best if best > 0 else 0.0

    def _checkpoint_path(self, k: int) -> str:
        """Beside the snapshots; a solver that takes none checkpoints in a temporary folder."""
        prefix = self.solver.param.snapshot_prefix
        if not prefix:
            import tempfile
            prefix = os.path.join(tempfile.gettempdir(), f"cct-{os.getpid()}")
        return os.path.abspath(f"{prefix}.cct.shard{k}.npz")

    def _new_shard(self, k: int, positions: List[int]):
        p = self.solver.params
        actor = self.ray.remote(StoreShard).options(
            num_cpus=0, max_restarts=-1, max_task_retries=-1)
        # The weights follow as the shard's first call (see StoreShard.__init__); an actor
        # runs its calls in order, so every later one sees them.
        shard = actor.remote(k, self.solver.param.SerializeToString(), self.solver.type,
                             [tuple(p.blobs[i].shape) for i in positions],
                             np.dtype(p.blobs[positions[0]].dtype).str,
                             [p.lr_mult[i] for i in positions],
                             [p.decay_mult[i] for i in positions],
                             self._checkpoint_path(k), self.checkpoint_every)
        shard.set_weights.remote([np.asarray(p.blobs[i].data) for i in positions])
        return shard

    def new_group_actor(self, index: int, batch: int, cpus: float):
        from ..context import RunContext
        from ..proto import caffe_pb2
        part = None
        if self.local_data:
            param = caffe_pb2.NetParameter()
            param.CopyFrom(self.master.param)
            for i in self.feeder.sources:
                lp = param.layer[i]
                if lp.type != "Data":
                    raise CCTError(f"--ray-data=local reads Data layers' LMDBs; layer "
                                   f"'{lp.name}' is {lp.type}: use --ray-data=ship")
                lp.data_param.batch_size = batch
            part = index % len(self._batches) / len(self._batches)
        else:
            param = self.master.replica_param(batch)
        device = self.device_of(index)
        gpus = 1 if device is not None and device.startswith("gpu") else 0
        actor = self.ray.remote(GroupWorker).options(
            num_cpus=cpus, num_gpus=gpus, max_restarts=self.group_restarts, max_task_retries=0)
        seed = (self.solver.param.random_seed if self.solver.param.random_seed >= 0
                else None)
        return actor.remote(index, param.SerializeToString(), self.master.dtype.str, seed,
                            self.bounds, float(self.solver.param.clip_gradients),
                            max(1, int(self.cpus)), RunContext.current(), part,
                            "gpu0" if gpus else device)

    def device_of(self, index: int) -> Optional[str]:
        """Group ``index``'s device spelling, None for a CPU group (a learner added later
        shares the place of learner ``index`` mod the places)."""
        return self.devices[index % len(self.devices)] if self.devices else None

    def make_groups(self, batches: Sequence[Optional[int]]) -> List[RayGroup]:
        cpus = self.ray.cluster_resources().get("CPU", 0)
        if len(batches) * self.cpus > cpus:
            # Ray would hold the actors that find no free CPU until one is: for ever on a
            # cluster that does not grow.
            raise CCTError(f"--groups={len(batches)} with --engine=ray: each group's actor "
                           f"takes {self.cpus:g} CPU and the cluster has {cpus:g}: at most "
                           f"{int(cpus // self.cpus)} group(s); lower --groups or add nodes")
        self._batches = list(batches)
        return [RayGroup(self, k, b or self.feeder.batch, self.group_restarts, self.cpus)
                for k, b in enumerate(batches)]

    def add_group(self, index: int, batch: int) -> RayGroup:
        """One more learner (SMA's autotune): it shares the cores (see the module doc)."""
        return RayGroup(self, index, batch, self.group_restarts, 0)

    def plan_table(self):
        from ..backend import plans
        return plans.table()

    # -- running ---------------------------------------------------------------------------
    def version(self) -> int:
        return self.solver.iter

    def run(self, store, groups: List[RayGroup], updates: int, observer=None) -> None:
        ray = self.ray

        def finished(heads):
            """The steps done, or after the timeout the groups overdue (their result raises
            NoAnswer and drops them)."""
            limit = self.timeout()
            started = [g.started for g in groups if any(g.head is h for h in heads)]
            first_due = min(started, default=time.perf_counter()) + limit
            done, _ = ray.wait(heads, num_returns=1,
                               timeout=max(first_due - time.perf_counter(), 0.0))
            now = time.perf_counter()
            return done or [g.head for g in groups if any(g.head is h for h in heads)
                            and now - g.started >= limit]

        wait_any(store, groups, updates, start=lambda g: g.start(), finished=finished,
                 result=lambda _, g: g.result(), drain=lambda pending: None,
                 observer=observer)
        self.check_shards()

    def compute_all(self, groups: List[RayGroup]) -> List[float]:
        """Every learner's gradient on its replica (SMA's round), all at once; a learner whose
        actor Ray restarted takes the next batch, one that is gone for good is dropped."""
        began = time.perf_counter()
        for g in list(groups):      # in order: the learners' batches do not depend on timing
            g.start()

        def loss_of(g: RayGroup) -> float:
            loss = g.result()
            while loss is None:
                g.start()
                loss = g.result()
            return loss

        losses = _results(groups, [(g, lambda g=g: loss_of(g)) for g in list(groups)])
        self.round_seconds = time.perf_counter() - began
        return losses

    def check_shards(self) -> None:
        """Log every shard that was restarted since the last check, and the updates lost."""
        for k, shard in enumerate(self.shards):
            pid, node, version, restored = self.get(shard.where.remote(), f"store shard {k}")
            if pid != self.shard_pids[k]:
                lost = "?" if restored is None else self.solver.iter - restored
                warning(SRC, f"store shard {k} (pid {self.shard_pids[k]}) was lost; Ray "
                        f"restarted it as pid {pid} on node {node} from its checkpoint at "
                        f"version {restored}: {lost} update(s) of its params lost")
                self.shard_pids[k] = pid

    # -- the solver's copy ------------------------------------------------------------------
    def gather(self) -> None:
        """The shards' params and history into the driver's solver (before a test or a
        snapshot)."""
        s = self.solver
        blobs = s.params.blobs
        n = len(blobs)
        states = self.get([shard.state.remote() for shard in self.shards], "the store shards")
        for positions, (weights, history, _) in zip(self.bounds, states):
            for i, w in zip(positions, weights):
                blobs[i].data[...] = w
            sets = len(history) // max(len(positions), 1)
            for j in range(sets):
                for i, h in zip(positions, history[j * len(positions):(j + 1) * len(positions)]):
                    s.history[j * n + i][...] = h

    def scatter(self) -> None:
        """The solver's (restored) params and history to the shards."""
        s = self.solver
        blobs = s.params.blobs
        n = len(blobs)
        sets = len(s.history) // max(n, 1)
        done = []
        for shard, positions in zip(self.shards, self.bounds):
            weights = [np.asarray(blobs[i].data) for i in positions]
            history = [np.asarray(s.history[j * n + i]) for j in range(sets) for i in positions]
            done.append(shard.load.remote(weights, history, s.iter))
        self.get(done, "the store shards")

    def get(self, refs, what: str, why: str = "hung, or its node unreachable"):
        """``ray.get`` bounded by the answer timeout: what did not answer stops the run with
        one error naming it."""
        limit = self.timeout()
        try:
            return self.ray.get(refs, timeout=limit)
        except self.ray.exceptions.GetTimeoutError:
            raise CCTError(f"{what} did not answer within {limit:g} s ({why}); the run "
                           f"cannot go on without it") from None

    def close(self) -> None:
        for shard in self.shards:
            try:
                self.ray.kill(shard)
            except Exception:
                pass
        self.shards = []
        if self.started_ray:
            self.ray.shutdown()
