"""Caffe's Solver::Test: a test net run ``test_iter`` times on the train net's weights, the mean
of every output value, and the ``Test net output #k`` lines (which the train outputs share).
"""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import numpy as np

from ..backend import host as _host
from ..glog import info
from ..net import Net
from ..proto import caffe_pb2

Scores = List[Tuple[str, float]]   # (output name, value) as the log printed them


def _g(x) -> str:
    """A number as C++ iostreams print it (6 significant digits)."""
    return "%g" % float(x)


class Tester:
    """The test nets of a solver (``param`` gives test_iter and test_compute_loss), sharing the
    weights of ``train_net``; arithmetic in ``dtype`` as Caffe's Dtype."""

    def __init__(self, param: caffe_pb2.SolverParameter, train_net: Net, test_nets: List[Net],
                 dtype):
        self.param = param
        self.train_net = train_net
        self.test_nets = test_nets
        self.dtype = np.dtype(dtype)

    def test(self, test_net_id: int, iter_: int, poll: Callable[[], None],
             stopped: Callable[[], bool]) -> Optional[Scores]:
        """Test net ``test_net_id`` at iteration ``iter_``: its scores, or None when it has no
        outputs or was interrupted: ``poll()`` acts on pending requests before every test
        iteration (Caffe's drain of them), then ``stopped()`` says whether to stop."""
        p = self.param
        dt = self.dtype.type
        info("solver.cpp:347", f"Iteration {iter_}, Testing net (#{test_net_id})")
        net = self.test_nets[test_net_id]
        net.share_trained_layers_with(self.train_net)
        n_iter = p.test_iter[test_net_id]
        scores = None
        ids: List[int] = []
        loss = dt(0)
        for _ in range(n_iter):
            poll()
            if stopped():
                break
            iter_loss = dt(net.forward_prefilled())
            if p.test_compute_loss:
                loss += iter_loss
            values = [_host(b.data).reshape(-1).astype(self.dtype)
                      for b in net.output_blobs()]
            result = np.concatenate(values) if values else np.zeros(0, self.dtype)
            if scores is None:
                scores = result.copy()
                ids = [j for j, v in enumerate(values) for _ in range(v.size)]
            else:
                scores += result
        if stopped():
            info("solver.cpp:396", "Test interrupted.")
            return None
        if p.test_compute_loss:
            loss /= dt(n_iter)
            info("solver.cpp:401", f"Test loss: {_g(loss)}")
        if scores is None:
            return None
        scores = scores / dt(n_iter)
        log_outputs(net, self.dtype, "solver.cpp:414", "Test", scores, ids)
        names = [net.blob_names[b] for b in net.output_ids()]
        return [(names[j], float(v)) for j, v in zip(ids, scores)]


def log_outputs(net: Net, dtype, src: str, kind: str, scores=None, ids=None) -> None:
    """``    Train net output #k: name = v (* w = w*v loss)``, one line per value of every
    output blob (Caffe prints every element): the net's output blobs as they are, or
    ``scores`` (``ids[k]``: the output blob of value k)."""
    dtype = np.dtype(dtype)
    dt = dtype.type
    if scores is None:
        values = [_host(b.data).reshape(-1) for b in net.output_blobs()]
        ids = [j for j, v in enumerate(values) for _ in range(v.size)]
        scores = np.concatenate(values).astype(dtype) if values else []
    output_ids = net.output_ids()
    for k, (j, v) in enumerate(zip(ids, scores)):
        blob_id = output_ids[j]
        lw = dt(net.blob_loss_weights[blob_id])
        tail = f" (* {_g(lw)} = {_g(lw * dt(v))} loss)" if lw else ""
        info(src, f"    {kind} net output #{k}: {net.blob_names[blob_id]} = {_g(v)}{tail}")
