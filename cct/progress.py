"""A live progress line for ``cct train`` on a terminal, beside Caffe's log.

``cct train --progress=auto|bar|none`` (auto: a bar only when stderr is a terminal) attaches a
:class:`TrainingProgress` to the solver as a callback (Caffe's and pycaffe's
``Solver::add_callback``, the way Caffe's multi-GPU code attaches to a solver), so it sees
every iteration whoever runs the loop, the solver's ``step`` or a driver's strategy
(cct/driver): both call the solver's ``begin_iteration`` and ``record_loss``, which call the
callbacks. The line shows::

    Iteration:  12%|##        | 1200/10000 [00:31<03:50, 38.2it/s, 2445 img/s, loss 0.0912, accuracy 0.9836 @1000]

the iteration of ``max_iter``, the iteration rate and the images per second (the train net's
batch times ``iter_size`` per iteration; a driver whose groups take other batches gets the
train net's), the time left, the smoothed loss of Caffe's ``Iteration N, loss = ...`` line, and
the first test net's last scores (the solver's ``test_scores``: the accuracy-like ones, or the
first when none is) with the iteration of the test that gave them (``accuracy 0.9836 @1000``):
a test runs every ``test_interval`` iterations, and without its iteration the initial weights'
accuracy (``test_initialization``) would read as the current one until the next test.

The log is untouched: each glog line is written with the bar taken off the terminal's last
line and put back after (cct/glog.py's ``set_live_display``), so on a terminal the log lines
scroll above the bar, and a log redirected to a file or a pipe (auto: no bar) is Caffe's,
byte for byte. The bar is drawn by tqdm.
"""
from __future__ import annotations

import os
import sys
from typing import List, Optional, Tuple

from . import glog
from .errors import CCTError

MODES = ("auto", "bar", "none")


def wants_bar(mode: str, stream=None) -> bool:
    """Whether ``--progress=mode`` draws a bar on ``stream`` (stderr by default): ``bar``
    always (tqdm must be installed), ``auto`` on a terminal when tqdm is installed."""
    if mode not in MODES:
        raise CCTError(f"train: -progress must be auto, bar or none; got '{mode}'")
    if mode == "none":
        return False
    if mode == "auto":
        stream = sys.stderr if stream is None else stream
        try:
            if not stream.isatty():
                return False
        except (AttributeError, ValueError):
            return False
    try:
        import tqdm  # noqa: F401
    except ImportError:
        if mode == "auto":   # the log is all a person needs; the bar is a convenience
            return False
        raise CCTError("train: -progress=bar needs tqdm, which is not installed: pip install "
                       "tqdm (or use -progress=none)") from None
    return True


def images_per_iteration(solver) -> int:
    """The records one iteration consumes: the batch of the train net's first data layer (a
    layer without bottoms) times ``iter_size``; 0 when the net has no such layer."""
    net = solver.net
    for i in range(len(net.layers)):
        tops = net.top_blobs(i)
        if not net.bottom_ids(i) and tops and tops[0].shape:
            return int(tops[0].shape[0]) * max(1, solver.param.iter_size)
    return 0


def _columns(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


class TrainingProgress:
    """The bar of one training run: :meth:`attach` it to a solver before ``solve``, and
    :meth:`close` it after (also on errors: it gives the terminal line back)."""

    def __init__(self, solver, stream=None):
        import tqdm

        self._tqdm = tqdm.tqdm
        self.solver = solver
        self.stream = sys.stderr if stream is None else stream
        self.images = images_per_iteration(solver)
        self.bar = None
        self._attached = False
        # The first test net's scores last seen (the solver's list, replaced by each test) and
        # the iteration they were first seen at: the test's, as the solver tests at the start
        # of an iteration, before the callbacks, and after the last one.
        self._scores: Optional[List[Tuple[str, float]]] = None
        self._tested_at = 0

    # -- wiring ------------------------------------------------------------------------------
    def attach(self) -> "TrainingProgress":
        self.solver.add_callback(self._on_start, self._on_gradients_ready)
        glog.set_live_display(self._around_line)
        self._attached = True
        return self

    def close(self) -> None:
        if not self._attached:
            return
        self._attached = False
        glog.set_live_display(None)
        if self.bar is not None:
            self.bar.set_postfix_str(self._postfix(), refresh=False)
            self.bar.close()
            self.bar = None

    def _around_line(self):
        return self._tqdm.external_write_mode(file=self.stream)

    # -- the solver's callbacks --------------------------------------------------------------
    def _on_start(self) -> None:
        self._test_scores()
        if self.bar is None and self._attached:
            max_iter = self.solver.param.max_iter
            # A terminal that reports no size (a bare pseudo-terminal) gets 100x24, else
            # tqdm would draw nothing.
            size = {} if _columns(self.stream) > 0 else {"ncols": 100, "nrows": 24}
            self.bar = self._tqdm(total=max_iter, initial=min(self.solver.iter, max_iter),
                                  desc="Iteration", unit="it", file=self.stream,
                                  dynamic_ncols=not size, leave=True, mininterval=0.2,
                                  **size)

    def _on_gradients_ready(self) -> None:
        if self.bar is None:
            return
        done = min(self.solver.iter + 1, self.bar.total)
        self.bar.set_postfix_str(self._postfix(), refresh=False)
        if done > self.bar.n:
            self.bar.update(done - self.bar.n)

    # -- the line ----------------------------------------------------------------------------
    def _postfix(self) -> str:
        parts = []
        rate = None
        if self.bar is not None:
            # tqdm's smoothed rate appears only after its first refresh interval; until
            # then, the mean since the bar started.
            fd = self.bar.format_dict
            rate = fd.get("rate") or ((fd["n"] - fd.get("initial", 0)) / fd["elapsed"]
                                      if fd.get("elapsed") else None)
        if rate and self.images:
            parts.append(f"{rate * self.images:.0f} img/s")
        parts.append(f"loss {float(self.solver.smoothed_loss):.4g}")
        parts += [f"{name} {value:.4g} @{self._tested_at}" for name, value in
                  self._shown_scores()]
        return ", ".join(parts)

    def _test_scores(self) -> List[Tuple[str, float]]:
        scores = self.solver.test_scores.get(0)
        if scores is not self._scores:
            self._scores, self._tested_at = scores, self.solver.iter
        return scores or []

    def _shown_scores(self) -> List[Tuple[str, float]]:
        first = self._test_scores()
        accuracy = [(name, v) for name, v in first if "acc" in name.lower()]
        return accuracy or first[:1]
