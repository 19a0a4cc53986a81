"""The train net's iteration as a CUDA graph (issue 29, item 3): a gradient source that runs the
data layers as they are, then replays the rest of the net's forward and backward, captured
once, as one graph launch instead of a launch (and a Python call) per kernel.

What a replay can repeat is what the capture saw: the same kernels on the same arrays with the
same scalars. So:

* **static shapes and arrays**: the blobs' shapes, and which arrays hold every blob's and
  param's values, are taken at capture and checked before each replay (every zoo net's are
  fixed; a restored snapshot writes into the same arrays); a change goes back to eager passes,
  saying so;
* **the data layers stay outside**: they read records on the host and copy the batch into
  their tops, the graph's inputs, before each launch (through pinned memory, queued on the
  stream the graph is launched on: ordered, no wait);
* **the update stays outside**: its rate changes with the iteration (and its kernels are a
  few per parameter); the solver runs it after the launch, as it does after an eager pass;
* **the loss is copied out** of the graph's arrays after each launch, into arrays of its own
  for the solver's pending losses (read when the log shows them, sometimes 50 iterations
  later, by when the graph has written its arrays 50 times);
* **random draws made before each launch**: a layer that draws in its forward (Dropout's
  masks) would repeat the capture's draws at every launch, its generator's state being the
  host's; its draws for the iteration are made first, in the forward's order, into arrays of
  its own that the graph reads (``Layer.draws``, ``draw``): the masks an eager pass draws;
* **no Python layer** (host code): such a net runs eagerly, and the log says which layer kept
  it so.

A graph is captured after WARMUP eager iterations (the kernels' first calls: cuDNN's engine
races, the CUDA kernels' first-use checks, cuBLAS's handle; each may synchronize, which a
capture refuses) and checked once: the capture's batch is computed eagerly too, and the
graph's gradients must agree with those (to float rounding: cuDNN's fastest weight-gradient
engines add in varying order) or the run stays eager, saying by how much they differ. Any
failure to capture (what CUDA or CuPy refuses) leaves the run eager with a warning naming it.
Where the backend has no graphs (the CPU) this is the plain net source.
"""
from __future__ import annotations

from typing import List, Optional

from .glog import info, warning
from .net import PendingLoss
from .params import NetSource

SRC = "graphed.py:0"
#: Eager iterations before the capture: the first runs every kernel's first call, the second
#: runs what a first call chose (an engine table, a layout) as the graph will hold it.
WARMUP = 2
#: How far the graph's gradients may be from the eager pass's, relative to each gradient's
#: largest magnitude (cuDNN's atomics reorder float additions: 1e-6 seen), per precision
#: (cct/backend/reduced.py): in bf16 and fp16 cuDNN's results are stored in those, and a sum
#: in another order can move one a unit of that rounding (2^-8, 2^-11 of its size).
TOLERANCE = {"float32": 1e-4, "tf32": 1e-4, "bf16": 1e-2, "fp16": 2e-3}
#: Layer types whose forward runs host code a graph cannot hold.
HOST_LAYERS = {"Python": "runs Python code on the host"}


def graphs_refused(net) -> str:
    """Why ``net`` cannot be replayed as a graph ('' when it can)."""
    graphs = getattr(net.backend, "graphs", None)
    if graphs is None:
        return f"the {net.backend.name} backend has no CUDA graphs"
    for name, layer in zip(net.layer_names, net.layers):
        why = HOST_LAYERS.get(layer.type)
        if why:
            return f"layer '{name}' ({layer.type}) {why}"
    sources = net.source_layers()
    if sources != list(range(len(sources))):
        return "its data layers are not its first layers"
    if len(sources) == len(net.layers):
        return "it has only data layers"
    return ""


class GraphedSource(NetSource):
    """The train net's gradients, its layers after the data layers replayed as a CUDA graph
    (module doc). ``defer`` as NetSource's: the losses stay on the device."""

    def __init__(self, net, defer: bool = True):
        super().__init__(net, defer)
        self.refused = graphs_refused(net)
        self.first = len(net.source_layers())
        # The layers drawing randoms in their forward, with their bottoms, in the net's order.
        self._drawers = [(layer, net.bottom_vecs[i]) for i, layer in enumerate(net.layers)
                         if layer.draws]
        self.eager = 0            # eager iterations so far (warm-up)
        self.graph = None
        self.replays = 0
        self._loss: Optional[PendingLoss] = None
        self._shapes: Optional[List[tuple]] = None
        self._ids: Optional[List[tuple]] = None
        if self.refused and getattr(net.backend, "graphs", None) is not None:
            info(SRC, f"Training iterations run eagerly, not as a CUDA graph: {self.refused}")

    def compute_gradients(self):
        net = self.net
        if self.refused or self.eager < WARMUP:
            self.eager += 1
            return net.forward_backward(self.defer)
        net.forward_from_to(0, self.first - 1)       # the batch, into the graph's inputs
        if self.graph is None:
            return self._capture()
        shapes = self._blob_shapes()
        if shapes != self._shapes:
            self._give_up(f"the blob shapes changed after the capture ({self._changed(shapes)})")
            return self._rest_eagerly()
        if self._array_ids() != self._ids:
            self._give_up(f"{self._replaced()} holds other arrays than at the capture")
            return self._rest_eagerly()
        self._draw()
        self.graph.launch()
        self.replays += 1
        return self._copied_loss()

    # -- the capture -------------------------------------------------------------------------
    def _blob_shapes(self) -> List[tuple]:
        return [tuple(b.shape) for b in self.net.blobs_list]

    def _array_ids(self) -> List[tuple]:
        """Every blob's and param's arrays, whose memory the graph reads and writes."""
        return [b.array_ids() for b in self.net.blobs_list + self.net.params_list]

    def _replaced(self) -> str:
        net = self.net
        names = [f"blob '{name}'" for name in net.blob_names] + [
            f"layer '{net.layer_names[layer]}''s param {k}"
            for layer, k in net.param_layer_indices]
        for name, before, now in zip(names, self._ids, self._array_ids()):
            if before != now:
                return name
        return "a blob"

    def _changed(self, shapes) -> str:
        for name, before, now in zip(self.net.blob_names, self._shapes, shapes):
            if before != now:
                return f"'{name}' {before} -> {now}"
        return "the blob count"

    def _rest_eagerly(self):
        net = self.net
        loss = net.forward_from_to(self.first, len(net.layers) - 1, self.defer)
        net.backward_all()
        return loss

    def _capture(self):
        """The capture's iteration: an eager pass on this batch (its gradients kept aside),
        the capture, one launch, the two compared; the launch's result is the iteration's."""
        net = self.net
        xp = net.backend.xp
        params = net.learnable_params
        start = [p.diff.copy() for p in params]          # what the solver left there (zeros)
        self._draw()                                     # the eager pass reads them too
        loss = self._rest_eagerly()
        eager = [p.diff.copy() for p in params]
        for p, d in zip(params, start):
            p.diff[...] = d
        self._shapes = self._blob_shapes()
        held = {}

        def body():
            held["loss"] = net.forward_from_to(self.first, len(net.layers) - 1, True)
            net.backward_all()
        try:
            self.graph = net.backend.graphs.capture(body)
            self.graph.launch()
        except Exception as e:        # what the capture refused: the run stays eager
            self._give_up(f"the capture failed ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})")
            return self._restore(eager, loss)
        worst = _worst_difference(xp, [p.diff for p in params], eager)
        tolerance = TOLERANCE[net.backend.precision()]
        if not worst <= tolerance:
            self._give_up(f"its gradients differ from an eager pass's by {worst:.3g} of their "
                          f"scale (more than {tolerance:g})")
            return self._restore(eager, loss)
        self._loss = held["loss"] if isinstance(held["loss"], PendingLoss) else None
        self._ids = self._array_ids()
        self.replays += 1
        info(SRC, f"Training iterations replay a CUDA graph of layers "
                  f"'{net.layer_names[self.first]}' to '{net.layer_names[-1]}' and back (the "
                  f"data layers and the update run outside it); its gradients agree with an "
                  f"eager pass's to {worst:.3g} of their scale")
        return self._copied_loss()

    def _restore(self, eager, loss):
        for p, d in zip(self.net.learnable_params, eager):
            p.diff[...] = d
        return loss

    def _draw(self) -> None:
        for layer, bottom in self._drawers:
            layer.draw(bottom)

    def _give_up(self, why: str) -> None:
        warning(SRC, f"Training iterations run eagerly, not as a CUDA graph: {why}")
        self.refused = why
        self.graph = None
        for layer, _ in self._drawers:
            layer.drawn_outside = False          # their forward draws again

    def _copied_loss(self):
        """The launch's loss and checks, copied out of the graph's arrays (device copies)."""
        if self._loss is None:
            return 0.0
        pending = self._loss
        return PendingLoss(pending.backend, pending.host,
                           [(w, t.copy()) for w, t in pending.terms],
                           [(c.copy(), error) for c, error in pending.checks])


def _worst_difference(xp, got, want) -> float:
    """The largest |got - want| over each array's largest |want|, over the arrays (one
    device-to-host read)."""
    if not got:
        return 0.0
    parts = []
    for g, w in zip(got, want):
        scale = xp.maximum(xp.abs(w).max(), w.dtype.type(1e-30))
        parts.append((xp.abs(g - w).max() / scale).reshape(1))
    return float(xp.concatenate(parts).max())
