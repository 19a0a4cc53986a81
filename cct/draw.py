"""Pictures of a NetParameter: pycaffe's ``caffe.draw`` and the drawing behind ``cct draw_net``
(cct/tools/draw_net.py, Caffe's python/draw_net.py, which imports caffe.draw as this does).

Layers are filled boxes labelled with name, type and (for convolution and pooling) kernel,
stride and pad, coloured by type as Caffe's draw.py colours them; blobs grey octagons; an arrow
from each bottom blob to its layer and from the layer to each top (labelled with
``num_output`` or the data batch size). When the ``pydot`` package and Graphviz's ``dot``
program are installed the graph is laid out by Graphviz as in Caffe (any format ``dot``
writes, from the output's extension). Otherwise cct lays the graph out itself in layers and
draws it with Pillow (PNG, JPEG, BMP, GIF, TIFF); there an in-place layer's top is drawn as a
new node of the same blob so the picture stays acyclic.

pycaffe's functions keep their signatures and return values: labels come back quoted for
Graphviz, :func:`get_pydot_graph` returns a ``pydot.Dot`` (it needs ``pip install pydot``).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Dict, List, Optional, Tuple

from .errors import CCTError
from .proto import caffe_pb2

#: What the drawing's messages start with: the tool's name (pycaffe's callers draw with it too).
TOOL = "draw_net"
RANKDIRS = ("LR", "TB", "BT", "RL")

BLOB_COLOR = "#E0E0E0"
NEURON_COLOR = "#90EE90"
LEARNING_LAYERS = ("Convolution", "Deconvolution", "InnerProduct")


def layer_color(layer_type: str) -> str:
    """Caffe draw.py's choose_color_by_layertype."""
    if layer_type in ("Convolution", "Deconvolution"):
        return "#FF5050"
    if layer_type == "Pooling":
        return "#FF9900"
    if layer_type == "InnerProduct":
        return "#CC33FF"
    return "#6495ED"


def is_in_place(layer: caffe_pb2.LayerParameter) -> bool:
    return len(layer.bottom) == 1 and len(layer.top) == 1 and layer.bottom[0] == layer.top[0]


def layer_label(layer: caffe_pb2.LayerParameter, rankdir: str, display_lrm: bool) -> List[str]:
    """The lines of a layer's label, as Caffe's get_layer_label builds them."""
    lines = [layer.name]
    if layer.type == "Pooling":
        pool = caffe_pb2.PoolingParameter.PoolMethod.Name(layer.pooling_param.pool)
        lines.append(f"({layer.type} {pool})")
    else:
        lines.append(f"({layer.type})")
    if layer.type in ("Convolution", "Deconvolution", "Pooling"):
        if layer.type == "Pooling":
            p = layer.pooling_param
            kernel, stride, pad = p.kernel_size, p.stride, p.pad
        else:
            p = layer.convolution_param
            kernel = p.kernel_size[0] if len(p.kernel_size) else 1
            stride = p.stride[0] if len(p.stride) else 1
            pad = p.pad[0] if len(p.pad) else 0
        lines += [f"kernel size: {kernel}", f"stride: {stride}", f"pad: {pad}"]
    if display_lrm and layer.type in LEARNING_LAYERS:
        lr = [f"{p.lr_mult:g}" for p in layer.param] or ["1"]
        decay = [f"{p.decay_mult:g}" for p in layer.param] or ["1"]
        lines.append(f"lr mult: {', '.join(lr)}")
        lines.append(f"decay mult: {', '.join(decay)}")
    if rankdir in ("TB", "BT"):
        # vertical flow: horizontal room is free, so one line
        return [" ".join(lines)]
    return lines


def edge_label(layer: caffe_pb2.LayerParameter) -> str:
    """Caffe's get_edge_label: the batch size of a data layer, num_output of a learning one."""
    if layer.type == "Data":
        return f"Batch {layer.data_param.batch_size}"
    if layer.type in ("Convolution", "Deconvolution"):
        return str(layer.convolution_param.num_output)
    if layer.type == "InnerProduct":
        return str(layer.inner_product_param.num_output)
    return ""


def phase_layers(net: caffe_pb2.NetParameter, phase: Optional[int]) -> List:
    """The layers draw.py draws for ``phase`` (None: all): include/exclude rules are read for
    their phase only."""
    kept = []
    for layer in net.layer:
        if phase is not None:
            if len(layer.include) and len(layer.exclude):
                raise CCTError(f"{TOOL}: layer '{layer.name}' has both include and exclude "
                               f"rules; give one kind")
            included = len(layer.include) == 0
            for rule in layer.include:
                included = included or rule.phase == phase
            for rule in layer.exclude:
                included = included and rule.phase != phase
            if not included:
                continue
        kept.append(layer)
    return kept


# -- Graphviz through pydot -------------------------------------------------------------------

def _have_graphviz() -> bool:
    import importlib

    if shutil.which("dot") is None:
        return False
    try:
        importlib.import_module("pydot")
    except ImportError:
        return False
    return True


def draw_with_pydot(net: caffe_pb2.NetParameter, layers: List, path: str, rankdir: str,
                    display_lrm: bool) -> None:
    import pydot

    graph = pydot.Dot(net.name or "Net", graph_type="digraph", rankdir=rankdir)
    sep = " " if rankdir in ("TB", "BT") else "\\n"
    nodes: Dict[str, pydot.Node] = {}
    edges: List[Tuple[str, str, str]] = []

    def quoted(text: str) -> str:
        return '"%s"' % text.replace('"', '\\"')

    for layer in layers:
        node = f"{layer.name}_{layer.type}"
        label = sep.join(layer_label(layer, rankdir, display_lrm))
        fill = NEURON_COLOR if is_in_place(layer) else layer_color(layer.type)
        nodes[node] = pydot.Node(quoted(node), label=quoted(label), shape="record",
                                 style="filled", fillcolor=fill)
        for bottom in layer.bottom:
            nodes.setdefault(bottom + "_blob", pydot.Node(
                quoted(bottom + "_blob"), label=quoted(bottom), shape="octagon",
                style="filled", fillcolor=BLOB_COLOR))
            edges.append((bottom + "_blob", node, ""))
        for top in layer.top:
            nodes.setdefault(top + "_blob", pydot.Node(
                quoted(top + "_blob"), label=quoted(top), shape="octagon", style="filled",
                fillcolor=BLOB_COLOR))
            edges.append((node, top + "_blob", edge_label(layer)))
    for node in nodes.values():
        graph.add_node(node)
    for src, dst, label in edges:
        graph.add_edge(pydot.Edge(nodes[src], nodes[dst], label=quoted(label)))
    ext = os.path.splitext(path)[1][1:].lower() or "png"
    try:
        data = graph.create(format=ext)
    except Exception as e:  # pydot raises plain exceptions for dot's failures
        raise CCTError(f"{TOOL}: Graphviz could not draw '{path}' as {ext}: {e}") from None
    _write_bytes(path, data)


def _write_bytes(path: str, data: bytes) -> None:
    from .io.atomic import atomic_write

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write(path, write)


# -- cct's own layered drawing (Pillow) ---------------------------------------------------------

class _Node:
    __slots__ = ("key", "lines", "kind", "color", "rank", "order", "box")

    def __init__(self, key: str, lines: List[str], kind: str, color: str):
        self.key, self.lines, self.kind, self.color = key, lines, kind, color
        self.rank = 0
        self.order = 0.0
        self.box = (0, 0, 0, 0)


def build_graph(layers: List, rankdir: str, display_lrm: bool):
    """Nodes (layers and blob versions) and edges (src, dst, label) of an acyclic picture."""
    nodes: Dict[str, _Node] = {}
    edges: List[Tuple[str, str, str]] = []
    current: Dict[str, str] = {}  # blob name -> key of its latest node
    versions: Dict[str, int] = {}

    def blob_node(name: str, new: bool) -> str:
        if name in current and not new:
            return current[name]
        versions[name] = versions.get(name, -1) + 1
        key = f"blob:{name}:{versions[name]}"
        nodes[key] = _Node(key, [name], "blob", BLOB_COLOR)
        current[name] = key
        return key

    for i, layer in enumerate(layers):
        key = f"layer:{i}"
        color = NEURON_COLOR if is_in_place(layer) else layer_color(layer.type)
        nodes[key] = _Node(key, layer_label(layer, rankdir, display_lrm), "layer", color)
        for bottom in layer.bottom:
            edges.append((blob_node(bottom, False), key, ""))
        for top in layer.top:
            edges.append((key, blob_node(top, top in current), edge_label(layer)))
    return nodes, edges


def _layout(nodes: Dict[str, _Node], edges) -> List[List[_Node]]:
    """Longest-path ranks; within a rank, order by the mean order of the predecessors."""
    preds: Dict[str, List[str]] = {k: [] for k in nodes}
    for src, dst, _ in edges:
        preds[dst].append(src)
    for key in nodes:  # nodes were created in topological order
        nodes[key].rank = max((nodes[p].rank + 1 for p in preds[key]), default=0)
    ranks: List[List[_Node]] = [[] for _ in range(max((n.rank for n in nodes.values()),
                                                       default=-1) + 1)]
    for n in nodes.values():
        ranks[n.rank].append(n)
    for r, row in enumerate(ranks):
        for i, n in enumerate(row):
            ps = preds[n.key]
            n.order = (sum(nodes[p].order for p in ps) / len(ps)) if ps and r else float(i)
        row.sort(key=lambda n: n.order)
        for i, n in enumerate(row):
            n.order = float(i)
    return ranks


def _octagon(box, cut: float):
    x0, y0, x1, y1 = box
    return [(x0 + cut, y0), (x1 - cut, y0), (x1, y0 + cut), (x1, y1 - cut), (x1 - cut, y1),
            (x0 + cut, y1), (x0, y1 - cut), (x0, y0 + cut)]


def _border_point(box, toward):
    """Where the segment from the box's centre toward a point leaves the box."""
    x0, y0, x1, y1 = box
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    dx, dy = toward[0] - cx, toward[1] - cy
    if dx == 0 and dy == 0:
        return cx, cy
    tx = (x1 - cx) / abs(dx) if dx else float("inf")
    ty = (y1 - cy) / abs(dy) if dy else float("inf")
    t = min(tx, ty)
    return cx + dx * t, cy + dy * t


def draw_with_pillow(net_name: str, layers: List, path: str, rankdir: str,
                     display_lrm: bool) -> None:
    import math

    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=13)
    small = ImageFont.load_default(size=11)
    nodes, edges = build_graph(layers, rankdir, display_lrm)
    if not nodes:
        raise CCTError(f"{TOOL}: the net has no layers to draw (for this --phase)")
    ranks = _layout(nodes, edges)
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    pad_x, pad_y = 10, 6
    sizes = {}
    for n in nodes.values():
        left, top, right, bottom = measure.multiline_textbbox((0, 0), "\n".join(n.lines),
                                                              font=font, spacing=3)
        sizes[n.key] = (right - left + 2 * pad_x + (12 if n.kind == "blob" else 0),
                        bottom - top + 2 * pad_y)
    horizontal = rankdir in ("LR", "RL")
    gap_rank, gap_node, margin = 60, 24, 20
    # extent of each rank along the flow, and along the cross axis
    rank_depth = [max(sizes[n.key][0 if horizontal else 1] for n in row) for row in ranks]
    rank_cross = [sum(sizes[n.key][1 if horizontal else 0] for n in row)
                  + gap_node * (len(row) - 1) for row in ranks]
    cross = max(rank_cross)
    depth = sum(rank_depth) + gap_rank * (len(ranks) - 1)
    title_h = 24
    width = (depth if horizontal else cross) + 2 * margin
    height = (cross if horizontal else depth) + 2 * margin + title_h
    pos = margin
    for r, row in enumerate(ranks):
        along = pos + rank_depth[r] / 2
        c = margin + (cross - rank_cross[r]) / 2
        for n in row:
            w, h = sizes[n.key]
            extent = h if horizontal else w
            mid = c + extent / 2
            cx, cy = (along, mid) if horizontal else (mid, along)
            if rankdir == "RL":
                cx = width - cx
            if rankdir == "BT":
                cy = (height - title_h) - cy
            cy += title_h
            n.box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
            c += extent + gap_node
        pos += rank_depth[r] + gap_rank
    image = Image.new("RGB", (int(math.ceil(width)), int(math.ceil(height))), "white")
    draw = ImageDraw.Draw(image)
    draw.text((margin, 6), net_name or "Net", fill="black", font=font)
    for src, dst, label in edges:
        a, b = nodes[src].box, nodes[dst].box
        ca = ((a[0] + a[2]) / 2, (a[1] + a[3]) / 2)
        cb = ((b[0] + b[2]) / 2, (b[1] + b[3]) / 2)
        p0, p1 = _border_point(a, cb), _border_point(b, ca)
        draw.line([p0, p1], fill="#404040", width=1)
        angle = math.atan2(p1[1] - p0[1], p1[0] - p0[0])
        head = [p1] + [(p1[0] - 9 * math.cos(angle + s), p1[1] - 9 * math.sin(angle + s))
                       for s in (0.4, -0.4)]
        draw.polygon(head, fill="#404040")
        if label:  # near the head, where fanned-out edges are apart
            mx, my = p0[0] + 0.6 * (p1[0] - p0[0]), p0[1] + 0.6 * (p1[1] - p0[1])
            draw.text((mx + 3, my - 13), label, fill="#202020", font=small)
    for n in nodes.values():
        if n.kind == "blob":
            draw.polygon(_octagon(n.box, 6), fill=n.color, outline="black")
        else:
            draw.rounded_rectangle(n.box, radius=4, fill=n.color, outline="black")
        cx, cy = (n.box[0] + n.box[2]) / 2, (n.box[1] + n.box[3]) / 2
        draw.multiline_text((cx, cy), "\n".join(n.lines), fill="black", font=font,
                            anchor="mm", align="center", spacing=3)
    ext = os.path.splitext(path)[1][1:].lower() or "png"
    fmt = Image.registered_extensions().get("." + ext)
    if fmt is None:
        raise CCTError(f"{TOOL}: cannot write '{path}': without Graphviz (pip install pydot, "
                       f"and the graphviz package for `dot`) cct draws PNG, JPEG, BMP, GIF or "
                       f"TIFF files, not .{ext}")
    import io

    buf = io.BytesIO()
    image.save(buf, fmt)
    _write_bytes(path, buf.getvalue())


def draw_net_to_file(net: caffe_pb2.NetParameter, path: str, rankdir: str = "LR",
                     phase: Optional[int] = None, display_lrm: bool = False,
                     engine: str = "auto") -> str:
    """Draw ``net`` into ``path``; returns the engine used (``graphviz`` or ``pillow``)."""
    if rankdir not in RANKDIRS:
        raise CCTError(f"{TOOL}: --rankdir must be one of {', '.join(RANKDIRS)}, got "
                       f"'{rankdir}'")
    layers = phase_layers(net, phase)
    if engine == "auto":
        engine = "graphviz" if _have_graphviz() else "pillow"
    if engine == "graphviz":
        draw_with_pydot(net, layers, path, rankdir, display_lrm)
    else:
        draw_with_pillow(net.name, layers, path, rankdir, display_lrm)
    return engine



LAYER_STYLE_DEFAULT = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": NEURON_COLOR, "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": BLOB_COLOR, "style": "filled"}


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
    return edge_label(layer) or '""'


def get_layer_lr_mult(layer: caffe_pb2.LayerParameter) -> Tuple[float, float]:
    """(weights, bias) lr_mult of a Convolution, Deconvolution or InnerProduct layer; 1.0
    where a ``param`` block is missing."""
    if layer.type not in LEARNING_LAYERS:
        raise CCTError(f"{layer.type} layers do not have a learning rate multiplier (layer "
                       f"'{layer.name}'); only {', '.join(LEARNING_LAYERS)} have")
    if len(layer.param) > 2:
        raise CCTError(f"Could not parse the learning rate multiplier of layer '{layer.name}': "
                       f"it has {len(layer.param)} param blocks, at most 2 expected")
    mults = [p.lr_mult for p in layer.param] + [1.0] * (2 - len(layer.param))
    return mults[0], mults[1]


def get_layer_label(layer: caffe_pb2.LayerParameter, rankdir: str,
                    display_lrm: bool = False) -> str:
    """The quoted node label: name, (type), kernel/stride/pad for spatial layers and with
    ``display_lrm`` the lr mults, one per line for LR/RL, space-separated for TB/BT."""
    lines = layer_label(layer, "LR", False)
    if display_lrm and layer.type in LEARNING_LAYERS:
        lrm0, lrm1 = get_layer_lr_mult(layer)
        if lrm0 or lrm1:
            lines.append("lr mult: %.1f, %.1f" % (lrm0, lrm1))
    separator = " " if rankdir in ("TB", "BT") else r"\n"
    return '"%s"' % separator.join(lines)


def choose_color_by_layertype(layertype: str) -> str:
    """Fill colour of a layer node: red convolutions, orange pooling, purple inner products,
    blue otherwise."""
    return layer_color(layertype)


def get_pydot_graph(caffe_net: caffe_pb2.NetParameter, rankdir: str, label_edges: bool = True,
                    phase: Optional[int] = None, display_lrm: bool = False):
    """The net as a ``pydot.Dot`` digraph: a node per layer (in-place layers green) and per
    blob, edges bottom -> layer -> top. ``phase`` keeps the layers whose include/exclude rules
    admit it (None: all)."""
    pydot = _pydot()
    graph = pydot.Dot(caffe_net.name or "Net", graph_type="digraph", rankdir=rankdir)
    nodes, edges = {}, []
    for layer in phase_layers(caffe_net, phase):
        node_name = f"{layer.name}_{layer.type}"
        label = get_layer_label(layer, rankdir, display_lrm=display_lrm)
        if is_in_place(layer):
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
    """The picture of the net as the bytes of an ``ext`` file (pycaffe's)."""
    with tempfile.TemporaryDirectory(prefix="cct-draw-") as tmp:
        path = os.path.join(tmp, "net." + ext)
        draw_net_to_file(caffe_net, path, rankdir, phase, display_lrm)
        with open(path, "rb") as f:
            return f.read()
