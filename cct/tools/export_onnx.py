"""``cct export_onnx --model=deploy.prototxt --weights=w.caffemodel --output=m.onnx
[--opset N] [--batch dynamic|N] [--check]``: a Caffe net and its weights as an ONNX model
(cct/onnx_export.py), optionally checked against cct's own forward in ONNX Runtime: at the
model's own batch where it is fixed (the net's, or -batch N), at 1 and 8 where it is dynamic."""
from __future__ import annotations

from typing import List

from ..errors import CCTError
from ..onnx_export import DEFAULT_OPSET, check_batches, check_opset, export_onnx, run_check
from ..flags import Flags
from ..glog import info
from ..api import TEST, Net


def main(argv: List[str]) -> int:
    flags = Flags("export_onnx", argv, {"model": "", "weights": "", "output": "",
                                        "opset": str(DEFAULT_OPSET), "batch": "", "level": "0",
                                        "stage": ""}, booleans=("check",))
    for name in ("model", "output"):
        if not flags.get(name):
            raise CCTError(f"export_onnx: give -{name} (usage: cct export_onnx "
                           f"--model=deploy.prototxt --weights=w.caffemodel --output=m.onnx)")
    batch = flags.get("batch") or None
    if batch not in (None, "dynamic"):
        batch = flags.int("batch")
        if batch < 1:
            raise CCTError(f"export_onnx: -batch must be 'dynamic' or a positive number, got "
                           f"{batch}")
    opset = flags.int("opset")
    check_opset(opset)        # before reading the net and its weights
    weights = flags.get("weights") or None
    net = Net(flags.get("model"), TEST, level=flags.int("level"), stages=flags.list("stage"),
              weights=weights)
    sources = [flags.get("model")] + ([weights] if weights else [])
    model = export_onnx(net, flags.get("output"), opset=opset, batch=batch, sources=sources)
    info("export_onnx.py:0", f"Wrote {flags.get('output')}: {len(model.graph.node)} nodes, "
         f"inputs {', '.join(i.name for i in model.graph.input)}, outputs "
         f"{', '.join(o.name for o in model.graph.output)}")
    if flags.bool("check"):
        for n in check_batches(model):
            for name, diff in run_check(net, model, n).items():
                print(f"check batch {n}: output {name}: largest difference {diff:.3g} "
                      f"(relative to its largest magnitude)")
    return 0
