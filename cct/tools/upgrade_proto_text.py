"""``cct upgrade_net_proto_text IN OUT`` and ``cct upgrade_solver_proto_text IN OUT``: Caffe's
tools/upgrade_net_proto_text and tools/upgrade_solver_proto_text.

Read a text prototxt, apply the upgrades Caffe applies when it loads one (V0/V1 layers,
data-transform fields, ``input`` fields, old BatchNorm params; the solver's ``solver_type``
enum), and write the result as protobuf text. A file that needs no upgrade is written back
unchanged with Caffe's "File already in latest proto format" line. Numbers are printed as
protobuf's C++ TextFormat prints them (``lr_mult: 1``, not Python's ``1.0``). The output is
written under a temporary name and renamed.
"""
from __future__ import annotations

import re
from typing import List

from google.protobuf import message, text_format

from ..flags import Flags
from ..glog import info
from ..io import prototxt, upgrade
from ..io.atomic import atomic_write
from ..proto import caffe_pb2
from . import log_error

_WHOLE_FLOAT = re.compile(r"^(\s*\w+: -?\d+)\.0$", re.MULTILINE)


def write_text(msg: message.Message, path: str) -> None:
    """Caffe's WriteProtoToTextFile: protobuf text, whole floats without Python's ``.0``."""
    text = _WHOLE_FLOAT.sub(r"\1", text_format.MessageToString(msg))

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, write)


def _upgrade_text(tool: str, argv: List[str], what: str, message_type, needs_upgrade,
                  apply_upgrade) -> int:
    """Caffe's upgrade_{net,solver}_proto_text: read, upgrade if needed, write back."""
    flags = Flags(tool, argv, {}, positional=(f"{what}_proto_file_in",
                                              f"{what}_proto_file_out"))
    source, out = flags.positional
    msg = prototxt.read_text(source, message_type(), what)
    if needs_upgrade(msg):
        apply_upgrade(msg, source)
    else:
        log_error(f"{tool}.cpp:40", f"File already in latest proto format: {source}")
    write_text(msg, out)
    info(f"{tool}.cpp:46", f"Wrote upgraded {message_type.DESCRIPTOR.name} text proto to {out}")
    return 0


def main_upgrade_net_proto_text(argv: List[str]) -> int:
    return _upgrade_text("upgrade_net_proto_text", argv, "net", caffe_pb2.NetParameter,
                         upgrade.net_needs_upgrade, upgrade.upgrade_net)


def main_upgrade_solver_proto_text(argv: List[str]) -> int:
    return _upgrade_text("upgrade_solver_proto_text", argv, "solver", caffe_pb2.SolverParameter,
                         upgrade.solver_needs_type_upgrade, upgrade.upgrade_solver)


main = main_upgrade_net_proto_text
