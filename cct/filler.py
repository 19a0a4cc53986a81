"""Caffe's fillers (``filler.hpp``): constant, uniform, gaussian, positive_unitball, xavier,
msra, bilinear.

fan_in = count / shape[0], fan_out = count / shape[1] (Caffe's definition, also for
InnerProduct weights); ``variance_norm`` picks fan_in (default), fan_out or their average.

Random values are drawn in float64 (NumPy's double-precision draws: the values every cct run
has drawn for a seed) one block at a time and rounded into the blob as each block is drawn, so
filling a blob needs one block of float64 beside it, not a float64 copy of the whole blob. The
generator's draws are sequential, so the blocks hold exactly the values one draw of the whole
blob would.
"""
from __future__ import annotations

import numpy as np

from . import backend
from .errors import LayerError
from .proto import caffe_pb2
from .rng import get_rng

_BLOCK = 1 << 20   # values drawn at once: 8 MiB of float64


def _fan(shape, variance_norm: int) -> float:
    count = int(np.prod(shape))
    fan_in = count / shape[0] if len(shape) > 0 and shape[0] else 1.0
    fan_out = count / shape[1] if len(shape) > 1 and shape[1] else 1.0
    if variance_norm == caffe_pb2.FillerParameter.FAN_OUT:
        return fan_out
    if variance_norm == caffe_pb2.FillerParameter.AVERAGE:
        return (fan_in + fan_out) / 2.0
    return fan_in


def fill(array, filler_param, where: str = "") -> None:
    """Fill ``array`` in place according to a FillerParameter. The values are drawn on the
    host (cct's one random stream, as Caffe draws fillers on the CPU) and copied to a device
    array in one go."""
    if isinstance(array, np.ndarray):
        _fill_host(array, filler_param, where)
        return
    host = np.empty(array.shape, np.dtype(array.dtype))
    _fill_host(host, filler_param, where)
    backend.copy(array, host)  # one host-to-device copy


def _draw(flat: np.ndarray, draw) -> None:
    """``flat[...] = draw(flat.size)``, drawn and rounded into ``flat`` a block at a time."""
    for start in range(0, flat.size, _BLOCK):
        stop = min(start + _BLOCK, flat.size)
        flat[start:stop] = draw(stop - start)


def _fill_host(array: np.ndarray, filler_param, where: str) -> None:
    """Fill a C-contiguous host array (``flat`` below is a view of it)."""
    rng = get_rng()
    shape = array.shape
    flat = array.reshape(-1)
    t = filler_param.type
    if t == "constant":
        array[...] = filler_param.value
    elif t == "uniform":
        _draw(flat, lambda n: rng.uniform(filler_param.min, filler_param.max, n))
    elif t == "gaussian":
        sparse = filler_param.sparse
        if sparse >= 0 and len(shape) < 2:
            raise LayerError(f"{where}sparse gaussian filler needs a blob with 2+ axes")
        _draw(flat, lambda n: rng.normal(filler_param.mean, filler_param.std, n))
        if sparse >= 0:
            # Each output unit keeps on average `sparse` non-zero inputs (Caffe's sparse
            # gaussian); the keep draws follow all the gaussian ones.
            p_keep = sparse / shape[0]
            for start in range(0, flat.size, _BLOCK):
                stop = min(start + _BLOCK, flat.size)
                flat[start:stop] *= rng.random(stop - start) < p_keep
    elif t == "positive_unitball":
        # Whole rows per block: each row's float64 sum (which sets its rounding) is the same
        # as over the whole blob.
        n = shape[0] if shape else 1
        rows = flat.reshape(n, -1)
        per_block = max(1, _BLOCK // max(rows.shape[1], 1))
        for start in range(0, n, per_block):
            v = rng.uniform(0.0, 1.0, rows[start:start + per_block].shape)
            v /= v.sum(axis=1, keepdims=True)
            rows[start:start + per_block] = v
    elif t == "xavier":
        scale = np.sqrt(3.0 / _fan(shape, filler_param.variance_norm))
        _draw(flat, lambda n: rng.uniform(-scale, scale, n))
    elif t == "msra":
        std = np.sqrt(2.0 / _fan(shape, filler_param.variance_norm))
        _draw(flat, lambda n: rng.normal(0.0, std, n))
    elif t == "bilinear":
        if len(shape) != 4 or shape[2] != shape[3]:
            raise LayerError(f"{where}bilinear filler needs a 4-axis blob with square kernels, "
                             f"got shape {tuple(shape)}")
        k = shape[3]
        f = np.ceil(k / 2.0)
        c = (2 * f - 1 - f % 2) / (2.0 * f)
        ax = 1 - np.abs(np.arange(k) / f - c)
        array[...] = np.outer(ax, ax)[None, None]
    else:
        known = "constant, uniform, gaussian, positive_unitball, xavier, msra, bilinear"
        raise LayerError(f"{where}unknown filler type '{t}'; known: {known}")
