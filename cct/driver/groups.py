"""Compute groups: each a copy of the train net below its data layers, with params of its own,
computing gradients on batches taken in turn from the solver's data layers.

Omnivore's groups are synchronous inside (the batch split across members) and asynchronous
between them. A group here is a gradient source over its own net: that net alone on one
device, or a HybridScheduler splitting each batch across the group's devices (a group's net
is then the scheduler's master). Every group computes on a whole mini-batch, as Omnivore's do.
"""
from __future__ import annotations

import collections
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..backend import copy as copy_array, host
from ..devices import Device, parse_devices
from ..errors import CCTError
from ..glog import quiet
from ..net import Net
from ..params import NetSource, ParamSet, statistics_positions
from ..proto import caffe_pb2
from ..scheduler import HybridScheduler


def unlearned_params(net) -> List:
    """The params of ``net`` that no update changes and a group keeps its own of: BatchNorm's
    running averages, which its forward passes move (every other param a net owns is
    learnable, as in Caffe). A group's replica of the train net has them in the same order
    (its data layers, replaced by Input layers, have none)."""
    return [net.learnable_params[k] for k in statistics_positions(net)]


def process_group_net(net_bytes: bytes, dtype: str, seed: Optional[int], index: int,
                      device: Optional[str], context, source: str) -> Net:
    """Group ``index``'s net in a process of its own (a group process, a Ray actor): on
    ``device`` (a spelling) when given, made current here, else on the CPU; under the driver's
    run context (a new process has none of its settings: its plans would be timed under
    --deterministic, its GEMMs float32 under bf16); drawing from its own generator, seeded from
    random_seed and the index as the threads engine's groups are."""
    backend = "cpu"
    if device is not None:
        place = parse_devices(device)[0]
        place.activate()
        backend = place.backend
    context.replace(backend=backend).apply()
    param = caffe_pb2.NetParameter.FromString(net_bytes)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))
    with quiet():
        return Net(param, backend=backend, dtype=np.dtype(dtype), source=source, rng=rng)

def show_outputs(master, values: Sequence[np.ndarray]) -> None:
    """A remote group's output values into the train net's output blobs, where the log reads
    them (the processes and Ray engines)."""
    for blob, value in zip(master.output_blobs(), values):
        if blob.shape != value.shape:
            blob.reshape(value.shape)
        copy_array(blob.data, value)


class BatchFeeder:
    """The solver's train net's data layers, handing out records in their order: each request
    takes the next ``n`` records of the epoch (from the current batch of the data layers, then
    the next ones), so groups never see the same record, none is skipped, and one group of
    the train net's batch size sees plain training's batches. It counts what each group took
    (the log's "epoch shared" lines)."""

    def __init__(self, master):
        self.master = master
        self.sources = master.source_layers()
        self.tops = list(master.source_tops().values())
        self.batch = self.tops[0].shape[0] if self.tops else 0
        self.lock = threading.Lock()
        self.left = 0                      # records of the current batch not handed out yet
        self.records: Dict[int, int] = collections.Counter()   # group index -> records taken

    def check_split(self) -> None:
        """A batch other than the data layers' splits their batches: every top must then hold
        one record per row."""
        odd = [t for t in self.tops if not t.shape or t.shape[0] != self.batch]
        if odd:
            raise CCTError(f"per-group batch sizes take the data layers' records one by one, "
                           f"but top shapes {[tuple(t.shape) for t in self.tops]} do not all "
                           f"start with the batch size {self.batch}; give every group the "
                           f"train net's batch")

    def _take(self, outputs: Sequence, n: int, group: int) -> None:
        pos = 0
        while pos < n:
            if self.left == 0:
                self.master.next_batch()
                self.left = self.batch
            take = min(n - pos, self.left)
            start = self.batch - self.left
            for src, dst in zip(self.tops, outputs):
                if src.shape[1:] != dst.shape[1:]:
                    raise CCTError(f"the data layers' records changed shape from "
                                   f"{tuple(dst.shape[1:])} to {tuple(src.shape[1:])}: a "
                                   f"group's batch must hold records of one shape")
                copy_array(dst[pos:pos + take], src.data[start:start + take])
            pos += take
            self.left -= take
        self.records[group] += n

    def feed(self, inputs: Sequence, n: Optional[int] = None, group: int = 0) -> None:
        """The next ``n`` records (the data layers' batch by default) into ``inputs`` (a group
        net's Input blobs, in the same order), reshaped to hold them."""
        n = self.batch if n is None else n
        with self.lock:
            if self.left == 0 and n == self.batch:
                # The data layers' own batch, whatever shape its records have this time.
                self.master.next_batch()
                for src, dst in zip(self.tops, inputs):
                    if dst.shape != src.shape:
                        dst.reshape(src.shape)
                    copy_array(dst.data, src.data)
                self.records[group] += n
                return
            for dst in inputs:
                if dst.shape[0] != n:
                    dst.reshape((n,) + tuple(dst.shape[1:]))
            self._take([dst.data for dst in inputs], n, group)

    def feed_arrays(self, arrays: Sequence, n: Optional[int] = None, group: int = 0) -> None:
        """The next ``n`` records into the first ``n`` rows of preallocated arrays (a group
        process's shared block)."""
        n = self.batch if n is None else n
        with self.lock:
            self._take([a[:n] for a in arrays], n, group)

    # -- snapshots: the records of the current batch not handed out yet ------------------------
    def state(self) -> Tuple[dict, Dict[str, np.ndarray]]:
        arrays = {f"top{i}": np.array(host(t.data[self.batch - self.left:]))
                  for i, t in enumerate(self.tops)} if self.left else {}
        return {"left": self.left, "records": {str(k): v for k, v in self.records.items()}}, \
            arrays

    def load_state(self, state: dict, arrays: Dict[str, np.ndarray]) -> None:
        left = int(state.get("left", 0))
        for i, t in enumerate(self.tops):
            if left:
                rows = arrays[f"top{i}"]
                if len(rows) != left or tuple(rows.shape[1:]) != tuple(t.shape[1:]):
                    raise ValueError(f"the saved records of top {i} have shape "
                                     f"{tuple(rows.shape)}, not {left} records of "
                                     f"{tuple(t.shape[1:])}")
                copy_array(t.data[self.batch - left:], rows)
        self.left = left
        self.records = collections.Counter({int(k): int(v)
                                            for k, v in state.get("records", {}).items()})


class Group:
    """One compute group: its net (Input layers where the train net has data layers), its
    params, the version of the weights it last read and its gradient source."""

    def __init__(self, index: int, feeder: BatchFeeder, devices: Optional[List[Device]] = None,
                 iter_size: int = 1, seed: Optional[int] = None, batch: Optional[int] = None):
        master = feeder.master
        self.index = index
        self.feeder = feeder
        self.steps_done = 0
        self.devices = list(devices or [])
        self.iter_size = iter_size
        self.batch = batch or feeder.batch     # records per pass (Hogbatch: per group)
        self.seconds = 0.0                     # the last step's pull and compute (engines)
        param = master.replica_param(self.batch)
        # The group's own generator (Caffe's per-thread RNG): its fillers (whose values the
        # store's weights replace) and its Dropout masks, whichever thread runs it. Group 0
        # draws its masks from the process-wide generator, as plain training does, so that one
        # group is plain training to the bit.
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))
        if len(self.devices) == 1:
            self.net = self.devices[0].build(param, master.dtype, rng)
        else:
            with quiet():
                self.net = Net(param, backend=master.backend.name, dtype=master.dtype,
                               source=f"<group {index}>", rng=rng)
        if index == 0:
            self.net.rng = None
        self.inputs = self.net.input_blobs()
        for mine, theirs in zip(self.net.params_list, master.params_list):
            copy_array(mine.data, theirs.data)     # lr_mult 0 params and statistics too
        self.params = ParamSet.of_net(self.net)
        self.source = (HybridScheduler(self.net, self.devices) if len(self.devices) > 1
                       else NetSource(self.net))
        self.read_version = 0
        self._pool: Optional[ThreadPoolExecutor] = None    # a several-device group's thread
        self.sync_fc = None        # (store, first FC layer, FC params, conv params): --sync-fc

    def use_sync_fc(self, store) -> None:
        """Run the InnerProduct layers and everything above them through the store, serially
        and on its current weights (Omnivore's FC server; cct/driver/store.py fc_step)."""
        net = self.net
        first = next((i for i, layer in enumerate(net.layers)
                      if layer.layer_param.type == "InnerProduct"), None)
        if first is None:
            raise CCTError(f"--sync-fc: net '{net.name}' has no InnerProduct layer")
        if self.iter_size != 1 or len(self.devices) > 1:
            raise CCTError("--sync-fc needs iter_size 1 and one device per group (the FC "
                           "layers run on the parameter store between a group's passes)")
        above = {id(b) for layer in net.layers[first:] for b in layer.blobs}
        fc = [k for k, b in enumerate(net.learnable_params) if id(b) in above]
        conv = [k for k in range(len(net.learnable_params)) if k not in set(fc)]
        self.sync_fc = (store, first, fc, conv)

    @property
    def pushed(self) -> Optional[List[int]]:
        """The params a push updates: all, or the conv ones with --sync-fc."""
        return self.sync_fc[3] if self.sync_fc else None

    @property
    def name(self) -> str:
        where = ",".join(d.name for d in self.devices) or "this thread"
        return f"group {self.index} ({where})"


    def submit(self, fn, *args) -> Future:
        """Run ``fn`` for this group off the driver's thread: on its device's thread, or,
        with several devices, on a thread of its own (its HybridScheduler keeps the devices'
        threads busy with their shares)."""
        if len(self.devices) == 1:
            return self.devices[0].submit(fn, *args)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"cct-group{self.index}")
        return self._pool.submit(fn, *args)

    def feed(self) -> None:
        """The next batch into the inputs now (SMA feeds its learners in order)."""
        self.feeder.feed(self.inputs, self.batch, self.index)

    def compute(self, fed: bool = False) -> float:
        """``iter_size`` batches' gradients summed in the group's param diffs; the mean loss.
        ``fed``: the (one) batch is already in the inputs (:meth:`feed`)."""
        self.steps_done += 1   # its net's running statistics are its own from here on
        self.net.clear_param_diffs()
        self.last_batch = self.batch
        if self.sync_fc:
            store, first, fc, _ = self.sync_fc
            self.feeder.feed(self.inputs, self.batch, self.index)
            self.net.forward_from_to(0, first - 1)
            loss = store.fc_step(self.net, first, fc, self.params)
            self.net.backward_from_to(first - 1, 0)
            return loss
        loss = 0.0
        for k in range(self.iter_size):
            if not (fed and k == 0):
                self.feeder.feed(self.inputs, self.batch, self.index)
            loss += self.source.compute_gradients()
        return loss / self.iter_size

    def _unlearned(self, master):
        """(this net's, the train net's) params that no update touches."""
        return zip(unlearned_params(self.net), unlearned_params(master))

    def copy_statistics_to(self, master) -> None:
        """What only this group's net holds back into the train net, for tests and
        snapshots."""
        self.source.pull_statistics()
        for mine, theirs in self._unlearned(master):
            copy_array(theirs.data, mine.data)

    def copy_statistics_from(self, master) -> None:
        """The train net's (restored) unlearned params into this group's net."""
        for mine, theirs in self._unlearned(master):
            copy_array(mine.data, theirs.data)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.source.close()
        self.net.close()
        for d in self.devices:
            d.close()
