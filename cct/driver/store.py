"""The parameter store: the weights, the solver's history and a version counter, shared by
asynchronous groups (Omnivore's model server).

The store is a :class:`~cct.solver.Solver` used from above: its train net's learnable params
are the weights, its schedule gives each update's rate and its update (every solver type,
clipping, decay) applies each pushed gradient to its history, its iteration count is the
version, and its loop pieces write Caffe's log, run the test nets and take snapshots, so an
asynchronous run's files are ordinary Caffe files. A group pulls the weights (the version it
read), computes a gradient on its own copy, and pushes it; the push records staleness =
versions applied since that read.
"""
from __future__ import annotations

import threading
from typing import List, Optional, Tuple

import numpy as np

from ..backend import copy as copy_array, owner
from ..glog import info
from ..params import ParamSet, StoreBlob, statistics_positions
from .staleness import StalenessStats, implicit_momentum


class MomentumPolicy:
    """The explicit momentum of each update: a literal value, or ``auto``: the rule, the
    solver's momentum minus the implicit momentum of the staleness measured so far (a window
    of recent updates), floored at 0 unless negative values are allowed. The rule is a prior
    and a lower bound, not the optimum (measured optima sit above it): ``cct train
    --momentum=auto`` probes the momenta from one step below it up to the solver's and gives
    the driver the one it measured best (cct/optimizer/momentum.py)."""

    def __init__(self, setting: str, solver_momentum: float, allow_negative: bool = False):
        self.auto = setting == "auto"
        self.value = None if self.auto else float(setting)
        self.base = float(solver_momentum)
        self.allow_negative = allow_negative

    def __call__(self, stats: StalenessStats) -> Tuple[float, float]:
        """(explicit momentum for the next update, implicit momentum estimated)."""
        recent = stats.recent_mean()
        implicit = implicit_momentum(recent if recent is not None else 0.0)
        if not self.auto:
            return self.value, implicit
        explicit = self.base - implicit
        return (explicit if self.allow_negative else max(0.0, explicit)), implicit

    def describe(self) -> str:
        if not self.auto:
            return f"explicit momentum {self.value:g} (given)"
        floor = "negative allowed" if self.allow_negative else "floored at 0"
        return (f"momentum auto: the solver's {self.base:g} minus the implicit momentum "
                f"E[tau]/(1+E[tau]) of the measured staleness, {floor}")


class ParameterStore:
    """Pull and push around a solver (see the module doc); thread-safe."""

    def __init__(self, solver, momentum: MomentumPolicy,
                 stats: Optional[StalenessStats] = None):
        self.solver = solver
        self.params: ParamSet = solver.params
        # A group keeps its own running statistics (BatchNorm's): a pull leaves them.
        self.statistics = frozenset(statistics_positions(solver.net))
        self.momentum = momentum
        self.stats = stats or StalenessStats()
        self.lock = threading.Lock()
        self._views = {}
        self.display_hooks: List = []      # more lines after the staleness line (per group)

    @property
    def version(self) -> int:
        return self.solver.iter

    def pull(self, into: ParamSet) -> int:
        """Copy the weights into a group's params; the version read."""
        with self.lock:
            self.params.copy_weights_to(into, skip=self.statistics)
            return self.solver.iter

    def fc_step(self, net, first_fc: int, fc: List[int], gradients: ParamSet) -> float:
        """Omnivore's FC server (``--sync-fc``): under the lock, a group's layers from
        ``first_fc`` on run forward and backward on the store's current weights of the params
        ``fc`` (positions), which are then updated at once, so that they are never stale. The
        group's conv layers have run forward before and run backward after, outside the lock.
        Returns the loss."""
        with self.lock:
            for i in fc:
                copy_array(gradients.blobs[i].data, self.params.blobs[i].data)
            loss = net.forward_from_to(first_fc, len(net.layers) - 1)
            net.backward_from_to(len(net.layers) - 1, first_fc)
            s = self.solver
            # Between iterations: the rate without Caffe's lr line, which the push writes.
            s.update.apply(s.history, self._update_view(gradients), s.learning_rate(log=False),
                           s.iter, only=fc)
            return loss

    def push(self, gradients: ParamSet, read_version: int, loss, outputs_of=None,
             only: Optional[List[int]] = None) -> bool:
        """Apply one group's gradient with the solver's rule, as the solver's next iteration
        (test when due, display, update, snapshot when due). False when training must stop
        (a stop request). ``only``: the params it updates (the conv ones, with ``--sync-fc``)."""
        with self.lock:
            s = self.solver
            if not s.begin_iteration(clear_diffs=False):
                return False
            self.stats.record(s.iter - read_version)
            s.record_loss(loss, outputs_of)
            explicit, implicit = self.momentum(self.stats)
            if s.param.display and s.iter % s.param.display == 0:
                mean, top, count = self.stats.take_interval()
                info("driver.cpp:0", f"Staleness mean {mean:.4g} max {top} over {count} "
                     f"updates; momentum explicit {explicit:.4g} (implicit ~{implicit:.4g})")
                for hook in self.display_hooks:
                    hook()
            rate = s.learning_rate()
            apply_remotely = getattr(gradients, "apply_remotely", None)
            if apply_remotely is not None:
                # Gradients held elsewhere (Ray's object store) are applied where they are.
                apply_remotely(rate, s.iter, explicit, only=only)
            else:
                # The update reads the group's diffs where they are: no model-sized copy.
                s.update.apply(s.history, self._update_view(gradients), rate, s.iter,
                               explicit, only)
            return s.end_iteration()

    def _update_view(self, gradients: ParamSet) -> ParamSet:
        """The weights paired with a group's gradients for the update. A group whose diffs
        live where the weights do lends them (no copy); one on another device's memory (a
        GPU group, a host store) copies them into diffs beside the weights first, since an
        update kernel takes arrays of one side."""
        key = id(gradients)
        view = self._views.get(key)
        if view is None:
            apart = bool(self.params.blobs) and (owner(gradients.blobs[0].diff)
                                                 is not owner(self.params.blobs[0].data))
            if apart:
                view = ParamSet([StoreBlob.pair(b.data, owner(b.data).to_device(
                    np.zeros(b.shape, b.dtype)), b.xp) for b in self.params.blobs],
                    self.params.lr_mult, self.params.decay_mult, self.params.backend)
            else:
                view = self.params.with_gradients_of(gradients)
            self._views[key] = view = (view, apart)
        staged, apart = view
        if apart:
            for mine, theirs in zip(staged.blobs, gradients.blobs):
                copy_array(mine.diff, theirs.diff)
        return staged
