"""One layer of a real-Caffe fixture net, run alone on the blobs Caffe saw, against Caffe's
saved results.

The fixtures (``numerics/<net>.<PHASE>.npz`` beside ``<net>.prototxt``, from the
``caffe_fixtures`` folder) hold, after one forward and backward pass of the whole net:
``blob/<name>/data`` and ``blob/<name>/diff`` for every blob (split blobs included),
``param_init/<layer>/<i>/data`` (the params before the pass) and ``param/<layer>/<i>/data`` /
``.../diff`` (after it: BatchNorm's running statistics are updated by the forward pass), and
``meta/phase``.

:func:`run_fixture_layer` sets the layer up with Caffe's bottoms and params, runs forward and
backward (from Caffe's top diffs); :func:`assert_matches_caffe` compares the result with what
Caffe saved. Blob names are those after Caffe's Split insertion, so a bottom fed by a blob with
several consumers reads its own split blob.

A blob that in-place ReLU layers rewrite is saved as it is after them (data) and before them
(diff), which is handled: a top followed by an in-place ReLU is compared after that ReLU, and
the diff of a bottom rewritten by an in-place ReLU before this layer is compared through that
ReLU's backward. Other in-place layers around the layer are refused.
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence, Union

import numpy as np
from google.protobuf import text_format

from cct.blob import Blob
from cct.io.prototxt import read_net_text
from cct.layers.base import Layer
from cct.net import filter_net, insert_splits
from cct.proto import caffe_pb2
from tests.gradient_check import build_layer, run_forward

PathLike = Union[str, pathlib.Path]


@dataclass
class FixtureLayer:
    """A fixture layer after :func:`run_fixture_layer`, with what is needed to check it."""

    layer: Layer
    bottom: List[Blob]
    top: List[Blob]
    layer_param: caffe_pb2.LayerParameter
    bottom_names: List[str]
    top_names: List[str]
    saved: Mapping[str, np.ndarray]
    #: backward ran (with Caffe's top diffs)
    backward: bool
    #: per bottom: whether backward was asked for its gradient
    propagate_down: List[bool]
    #: per top: negative slope of an in-place ReLU that rewrites it after this layer, or None
    top_relu: List[Optional[float]]
    #: per bottom: negative slope of an in-place ReLU that rewrote it before this layer, or None
    bottom_relu: List[Optional[float]]


def _in_place_relu(net: caffe_pb2.NetParameter, blob: str, layers: Sequence[int],
                   what: str) -> Optional[float]:
    """The negative slope of the in-place ReLU among ``layers`` (indices into ``net.layer``)
    that rewrites ``blob``, None when none does; any other in-place layer is refused."""
    found = None
    for i in layers:
        lp = net.layer[i]
        if blob not in lp.top:
            continue
        if blob not in lp.bottom:
            break  # produced anew: later layers rewrite another blob of the same name
        if lp.type != "ReLU" or found is not None:
            raise NotImplementedError(f"{what} '{blob}' is rewritten in place by {lp.type} layer "
                                      f"'{lp.name}': its saved data / diff cannot be compared")
        found = float(np.float32(lp.relu_param.negative_slope))
    return found


def run_fixture_layer(npz_path: PathLike, prototxt_path: PathLike, layer_name: str,
                      dtype=np.float32, *, backward: bool = True,
                      propagate_down: Union[bool, Sequence[bool]] = True,
                      edit: Optional[Callable[[caffe_pb2.LayerParameter], None]] = None
                      ) -> FixtureLayer:
    """Run layer ``layer_name`` of the fixture net ``prototxt_path`` alone, as Caffe ran it for
    ``npz_path`` (phase from the npz): bottoms from Caffe's bottom data, params from Caffe's
    initial params, forward, then (``backward``) backward from Caffe's top diffs with zeroed
    bottom and param diffs.

    ``propagate_down``: whether Caffe computed each bottom's gradient (one bool for all
    bottoms); False for bottoms that need none in a net without force_backward (the data). A
    bottom the layer cannot back-propagate to (a label) never gets one.

    ``edit`` changes the layer's parameter before it is built (a field that does not change
    Caffe's numbers, such as convolution_param.engine).
    """
    saved = np.load(npz_path)
    phase = caffe_pb2.Phase.Value(str(saved["meta/phase"]))
    net = read_net_text(str(prototxt_path))
    net.state.phase = phase
    net = insert_splits(filter_net(net))
    index = next((i for i, lp in enumerate(net.layer) if lp.name == layer_name), None)
    if index is None:
        raise KeyError(f"no layer '{layer_name}' in {prototxt_path} "
                       f"({caffe_pb2.Phase.Name(phase)})")
    lp = net.layer[index]
    if edit is not None:
        edit(lp)
    bottom_names, top_names = list(lp.bottom), list(lp.top)
    if set(bottom_names) & set(top_names):
        raise NotImplementedError(f"layer '{layer_name}' works in place: Caffe's saved data "
                                  f"of its bottom is overwritten by its top")
    before, after = range(index - 1, -1, -1), range(index + 1, len(net.layer))
    top_relu = [_in_place_relu(net, t, after, "top") for t in top_names]
    bottom_relu = []
    for b in bottom_names:
        if _in_place_relu(net, b, after, "bottom") is not None:
            raise NotImplementedError(f"bottom '{b}' is rewritten in place after layer "
                                      f"'{layer_name}' has read it")
        # in-place layers run on b between the layer that made it and this one
        producer = next(i for i in before if b in net.layer[i].top
                        and b not in net.layer[i].bottom)
        bottom_relu.append(_in_place_relu(net, b, range(producer + 1, index), "bottom"))

    layer, bottom, top = build_layer(text_format.MessageToString(lp),
                                     [saved[f"blob/{b}/data"] for b in bottom_names],
                                     num_tops=len(top_names), phase=phase, dtype=dtype)
    for i, p in enumerate(layer.blobs):
        p.data[...] = saved[f"param_init/{layer_name}/{i}/data"]
    run_forward(layer, bottom, top)

    if isinstance(propagate_down, bool):
        propagate_down = [propagate_down] * len(bottom)
    assert len(propagate_down) == len(bottom), "propagate_down: one bool per bottom"
    propagate = [bool(p) and layer.allow_force_backward(i)
                 for i, p in enumerate(propagate_down)]
    if backward:
        for t, name in zip(top, top_names):
            t.diff[...] = saved[f"blob/{name}/diff"]
        for blob in bottom + list(layer.blobs):
            blob.diff[...] = 0
        layer.backward(top, propagate, bottom)
    return FixtureLayer(layer, bottom, top, lp, bottom_names, top_names, saved, backward,
                        propagate, top_relu, bottom_relu)


def assert_matches_caffe(run: FixtureLayer, rtol: float = 2e-6, atol: float = 1e-7) -> None:
    """Compare a :func:`run_fixture_layer` result with what Caffe saved: the tops, the param
    data (which a forward pass may update: BatchNorm's statistics), and after a backward the
    bottom diffs and param diffs.

    Each array ``got`` must lie within ``rtol * |ref| + atol * max|ref|`` of Caffe's ``ref``,
    elementwise: ``atol`` is relative to the array's largest magnitude (float32 rounding grows
    with the size of what was summed, not of the element), so an array that Caffe saved as all
    zeros must come out exactly zero. A bottom whose gradient was not asked for must keep its
    zero diff.
    """
    saved = run.saved

    def close(got, key):
        ref = saved[key]
        assert got.shape == ref.shape, f"{key}: shape {got.shape}, Caffe's {ref.shape}"
        scale = float(np.abs(ref).max()) if ref.size else 0.0
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol * scale, err_msg=key)

    name = run.layer_param.name
    for t, tname, slope in zip(run.top, run.top_names, run.top_relu):
        # saved after the in-place ReLU
        got = t.data if slope is None else np.where(t.data > 0, t.data, slope * t.data)
        close(got, f"blob/{tname}/data")
    for i, p in enumerate(run.layer.blobs):
        close(p.data, f"param/{name}/{i}/data")
    if not run.backward:
        return
    for b, bname, slope, asked in zip(run.bottom, run.bottom_names, run.bottom_relu,
                                      run.propagate_down):
        if not asked:
            assert not b.diff.any(), f"blob/{bname}/diff written though not asked for"
            continue
        # saved before the in-place ReLU's backward, which (like Caffe's) reads its output
        got = b.diff if slope is None else b.diff * np.where(b.data > 0, 1, slope)
        close(got, f"blob/{bname}/diff")
    for i, p in enumerate(run.layer.blobs):
        close(p.diff, f"param/{name}/{i}/diff")
