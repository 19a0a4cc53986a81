"""pycaffe's ``caffe.draw``: pictures of a NetParameter, through ``cct draw_net``'s drawing code
(cct/tools/draw_net.py).

The functions keep pycaffe's signatures and return values: labels come back quoted for
Graphviz, :func:`get_pydot_graph` returns a ``pydot.Dot`` (it needs ``pip install pydot``).
:func:`draw_net` and :func:`draw_net_to_file` draw with Graphviz when pydot and ``dot`` are
installed and with cct's own Pillow layout otherwise (PNG, JPEG, BMP, GIF, TIFF).
"""
from __future__ import annotations

import os
import tempfile
from typing import Optional, Tuple

from .errors import CCTError
from .proto import caffe_pb2
from .tools import draw_net as _tool

LAYER_STYLE_DEFAULT = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": _tool.NEURON_COLOR, "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": _tool.BLOB_COLOR, "style": "filled"}


def _pydot():
    try:
        import pydot
    except ImportError:
        raise CCTError("caffe.draw.get_pydot_graph needs pydot (and Graphviz's `dot` to render "
                       "it): pip install pydot; draw_net_to_file draws without it") from None
    return pydot


def get_pooling_types_dict() -> dict:
    """{pool method number: name}, e.g. {0: 'MAX', 1: 'AVE', 2: 'STOCHASTIC'}."""
    desc = caffe_pb2.PoolingParameter.PoolMethod.DESCRIPTOR
    return {v.number: name for name, v in desc.values_by_name.items()}


def get_edge_label(layer: caffe_pb2.LayerParameter) -> str:
    """The label of a layer's edges to its tops: ``Batch N`` for Data, num_output for
    Convolution, Deconvolution and InnerProduct, else ``'""'`` (an empty Graphviz label)."""
    return _tool.edge_label(layer) or '""'


def get_layer_lr_mult(layer: caffe_pb2.LayerParameter) -> Tuple[float, float]:
    """(weights, bias) lr_mult of a Convolution, Deconvolution or InnerProduct layer; 1.0
    where a ``param`` block is missing."""
    if layer.type not in _tool.LEARNING_LAYERS:
        raise CCTError(f"{layer.type} layers do not have a learning rate multiplier (layer "
                       f"'{layer.name}'); only {', '.join(_tool.LEARNING_LAYERS)} have")
    if len(layer.param) > 2:
        raise CCTError(f"Could not parse the learning rate multiplier of layer '{layer.name}': "
                       f"it has {len(layer.param)} param blocks, at most 2 expected")
    mults = [p.lr_mult for p in layer.param] + [1.0] * (2 - len(layer.param))
    return mults[0], mults[1]


def get_layer_label(layer: caffe_pb2.LayerParameter, rankdir: str,
                    display_lrm: bool = False) -> str:
    """The quoted node label: name, (type), kernel/stride/pad for spatial layers and with
    ``display_lrm`` the lr mults, one per line for LR/RL, space-separated for TB/BT."""
    lines = _tool.layer_label(layer, "LR", False)
    if display_lrm and layer.type in _tool.LEARNING_LAYERS:
        lrm0, lrm1 = get_layer_lr_mult(layer)
        if lrm0 or lrm1:
            lines.append("lr mult: %.1f, %.1f" % (lrm0, lrm1))
    separator = " " if rankdir in ("TB", "BT") else r"\n"
    return '"%s"' % separator.join(lines)


def choose_color_by_layertype(layertype: str) -> str:
    """Fill colour of a layer node: red convolutions, orange pooling, purple inner products,
    blue otherwise."""
    return _tool.layer_color(layertype)


def get_pydot_graph(caffe_net: caffe_pb2.NetParameter, rankdir: str, label_edges: bool = True,
                    phase: Optional[int] = None, display_lrm: bool = False):
    """The net as a ``pydot.Dot`` digraph: a node per layer (in-place layers green) and per
    blob, edges bottom -> layer -> top. ``phase`` keeps the layers whose include/exclude rules
    admit it (None: all)."""
    pydot = _pydot()
    graph = pydot.Dot(caffe_net.name or "Net", graph_type="digraph", rankdir=rankdir)
    nodes, edges = {}, []
    for layer in _tool.phase_layers(caffe_net, phase):
        node_name = f"{layer.name}_{layer.type}"
        label = get_layer_label(layer, rankdir, display_lrm=display_lrm)
        if _tool.is_in_place(layer):
            nodes[node_name] = pydot.Node(label, **NEURON_LAYER_STYLE)
        else:
            style = dict(LAYER_STYLE_DEFAULT, fillcolor=choose_color_by_layertype(layer.type))
            nodes[node_name] = pydot.Node(label, **style)
        for bottom in layer.bottom:
            nodes[bottom + "_blob"] = pydot.Node(bottom, **BLOB_STYLE)
            edges.append((bottom + "_blob", node_name, '""'))
        for top in layer.top:
            nodes[top + "_blob"] = pydot.Node(top)
            edges.append((node_name, top + "_blob",
                          get_edge_label(layer) if label_edges else '""'))
    for node in nodes.values():
        graph.add_node(node)
    for src, dst, label in edges:
        graph.add_edge(pydot.Edge(nodes[src], nodes[dst], label=label))
    return graph


def draw_net(caffe_net: caffe_pb2.NetParameter, rankdir: str, ext: str = "png",
             phase: Optional[int] = None, display_lrm: bool = False) -> bytes:
    """The picture of the net as the bytes of an ``ext`` file."""
    with tempfile.TemporaryDirectory(prefix="cct-draw-") as tmp:
        path = os.path.join(tmp, "net." + ext)
        draw_net_to_file(caffe_net, path, rankdir, phase, display_lrm)
        with open(path, "rb") as f:
            return f.read()


def draw_net_to_file(caffe_net: caffe_pb2.NetParameter, filename: str, rankdir: str = "LR",
                     phase: Optional[int] = None, display_lrm: bool = False) -> None:
    """Draw the net into ``filename``, in the format its extension names."""
    _tool.draw_net_to_file(caffe_net, filename, rankdir, phase, display_lrm)
