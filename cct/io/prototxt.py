"""Read NetParameter / SolverParameter from prototxt or binary protobuf, with clear errors,
and apply Caffe's upgrades of legacy formats on load (``upgrade_proto.cpp``)."""
from __future__ import annotations

import os
import re

from google.protobuf import message, text_format

from ..errors import ProtoError
from ..proto import caffe_pb2
from . import upgrade

_POS = re.compile(r"^(\d+):(\d+)\s*:\s*")


def _read_bytes(path: str, what: str) -> bytes:
    if not path:
        raise ProtoError(f"no {what} file given")
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ProtoError(f"{what} file '{path}' does not exist") from None
    except IsADirectoryError:
        raise ProtoError(f"{what} file '{path}' is a directory, expected a file") from None
    except OSError as e:
        raise ProtoError(f"cannot read {what} file '{path}': {e.strerror}") from None


def parse_text(text: str, msg: message.Message, source: str = "<string>") -> message.Message:
    """Parse protobuf text format into ``msg``; errors name ``source`` and the line."""
    try:
        text_format.Merge(text, msg, allow_unknown_field=False)
    except text_format.ParseError as e:
        detail = str(e)
        m = _POS.match(detail)
        if m:
            line, col = m.group(1), m.group(2)
            detail = detail[m.end():]
            raise ProtoError(f"{source}:{line}:{col}: cannot parse {msg.DESCRIPTOR.name}: "
                             f"{detail}") from None
        raise ProtoError(f"{source}: cannot parse {msg.DESCRIPTOR.name}: {detail}") from None
    return msg


def read_text(path: str, msg: message.Message, what: str) -> message.Message:
    data = _read_bytes(path, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtoError(f"{what} file '{path}' is not a text prototxt (it is not UTF-8; "
                         f"a binary file given where a prototxt was expected?)") from None
    return parse_text(text, msg, path)


def read_binary(path: str, msg: message.Message, what: str) -> message.Message:
    data = _read_bytes(path, what)
    try:
        msg.ParseFromString(data)
    except (message.DecodeError, RuntimeError) as e:
        raise ProtoError(f"{what} file '{path}' is not a valid binary {msg.DESCRIPTOR.name} "
                         f"(truncated or not a protobuf file: {e})") from None
    return msg


def net_from_text(text: str, source: str = "<string>") -> caffe_pb2.NetParameter:
    net = parse_text(text, caffe_pb2.NetParameter(), source)
    return upgrade.upgrade_net(net, source)


def read_net_text(path: str) -> caffe_pb2.NetParameter:
    """Caffe's ReadNetParamsFromTextFileOrDie, without dying: parse then upgrade."""
    net = read_text(path, caffe_pb2.NetParameter(), "net")
    return upgrade.upgrade_net(net, path)


def read_net_binary(path: str) -> caffe_pb2.NetParameter:
    net = read_binary(path, caffe_pb2.NetParameter(), "weights")
    return upgrade.upgrade_net(net, path)


def read_net(path: str) -> caffe_pb2.NetParameter:
    """A net from either format: text if it parses as text, binary otherwise."""
    data = _read_bytes(path, "net")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return read_net_binary(path)
    return upgrade.upgrade_net(parse_text(text, caffe_pb2.NetParameter(), path), path)


def read_solver_text(path: str) -> caffe_pb2.SolverParameter:
    solver = read_text(path, caffe_pb2.SolverParameter(), "solver")
    return upgrade.upgrade_solver(solver, path)


def write_text(msg: message.Message, path: str) -> None:
    tmp = path + ".tmp-%d" % os.getpid()
    with open(tmp, "w") as f:
        f.write(text_format.MessageToString(msg))
    os.replace(tmp, path)
