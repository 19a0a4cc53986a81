"""``cct draw_net NET.prototxt OUT.png [--rankdir LR|TB|BT|RL] [--phase TRAIN|TEST|ALL]
[--display_lrm]``: Caffe's python/draw_net.py.

A picture of the net (the drawing is cct/draw.py's, pycaffe's ``caffe.draw``): layers as filled boxes labelled with name, type and (for convolution and
pooling) kernel, stride and pad, coloured by type as Caffe's draw.py colours them; blobs as grey
octagons; an arrow from each bottom blob to its layer and from the layer to each top (labelled
with ``num_output`` or the data batch size). ``--phase`` keeps the layers whose include/exclude
rules admit that phase (ALL, the default, keeps every layer); ``--rankdir`` is the direction of
the data flow (LR: left to right, the default).

When the ``pydot`` package and Graphviz's ``dot`` program are installed the graph is laid out by
Graphviz as in Caffe (any format ``dot`` writes, from the output's extension). Otherwise cct
lays the graph out itself in layers and draws it with Pillow (PNG, JPEG, BMP, ...); there an
in-place layer's top is drawn as a new node of the same blob so the picture stays acyclic.
"""
from __future__ import annotations

from typing import List

from ..draw import TOOL, draw_net_to_file
from ..errors import CCTError
from ..flags import Flags
from ..io import prototxt
from ..proto import caffe_pb2

PHASES = {"TRAIN": caffe_pb2.TRAIN, "TEST": caffe_pb2.TEST, "ALL": None}


def main(argv: List[str]) -> int:
    flags = Flags(TOOL, argv, {"rankdir": "LR", "phase": "ALL"}, booleans=("display_lrm",),
                  positional=("input_net_proto_file", "output_image_file"))
    source, out = flags.positional
    phase_name = flags.get("phase").upper()
    if phase_name not in PHASES:
        raise CCTError(f"{TOOL}: --phase must be TRAIN, TEST or ALL, got '{flags.get('phase')}'")
    net = prototxt.read_net_text(source)
    print(f"Drawing net to {out}")
    draw_net_to_file(net, out, flags.get("rankdir"), PHASES[phase_name],
                     flags.bool("display_lrm"))
    return 0
