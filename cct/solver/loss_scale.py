"""Dynamic loss scaling, for training with fp16 GEMMs and convolutions (issue 29, item 4).

IEEE half holds magnitudes from 6e-8 (its smallest subnormal) to 65504. The backward pass's
operands, the top diffs, are a loss weight divided by the batch and smaller with every layer
down: rounded to half they vanish, and the weights stop learning where Caffe's float32 would
not. So backward starts from the loss weight times a scale S instead of the loss weight
(every diff is then S times Caffe's, and rounds as it would at S times the size), and the
gradients are divided by S before the update (weight decay, clipping and the rule see
Caffe's gradient). S is a power of two, so multiplying and dividing by it is exact in
float32: where nothing overflows or vanishes, a scaled iteration rounds exactly as an
unscaled one would.

S starts at 2^16 and adapts, as NVIDIA's mixed-precision recipe and PyTorch's GradScaler do:
a gradient that overflowed (an infinity or NaN in any param's diff) skips the update and
halves S; GROWTH_INTERVAL updates in a row without one double it. Finding an overflow reads
one value from the device each iteration (PyTorch's GradScaler reads one too). A run whose
gradients stay non-finite at every scale has a NaN of its own, not an overflow: after
MAX_SKIPS skipped updates in a row it stops, naming the iteration. S and its count are kept
beside snapshots (the side file), so a resumed run goes on with the scale it had.

bf16 needs none of this: its range is float32's.
"""
from __future__ import annotations

from ..errors import CCTError
from ..glog import info

SRC = "loss_scale.py:0"
INIT_SCALE = 2.0 ** 16
GROWTH_INTERVAL = 2000
#: skipped updates in a row before the run stops: halving 2^16 this many times reaches 2^-24,
#: where no finite gradient can overflow any more
MAX_SKIPS = 40


class LossScale:
    """The scale of one net's backward pass: :meth:`seed` writes it into the loss tops' diffs
    (where backward starts), :meth:`unscale` checks and divides the gradients before an update
    and says whether to apply it."""

    def __init__(self, net, source: str = "<solver>", scale: float = INIT_SCALE):
        self.net = net
        self.source = source
        self.scale = float(scale)
        self.good = 0        # updates in a row without an overflow
        self.skipped = 0     # overflows in a row
        self.skips_total = 0
        self._tops = [(top, w) for _, top, w in net.loss_tops()]
        self.seed()

    def seed(self) -> None:
        """Each loss top's diff = its loss weight times the scale (Caffe's: the weight)."""
        for top, w in self._tops:
            top.diff[...] = w * self.scale

    def unscale(self, iteration: int) -> bool:
        """After backward, before the update: True (the gradients divided by the scale) when
        every param's gradient is finite, else False (the update to skip; the scale halved)."""
        params = self.net.learnable_params
        xp = self.net.backend.xp
        sums = [p.diff.sum() for p in params]
        finite = bool(xp.isfinite(xp.stack(sums)).all()) if sums else True   # one read
        if finite:
            inverse = 1.0 / self.scale                  # a power of two: exact
            for p in params:
                p.diff *= p.diff.dtype.type(inverse)
            self.skipped = 0
            self.good += 1
            if self.good == GROWTH_INTERVAL:
                self._set(self.scale * 2.0)
            return True
        self.skipped += 1
        self.skips_total += 1
        if self.skipped > MAX_SKIPS:
            raise CCTError(
                f"{self.source}: the gradients are not finite at iteration {iteration} at every "
                f"loss scale down to {self.scale:g} ({self.skipped} updates skipped in a row): "
                f"not an fp16 overflow but a NaN or infinity in the net (its weights, its input "
                f"data); train in float32 or bf16 to find it, or lower base_lr.")
        info(SRC, f"Iteration {iteration}: fp16 gradients overflowed at loss scale "
                  f"{self.scale:g}; update skipped, loss scale now {self.scale / 2:g}")
        self._set(self.scale / 2.0)
        return False

    def _set(self, scale: float) -> None:
        self.scale = scale
        self.good = 0
        self.seed()

    # -- beside snapshots (Solver.keep_beside_snapshots) -------------------------------------
    def state(self, _path: str = "") -> dict:
        return {"scale": self.scale, "good": self.good}

    def load_state(self, state, _path: str = "") -> None:
        if not (isinstance(state, dict) and isinstance(state.get("scale"), (int, float))
                and state["scale"] > 0 and isinstance(state.get("good"), int)):
            raise ValueError(f"not {{'scale': > 0, 'good': int}}: {str(state):.80}")
        self.scale = float(state["scale"])
        self.good = int(state["good"])
        self.skipped = 0
        self.seed()

