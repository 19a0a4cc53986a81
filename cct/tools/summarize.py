"""``cct summarize NET.prototxt``: Caffe's tools/extra/summarize.py, a table of a net's layers
to check at a glance that the prototxt computes what you meant.

One row per layer, columns as Caffe's: name, type (``module.layer`` for a Python layer), the
``param`` specs (``(name x<lr_mult> Dx<decay_mult>, ...)``, only what differs from the
defaults), the bottoms, ``->``, the tops (``<loss_weight> * top`` for a loss) and the layer's
arguments (Convolution/Deconvolution ``kernel[/stride][+pad] num_output[/group]``, Pooling
``kernel[/stride][+pad]``). On a terminal every blob name has a color of its own, a top no
later layer reads (an output) is bold and underlined, and a bottom no layer produced is on
red.

Unlike Caffe's script, cct builds the net (``--phase``, ``--level``, ``--stage`` choose its
state, as ``cct train`` and ``cct test`` do) and adds what only a built net knows: each top's
shape and each layer's number of param values, with the totals at the end. The data layers
must then find their sources (relative to the current folder, as in Caffe); when the net
cannot be built, a warning says why and the table has the prototxt's columns only.
``--phase=ALL`` lists every layer of the file, whatever its include/exclude rules, as
Caffe's script does, and builds nothing.
"""
from __future__ import annotations

import re
import sys
from typing import Dict, List, Optional, Sequence

from ..errors import CCTError
from ..flags import Flags
from ..io import prototxt
from ..proto import caffe_pb2

TOOL = "summarize"
PHASES = {"TRAIN": caffe_pb2.TRAIN, "TEST": caffe_pb2.TEST, "ALL": None}

#: ANSI colors given to blobs in turn (Caffe's summarize.py palette)
COLORS = ["92", "93", "94", "95", "97", "96", "42", "43;30", "100", "444", "103;30", "107;30"]
DISCONNECTED_COLOR = "41"
OUTPUT_STYLE = "1;4"
_ANSI = re.compile(r"\033\[[\d;]+m")

HEADER = ["layer", "type", "params", "bottoms", "", "tops", "args", "top shapes", "param values"]


def _g(x: float) -> str:
    return "%g" % x


def format_param(spec: caffe_pb2.ParamSpec) -> str:
    """A ``param {}`` block as ``name x<lr_mult> Dx<decay_mult>``, defaults left out."""
    out = [spec.name] if spec.name else []
    if spec.lr_mult != 1:
        out.append(f"x{_g(spec.lr_mult)}")
    if spec.decay_mult != 1:
        out.append(f"Dx{_g(spec.decay_mult)}")
    return " ".join(out)


def _pair(values: Sequence[int], h: int, w: int, default: int) -> str:
    """A repeated spatial field (kernel_size, stride, pad) or its _h/_w form, as 5 or 3x5."""
    if h or w:
        return str(h) if h == w else f"{h}x{w}"
    vals = list(values) or [default]
    return str(vals[0]) if len(set(vals)) == 1 else "x".join(map(str, vals))


def layer_args(lp: caffe_pb2.LayerParameter) -> str:
    """Caffe's summary of a convolution or pooling: ``5/2+1 64/2`` is a 5x5 kernel, stride 2,
    pad 1, 64 outputs in 2 groups; InnerProduct shows its num_output."""
    if lp.type in ("Convolution", "Deconvolution"):
        c = lp.convolution_param
        text = _pair(c.kernel_size, c.kernel_h, c.kernel_w, 0)
        stride = _pair(c.stride, c.stride_h, c.stride_w, 1)
        pad = _pair(c.pad, c.pad_h, c.pad_w, 0)
        text += ("" if stride == "1" else f"/{stride}") + ("" if pad == "0" else f"+{pad}")
        text += f" {c.num_output}" + ("" if c.group == 1 else f"/{c.group}")
        return text
    if lp.type == "Pooling":
        p = lp.pooling_param
        if p.global_pooling:
            return "global"
        text = _pair([p.kernel_size] if p.HasField("kernel_size") else [], p.kernel_h,
                     p.kernel_w, 0)
        stride = _pair([p.stride], p.stride_h, p.stride_w, 1)
        pad = _pair([p.pad], p.pad_h, p.pad_w, 0)
        return text + ("" if stride == "1" else f"/{stride}") + ("" if pad == "0" else f"+{pad}")
    if lp.type == "InnerProduct":
        return str(lp.inner_product_param.num_output)
    return ""


def _paint(text: str, style: Optional[str]) -> str:
    return f"\033[{style}m{text}\033[0m" if style else text


def summarize_net(param: caffe_pb2.NetParameter, net=None, color: bool = False
                  ) -> List[List[str]]:
    """The table's rows (without the header), one per layer of ``param``; ``net``, the
    built net of ``param`` (a cct Net), fills the shapes and param counts."""
    outputs = set()
    for lp in param.layer:
        outputs |= set(lp.top)
        outputs -= set(lp.bottom)
    colors: Dict[str, str] = {}
    rows = []
    for lp in param.layer:
        index = net.layer_id(lp.name) if net is not None else None
        tops = []
        for i, top in enumerate(lp.top):
            style = colors.setdefault(top, COLORS[len(colors) % len(COLORS)])
            if index is not None:
                weight = net.blob_loss_weights[net.top_ids(index)[i]]
            else:
                weight = lp.loss_weight[i] if i < len(lp.loss_weight) else 0
            name = _paint(top, OUTPUT_STYLE) if color and top in outputs else top
            shown = (f"{_g(weight)} * " if weight else "") + name
            tops.append(_paint(shown, style) if color else shown)
        bottoms = [_paint(b, colors.get(b, DISCONNECTED_COLOR) if color else None)
                   for b in lp.bottom]
        type_str = (f"{lp.python_param.module}.{lp.python_param.layer}" if lp.type == "Python"
                    else lp.type)
        specs = [format_param(s) for s in lp.param]
        params = f"({', '.join(specs)})" if any(specs) else ""
        shapes = count = ""
        if index is not None:
            shapes = ", ".join("x".join(map(str, t.shape)) or "scalar"
                               for t in net.top_blobs(index)[:len(lp.top)])
            values = sum(b.count for b in net.layers[index].blobs)
            count = str(values) if net.layers[index].blobs else ""
        rows.append([lp.name, type_str, params, ", ".join(bottoms), "->", ", ".join(tops),
                     layer_args(lp), shapes, count])
    return rows


def printed_len(text: str) -> int:
    return len(_ANSI.sub("", text))


def format_table(rows: List[List[str]], max_width: int) -> List[str]:
    """Caffe's print_table: space-separated columns as narrow as their cells, but no wider
    than ``max_width``; a longer cell runs into the next column, which then starts as soon
    after it as it can, so the later columns stay aligned where they fit."""
    if not rows:
        return []
    widths = [min(max(printed_len(row[j]) + 1 for row in rows), max_width)
              for j in range(len(rows[0]))]
    lines = []
    for row in rows:
        line = ""
        right = 0
        for cell, width in zip(row, widths):
            right += width
            line += cell + " "
            line += " " * max(right - printed_len(line), 0)
        lines.append(line.rstrip())
    return lines


def totals(net) -> str:
    """The built net's totals: param values (a shared param counted once, as its owner's) and
    the values its tops hold."""
    owned = sum(net.params_list[row.net_id].count for row in net.param_table())
    learnable = sum(b.count for b in net.learnable_params)
    tops = sum(net.blobs_list[i].count for i in range(len(net.blobs_list)))
    return (f"Total: {owned} param values ({learnable} learnable) in {len(net.layers)} layers; "
            f"blobs of {tops} values ({tops * net.dtype.itemsize} bytes of data)")


def build_net(param: caffe_pb2.NetParameter, phase: int, level: int, stages: List[str],
              source: str):
    """The cct Net of ``param`` in that state, built quietly; a CCTError says why not."""
    from ..glog import quiet
    from ..net import Net

    with quiet():
        return Net(param, phase=phase, level=level, stages=stages, source=source)


def main(argv: List[str]) -> int:
    flags = Flags(TOOL, argv, {"phase": "TRAIN", "level": "0", "stage": "", "max-width": "30",
                               "color": "auto"}, positional=("filename",))
    (source,) = flags.positional
    phase_name = flags.get("phase").upper()
    if phase_name not in PHASES:
        raise CCTError(f"{TOOL}: --phase must be TRAIN, TEST or ALL, got '{flags.get('phase')}'")
    max_width = flags.int("max-width")
    if max_width < 1:
        raise CCTError(f"{TOOL}: --max-width must be at least 1, got {max_width}")
    choice = flags.get("color")
    if choice not in ("auto", "always", "never"):
        raise CCTError(f"{TOOL}: --color must be auto, always or never, got '{choice}'")
    color = choice == "always" or (choice == "auto" and sys.stdout.isatty())
    param = prototxt.read_net_text(source)
    net = None
    if PHASES[phase_name] is not None:
        from ..glog import quiet
        from ..net import filter_net

        try:
            net = build_net(param, PHASES[phase_name], flags.int("level"), flags.list("stage"),
                            source)
        except CCTError as e:
            print(f"{TOOL}: warning: the {phase_name} net of '{source}' cannot be built, so "
                  f"the table has no shapes: {e}", file=sys.stderr)
        state = caffe_pb2.NetParameter()
        state.CopyFrom(param)
        state.state.phase = PHASES[phase_name]
        state.state.level = flags.int("level")
        state.state.stage.extend(flags.list("stage"))
        with quiet():     # the rules' INFO lines were the net's to print
            param = filter_net(state)
    rows = summarize_net(param, net, color)
    if net is None:
        rows = [HEADER[:7]] + [r[:7] for r in rows]
    else:
        rows = [HEADER] + rows
    for line in format_table(rows, max_width):
        print(line)
    if net is not None:
        print(totals(net))
        net.close()
    return 0
