"""Finite-difference gradient checking for layers (Caffe's test_gradient_check_util.hpp), in
float64.

The objective is a fixed random projection of every top, L = sum_t <R_t, top_t>, so every top
element contributes with its own weight; the analytic gradient comes from the layer's backward
with top diffs R_t, the numeric one from central differences of L.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
from google.protobuf import text_format

from cct import backend as backends
from cct.blob import Blob
from cct.layers import create_layer
from cct.proto import caffe_pb2
from cct.rng import set_random_seed


def make_layer_param(text: str, phase: int = caffe_pb2.TEST) -> caffe_pb2.LayerParameter:
    lp = caffe_pb2.LayerParameter()
    text_format.Merge(text, lp)
    if not lp.name:
        lp.name = "under_test"
    lp.phase = phase
    return lp


def build_layer(text: str, bottoms: Sequence[np.ndarray], num_tops: int = 1,
                phase: int = caffe_pb2.TEST, dtype=np.float64, seed: int = 1701):
    """A set-up layer from a prototxt ``layer { }`` body plus its bottom and top blobs."""
    set_random_seed(seed)
    lp = make_layer_param(text, phase)
    layer = create_layer(lp, backends.get("cpu"), dtype)
    bottom = []
    for a in bottoms:
        b = Blob(np.shape(a), dtype)
        b.data[...] = a
        bottom.append(b)
    top = [Blob((), dtype) for _ in range(num_tops)]
    layer.setup(bottom, top)
    return layer, bottom, top


def run_forward(layer, bottom, top, seed: int = 1701) -> None:
    set_random_seed(seed)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)


def check_gradient(layer, bottom: List[Blob], top: List[Blob],
                   check_bottom: Optional[Iterable[int]] = None, check_params: bool = True,
                   step: float = 1e-6, rtol: float = 1e-5, atol: float = 1e-7,
                   kink: Optional[float] = None, kink_range: float = -1.0,
                   top_weights: Optional[Sequence[int]] = None, seed: int = 1701) -> None:
    """Assert that backward agrees with central differences of the forward pass.

    ``check_bottom``: indices of bottoms whose gradient is checked (default: all).
    ``kink``/``kink_range``: skip elements whose input lies within ``kink_range`` of a kink
    (ReLU-like functions are not differentiable there).
    ``top_weights``: which tops enter the objective (default all).

    Blobs are read and written through their host views (pycaffe's arrays), so the same check
    runs on a device backend, whose arrays host code may not touch directly.
    """
    rng = np.random.default_rng(seed)
    check_bottom = list(range(len(bottom))) if check_bottom is None else list(check_bottom)
    tops_used = list(range(len(top))) if top_weights is None else list(top_weights)

    run_forward(layer, bottom, top, seed)
    proj: Dict[int, np.ndarray] = {t: rng.standard_normal(top[t].shape) for t in tops_used}

    def objective() -> float:
        run_forward(layer, bottom, top, seed)
        return float(sum((proj[t] * top[t].host_view().data).sum() for t in tops_used))

    def put(blob, k: int, value: float) -> None:
        # Asked for afresh each time: the host view's array is the one device code reads
        # next only while no device code has run since (Caffe's mutable_cpu_data).
        blob.host_view().data.reshape(-1)[k] = value

    objective()
    for t in range(len(top)):
        top[t].host_view().diff[...] = proj[t] if t in proj else 0.0
    for b in bottom:
        b.host_view().diff[...] = 0.0
    for p in layer.blobs:
        p.host_view().diff[...] = 0.0
    propagate = [i in check_bottom for i in range(len(bottom))]
    layer.backward(top, propagate, bottom)
    analytic = [(f"bottom {i}", bottom[i], bottom[i].host_view().diff.copy())
                for i in check_bottom]
    if check_params:
        analytic += [(f"param {i}", p, p.host_view().diff.copy())
                     for i, p in enumerate(layer.blobs) if layer.param_propagate_down[i]]

    for what, blob, grad in analytic:
        start = blob.host_view().data.reshape(-1).copy()
        gflat = grad.reshape(-1)
        for k in range(start.size):
            x0 = start[k]
            if kink is not None and kink_range > 0 and abs(x0 - kink) < kink_range:
                continue
            put(blob, k, x0 + step)
            plus = objective()
            put(blob, k, x0 - step)
            minus = objective()
            put(blob, k, x0)
            numeric = (plus - minus) / (2 * step)
            scale = max(abs(numeric), abs(gflat[k]), 1.0)
            assert abs(numeric - gflat[k]) <= atol + rtol * scale, (
                f"{layer.type} {what} element {k}: analytic {gflat[k]:.9g} vs numeric "
                f"{numeric:.9g}")
    objective()


def assert_param_diffs_accumulate(layer, bottom: List[Blob], top: List[Blob],
                                  seed: int = 1701) -> List[np.ndarray]:
    """Two backward passes: param diffs add up (Caffe accumulates them), the bottom diff is
    overwritten. Returns the param diffs of one pass."""
    run_forward(layer, bottom, top, seed)
    top[0].diff[...] = np.random.default_rng(seed).standard_normal(top[0].shape)
    layer.backward(top, [True], bottom)
    once = [b.diff.copy() for b in layer.blobs]
    dx = bottom[0].diff.copy()
    layer.backward(top, [True], bottom)
    for b, d in zip(layer.blobs, once):
        np.testing.assert_allclose(b.diff, 2 * d)
    np.testing.assert_allclose(bottom[0].diff, dx)
    return once


def forward_backward_on(backend_name: str, layer_text: str, x: np.ndarray, rng,
                        dy: Optional[np.ndarray] = None):
    """One-bottom, one-top layer ``layer_text`` on backend ``backend_name`` in float64: its
    top, and the bottom diff for top diff ``dy`` (drawn from ``rng`` when None); returns
    (top, bottom diff, dy) as host arrays, so that backends can be compared on the same dy."""
    be = backends.get(backend_name)
    layer = create_layer(make_layer_param(layer_text), be, np.float64)
    b = Blob(x.shape, np.float64, be.xp)
    b.host_view().data[...] = x
    t = Blob((), np.float64, be.xp)
    layer.setup([b], [t])
    layer.forward([b], [t])
    if dy is None:
        dy = rng.standard_normal(t.shape)
    t.host_view().diff[...] = dy
    layer.backward([t], [True], [b])
    return np.array(t.cpu_data()), np.array(b.cpu_diff()), dy
