"""The net graph (Caffe's ``net.cpp``): filtering by NetState, Split insertion, blob wiring,
shared params, the backward-need analysis, and forward/backward over a range of layers."""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import backend as backends
from . import heap
from .blob import Blob
from .errors import CCTError, LayerError, NetError
from .layers.base import Layer, create_layer
from .layers.conv import SiblingScratch, backward_siblings
from .glog import info
from .io import weights
from .io.prototxt import debug_string
from .proto import caffe_pb2
from .rng import using

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST


# ------------------------------------------------------------------------------------------------
# NetState filtering
# ------------------------------------------------------------------------------------------------
def state_meets_rule(state: caffe_pb2.NetState, rule: caffe_pb2.NetStateRule,
                     layer_name: str) -> bool:
    """Caffe's Net::StateMeetsRule, with its log lines."""
    if rule.HasField("phase") and rule.phase != state.phase:
        info("net.cpp:296", f"The NetState phase ({state.phase}) differed from the phase "
             f"({rule.phase}) specified by a rule in layer {layer_name}")
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        info("net.cpp:303", f"The NetState level ({state.level}) is above the min_level "
             f"({rule.min_level}) specified by a rule in layer {layer_name}")
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        info("net.cpp:311", f"The NetState level ({state.level}) is above the max_level "
             f"({rule.max_level}) specified by a rule in layer {layer_name}")
        return False
    for stage in rule.stage:
        if stage not in state.stage:
            info("net.cpp:325", f"The NetState did not contain stage '{stage}' specified by "
                 f"a rule in layer {layer_name}")
            return False
    for stage in rule.not_stage:
        if stage in state.stage:
            info("net.cpp:340", f"The NetState contained a not_stage '{stage}' specified by "
                 f"a rule in layer {layer_name}")
            return False
    return True


def filter_net(param: caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """Keep the layers whose include/exclude rules admit ``param.state`` (Caffe's FilterNet)."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    for lp in param.layer:
        if len(lp.include) and len(lp.exclude):
            raise NetError(f"Layer '{lp.name}' has both include and exclude rules; specify "
                           f"either include rules or exclude rules, not both.")
        included = len(lp.include) == 0
        for rule in lp.exclude:
            if state_meets_rule(param.state, rule, lp.name):
                included = False
        for rule in lp.include:
            if state_meets_rule(param.state, rule, lp.name):
                included = True
        if included:
            out.layer.add().CopyFrom(lp)
    return out


# ------------------------------------------------------------------------------------------------
# Split insertion (Caffe's insert_splits.cpp)
# ------------------------------------------------------------------------------------------------
def split_layer_name(layer_name: str, blob_name: str, top_idx: int) -> str:
    return f"{blob_name}_{layer_name}_{top_idx}_split"


def split_blob_name(layer_name: str, blob_name: str, top_idx: int, split_idx: int) -> str:
    return f"{blob_name}_{layer_name}_{top_idx}_split_{split_idx}"


def insert_splits(param: caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """Give every top consumed by more than one bottom its own Split layer, so that each
    consumer gets its own diff and the gradients are summed."""
    last_top: Dict[str, Tuple[int, int]] = {}
    source_of: Dict[Tuple[int, int], Tuple[int, int]] = {}
    consumers: Dict[Tuple[int, int], int] = {}
    loss_weight: Dict[Tuple[int, int], float] = {}
    for i, lp in enumerate(param.layer):
        for j, name in enumerate(lp.bottom):
            if name not in last_top:
                raise NetError(f"Unknown bottom blob '{name}' (layer '{lp.name}', bottom index "
                               f"{j}): no earlier layer produces it.")
            src = last_top[name]
            source_of[(i, j)] = src
            consumers[src] = consumers.get(src, 0) + 1
        for j, name in enumerate(lp.top):
            last_top[name] = (i, j)
        # A top used as a loss counts as one more consumer of it.
        for j in range(min(len(lp.loss_weight), len(lp.top))):
            src = last_top[lp.top[j]]
            loss_weight[src] = lp.loss_weight[j]
            if lp.loss_weight[j]:
                consumers[src] = consumers.get(src, 0) + 1

    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    next_split: Dict[Tuple[int, int], int] = {}
    for i, lp in enumerate(param.layer):
        new = out.layer.add()
        new.CopyFrom(lp)
        for j, name in enumerate(lp.bottom):
            src = source_of[(i, j)]
            if consumers[src] > 1:
                k = next_split.get(src, 0)
                new.bottom[j] = split_blob_name(param.layer[src[0]].name, name, src[1], k)
                next_split[src] = k + 1
        for j, name in enumerate(lp.top):
            n = consumers.get((i, j), 0)
            if n > 1:
                lw = loss_weight.get((i, j), 0.0)
                split = out.layer.add(name=split_layer_name(lp.name, name, j), type="Split")
                split.bottom.append(name)
                for k in range(n):
                    split.top.append(split_blob_name(lp.name, name, j, k))
                    if lw:
                        split.loss_weight.append(lw if k == 0 else 0.0)
                if lw:
                    # The first split top carries the loss; consumers take the others.
                    del new.loss_weight[:]
                    next_split[(i, j)] = 1
    return out


# ------------------------------------------------------------------------------------------------
# The net
# ------------------------------------------------------------------------------------------------
class LearnableParam(NamedTuple):
    """One row of :meth:`Net.param_table`: a learnable param (Caffe's ``learnable_params_[k]``)
    as the update and the net's replicas see it."""
    net_id: int         # its position in ``params_list``
    lr_mult: float      # Caffe's params_lr_[k]
    decay_mult: float   # Caffe's params_weight_decay_[k]
    sharers: Tuple[int, ...] = ()   # the positions of the params that share its data


class SiblingGroup(NamedTuple):
    """Layers whose backward passes run as one (Net._find_sibling_fusions): the Split they
    read, their layer ids (ascending), and the Split's top each reads."""
    split: int
    layers: List[int]
    split_tops: List[int]


class PendingLoss:
    """A forward pass's weighted loss with terms still on a device: its host part, the
    (weight, device sum) of each loss top, and the layers' pending checks. Reading it
    (:meth:`value`, :func:`read_losses` for many at once) is one device-to-host copy; a
    failed check raises its layer's error then. The loss adds up on the host in the layers'
    order, as a forward pass that reads each term at once does, so both give the same number."""

    __slots__ = ("backend", "host", "terms", "checks")

    def __init__(self, backend, host: float, terms, checks):
        self.backend, self.host, self.terms, self.checks = backend, host, terms, checks

    def _arrays(self) -> list:
        xp = self.backend.xp
        return ([xp.reshape(s, (1,)).astype(np.float64) for _, s in self.terms]
                + [c.reshape(-1).astype(np.float64) for c, _ in self.checks])

    def _finish(self, values) -> float:
        n = len(self.terms)
        for k, (_, error) in enumerate(self.checks):
            any_bad, first = values[n + 2 * k: n + 2 * k + 2]
            if any_bad:
                raise error(int(first))
        loss = self.host
        for (w, _), v in zip(self.terms, values[:n]):
            loss += w * float(v)
        return loss

    def value(self) -> float:
        return read_losses([self])[0]


def read_losses(losses: Sequence) -> List[float]:
    """The values of ``losses`` (numbers, or PendingLoss of one backend) in one copy."""
    pending = [x for x in losses if isinstance(x, PendingLoss)]
    if not pending:
        return [float(x) for x in losses]
    backend = pending[0].backend
    arrays = [a for x in pending for a in x._arrays()]
    host = backends.host(backend.xp.concatenate(arrays)).tolist()
    out, at = [], 0
    for x in losses:
        if isinstance(x, PendingLoss):
            size = len(x.terms) + 2 * len(x.checks)
            out.append(x._finish(host[at:at + size]))
            at += size
        else:
            out.append(float(x))
    return out


class Net:
    """A net built from a NetParameter for one NetState (phase, level, stages).

    The attributes mirror Caffe's Net (layers, blobs, bottom/top vectors, learnable params with
    their lr_mult/decay_mult); other rooms read them through the accessors below. pycaffe's
    facade (``blobs``, ``params``, ``forward(**inputs)``, ``save`` ...) is cct/pycaffe.py's,
    attached to this class there as pycaffe.py attaches it to _caffe's Net.
    """

    def __init__(self, param: caffe_pb2.NetParameter, phase: Optional[int] = None,
                 level: Optional[int] = None, stages: Optional[Sequence[str]] = None,
                 backend: str = "cpu", dtype=np.float32, source: str = "<net>",
                 rng: Optional[np.random.Generator] = None):
        heap.keep_freed_memory()  # once per process: the iterations' temporaries reuse pages
        param = _copy(param)
        if phase is not None:
            param.state.phase = phase
        if level is not None:
            param.state.level = level
        if stages is not None:
            del param.state.stage[:]
            param.state.stage.extend(stages)
        self.backend = backends.get(backend)
        self.dtype = np.dtype(dtype)
        self.source = source
        self.phase = param.state.phase
        filtered = filter_net(param)
        info("net.cpp:53", "Initializing net from parameters: \n"
             + debug_string(filtered).rstrip("\n"))
        self.param = insert_splits(filtered)
        self.name = self.param.name
        # The net's own generator (fillers, Dropout), or None: the process-wide one (cct/rng.py).
        self.rng = rng
        # Caffe's Net::add_before_forward and add_after_backward: called with a layer's id
        # before its forward runs and once its backward has run (its params' gradients are
        # then complete, but for a weight shared with a lower layer), on the thread running
        # the pass. The hybrid scheduler (cct/scheduler.py) lets a replica's layer start once
        # its own weights have arrived, and ships each gradient while the layers below still
        # compute (Caffe's NCCL reduces a layer's gradients in the same callback).
        self.before_forward: List[Callable[[int], None]] = []
        self.after_backward: List[Callable[[int], None]] = []
        with using(rng):
            self._init()

    # -- construction ------------------------------------------------------------------------
    def _init(self) -> None:
        p = self.param
        self.layers: List[Layer] = []
        self.layer_names: List[str] = []
        self.blobs_list: List[Blob] = []
        self.blob_names: List[str] = []
        self.blob_need_backward: List[bool] = []
        self.bottom_vecs: List[List[Blob]] = []
        self.bottom_id_vecs: List[List[int]] = []
        self.bottom_need_backward: List[List[bool]] = []
        self.top_vecs: List[List[Blob]] = []
        self.top_id_vecs: List[List[int]] = []
        self.layer_need_backward: List[bool] = []
        self.blob_loss_weights: List[float] = []
        self.input_blob_indices: List[int] = []
        # params
        self.params_list: List[Blob] = []
        self.param_owners: List[int] = []
        self.param_display_names: List[str] = []
        self.param_layer_indices: List[Tuple[int, int]] = []
        self.param_names_index: Dict[str, int] = {}
        self.learnable_params: List[Blob] = []
        self.learnable_param_ids: List[int] = []
        self._sources: Optional[Tuple[int, ...]] = None     # source_layers(), once known
        self.params_lr: List[float] = []
        self.params_weight_decay: List[float] = []
        self.has_params_lr: List[bool] = []
        self.has_params_decay: List[bool] = []

        name_to_idx: Dict[str, int] = {}
        available: set = set()
        memory_used = 0
        for layer_id, lp in enumerate(p.layer):
            if not lp.HasField("phase"):
                lp.phase = self.phase
            if len(lp.propagate_down) and len(lp.propagate_down) != len(lp.bottom):
                raise NetError(f"Layer '{lp.name}': propagate_down must be given 0 or "
                               f"{len(lp.bottom)} times (once per bottom), got "
                               f"{len(lp.propagate_down)}.")
            info("layer_factory.hpp:77", f"Creating layer {lp.name}")
            layer = create_layer(lp, self.backend, self.dtype)
            self.layers.append(layer)
            self.layer_names.append(lp.name)
            info("net.cpp:86", f"Creating Layer {lp.name}")
            need_backward = False
            self.bottom_vecs.append([])
            self.bottom_id_vecs.append([])
            self.bottom_need_backward.append([])
            self.top_vecs.append([])
            self.top_id_vecs.append([])
            for bottom_id, bname in enumerate(lp.bottom):
                if bname not in available:
                    produced = bname in name_to_idx
                    why = ("it was already consumed by an earlier layer; a blob feeds one "
                           "in-place chain" if produced else "no earlier layer produces it")
                    raise NetError(f"Unknown bottom blob '{bname}' (layer '{lp.name}', bottom "
                                   f"index {bottom_id}): {why}.")
                blob_id = name_to_idx[bname]
                info("net.cpp:408", f"{lp.name} <- {bname}")
                self.bottom_vecs[-1].append(self.blobs_list[blob_id])
                self.bottom_id_vecs[-1].append(blob_id)
                available.discard(bname)
                nb = self.blob_need_backward[blob_id]
                if len(lp.propagate_down):
                    nb = bool(lp.propagate_down[bottom_id])
                self.bottom_need_backward[-1].append(nb)
                need_backward |= self.blob_need_backward[blob_id]
            for top_id, tname in enumerate(lp.top):
                self._append_top(lp, layer_id, top_id, tname, available, name_to_idx)
                if lp.type == "Input":
                    self.input_blob_indices.append(len(self.blobs_list) - 1)
            if layer.auto_top_blobs:
                needed = max(layer.min_top_blobs, layer.exact_num_top_blobs)
                for top_id in range(len(lp.top), needed):
                    self._append_top(lp, layer_id, top_id, "(automatic)", None, None)
            try:
                layer.setup(self.bottom_vecs[-1], self.top_vecs[-1])
            except CCTError:
                raise
            except (ValueError, IndexError, ZeroDivisionError) as e:
                shapes = ", ".join(str(b.shape) for b in self.bottom_vecs[-1])
                raise NetError(f"{lp.type} layer '{lp.name}' cannot be set up with bottom "
                               f"shape(s) {shapes}: {e}") from None
            info("net.cpp:124", f"Setting up {lp.name}")
            for top_id, top in enumerate(self.top_vecs[-1]):
                blob_id = self.top_id_vecs[-1][top_id]
                while len(self.blob_loss_weights) <= blob_id:
                    self.blob_loss_weights.append(0.0)
                lw = layer.loss_weights[top_id]
                self.blob_loss_weights[blob_id] = lw
                info("net.cpp:131", f"Top shape: {top.shape_string()}")
                if lw:
                    info("net.cpp:134", f"    with loss weight {_g(lw)}")
                memory_used += top.count
            info("net.cpp:139", f"Memory required for data: {memory_used * self.dtype.itemsize}")
            if len(lp.param) > len(layer.blobs):
                raise NetError(f"Too many params specified for layer '{lp.name}': "
                               f"{len(lp.param)} param {{}} blocks for {len(layer.blobs)} "
                               f"parameter blob(s).")
            layer.param_propagate_down = []
            for param_id in range(len(layer.blobs)):
                spec = lp.param[param_id] if param_id < len(lp.param) else caffe_pb2.ParamSpec()
                pnb = spec.lr_mult != 0
                need_backward |= pnb
                layer.param_propagate_down.append(pnb)
            for param_id in range(len(layer.blobs)):
                self._append_param(layer_id, param_id)
            self.layer_need_backward.append(need_backward)
            if need_backward:
                for blob_id in self.top_id_vecs[-1]:
                    self.blob_need_backward[blob_id] = True

        self._analyse_backward(p.force_backward)
        self.output_blob_indices = []
        for name in sorted(available):
            info("net.cpp:244", f"This network produces output {name}")
            self.output_blob_indices.append(name_to_idx[name])
        self.blob_names_index = {n: i for i, n in enumerate(self.blob_names)}
        self.layer_names_index = {n: i for i, n in enumerate(self.layer_names)}
        self._share_weights()
        self._relu_fused = self._find_relu_fusions()
        self._sibling_groups = self._find_sibling_fusions()
        self._relu_backward_fusions = self._find_relu_backward_fusions()
        self._sibling_scratch = SiblingScratch()  # the groups run one after another: one for all
        info("net.cpp:257", "Network initialization done.")

    def _find_relu_fusions(self) -> List[bool]:
        """Per layer: whether its forward also runs the ReLU layer after it, when a forward
        pass runs both (forward_from_to). That ReLU works in place on this layer's one top,
        with negative_slope 0, and nothing can read the top between the two layers, so the
        producer applying the ReLU as it writes the top (Layer.applies_relu: the CPU's
        convolution kernels) leaves every blob with the bits the two layers leave, and the
        ReLU's pass over the top, read and written through memory, is gone. (A top with a loss
        weight or another reader has a Split after it, insert_splits, so no ReLU reads it in
        place.)"""
        fused = [False] * len(self.layers)
        for i, (layer, relu) in enumerate(zip(self.layers, self.layers[1:])):
            tops = self.top_id_vecs[i]
            slope = getattr(relu, "negative_slope", None)
            # a slope of -0.0 makes +0 of -0 (0 * -0 = +0 and -0 + +0 = +0): not fused
            fused[i] = (relu.type == "ReLU" and slope == 0 and not np.signbit(slope)
                        and layer.applies_relu() and len(tops) == 1
                        and self.bottom_id_vecs[i + 1] == tops
                        and self.top_id_vecs[i + 1] == tops)
        return fused

    def _find_sibling_fusions(self) -> List["SiblingGroup"]:
        """The groups of layers whose backward passes run as one (conv.backward_siblings):
        two or more of a Split's consumers with the same Layer.sibling_key (GoogLeNet's
        inception modules: the 1x1, 3x3_reduce and 5x5_reduce convolutions of one bottom).
        Only on the CPU backend, where the measurements were made (bench/RESULTS.md)."""
        if self.backend.name != "cpu":
            return []
        groups = []
        for s, layer in enumerate(self.layers):
            if layer.type != "Split":
                continue
            by_key: Dict = {}
            for k, blob_id in enumerate(self.top_id_vecs[s]):
                users = [j for j in range(s + 1, len(self.layers))
                         if blob_id in self.bottom_id_vecs[j]]
                if len(users) != 1 or self.bottom_id_vecs[users[0]] != [blob_id]:
                    continue
                key = self.layers[users[0]].sibling_key()
                if key is not None:
                    by_key.setdefault(key, []).append((users[0], k))
            for members in by_key.values():
                if len(members) >= 2:
                    members.sort()
                    groups.append(SiblingGroup(s, [j for j, _ in members],
                                               [k for _, k in members]))
        return groups

    def _find_relu_backward_fusions(self) -> List[Tuple[int, Dict[int, int]]]:
        """(layer id, {bottom index: ReLU layer id}) for each layer that can run the backward
        of the ReLUs in place on its bottoms as it writes their diffs (Layer.takes_relu_backward:
        a Concat as it copies each bottom's share, GoogLeNet's inception outputs, where every
        branch ends in a ReLU; a MAX Pooling plane by plane, CaffeNet's pool1, 2 and 5; an LRN
        across channels as it stores each diff, AlexNet's norm1 and 2). Such a ReLU is the last
        layer to write the bottom before the layer, its only reader (another reader would have
        a Split between, insert_splits), so the diff it reads is the one the layer writes; its
        backward reads the blob's data (a slope >= 0: not backward_needs_bottom), there when
        the layer's backward runs. The ReLU's pass over memory, reading the diff just written
        and writing it again, is gone; every blob gets the same bits. Only on the CPU backend,
        where it was measured (bench/RESULTS.md)."""
        if self.backend.name != "cpu":
            return []
        fusions = []
        for c, layer in enumerate(self.layers):
            if not layer.takes_relu_backward():
                continue
            relus = {}
            for k, blob_id in enumerate(self.bottom_id_vecs[c]):
                writers = [j for j in range(c) if blob_id in self.top_id_vecs[j]]
                j = writers[-1] if writers else None
                if (j is not None and self.layers[j].type == "ReLU"
                        and self.bottom_id_vecs[j] == [blob_id]
                        and self.top_id_vecs[j] == [blob_id]
                        and not self.layers[j].backward_needs_bottom):
                    relus[k] = j
            if relus:
                fusions.append((c, relus))
        return fusions

    def _active_relu_backward_fusions(self, start: int, end: int) -> Dict[int, tuple]:
        """The roles of the ReLU backward fusions in a backward pass from ``start`` down to
        ``end``: ("relu", {bottom index: ReLU id}) for the layer and ("skip",) for its ReLUs,
        those in the range whose backward would run (the ReLU's and the layer's for that
        bottom)."""
        roles: Dict[int, tuple] = {}
        for c, relus in self._relu_backward_fusions:
            if not (end <= c <= start and self.layer_need_backward[c]):
                continue
            fused = {k: j for k, j in relus.items()
                     if end <= j and self.layer_need_backward[j]
                     and self.bottom_need_backward[j][0] and self.bottom_need_backward[c][k]}
            if fused:
                roles[c] = ("relu", fused)
                roles.update((j, ("skip",)) for j in fused.values())
        return roles

    def backward_turn(self, layer_id: int) -> int:
        """The layer at whose turn training's backward pass (backward_all) may run this layer's
        backward: its own, or for a stacked sibling its group's first layer's (the last of the
        group in the pass), where its top diff is read (blob_memory's lifetimes)."""
        for g in self._sibling_groups:
            if layer_id in g.layers:
                return g.layers[0]
        return layer_id

    def _active_siblings(self, start: int, end: int) -> Dict[int, tuple]:
        """Per layer id, its part in the sibling groups that run as one in a backward pass from
        ``start`` down to ``end``: ("run", group, propagate_down) for a group's first layer
        (the last to come in the pass, when every sibling's top diff is ready; whether the
        bottom diff is wanted, which the siblings must agree on), ("skip",) for the others, and
        ("split", tops) for the group's Split, which then adds only the tops still written
        (the first sibling's carrying the group's sum). A group runs as one only when its Split
        and all its layers are in the range and need backward alike."""
        roles: Dict[int, tuple] = {}
        for g in self._sibling_groups:
            if not (end <= g.split and g.layers[-1] <= start):
                continue
            if not all(self.layer_need_backward[j] for j in g.layers):
                continue
            down = {self.bottom_need_backward[j][0] for j in g.layers}
            if len(down) != 1:
                continue
            roles[g.layers[0]] = ("run", g, down.pop())
            for j in g.layers[1:]:
                roles[j] = ("skip",)
            dropped = set(g.split_tops[1:])
            tops = [t for k, t in enumerate(self.top_vecs[g.split]) if k not in dropped]
            if g.split in roles:   # two groups on one Split: drop both groups' tops
                tops = [t for t in roles[g.split][1] if t in tops]
            roles[g.split] = ("split", tops)
        return roles

    def _append_top(self, lp, layer_id, top_id, tname, available, name_to_idx) -> None:
        if name_to_idx is not None and top_id < len(lp.bottom) and tname == lp.bottom[top_id]:
            info("net.cpp:369", f"{lp.name} -> {tname} (in-place)")
            blob_id = name_to_idx[tname]
            self.top_vecs[layer_id].append(self.blobs_list[blob_id])
            self.top_id_vecs[layer_id].append(blob_id)
        elif name_to_idx is not None and tname in name_to_idx:
            raise NetError(f"Top blob '{tname}' produced by multiple sources: layer "
                           f"'{lp.name}' and an earlier layer both write it (only in-place "
                           f"layers, with top = bottom at the same index, may reuse a name).")
        else:
            info("net.cpp:382", f"{lp.name} -> {tname}")
            blob = Blob((), self.dtype, self.backend.xp)
            blob_id = len(self.blobs_list)
            self.blobs_list.append(blob)
            self.blob_names.append(tname)
            self.blob_need_backward.append(False)
            if name_to_idx is not None:
                name_to_idx[tname] = blob_id
            self.top_vecs[layer_id].append(blob)
            self.top_id_vecs[layer_id].append(blob_id)
        if available is not None:
            available.add(tname)

    def _append_param(self, layer_id: int, param_id: int) -> None:
        layer = self.layers[layer_id]
        lp = layer.layer_param
        has_spec = param_id < len(lp.param)
        spec = lp.param[param_id] if has_spec else caffe_pb2.ParamSpec()
        pname = spec.name
        self.param_display_names.append(pname or str(param_id))
        net_param_id = len(self.params_list)
        self.params_list.append(layer.blobs[param_id])
        self.param_layer_indices.append((layer_id, param_id))
        if not pname or pname not in self.param_names_index:
            self.param_owners.append(-1)
            if pname:
                self.param_names_index[pname] = net_param_id
            self.learnable_param_ids.append(len(self.learnable_params))
            self.learnable_params.append(layer.blobs[param_id])
            self.has_params_lr.append(spec.HasField("lr_mult"))
            self.has_params_decay.append(spec.HasField("decay_mult"))
            self.params_lr.append(spec.lr_mult)
            self.params_weight_decay.append(spec.decay_mult)
            return
        owner_id = self.param_names_index[pname]
        self.param_owners.append(owner_id)
        owner_layer, owner_param = self.param_layer_indices[owner_id]
        info("net.cpp:497", f"Sharing parameters '{pname}' owned by layer "
             f"'{self.layer_names[owner_layer]}', param index {owner_param}")
        this_blob = layer.blobs[param_id]
        owner_blob = self.layers[owner_layer].blobs[owner_param]
        if spec.share_mode == caffe_pb2.ParamSpec.PERMISSIVE:
            ok = this_blob.count == owner_blob.count
            rule = "count"
        else:
            ok = this_blob.shape == owner_blob.shape
            rule = "shape"
        if not ok:
            raise NetError(f"Cannot share param '{pname}' owned by layer "
                           f"'{self.layer_names[owner_layer]}' with layer '{lp.name}'; {rule} "
                           f"mismatch. Owner layer param shape is {owner_blob.shape_string()}; "
                           f"sharing layer shape is {this_blob.shape_string()}")
        lid = self.learnable_param_ids[owner_id]
        self.learnable_param_ids.append(lid)
        for has, values, field, what in (
                (self.has_params_lr, self.params_lr, "lr_mult", "lr_mult"),
                (self.has_params_decay, self.params_weight_decay, "decay_mult", "decay_mult")):
            if spec.HasField(field):
                v = getattr(spec, field)
                if has[lid] and values[lid] != v:
                    raise NetError(f"Shared param '{pname}' has mismatched {what}: "
                                   f"{_g(values[lid])} in layer '{self.layer_names[owner_layer]}'"
                                   f", {_g(v)} in layer '{lp.name}'.")
                has[lid] = True
                values[lid] = v

    def _analyse_backward(self, force_backward: bool) -> None:
        under_loss: set = set()
        skip_backp: set = set()
        for layer_id in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[layer_id]
            contributes = False
            skip_propagate = True
            for top_id, blob_id in enumerate(self.top_id_vecs[layer_id]):
                bname = self.blob_names[blob_id]
                if layer.loss_weights[top_id] or bname in under_loss:
                    contributes = True
                if bname not in skip_backp:
                    skip_propagate = False
                if contributes and not skip_propagate:
                    break
            if self.layer_need_backward[layer_id] and skip_propagate:
                self.layer_need_backward[layer_id] = False
                self.bottom_need_backward[layer_id] = [False] * len(self.bottom_vecs[layer_id])
            if not contributes:
                self.layer_need_backward[layer_id] = False
            name = self.layer_names[layer_id]
            if self.layer_need_backward[layer_id]:
                info("net.cpp:200", f"{name} needs backward computation.")
            else:
                info("net.cpp:202", f"{name} does not need backward computation.")
            for bottom_id, blob_id in enumerate(self.bottom_id_vecs[layer_id]):
                bname = self.blob_names[blob_id]
                if contributes:
                    under_loss.add(bname)
                else:
                    self.bottom_need_backward[layer_id][bottom_id] = False
                if not self.bottom_need_backward[layer_id][bottom_id]:
                    skip_backp.add(bname)
        if force_backward:
            for layer_id, layer in enumerate(self.layers):
                self.layer_need_backward[layer_id] = True
                for bottom_id, blob_id in enumerate(self.bottom_id_vecs[layer_id]):
                    nb = (self.bottom_need_backward[layer_id][bottom_id]
                          or layer.allow_force_backward(bottom_id))
                    self.bottom_need_backward[layer_id][bottom_id] = nb
                    self.blob_need_backward[blob_id] = self.blob_need_backward[blob_id] or nb
                layer.param_propagate_down = [True] * len(layer.blobs)

    def _share_weights(self) -> None:
        for i, owner in enumerate(self.param_owners):
            if owner >= 0:
                self.params_list[i].share_data(self.params_list[owner])
                self.params_list[i].share_diff(self.params_list[owner])

    # -- running -----------------------------------------------------------------------------
    def forward_from_to(self, start: int, end: int, defer: bool = False):
        """Run layers start..end inclusive; returns the weighted loss (Caffe's ForwardFromTo).
        On a device the loss and the layers' checks are read in one copy at the end; with
        ``defer`` they are not read at all: a :class:`PendingLoss` comes back instead, for the
        solver to read when it shows the loss, so that an iteration never waits for the GPU."""
        loss = 0.0
        terms, checks = [], []
        applied = False  # whether the layer before applied this one (a ReLU: _find_relu_fusions)
        with using(self.rng):
            for i in range(start, end + 1):
                layer = self.layers[i]
                bottom, top = self.bottom_vecs[i], self.top_vecs[i]
                for callback in self.before_forward:
                    callback(i)
                try:
                    layer.reshape(bottom, top)
                    fuse = i < end and self._relu_fused[i]
                    if fuse:
                        layer.forward(bottom, top, relu=True)
                    elif not applied:
                        layer.forward(bottom, top)
                    applied = fuse
                    if layer.pending_check is not None:
                        checks.append(layer.pending_check)
                        layer.pending_check = None
                    for t, w in zip(top, layer.loss_weights):
                        if w:
                            total = t.data.sum()
                            if self.backend.is_device(total):
                                terms.append((w, total))
                            else:
                                loss += w * float(total)
                except MemoryError as e:
                    self._out_of_memory(i, "forward", e)
                    raise
        if not (terms or checks):
            return loss
        pending = PendingLoss(self.backend, loss, terms, checks)
        return pending if defer else pending.value()

    def backward_from_to(self, start: int, end: int) -> None:
        """Run backward from layer ``start`` down to ``end`` inclusive, a layer at a time
        (pycaffe's Net.backward: every blob diff as Caffe leaves it)."""
        self._run_backward(start, end, {})

    def _run_backward(self, start: int, end: int, roles: Dict[int, tuple]) -> None:
        for i in range(start, end - 1, -1):
            if self.layer_need_backward[i]:
                role = roles.get(i, ())
                try:
                    if not role:
                        self.layers[i].backward(self.top_vecs[i], self.bottom_need_backward[i],
                                                self.bottom_vecs[i])
                    elif role[0] == "run":
                        g = role[1]
                        backward_siblings([self.layers[j] for j in g.layers],
                                          [self.top_vecs[j][0] for j in g.layers],
                                          self.bottom_vecs[i][0], role[2],
                                          self._sibling_scratch)
                    elif role[0] == "split":
                        self.layers[i].backward(role[1], self.bottom_need_backward[i],
                                                self.bottom_vecs[i])
                    elif role[0] == "relu":
                        bottom = self.bottom_vecs[i]
                        relu = [None] * len(bottom)
                        for k, j in role[1].items():
                            relu[k] = (bottom[k].data, self.layers[j].negative_slope)
                        self.layers[i].backward(self.top_vecs[i], self.bottom_need_backward[i],
                                                bottom, relu=relu)
                except MemoryError as e:
                    self._out_of_memory(i, "backward", e)
                    raise
                for callback in self.after_backward:
                    callback(i)

    def _out_of_memory(self, layer_id: int, direction: str, exc: MemoryError) -> None:
        """Raises a LayerError naming layer ``layer_id`` and the bytes it asked for when ``exc``
        is the backend's device running out of memory: a user's mistake, since a layer's memory
        grows with the batch the user sets. Returns for any other MemoryError."""
        size = self.backend.out_of_memory(exc)
        if size is None:
            return
        layer = self.layers[layer_id]
        device = self.backend.device()
        where = "the host" if device is None else f"{self.backend.name} device {device}"
        raise LayerError(f"{layer.type} layer '{self.layer_names[layer_id]}': out of memory on "
                         f"{where} allocating {size:,} bytes in the {direction} pass; lower the "
                         f"batch size (the data layer's batch_size, or an Input shape's first "
                         f"dim)") from exc

    def forward_prefilled(self, defer: bool = False):
        return self.forward_from_to(0, len(self.layers) - 1, defer)

    def backward_all(self) -> None:
        """The whole backward pass, for training (the solver's forward_backward): sibling
        groups run as one (_find_sibling_fusions) and layers run their bottoms' ReLUs
        (_find_relu_backward_fusions), unless a callback watches each layer's backward (Caffe's
        add_after_backward: it would see a sibling's param diffs before they are written, a
        ReLU's bottom diff already written)."""
        self._run_backward(len(self.layers) - 1, 0, self._training_roles())

    def _training_roles(self) -> Dict[int, tuple]:
        """The roles backward_all runs the layers in (_run_backward): the sibling groups' and
        the ReLU backward fusions', none under after_backward callbacks."""
        if self.after_backward:
            return {}
        last = len(self.layers) - 1
        return {**self._active_relu_backward_fusions(last, 0), **self._active_siblings(last, 0)}

    def forward_backward(self, defer: bool = False):
        loss = self.forward_prefilled(defer)
        self.backward_all()
        return loss

    def clear_param_diffs(self) -> None:
        for p in self.learnable_params:
            p.diff[...] = 0

    def reshape(self) -> None:
        """Propagate changed input shapes through every layer (Caffe's Net::Reshape)."""
        for i, layer in enumerate(self.layers):
            layer.reshape(self.bottom_vecs[i], self.top_vecs[i])

    def share_trained_layers_with(self, other: "Net") -> None:
        """Make this net's params the same arrays as ``other``'s layers of the same name (Caffe's
        ShareTrainedLayersWith, used by the solver's test nets)."""
        for layer_id, name in enumerate(other.layer_names):
            mine = self.layer_id(name)
            if mine is None:
                continue
            src = other.layers[layer_id]
            dst = self.layers[mine]
            if len(src.blobs) != len(dst.blobs):
                raise NetError(f"Layer '{name}': {len(src.blobs)} param blobs in the train net "
                               f"but {len(dst.blobs)} in the test net.")
            for i, (s, d) in enumerate(zip(src.blobs, dst.blobs)):
                if s.shape != d.shape:
                    raise NetError(f"Layer '{name}' param {i}: shape {s.shape} in the train "
                                   f"net but {d.shape} in the test net.")
                d.share_data(s)
                d.share_diff(s)

    # -- what the solver's helpers use: the data layers and the learnable params ---------------
    # The hybrid scheduler, the driver's groups and the optimizer feed replicas of the train net
    # from its data layers and sum or update their params; they ask for these rather than read
    # the bottom/top vectors and param bookkeeping, which stay the net's own.
    def source_layers(self) -> List[int]:
        """The ids of the layers that produce the batch: no bottoms, no params (Data,
        ImageData, HDF5Data, DummyData, MemoryData, Input, Python data layers). Found once:
        the layers and their params are fixed when the net is built, and next_batch asks for
        them every batch."""
        if self._sources is None:
            self._sources = tuple(i for i, layer in enumerate(self.layers)
                                  if not self.bottom_vecs[i] and not layer.blobs)
        return list(self._sources)

    def source_tops(self) -> "OrderedDict[str, Blob]":
        """The source layers' tops in layer order, by name: the net's own blobs (the layers'
        arrays, not pycaffe's host views)."""
        return OrderedDict((self.blob_names[b], self.blobs_list[b])
                           for i in self.source_layers() for b in self.top_id_vecs[i])

    def next_batch(self) -> None:
        """Run the source layers alone: their tops hold the next batch, and the layers above
        them are left as they are (a replica computes on it instead)."""
        self.source_layers()
        self.forward_layers(self._sources)

    def replica_param(self, batch: int) -> caffe_pb2.NetParameter:
        """This net's (filtered, split-inserted) NetParameter with every source layer turned
        into an Input layer of batch ``batch``: a net that computes on batches it is given,
        with the same params in the same order (the source layers have none)."""
        param = caffe_pb2.NetParameter()
        param.CopyFrom(self.param)
        for i in self.source_layers():
            old = param.layer[i]
            new = caffe_pb2.LayerParameter(name=old.name, type="Input", top=list(old.top))
            for b in self.top_id_vecs[i]:
                shape = (batch,) + tuple(self.blobs_list[b].shape[1:])
                new.input_param.shape.add().dim.extend(shape)
            param.layer[i].CopyFrom(new)
        return param

    def param_table(self) -> List[LearnableParam]:
        """One row per learnable param, in ``learnable_params``' order. The learnable params
        are exactly the params that own their data (Caffe's ``param_owners_[i] < 0``), in the
        same order; a param sharing another's data has no row: its owner's row stands for it
        and names it among its ``sharers``."""
        owners = [j for j, owner in enumerate(self.param_owners) if owner < 0]
        sharers = {j: tuple(i for i, owner in enumerate(self.param_owners) if owner == j)
                   for j in owners}
        return [LearnableParam(j, lr, decay, sharers[j])
                for j, lr, decay in zip(owners, self.params_lr, self.params_weight_decay)]

    # -- what other rooms read: the wiring, by layer and by name ------------------------------
    # Caffe's public accessors (net.hpp's bottom_ids, top_ids, blob_by_name, input_blobs ...):
    # the tools, the export, the diff sharing and pycaffe read the net through these rather
    # than through its bookkeeping lists.
    def bottom_blobs(self, layer_id: int) -> List[Blob]:
        """Layer ``layer_id``'s bottoms (Caffe's ``bottom_vecs()[layer_id]``): the net's own
        blobs, not pycaffe's host views."""
        return list(self.bottom_vecs[layer_id])

    def loss_tops(self) -> List[Tuple[Layer, Blob, float]]:
        """(layer, top, loss weight) of every top with a loss weight, in layer order: where
        backward starts, each top's diff holding its weight (a replica scales it by its share
        of the batch, fp16 by its loss scale)."""
        return [(layer, top, w) for i, layer in enumerate(self.layers)
                for top, w in zip(self.top_vecs[i], layer.loss_weights) if w]

    def top_blobs(self, layer_id: int) -> List[Blob]:
        """Layer ``layer_id``'s tops (Caffe's ``top_vecs()[layer_id]``)."""
        return list(self.top_vecs[layer_id])

    def bottom_ids(self, layer_id: int) -> List[int]:
        """The blob ids of layer ``layer_id``'s bottoms (Caffe's Net::bottom_ids)."""
        return list(self.bottom_id_vecs[layer_id])

    def top_ids(self, layer_id: int) -> List[int]:
        """The blob ids of layer ``layer_id``'s tops (Caffe's Net::top_ids)."""
        return list(self.top_id_vecs[layer_id])

    def input_ids(self) -> List[int]:
        """The blob ids of the Input layers' tops (Caffe's Net::input_blob_indices)."""
        return list(self.input_blob_indices)

    def output_ids(self) -> List[int]:
        """The blob ids of the blobs no layer consumes, by name (Caffe's
        Net::output_blob_indices)."""
        return list(self.output_blob_indices)

    def input_blobs(self) -> List[Blob]:
        """The Input layers' tops, in order (Caffe's Net::input_blobs)."""
        return [self.blobs_list[i] for i in self.input_blob_indices]

    def output_blobs(self) -> List[Blob]:
        """The blobs no layer consumes, by name (Caffe's Net::output_blobs)."""
        return [self.blobs_list[i] for i in self.output_blob_indices]

    def has_blob(self, name: str) -> bool:
        return name in self.blob_names_index

    def blob_by_name(self, name: str) -> Blob:
        """The net's own blob ``name`` (Caffe's Net::blob_by_name); a NetError names the net
        when it has none."""
        try:
            return self.blobs_list[self.blob_names_index[name]]
        except KeyError:
            raise NetError(f"no blob named '{name}' in net '{self.name}'") from None

    def layer_id(self, name: str) -> Optional[int]:
        """The position of layer ``name``, or None when the net has no such layer (a filtered
        phase or stage left it out)."""
        return self.layer_names_index.get(name)

    def forward_layers(self, layer_ids: Sequence[int]) -> None:
        """Reshape and run these layers alone, in the order given, leaving the others as they
        are: a caller that fills some blobs itself (the next batch into the source layers'
        tops, an exported graph's inputs) runs only the layers it needs."""
        for i in layer_ids:
            self.layers[i].reshape(self.bottom_vecs[i], self.top_vecs[i])
            self.layers[i].forward(self.bottom_vecs[i], self.top_vecs[i])

    # -- weights (Caffe's Net::CopyTrainedLayersFrom and Net::ToProto) ---------------------------
    # The solver copies -weights and a snapshot's model in through these; the files' formats are
    # cct/io/weights.py's. pycaffe's spellings (copy_from, save, save_hdf5, load_hdf5) are
    # cct/pycaffe.py's.
    def copy_trained_layers_from(self, source) -> None:
        """Copy params by layer name from a NetParameter or a weights file path (``.caffemodel``
        binary or ``.h5``). Unknown source layers are ignored, as in Caffe."""
        weights.copy_trained_layers(self, source)

    def to_proto(self, write_diff: bool = False) -> caffe_pb2.NetParameter:
        return weights.net_to_proto(self, write_diff)

    def close(self) -> None:
        """Stop the data layers' prefetch threads and close their databases (also done when
        the layers are garbage-collected)."""
        for layer in self.layers:
            if callable(getattr(type(layer), "close", None)):
                layer.close()


def _copy(param: caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    return out


def _g(x: float) -> str:
    """Format a float as C++ iostreams do by default (``%g``, 6 significant digits)."""
    return "%g" % x
