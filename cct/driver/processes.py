"""The processes engine: each compute group an OS process, weights, gradients and batches in
shared memory, so that a group killed (even with SIGKILL) costs only its own batch.

The driver process keeps the parameter store and the data layers. Per group it allocates one
shared block holding the weights the group reads, the gradient it writes and its next
``iter_size`` batches, all preallocated (first-touch of fresh memory costs about 20x a copy
on these machines). A step is: the driver copies the store's weights and the next batches
into the block and sends ``step`` on the group's pipe; the group copies them into its net,
runs forward and backward, writes its param diffs into the block and answers with its loss
and output values. The driver waits for whichever group answers first, as the threads engine
does. A pipe that closes (the process died) drops the group; the log names every group's pid.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from multiprocessing import shared_memory
from multiprocessing.connection import wait
from typing import List, Optional, Sequence

import numpy as np

from .. import _C, glog
from ..backend import copy as copy_array, get as get_backend, host, plans
from ..devices import parse_devices
from ..errors import CCTError
from ..net import Net
from ..params import ParamSet, StoreBlob, statistics_positions
from ..proto import caffe_pb2
from ..scheduler import replica_param
from .engines import Engine, _dropped, _results, wait_any
from .groups import show_outputs

_STARTUP_SECONDS = 300


class _Layout:
    """Offsets of a group's arrays in its shared block: weights, gradients, batches."""

    def __init__(self, param_shapes, input_shapes, iter_size: int, dtype):
        self.dtype = np.dtype(dtype)
        self.param_shapes = [tuple(s) for s in param_shapes]
        self.input_shapes = [tuple(s) for s in input_shapes]
        self.iter_size = iter_size
        sizes = ([int(np.prod(s)) for s in self.param_shapes] * 2
                 + [int(np.prod(s)) for s in self.input_shapes] * iter_size)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int) * self.dtype.itemsize
        self.nbytes = max(int(self.offsets[-1]), 1)

    def arrays(self, buf) -> tuple:
        """(weights, gradients, batches[pass][input]) as views of ``buf``."""
        views, k = [], 0
        shapes = (self.param_shapes * 2) + self.input_shapes * self.iter_size
        for shape in shapes:
            views.append(np.ndarray(shape, self.dtype, buf, int(self.offsets[k])))
            k += 1
        n = len(self.param_shapes)
        m = len(self.input_shapes)
        batches = [views[2 * n + i * m: 2 * n + (i + 1) * m] for i in range(self.iter_size)]
        return views[:n], views[n:2 * n], batches


def _group_main(conn, net_bytes: bytes, dtype: str, shm_name: str, layout: _Layout,
                cores: Sequence[int], seed: Optional[int], index: int,
                device: Optional[str] = None) -> None:
    """A group process: build the net (on ``device``, a device spelling, when given; else on
    the CPU cores ``cores``), then compute on request until told to stop. The block is host
    memory: a device group's net takes its weights and batches from it and leaves its
    gradients there through its backend's copies."""
    shm = shared_memory.SharedMemory(name=shm_name)
    weights = grads = batches = None
    try:
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)
        _C.set_num_threads(len(cores) or 0)
        backend = "cpu"
        if device is not None:
            place = parse_devices(device)[0]
            place.activate()              # a GPU made current in this process
            backend = place.backend
        plans.use_machine_cache()
        param = caffe_pb2.NetParameter()
        param.ParseFromString(net_bytes)
        # The process's own generator (its Dropout masks), seeded from random_seed and the
        # group's index as the threads engine's groups are.
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))
        with glog.quiet():
            net = Net(param, backend=backend, dtype=np.dtype(dtype), source="<group process>",
                      rng=rng)
        weights, grads, batches = layout.arrays(shm.buf)
        inputs = [net.blobs_list[i] for i in net.input_blob_indices]
        outputs = [net.blobs_list[b] for b in net.output_blob_indices]
        own = set(statistics_positions(net))       # its running statistics: not pulled
        conn.send(("ready", os.getpid()))
        while True:
            msg, table, n = conn.recv()
            if msg == "stop":
                break
            if msg == "load_statistics":   # a restored train net's, from the driver
                for k, a in zip(sorted(own), table):
                    copy_array(net.learnable_params[k].data, a)
                continue
            if table is not None:
                plans.install(table)   # the driver's plans (a resumed run's side file's)
            for k, (blob, w) in enumerate(zip(net.learnable_params, weights)):
                if k not in own:
                    copy_array(blob.data, w)
            net.clear_param_diffs()
            loss = 0.0
            for batch in batches:
                for blob, x in zip(inputs, batch):
                    if blob.shape[0] != n:
                        blob.reshape((n,) + tuple(blob.shape[1:]))
                    copy_array(blob.data, x[:n])
                loss += net.forward_backward()
            for blob, g in zip(net.learnable_params, grads):
                copy_array(g, blob.diff)
            for k in own:      # its running statistics, where the driver reads them
                copy_array(weights[k], net.learnable_params[k].data)
            plans.persist()
            conn.send(("done", loss / len(batches),
                       [np.array(host(o.data)) for o in outputs]))
    except CCTError as e:       # the user's net or data: the driver stops the run with it
        conn.send(("error", str(e)))
    finally:
        del weights, grads, batches   # views of the block, released before it is closed
        shm.close()


class ProcessGroup:
    """The driver's side of one group process."""

    def __init__(self, index: int, feeder, cores: Sequence[int], iter_size: int,
                 seed: Optional[int] = None, batch: Optional[int] = None,
                 max_batch: Optional[int] = None, device: Optional[str] = None):
        master = feeder.master
        self.index = index
        self.feeder = feeder
        self.cores = tuple(cores)
        self.device = device        # a device spelling (gpu0, standin), or None: the cores
        self.net = master           # whose output blobs the log reads back
        self.batch = batch or feeder.batch
        self.seconds = 0.0
        self.steps_done = 0   # its block holds running statistics once this is > 0
        self._started = 0.0
        # The block holds the largest batch this group may be given (Adaptive Hogbatch).
        self.max_batch = max(max_batch or self.batch, self.batch)
        param = replica_param(master, feeder.sources, self.batch)
        layout = _Layout([b.shape for b in master.learnable_params],
                         [(self.max_batch,) + tuple(t.shape[1:]) for t in feeder.tops],
                         iter_size, master.dtype)
        self.shm = shared_memory.SharedMemory(create=True, size=layout.nbytes)
        self.weights, self.grads, self.batches = layout.arrays(self.shm.buf)
        self.statistics = statistics_positions(master)   # the process's own (BatchNorm's)
        for k in self.statistics:
            self.weights[k][...] = master.learnable_params[k].data
        # The weights are this group's own copy (an SMA learner updates it in place).
        self.params = ParamSet([StoreBlob.pair(w, g) for w, g in zip(self.weights, self.grads)],
                               master.params_lr, master.params_weight_decay,
                               get_backend("cpu"))
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_group_main, daemon=True,
                                   args=(child, param.SerializeToString(), master.dtype.str,
                                         self.shm.name, layout, self.cores, seed, index,
                                         device))
        self.process.start()
        child.close()
        self.read_version = 0
        self.pid = None
        self.sent_plans = False
        self.outputs: List[np.ndarray] = []

    def wait_ready(self) -> None:
        if not self.conn.poll(_STARTUP_SECONDS):
            raise CCTError(f"{self.name}: the group process did not start within "
                           f"{_STARTUP_SECONDS} s")
        kind, payload = self.conn.recv()
        if kind == "error":
            raise CCTError(payload)
        self.pid = payload

    pushed = None      # a push updates every param (no --sync-fc across processes)

    @property
    def name(self) -> str:
        where = self.device or "cores " + ",".join(map(str, self.cores))
        return f"group {self.index} (pid {self.process.pid}, {where})"

    def start(self, store=None) -> None:
        """Send the next step: the store's weights (none: the group's own, an SMA learner's)
        and the next batches."""
        self._started = time.perf_counter()
        if self.batch > self.max_batch:
            raise CCTError(f"{self.name}: batch {self.batch} is over the {self.max_batch} its "
                           f"shared block holds")
        self.last_batch = self.batch
        if store is not None:
            self.read_version = store.pull(self.params)
        for batch in self.batches:
            self.feeder.feed_arrays(batch, self.batch, self.index)
        # The kernels' plans round differently: the group runs the driver's (first step only).
        self._ask(("step", None if self.sent_plans else plans.table(), self.batch))
        self.sent_plans = True

    def _ask(self, message) -> None:
        try:
            self.conn.send(message)
        except OSError as e:        # BrokenPipeError: the process is gone
            self.process.join(1)
            raise RuntimeError(f"the process ended (exit code {self.process.exitcode}): "
                               f"{type(e).__name__}") from None

    def result(self) -> float:
        """The loss of the step just finished; RuntimeError when the process died."""
        try:
            kind, *payload = self.conn.recv()
        except (EOFError, OSError) as e:
            self.process.join(1)
            raise RuntimeError(f"the process ended (exit code {self.process.exitcode}): "
                               f"{type(e).__name__}") from None
        if kind == "error":
            raise CCTError(payload[0])
        self.seconds = time.perf_counter() - self._started
        loss, self.outputs = payload
        self.steps_done += 1
        show_outputs(self.feeder.master, self.outputs)
        return loss

    def copy_statistics_to(self, master) -> None:
        """What only this group's net holds (BatchNorm's running averages) back into the
        train net, for tests and snapshots: the process leaves them in its block's weights
        after each step (a test may come while it computes: no message on its pipe)."""
        for k in self.statistics:
            master.learnable_params[k].data[...] = self.weights[k]

    def copy_statistics_from(self, master) -> None:
        """The train net's (restored) running statistics into the group's net (between
        steps, when a snapshot is restored)."""
        if self.statistics:
            for k in self.statistics:
                self.weights[k][...] = master.learnable_params[k].data
            if self.pid is None:
                self.wait_ready()
            self._ask(("load_statistics", [np.array(self.weights[k])
                                           for k in self.statistics], 0))

    def close(self) -> None:
        try:
            if self.process.is_alive():
                self.conn.send(("stop", None, 0))
                self.process.join(5)
        except (BrokenPipeError, EOFError, OSError):
            pass
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()
        del self.weights, self.grads, self.batches, self.params
        self.shm.close()
        self.shm.unlink()


class ProcessEngine(Engine):
    name = "processes"

    def run(self, store, groups: List[ProcessGroup], updates: int, observer=None) -> None:
        self._ready(groups)

        def start(group: ProcessGroup):
            group.start(store)
            return group.conn

        # Nothing to drain: reading a pending group's answer afterwards waits for it.
        wait_any(store, groups, updates, start=start, finished=wait,
                 result=lambda _, group: group.result(), drain=lambda pending: None,
                 observer=observer)

    def compute_all(self, groups: List[ProcessGroup]) -> List[float]:
        """Every group's gradient on its own weights (SMA's learners), all at once."""
        self._ready(groups)
        began = time.perf_counter()
        started = []
        for g in list(groups):
            started.append((g, _attempt(groups, g, g.start)))
        losses = _results(groups, [(g, g.result) for g, ok in started if ok])
        self.round_seconds = time.perf_counter() - began
        return losses

    @staticmethod
    def _ready(groups) -> None:
        for g in groups:
            if g.pid is None:
                g.wait_ready()


def _attempt(groups, group, start) -> bool:
    """Start a group's step; one whose process is gone is dropped."""
    try:
        start()
        return True
    except CCTError:
        raise
    except Exception as e:
        _dropped(groups, group, e)
        return False
