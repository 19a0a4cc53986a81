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

A group process ignores SIGINT and SIGHUP: a terminal sends them to the whole process group,
and what they do is the driver's to decide (Caffe's -sigint_effect and -sighup_effect, through
the solver's action_request); a group that died of them would be a lost group. A group that
does not answer within the engine's :class:`~cct.driver.engines.AnswerTimeout` (a stopped or
hung process) is dropped as a dead one is. Each shared block is named ``cct_<driver pid>_...``
so that the next driver removes the blocks of one killed with SIGKILL (nothing of it ran to
unlink them; cct/io/atomic.py :func:`remove_stale_shared_memory`).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import signal
import time
from multiprocessing import shared_memory
from multiprocessing.connection import wait
from typing import List, Optional, Sequence

import numpy as np

from ..native import _C
from ..backend import copy as copy_array, get as get_backend, host, plans
from ..context import RunContext
from ..errors import CCTError
from ..glog import warning
from ..io.atomic import SHARED_MEMORY_PREFIX, hold_shared_memory, remove_stale_shared_memory
from ..net import Net
from ..params import ParamSet, StoreBlob, statistics_positions
from .engines import AnswerTimeout, Engine, NoAnswer, _dropped, _results, wait_any
from .groups import process_group_net, show_outputs

_STARTUP_SECONDS = 300
# The signals a terminal sends to its whole process group: the driver acts on them.
_TERMINAL_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGHUP") if hasattr(signal, n))


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
                device: Optional[str] = None, context: Optional[RunContext] = None) -> None:
    """A group process: build the net (on ``device``, a device spelling, when given; else on
    the CPU cores ``cores``), then compute on request until told to stop. The block is host
    memory: a device group's net takes its weights and batches from it and leaves its
    gradients there through its backend's copies."""
    for signum in _TERMINAL_SIGNALS:      # a pending one (blocked since the fork) is discarded
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _TERMINAL_SIGNALS)
    shm = shared_memory.SharedMemory(name=shm_name)
    weights = grads = batches = None
    try:
        net = _group_net(net_bytes, dtype, cores, seed, index, device,
                         context or RunContext())
        weights, grads, batches = layout.arrays(shm.buf)
        inputs = net.input_blobs()
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
            loss = _group_step(net, inputs, weights, grads, batches, own, n)
            plans.persist()
            conn.send(("done", loss, [np.array(host(b.data)) for b in net.output_blobs()]))
    except CCTError as e:       # the user's net or data: the driver stops the run with it
        conn.send(("error", str(e)))
    finally:
        del weights, grads, batches   # views of the block, released before it is closed
        shm.close()


def _group_net(net_bytes: bytes, dtype: str, cores: Sequence[int], seed: Optional[int],
               index: int, device: Optional[str], context: RunContext) -> Net:
    """The group process's net (:func:`~cct.driver.groups.process_group_net`) on its cores:
    pinned, and the kernels' threads one per core."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    _C.set_num_threads(len(cores) or 0)
    return process_group_net(net_bytes, dtype, seed, index, device, context,
                             "<group process>")


def _group_step(net: Net, inputs, weights, grads, batches, own, n: int) -> float:
    """One step in the group process: the block's weights in (not its own statistics), the
    ``iter_size`` batches of ``n`` records through forward and backward, the gradients (and
    its statistics) out to the block; the mean loss. ``inputs``: the net's Input tops, found
    once when the process starts."""
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
    return loss / len(batches)


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
        param = master.replica_param(self.batch)
        layout = _Layout([b.shape for b in master.learnable_params],
                         [(self.max_batch,) + tuple(t.shape[1:]) for t in feeder.tops],
                         iter_size, master.dtype)
        # Blocked while the block is made and the process started (this thread's mask; a
        # signal meant for the driver meanwhile reaches it once unblocked): a process started
        # now keeps them blocked, the group process until it has set them to be ignored (a
        # Ctrl-C while it imports cct, a second or more, would otherwise kill it), and
        # multiprocessing's resource tracker (started by the first block) for good: it
        # ignores SIGINT but would die of SIGHUP, and then complain of every block unlinked.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _TERMINAL_SIGNALS)
        try:
            try:
                self.shm = shared_memory.SharedMemory(
                    create=True, size=layout.nbytes,
                    name=f"{SHARED_MEMORY_PREFIX}{os.getpid()}_{index}_{secrets.token_hex(4)}")
            except OSError as e:
                raise CCTError(f"group {index}: cannot make its shared block of {layout.nbytes} "
                               f"bytes: {e.strerror or e} (containers often give /dev/shm 64 "
                               f"MiB: enlarge it, e.g. docker --shm-size, or use "
                               f"--engine=threads)") from None
            self.held = hold_shared_memory(self.shm.name)   # in use: not swept
            try:
                self.process = self._start(index, feeder, param, layout, seed, device)
            except OSError as e:
                self._release()
                raise CCTError(f"group {index}: cannot start its process: {e.strerror or e} "
                               f"(the system's limit on processes or memory; lower --groups "
                               f"or use --engine=threads)") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self.weights, self.grads, self.batches = layout.arrays(self.shm.buf)
        self.statistics = statistics_positions(master)   # the process's own (BatchNorm's)
        for k in self.statistics:
            self.weights[k][...] = master.learnable_params[k].data
        # The weights are this group's own copy (an SMA learner updates it in place).
        table = master.param_table()
        self.params = ParamSet([StoreBlob.pair(w, g) for w, g in zip(self.weights, self.grads)],
                               [row.lr_mult for row in table],
                               [row.decay_mult for row in table], get_backend("cpu"))
        self.timeout = AnswerTimeout()   # the engine's, once it runs the group
        self.read_version = 0
        self.pid = None
        self.sent_plans = False
        self.outputs: List[np.ndarray] = []

    def _start(self, index, feeder, param, layout, seed, device):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        process = ctx.Process(target=_group_main, daemon=True,
                              args=(child, param.SerializeToString(), feeder.master.dtype.str,
                                    self.shm.name, layout, self.cores, seed, index, device,
                                    RunContext.current()))
        process.start()
        child.close()
        return process

    def wait_ready(self) -> None:
        if not self.conn.poll(_STARTUP_SECONDS):
            raise CCTError(f"{self.name}: the group process did not start within "
                           f"{_STARTUP_SECONDS} s")
        try:
            kind, payload = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(1)
            raise CCTError(f"{self.name}: the group process ended while starting (exit code "
                           f"{self.process.exitcode}); its error is above") from None
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

    def due(self) -> float:
        """When the step sent must have been answered (perf_counter seconds)."""
        return self._started + self.timeout()

    def result(self) -> float:
        """The loss of the step just finished, waited for up to the timeout from its start;
        RuntimeError when the process died, NoAnswer when it did not answer in time."""
        limit = self.timeout()
        if not self.conn.poll(max(self.due() - time.perf_counter(), 0.0)):
            raise NoAnswer(f"the process did not answer within {limit:g} s of its step's start "
                           f"(stopped or hung; -group-timeout sets the limit)")
        try:
            kind, *payload = self.conn.recv()
        except (EOFError, OSError) as e:
            self.process.join(1)
            raise RuntimeError(f"the process ended (exit code {self.process.exitcode}): "
                               f"{type(e).__name__}") from None
        if kind == "error":
            raise CCTError(payload[0])
        self.seconds = time.perf_counter() - self._started
        self.timeout.seen(self.seconds)
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
        self._release()

    def _release(self) -> None:
        self.shm.close()
        self.shm.unlink()
        if self.held is not None:
            os.close(self.held)


class ProcessEngine(Engine):
    name = "processes"

    def __init__(self, timeout: Optional[AnswerTimeout] = None):
        self.timeout = timeout or AnswerTimeout()
        for name in remove_stale_shared_memory():
            warning("driver.cpp:0", f"Removed shared block '{name}' of a driver that is gone "
                    f"(killed before it could remove it)")

    def run(self, store, groups: List[ProcessGroup], updates: int, observer=None) -> None:
        self._ready(groups)
        by_conn = {g.conn: g for g in groups}

        def start(group: ProcessGroup):
            group.start(store)
            return group.conn

        def finished(conns):
            """The answers in, or after the timeout the groups overdue (their result
            raises NoAnswer and drops them)."""
            first_due = min(by_conn[c].due() for c in conns)
            ready = wait(conns, timeout=max(first_due - time.perf_counter(), 0.0))
            return ready or [c for c in conns if by_conn[c].due() <= time.perf_counter()]

        # Nothing to drain: reading a pending group's answer afterwards waits for it (up to
        # the timeout).
        wait_any(store, groups, updates, start=start, finished=finished,
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

    def _ready(self, groups) -> None:
        for g in groups:
            g.timeout = self.timeout
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
