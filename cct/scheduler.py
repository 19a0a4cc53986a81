"""The hybrid scheduler: every device of a group works on every mini-batch (Caffe con Troll).

The solver's train net (the *master*) keeps its data layers and its params. The rest of the net
runs as one replica per device. Each iteration the master's source layers (layers with no
bottoms and no params: Data, ImageData, HDF5Data, DummyData, MemoryData, Input, Python data
layers) produce the whole batch; the scheduler cuts it along the first axis into slices in
proportion to each device's measured throughput, the replicas run forward and backward
concurrently, and their param gradients are summed into the master's, so that the solver applies
one update equal to the single-device update on the whole batch:

- A loss normalised by the batch (VALID, BATCH_SIZE, FULL; Euclidean, Hinge, ...) is a mean, so
  replica i's loss weight is scaled by n_i / N; a loss with normalization NONE is a sum and keeps
  its weight (``Layer.batch_share``). With ignore_label and VALID normalisation each replica
  divides by its own count of valid labels: a weighted mean that equals the whole-batch one when
  the ignored labels are spread evenly (Caffe's multi-GPU training averages the same way).
- BatchNorm computes its batch statistics per device, over the device's slice, as Caffe's
  multi-GPU training does per GPU; its running averages are the first device's (Caffe's root
  solver's). Dropout draws its masks per device.

Throughput: each device first times a few iterations of its replica alone on its share of the
first batch (cached per device, net and slice shape; logged). While training the scheduler keeps
a moving average of each device's images/s from the time its slice took, re-splits when another
split would be predicted faster by more than ``rebalance_margin`` (10%, checked every
``rebalance_every`` = 20 iterations: a LeNet-sized net's slice times jitter by 5-10%, and each
re-split is a log line and a reshape), and leaves out a device whose images do not pay for the
cost of sending it params and gathering its gradients. It logs every split with its reason.
In deterministic mode (``--deterministic``) nothing is timed: :func:`rule_split` fixes the
split from the devices alone and it is never rebalanced, so two runs sum the same slices'
gradients and agree to the bit.
A replica whose memory is not the master's (a CPU beside a GPU master) gets its slice and the
weights, and sends its gradients back, on a copier thread pipelined with its passes
(:class:`_Copies`); what the copies still keep it waiting counts as its per-batch overhead.

A device that fails (an exception that is not a user error, e.g. a GPU lost or out of memory)
is dropped with an error line and the same batch is redone on the remaining devices, so no
update is lost; when no device remains, :class:`~cct.devices.DeviceError` says so and the solver
writes a snapshot of the last update before stopping.
"""
from __future__ import annotations

import hashlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import glog
from .devices import (BlasThreads, CPUDevice, Device, DeviceError, available_cores,
                      parse_devices)
from .backend import alongside, copy as copy_array, host, plans
from .errors import CCTError, bug_report, is_bug
from .params import GradientSource, NetSource


def proportional_split(total: int, speeds: Sequence[float]) -> List[int]:
    """``total`` items cut in proportion to ``speeds`` (largest remainders get the leftovers);
    every device with a positive speed gets at least one item while items last."""
    speeds = [max(0.0, float(s)) for s in speeds]
    active = [i for i, s in enumerate(speeds) if s > 0]
    if total < 0 or not active:
        raise ValueError(f"cannot split {total} items over speeds {speeds}")
    weight = sum(speeds[i] for i in active)
    exact = [total * s / weight for s in speeds]
    split = [int(np.floor(e)) for e in exact]
    order = sorted(active, key=lambda i: (split[i] - exact[i], -speeds[i]))
    for i in order[:total - sum(split)]:
        split[i] += 1
    for i in active:   # a zero share would leave a fast-enough device idle
        if split[i] == 0:
            donor = max(active, key=lambda j: split[j])
            if split[donor] > 1:
                split[donor] -= 1
                split[i] += 1
    return split


def batch_seconds(split: Sequence[int], speeds: Sequence[float],
                  overheads: Sequence[float]) -> float:
    """Predicted time of one batch: the slowest device's slice, plus the host's work of
    sending params to and gathering gradients from every device that takes part."""
    busy = [n / s for n, s in zip(split, speeds) if n]
    sync = sum(o for n, o in zip(split, overheads) if n)
    return max(busy) + sync if busy else float("inf")


def choose_devices(total: int, speeds: Sequence[float], overheads: Sequence[float],
                   names: Optional[Sequence[str]] = None) -> Tuple[List[int], str]:
    """The split of ``total`` with the shortest predicted batch time over the sets made of the
    k fastest devices (k = 1, 2, ...), and a sentence saying why."""
    order = sorted(range(len(speeds)), key=lambda i: -speeds[i])
    best: Optional[Tuple[float, List[int]]] = None
    for k in range(1, len(order) + 1):
        chosen = order[:k]
        masked = [speeds[i] if i in chosen else 0.0 for i in range(len(speeds))]
        split = proportional_split(total, masked)
        t = batch_seconds(split, speeds, overheads)
        if best is None or t < best[0]:
            best = (t, split)
    t, split = best
    left_out = [i for i in range(len(speeds)) if split[i] == 0]
    why = "in proportion to measured throughput"
    if left_out:
        alone = batch_seconds(proportional_split(total, speeds), speeds, overheads)
        names = names or [str(i) for i in range(len(speeds))]
        why += (f"; left out device(s) {', '.join(names[i] for i in left_out)}: predicted "
                f"{t:.3g} s/batch without them, {alone:.3g} s with all")
    return split, why


def rule_split(total: int, devices: Sequence[Device]) -> Tuple[List[int], str]:
    """Deterministic mode's split of ``total``, by a rule and not by timing (a measured split
    moves with the machine's load, and the split decides how the batch's gradient is summed,
    so two runs would differ in their last bits): with a GPU (or the stand-in) among the
    devices, the accelerators share the batch equally and CPU groups beside them take
    nothing (a GPU alone is the fast one: issue 30's CaffeNet, 2,277 img/s against the CPU's
    255); else each CPU group in proportion to its cores. And a sentence saying so."""
    cores = [len(getattr(d, "cores", ())) for d in devices]
    if any(c == 0 for c in cores):
        weights = [1.0 if c == 0 else 0.0 for c in cores]
        why = "the accelerators equally, none to the CPU groups beside them"
    else:
        weights = [float(c) for c in cores]
        why = "in proportion to each CPU group's cores"
    return proportional_split(total, weights), \
        f"deterministic mode's rule, nothing timed: {why}"


def gradient_source(net, devices) -> GradientSource:
    """What computes ``net``'s gradients on ``devices`` (a spelling such as ``"cpu:1,cpu:1"``
    or ``"cpu,gpu0"``, cct/devices.py, or a list of Devices): the net itself when that is one
    device of every core, else a HybridScheduler sharing every batch among them."""
    if isinstance(devices, str):
        devices = parse_devices(devices)
    devices = list(devices)
    names = ", ".join(d.name for d in devices)
    glog.info("solver.cpp:0", f"Training on {len(devices)} device(s): {names}")
    if (len(devices) == 1 and isinstance(devices[0], CPUDevice)
            and list(devices[0].cores) == available_cores()):
        return NetSource(net)
    return HybridScheduler(net, devices)


def master_place(devices, backend: str):
    """Where the solver's nets live: (devices left for the scheduler, their backend). One
    device with memory of its own (a GPU, the stand-in) is the plain single-net path on its
    backend (no scheduler). Among several devices, the first with memory of its own holds the
    master (the weights, the update, the gradients' sum): its replica then shares the master's
    weights, so a split that gives it every image copies no weight and no gradient, and only
    the others' slices cross the bus (a GPU is the fast device of a CPU+GPU machine; the CPU
    slices are the small ones)."""
    if isinstance(devices, str):
        devices = parse_devices(devices)
    own = [d for d in devices or () if not d.host_memory]
    if not own:
        return devices, backend
    own[0].activate()             # a GPU made current on this thread, where the nets run
    return (None if len(devices) == 1 else devices), own[0].backend


def master_backend(devices, backend: str) -> str:
    """Only the backend of :func:`master_place`, for callers that build their devices
    themselves, each from the spelling (a driver's groups, the optimizer's places): devices
    parsed here from a spelling are closed again; given Device objects stay the caller's."""
    placed, backend = master_place(devices, backend)
    if isinstance(devices, str):
        for d in placed or ():
            d.close()
    return backend


def _blob(net, name: str):
    """The net's own Blob (the layers' arrays, not pycaffe's host view)."""
    return net.blob_by_name(name)


class _Replica:
    """One device's copy of the net below the source layers."""

    def __init__(self, device: Device, net, loss_tops, outputs):
        self.device = device
        self.net = net
        self.loss_tops = loss_tops      # [(layer, top blob, weight)]
        self.outputs = outputs          # blob names the master reports
        self.inputs = net.input_blobs()
        self.n = 0
        self.speed: Optional[float] = None     # images/s, moving average
        self.overhead = 0.0                    # seconds per batch its copies add to its pass
        self.serial_copies = 0.0               # its copies' seconds, one after the other
        # Its copies to and from the master's memory, when its memory is another one (None
        # when it shares the master's arrays).
        self.copies: Optional[_Copies] = None


class _Copies:
    """A replica's copies to and from the master's memory, pipelined with its passes (issue
    30): on a thread of their own, its slice of the batch, then its weights in the order its
    forward first needs them, each layer starting as soon as its own have arrived (conv1's
    weights are small and come first; a fully connected layer's, the bulk, arrive while the
    convolutions compute); and each gradient back as soon as the backward of the lowest layer
    using it has run, while the layers below still compute (Caffe's NCCL reduces a layer's
    gradients in its after-backward callback; PyTorch DDP ships buckets). The gradients land
    in buffers on the master's memory, which the scheduler adds in its fixed order: the sums
    are the ones copying everything at the end gave.

    The replica receives the master's weights, not the update: the same bytes, and its device
    neither keeps a history nor makes a pass over the model to apply an update (a slow CPU's
    time is the split's bottleneck); the weights it computes with are the master's, bit for
    bit, by construction.

    On a GPU master the copies run on a stream of their own (``backend.aside``), after a mark
    taken once the master's update and the batch were queued: on the default stream they would
    wait behind the GPU replica's whole forward and backward, queued by another thread."""

    def __init__(self, master, replica: _Replica, param_table, activate):
        self.master = master
        self.net = replica.net
        self.inputs = replica.inputs
        net = replica.net
        rows = [(k, row) for k, row in enumerate(param_table) if row.lr_mult != 0]

        def lowest_layer(row) -> int:
            return min(net.param_layer_indices[i][0] for i in (row.net_id,) + row.sharers)

        # The weights in the order of their first use by the forward pass, which is also the
        # layer whose backward completes their gradient (the lowest layer using them).
        self.order = sorted(rows, key=lambda kr: lowest_layer(kr[1]))
        first_use = [lowest_layer(row) for _, row in self.order]
        # layer i may run once need[i] items have arrived: the slice, then weights in order
        self.need = [1 + sum(1 for f in first_use if f <= i) for i in range(len(net.layers))]
        self.complete_at: Dict[int, List[int]] = {}
        for (k, _), layer_id in zip(self.order, first_use):
            self.complete_at.setdefault(layer_id, []).append(k)
        xp = master.backend.xp
        self.grads = {k: xp.empty_like(master.learnable_params[k].diff) for k, _ in rows}
        aside = getattr(master.backend, "aside", None)
        if aside is not None and replica.device.host_memory:
            self._mark = aside.mark
            self._down = lambda dst, src, mark: aside.to_host(src, dst, after=mark)
            self._up = lambda dst, src, mark: aside.to_device(src, dst, after=mark)
        else:        # a host master, or two devices' memories: plain copies, in order
            self._mark = lambda: None
            self._down = lambda dst, src, mark: copy_array(dst, src)
            self._up = lambda dst, src, mark: copy_array(dst, src)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"cct-copies-{replica.device}",
                                       initializer=activate)
        self._cond = threading.Condition()
        self.active = False
        self.backward = False
        self.arrived = 0
        self.error: Optional[BaseException] = None
        self.mark = None
        self.fetch = None
        self.uploads: list = []
        self.shipped: set = set()
        self.waited = 0.0
        net.before_forward.append(self._before_forward)
        net.after_backward.append(self._after_backward)

    # -- the main thread -----------------------------------------------------------------------
    def start(self, source_tops, offset: int, n: int, backward: bool, mark) -> None:
        """Queues this iteration's slice and weights (after ``mark``) before the replica runs."""
        self.arrived, self.error, self.waited = 0, None, 0.0
        self.uploads, self.shipped = [], set()
        self.mark, self.backward, self.active = mark, backward, True
        self.fetch = self.pool.submit(self._fetch, source_tops, offset, n, mark)

    def abandon(self) -> None:
        """The replica failed: wait for what was queued, keep nothing."""
        self.active = False
        for f in [self.fetch] + self.uploads:
            if f is not None:
                f.exception()

    def close(self) -> None:
        self.active = False
        self.pool.shutdown(wait=True)

    # -- the copier thread ---------------------------------------------------------------------
    def _fetch(self, source_tops, offset: int, n: int, mark) -> None:
        try:
            for (_, src), dst in zip(source_tops, self.inputs):
                self._down(dst.data, src.data[offset:offset + n], mark)
            self._arrive()
            for _, row in self.order:
                self._down(self.net.params_list[row.net_id].data,
                           self.master.params_list[row.net_id].data, mark)
                self._arrive()
        except BaseException as e:
            with self._cond:
                self.error = e
                self._cond.notify_all()
            raise

    def _arrive(self) -> None:
        with self._cond:
            self.arrived += 1
            self._cond.notify_all()

    def _send(self, ks: Sequence[int], mark) -> None:
        for k in ks:
            self._up(self.grads[k], self.net.learnable_params[k].diff, mark)

    # -- the replica's thread ------------------------------------------------------------------
    def _before_forward(self, layer_id: int) -> None:
        if not self.active or self.arrived >= self.need[layer_id]:
            return
        t0 = time.perf_counter()
        with self._cond:
            while self.arrived < self.need[layer_id] and self.error is None:
                self._cond.wait()
        self.waited += time.perf_counter() - t0
        if self.error is not None:
            raise self.error

    def _after_backward(self, layer_id: int) -> None:
        if self.active and self.backward:
            ks = self.complete_at.get(layer_id)
            if ks:
                self._ship(ks)

    def _ship(self, ks: Sequence[int]) -> None:
        self.shipped.update(ks)
        self.uploads.append(self.pool.submit(self._send, list(ks), self.mark))

    def finish(self) -> None:
        """After the replica's pass: ship what no callback did, wait for every copy."""
        if self.backward:
            rest = [k for k, _ in self.order if k not in self.shipped]
            if rest:
                self._ship(rest)
        t0 = time.perf_counter()
        try:
            self.fetch.result()
            for f in self.uploads:
                f.result()
        finally:
            self.waited += time.perf_counter() - t0
            self.active = False


class HybridScheduler:
    """Runs ``master``'s forward/backward on several devices at once (see the module doc)."""

    def __init__(self, master, devices: Sequence[Device], *, rebalance_margin: float = 0.1,
                 rebalance_every: int = 20, probe_iters: int = 2, smoothing: float = 0.2,
                 split: Optional[Sequence[int]] = None,
                 throughput: Optional[Dict[Tuple[str, str, tuple], float]] = None,
                 deterministic: Optional[bool] = None):
        if not devices:
            raise DeviceError("the hybrid scheduler needs at least one device")
        self.master = master
        # The memory the master's arrays are in: its backend and device (on this thread).
        self.master_memory = (master.backend.name, master.backend.device())
        self.devices = list(devices)
        # Each device's probe, (device, net digest, slice shape) -> images/s: this scheduler's
        # own, or a dict shared on purpose by whoever builds several (a driver, an optimizer).
        self.throughput = {} if throughput is None else throughput
        self.rebalance_margin = rebalance_margin
        self.rebalance_every = rebalance_every
        self.probe_iters = probe_iters
        self.smoothing = smoothing
        # Deterministic mode (cct train --deterministic: the kernels' plans by rule too): the
        # split by rule_split, never timed nor rebalanced.
        self.by_rule = plans.deterministic() if deterministic is None else deterministic
        if len(master.source_layers()) == len(master.layers):
            raise DeviceError(f"net '{master.name}' has nothing to split across devices: every "
                              f"layer is a data layer.")
        self.source_tops = list(master.source_tops().items())
        self.batch = self._batch_size()
        self.digest = self._digest()
        # Each learnable param's multipliers and place among the master's params.
        self.param_table = master.param_table()
        # The params the solver updates (positions among the master's params): shared with
        # (host) or sent to the replicas each batch. Counted in that numbering, not the
        # learnable params' one, which differs once a layer shares a weight but owns its bias.
        self.updated_ids = [row.net_id for row in self.param_table if row.lr_mult != 0]
        self.blas_threads = BlasThreads(self.devices)
        self.replicas: List[_Replica] = []
        try:
            for d in self.devices:
                self.replicas.append(self._make_replica(d))
            self._free_master_activations()
            self.split: Optional[List[int]] = None
            self.fixed_split: Optional[List[int]] = None
            self.iterations = 0
            if split is not None:
                self.set_split(split)
        except BaseException:
            self.close()        # what was made so far, and the BLAS's thread count
            raise

    # -- construction ------------------------------------------------------------------------
    def _batch_size(self) -> int:
        sizes = {name: blob.shape[0] if blob.num_axes else None
                 for name, blob in self.source_tops}
        distinct = set(sizes.values())
        if len(distinct) != 1 or None in distinct:
            shown = ", ".join(f"'{n}' {b.shape}" for n, b in self.source_tops)
            raise DeviceError(f"net '{self.master.name}': the data layers' tops must share "
                              f"their first axis (the batch) to be split across devices; "
                              f"got {shown}.")
        return distinct.pop()

    def _digest(self) -> str:
        return hashlib.sha1(self.master.param.SerializeToString()).hexdigest()[:16]

    def _make_replica(self, device: Device) -> _Replica:
        n = max(1, self.batch // len(self.devices))
        try:
            net = device.build(self.master.replica_param(n), self.master.dtype)
        except CCTError as e:
            raise DeviceError(f"net '{self.master.name}' cannot be split across devices: its "
                              f"replica for {n} of the batch's {self.batch} items on {device} "
                              f"fails to build ({e}). Every layer must work on part of the "
                              f"batch (e.g. no Reshape with a fixed first dimension).") from None
        if len(net.learnable_params) != len(self.master.learnable_params):
            raise DeviceError(f"replica of '{self.master.name}' on {device} has "
                              f"{len(net.learnable_params)} learnable params, the net "
                              f"{len(self.master.learnable_params)}")
        outputs = [self.master.blob_names[b] for b in self.master.output_ids()]
        replica = _Replica(device, net, net.loss_tops(), outputs)
        replica.n = n
        if not self._shares(replica):
            replica.copies = _Copies(self.master, replica, self.param_table,
                                     self._copier_activation(device))
        else:
            # Params the solver updates are the master's arrays; the others (lr_mult 0,
            # BatchNorm's running statistics) are the replica's own, copied from the master.
            # A param that shares an updated one's data (a weight tied across layers) takes
            # the master's array too: it was bound to the replica's own copy when the
            # replica was built, and would go on reading that stale copy.
            for row in self.param_table:
                if row.lr_mult != 0:
                    for j in (row.net_id,) + row.sharers:
                        net.params_list[j].share_data(self.master.params_list[j])
        self._push_frozen_params(replica)
        return replica

    def _copier_activation(self, device: Device):
        """What a replica's copier thread runs first: the device memory it moves arrays to and
        from made current (a GPU replica's, else the master's GPU)."""
        if not device.host_memory:
            return device.activate
        for d in self.devices:
            if not d.host_memory and (d.backend, d.device_id) == self.master_memory:
                return d.activate
        return None

    def _mark(self):
        """Where the replicas' copies start: after the work queued so far for the master (its
        update, this batch), on a GPU master; nothing to wait for elsewhere."""
        aside = getattr(self.master.backend, "aside", None)
        return aside.mark() if aside is not None else None

    def refresh_replicas(self) -> None:
        """After the master's params were replaced (a restored snapshot): the replicas'
        own copies (lr_mult 0, BatchNorm's statistics) follow; updated params are the
        master's arrays (host devices) or sent every batch (the others)."""
        for replica in self.replicas:
            replica.device.run(self._push_frozen_params, replica)

    def _push_frozen_params(self, replica: _Replica) -> None:
        updated = set(self.updated_ids)
        for j in (row.net_id for row in self.param_table):
            if j not in updated:
                copy_array(replica.net.params_list[j].data, self.master.params_list[j].data)

    def _free_master_activations(self) -> None:
        """The master never runs the layers below its data layers while the scheduler trains:
        drop their activations (pycaffe's ``net.forward()`` reshapes them back)."""
        keep = {id(b) for _, b in self.source_tops}
        keep |= {id(b) for b in self.master.output_blobs()}
        keep |= {id(p) for p in self.master.params_list}
        for blob in self.master.blobs_list:
            if id(blob) not in keep:
                blob.reshape((0,))

    # -- measuring ---------------------------------------------------------------------------
    def _probe(self, replica: _Replica) -> float:
        """Images/s of the device alone on its slice of the current batch (cached)."""
        shape = tuple(replica.inputs[0].shape) if replica.inputs else (replica.n,)
        key = (replica.device.name, self.digest, shape)
        if key not in self.throughput:
            def timed() -> float:
                replica.net.forward_backward()        # warm-up: kernels pick their layouts
                replica.device.synchronize()
                t0 = time.perf_counter()
                for _ in range(self.probe_iters):
                    replica.net.forward_backward()
                replica.device.synchronize()
                return (time.perf_counter() - t0) / self.probe_iters
            seconds = replica.device.run(timed)
            self.throughput[key] = replica.n / seconds
            glog.info("scheduler.py:0", f"Device {replica.device} runs {self.master.name} at "
                      f"{self.throughput[key]:.4g} img/s alone (slice of {replica.n}, "
                      f"{self.probe_iters} timed iterations)")
        self._push_frozen_params(replica)  # the probe moved BatchNorm's running averages
        return self.throughput[key]

    def _measure_overhead(self, replica: _Replica) -> float:
        """Seconds to send the replica its slice and weights and add its gradients to a scratch
        copy of the master's, one after the other (an upper bound: while training, the copies
        overlap the replica's passes and what is left shows in its measured time)."""
        xp = self.master.backend.xp
        scratch = [xp.zeros_like(p.diff) for p in self.master.learnable_params]
        t0 = time.perf_counter()
        if replica.copies is not None:
            replica.copies.start(self.source_tops, 0, replica.n, True, self._mark())
            replica.copies.finish()    # no backward ran: every gradient is shipped here
        self._gather(replica, scratch)
        self.master.backend.synchronize()
        return time.perf_counter() - t0

    def _first_split(self) -> None:
        if len(self.replicas) == 1:        # nothing to choose: the device takes everything
            self.replicas[0].speed = 1.0
            self._apply_split([self.batch])
            return
        if self.by_rule:
            self._resplit("first split")
            return
        self._fill_inputs_all()
        failed = []
        for r in self.replicas:
            try:
                r.speed = self._probe(r)
            except CCTError as e:
                raise self._in_slice(e, r) from None
            except Exception as e:         # the device itself
                failed.append((r, e))
                continue
            r.overhead = r.serial_copies = self._measure_overhead(r)
        if failed:
            self._drop(failed)
        else:
            self._resplit("first split")

    def _in_slice(self, error: CCTError, replica: _Replica) -> CCTError:
        """The user's error, saying where it happened."""
        return type(error)(f"{error} (on device {replica.device}, a slice of {replica.n} of "
                           f"the batch's {self.batch} items)")

    def _drop(self, failed) -> None:
        """Leaves out devices that raised and splits the batch over the others (DeviceError
        when none is left). A programming error is not a lost device: it stops the run."""
        for r, e in failed:
            if is_bug(e):
                glog.logger.error(bug_report(f"Device {r.device}", e),
                                  extra={"caffe_src": "scheduler.py:0"})
                raise e
        for r, e in failed:
            glog.logger.error(f"Device {r.device} failed: {type(e).__name__}: {e}",
                              extra={"caffe_src": "scheduler.py:0"})
            self.replicas.remove(r)
            if r.copies is not None:
                r.copies.close()
            r.device.close()
        if not self.replicas:
            r, e = failed[-1]
            raise DeviceError(f"every device of the hybrid scheduler failed; the last, "
                              f"{r.device}, with {type(e).__name__}: {e}")
        self.fixed_split = None
        for r in self.replicas:
            r.speed = r.speed or 1.0      # never measured (a fixed split): equal shares
        self._resplit(f"{', '.join(str(r.device) for r, _ in failed)} lost; redoing the "
                      f"batch on {', '.join(str(r.device) for r in self.replicas)}")

    # -- splitting ---------------------------------------------------------------------------
    def _resplit(self, reason: str) -> None:
        if self.by_rule:
            split, why = rule_split(self.batch, [r.device for r in self.replicas])
        else:
            split, why = choose_devices(self.batch, [r.speed for r in self.replicas],
                                        [r.overhead for r in self.replicas],
                                        [r.device.name for r in self.replicas])
        self._apply_split(split)
        parts = ", ".join(f"{r.device} {r.n}" + ("" if self.by_rule else
                                                  f" ({r.speed:.4g} img/s)")
                          for r in self.replicas)
        glog.info("scheduler.py:0", f"Hybrid split of {self.batch} ({reason}): {parts}; {why}")

    def set_split(self, split: Optional[Sequence[int]]) -> None:
        """Fixes the split by hand (Caffe con Troll's prototxt split): ``split[i]`` items of
        every batch to device i, no rebalancing; None hands it back to the measurements."""
        if split is None:
            self.fixed_split = None
            return
        split = [int(n) for n in split]
        if len(split) != len(self.replicas) or sum(split) != self.batch or min(split) < 0:
            raise DeviceError(f"a split of the batch of {self.batch} over "
                              f"{len(self.replicas)} device(s) must be {len(self.replicas)} "
                              f"counts >= 0 adding up to {self.batch}; got {split}.")
        self.fixed_split = split
        self._apply_split(split)
        parts = ", ".join(f"{r.device} {r.n}" for r in self.replicas)
        glog.info("scheduler.py:0", f"Hybrid split of {self.batch} (fixed): {parts}")

    def _apply_split(self, split: Sequence[int]) -> None:
        self.split = list(split)
        for r, n in zip(self.replicas, split):
            r.n = n
            if n:
                for blob in r.inputs:
                    blob.reshape((n,) + tuple(blob.shape[1:]))

    def _maybe_rebalance(self) -> None:
        if (self.fixed_split is not None or self.by_rule
                or self.iterations % self.rebalance_every):
            return
        speeds = [r.speed for r in self.replicas]
        overheads = [r.overhead for r in self.replicas]
        ideal, _ = choose_devices(self.batch, speeds, overheads)
        now = batch_seconds(self.split, speeds, overheads)
        better = batch_seconds(ideal, speeds, overheads)
        if ideal != self.split and better < now * (1.0 - self.rebalance_margin):
            self._resplit(f"rebalanced: predicted {better:.3g} s/batch instead of {now:.3g} s")

    def _shares(self, replica: _Replica) -> bool:
        """Whether the replica's updated params are the master's arrays: its device's memory
        is the master's (host memory for both, or the master's own GPU), so that nothing is
        copied for it."""
        return (replica.device.backend, replica.device.device_id) == self.master_memory

    # -- one iteration -----------------------------------------------------------------------
    def _gather(self, replica: _Replica, into: Sequence[np.ndarray]) -> None:
        """Adds the replica's param gradients into ``into`` (the master's diffs): its own
        arrays where it shares the master's memory, else what its copies brought back."""
        copies = replica.copies
        for k, (row, rp) in enumerate(zip(self.param_table, replica.net.learnable_params)):
            if row.lr_mult != 0:
                into[k] += copies.grads[k] if copies is not None else alongside(into[k], rp.diff)

    def _fill_inputs(self, replica: _Replica, offset: int) -> None:
        n = replica.n
        for (_, src), dst in zip(self.source_tops, replica.inputs):
            copy_array(dst.data, src.data[offset:offset + n])

    def _fill_inputs_all(self) -> None:
        offset = 0
        for r in self.replicas:
            if r.n:
                r.device.run(self._fill_inputs, r, offset)
            offset += r.n

    def _run_replica(self, replica: _Replica, offset: int, backward: bool):
        copies = replica.copies
        if copies is None:
            self._fill_inputs(replica, offset)
        else:
            try:
                return self._run_with_copies(replica, offset, backward)
            except BaseException:
                copies.abandon()
                raise
        return self._run_pass(replica, backward)

    def _run_with_copies(self, replica: _Replica, offset: int, backward: bool):
        loss, seconds = self._run_pass(replica, backward)
        t0 = time.perf_counter()
        replica.copies.finish()
        return loss, seconds + time.perf_counter() - t0

    def _seed_losses(self, replica: _Replica) -> List[float]:
        """Each loss top's diff set to its weight times the replica's share of the batch (a
        per-item top's loss is a sum over the items: share 1); the shares, in order."""
        share = []
        for layer, top, w in replica.loss_tops:
            if top.num_axes and top.shape[0] == replica.n:
                s = 1.0
            else:
                s = layer.batch_share(replica.n, self.batch)
            top.diff[...] = w * s
            share.append(s)
        return share

    def _run_pass(self, replica: _Replica, backward: bool):
        share = self._seed_losses(replica)
        t0 = time.perf_counter()
        if backward:
            replica.net.clear_param_diffs()
            replica.net.forward_backward()
        else:
            replica.net.forward_prefilled()
        replica.device.synchronize()
        seconds = time.perf_counter() - t0
        loss = sum(w * s * float(top.data.sum())
                   for (_, top, w), s in zip(replica.loss_tops, share))
        return loss, seconds

    def _run_all(self, backward: bool) -> List[Tuple[_Replica, float, float]]:
        while True:
            futures, offset = [], 0
            # Every replica's copies are queued before any replica runs (a GPU's work queued
            # first would hold them back), and go on while the replicas compute.
            mark = self._mark()
            for r in self.replicas:
                if r.n and r.copies is not None:
                    r.copies.start(self.source_tops, offset, r.n, backward, mark)
                offset += r.n
            offset = 0
            for r in self.replicas:
                if r.n:
                    futures.append((r, r.device.submit(self._run_replica, r, offset, backward)))
                offset += r.n
            results, failed = [], []
            for r, f in futures:
                try:
                    loss, seconds = f.result()
                    results.append((r, loss, seconds))
                except CCTError as e:          # the user's net or data, not the device
                    raise self._in_slice(e, r) from None
                except Exception as e:         # the device itself
                    failed.append((r, e))
            if not failed:
                return results
            self._drop(failed)

    def forward_backward(self, backward: bool = True) -> float:
        """The whole batch's loss; with ``backward``, the master's param diffs gain the whole
        batch's gradient (Caffe's Net::ForwardBackward, spread over the devices)."""
        m = self.master
        m.next_batch()
        if self.source_tops[0][1].shape[0] != self.batch:
            # The master's Input was given another batch (a driver group's batch re-sized):
            # check the tops agree, and split it by the speeds known.
            batch = self.batch = self._batch_size()
            if self.split is not None:
                if self.fixed_split is not None:
                    raise DeviceError(f"the batch changed to {batch}: the fixed split "
                                      f"{self.fixed_split} no longer adds up; set_split(None)")
                self._resplit(f"the batch is now {batch}")
        if self.split is None:
            self._first_split()
        solo = self._solo() if backward else None
        if solo is not None:
            try:
                return self._solo_pass(solo)
            except CCTError as e:              # the user's net or data, not the device
                raise self._in_slice(e, solo) from None
            except Exception as e:             # the device itself
                self._drop([(solo, e)])

        results = self._run_all(backward)
        if backward:
            diffs = [p.diff for p in m.learnable_params]
            for r, _, _ in results:
                self._gather(r, diffs)
        self._report_outputs(results)
        for r, _, seconds in results:
            # A replica's copies: what they kept it waiting is a cost per batch (its
            # overhead), not per image.
            waited = min(r.copies.waited, seconds) if r.copies is not None else 0.0
            measured = r.n / max(seconds - waited, 1e-9)
            r.speed = measured if r.speed is None else (
                (1 - self.smoothing) * r.speed + self.smoothing * measured)
            if r.copies is not None:
                r.overhead = (1 - self.smoothing) * r.overhead + self.smoothing * waited
        self.iterations += 1
        self._maybe_rebalance()
        return sum(loss for _, loss, _ in results)

    def _solo(self) -> Optional[_Replica]:
        """The replica given the whole batch, when it shares the master's memory and this is
        not an iteration that measures (every ``rebalance_every``-th, as the rebalancing
        reads): it then runs alone as the plain one-device path does (:meth:`_solo_pass`)."""
        if self.iterations % self.rebalance_every == 0:
            return None
        busy = [r for r in self.replicas if r.n]
        if len(busy) != 1 or busy[0].copies is not None:
            return None
        return busy[0]

    def _solo_pass(self, r: _Replica):
        """A device given nothing costs nothing, and neither does the scheduler: the replica
        with the whole batch runs as the one-device path does, its loss left on the device
        (read when the log shows it), its outputs copied on the device, nothing timed, so no
        iteration waits for a GPU; the iterations that measure go the whole way."""
        def run():
            self._fill_inputs(r, 0)
            self._seed_losses(r)
            r.net.clear_param_diffs()
            return r.net.forward_backward(defer=True)
        loss = r.device.run(run)
        self._gather(r, [p.diff for p in self.master.learnable_params])
        for name in r.outputs:
            src, dst = _blob(r.net, name), _blob(self.master, name)
            if dst.shape != src.shape:
                dst.reshape(src.shape)
            copy_array(dst.data, src.data)
        self.iterations += 1
        return loss

    def forward(self) -> float:
        return self.forward_backward(backward=False)

    # A gradient source (cct/params.py) for the solver.
    compute_gradients = forward_backward
    compute_loss = forward

    def refresh(self) -> None:
        self.refresh_replicas()

    def _report_outputs(self, results) -> None:
        """The master's output blobs (what the solver displays) from the replicas': slices put
        back together where a blob is per item, else a mean weighted by slice size."""
        for name in self.replicas[0].outputs:
            parts = [(r, host(_blob(r.net, name).data)) for r, _, _ in results]
            dst = _blob(self.master, name)
            per_item = all(a.ndim and a.shape[0] == r.n for r, a in parts)
            if per_item:
                whole = np.concatenate([a for _, a in parts])
                if dst.shape != whole.shape:
                    dst.reshape(whole.shape)
                copy_array(dst.data, whole)
            else:
                if dst.shape != parts[0][1].shape:
                    dst.reshape(parts[0][1].shape)
                copy_array(dst.data, np.asarray(sum(a * (r.n / self.batch) for r, a in parts),
                                                dst.dtype))

    # -- the end -------------------------------------------------------------------------------
    def pull_statistics(self) -> None:
        """Copies what only the replicas hold back into the master (BatchNorm's running
        averages, from the first device), so snapshots and test nets see them."""
        if not self.replicas:
            return
        first = self.replicas[0]
        updated = set(self.updated_ids)
        for j in (row.net_id for row in self.param_table):
            if j not in updated:
                copy_array(self.master.params_list[j].data, first.net.params_list[j].data)

    def close(self) -> None:
        for r in self.replicas:
            if r.copies is not None:
                r.copies.close()
            r.net.close()
            r.device.close()
        self.blas_threads.release()
