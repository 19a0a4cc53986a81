"""Read NetParameter / SolverParameter from prototxt or binary protobuf, with clear errors,
and apply Caffe's upgrades of legacy formats on load (``upgrade_proto.cpp``)."""
from __future__ import annotations

import math
import re

import numpy as np
from google.protobuf import message, text_encoding, text_format

from ..errors import ProtoError, close_matches
from ..proto import caffe_pb2
from . import upgrade
from .atomic import atomic_write

_POS = re.compile(r"^(\d+):(\d+)\s*:\s*")
_NO_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_NO_ENUM_VALUE = re.compile(r'Enum type "([\w.]+)" has no value named (\w+)')
# Control bytes other than tab, newline, vt, form feed and return: a text prototxt holds
# next to none (a stray one in a comment, say), a binary protobuf many (field tags and lengths
# below 0x20).
_BINARY_BYTES = re.compile(rb"[\x00-\x08\x0e-\x1f]")


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
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise ProtoError(f"cannot read {what} file '{path}': "
                         f"{getattr(e, 'strerror', None) or e}") from None


def _looks_binary(data: bytes) -> bool:
    """Whether bytes that do not parse are rather a binary file than a damaged prototxt: more
    than 5% of them are control bytes (about 10% of random float bytes are, and more of a
    message's tags and lengths)."""
    return len(_BINARY_BYTES.findall(data)) * 20 > len(data)


def _decode(data: bytes) -> str:
    """Text of a prototxt. Caffe's parser takes any bytes; a file that is not UTF-8 (Latin-1
    comments, typically) is read as Latin-1 rather than refused."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _hint(detail: str) -> str:
    """A suggestion for the usual slips: a misspelt field or enum value, an unquoted string."""
    pool = caffe_pb2.DESCRIPTOR.pool
    m = _NO_FIELD.search(detail)
    if m:
        try:
            fields = pool.FindMessageTypeByName(m.group(1)).fields_by_name
        except KeyError:
            return ""
        return close_matches(m.group(2), fields)
    m = _NO_ENUM_VALUE.search(detail)
    if m:
        try:
            values = pool.FindEnumTypeByName(m.group(1)).values_by_name
        except KeyError:
            return ""
        return close_matches(m.group(2), values)
    if detail.startswith("Expected string but found"):
        return " String values are written in double quotes, e.g. type: \"ReLU\"."
    return ""


def parse_text(text: str, msg: message.Message, source: str = "<string>") -> message.Message:
    """Parse protobuf text format into ``msg`` as Caffe's ReadProtoFromTextFile does (a field
    that is not repeated may appear once); errors name ``source``, the line and the column."""
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as e:
        detail = str(e)
        m = _POS.match(detail)
        if not m:
            raise ProtoError(f"{source}: cannot parse {msg.DESCRIPTOR.name}: {detail}") from None
        line, col = int(m.group(1)), m.group(2)
        detail = detail[m.end():]
        lines = text.splitlines()
        shown = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        # The parser quotes the whole line before some messages; it is shown below instead.
        echo = f"'{lines[line - 1]}': " if shown else None
        if echo and detail.startswith(echo):
            detail = detail[len(echo):]
        hint = _hint(detail)
        if hint and not detail.endswith("."):
            detail += "."
        where = f"\n    line {line}: {shown}" if shown else ""
        raise ProtoError(f"{source}:{line}:{col}: cannot parse {msg.DESCRIPTOR.name}: {detail}"
                         f"{hint}{where}") from None
    return msg


def read_text(path: str, msg: message.Message, what: str) -> message.Message:
    data = _read_bytes(path, what)
    try:
        return parse_text(_decode(data), msg, path)
    except ProtoError:
        if _looks_binary(data):
            raise ProtoError(f"{what} file '{path}' is a binary file, not a text prototxt (a "
                             f".caffemodel or other binary given where a prototxt was "
                             f"expected?)") from None
        raise


def read_binary(path: str, msg: message.Message, what: str) -> message.Message:
    data = _read_bytes(path, what)
    try:
        msg.ParseFromString(data)
    except (message.DecodeError, RuntimeError) as e:
        hint = ("; it looks like a text file (a prototxt given where a binary file was "
                "expected?)" if data and not _looks_binary(data) else "")
        raise ProtoError(f"{what} file '{path}' is not a valid binary {msg.DESCRIPTOR.name}: "
                         f"it is truncated or not a protobuf file ({e}){hint}") from None
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
    """A net from either format: text if the file parses as text, else binary. When it
    parses neither way, the error is the one of the format it looks like."""
    data = _read_bytes(path, "net")
    try:
        net = parse_text(_decode(data), caffe_pb2.NetParameter(), path)
    except ProtoError as text_error:
        if not _BINARY_BYTES.search(data):
            raise
        try:
            net = read_binary(path, caffe_pb2.NetParameter(), "net")
        except ProtoError:
            if _looks_binary(data):
                raise
            raise text_error from None
    return upgrade.upgrade_net(net, path)


def read_solver_text(path: str) -> caffe_pb2.SolverParameter:
    """Caffe's ReadSolverParamsFromTextFileOrDie, without dying: parse, upgrade solver_type,
    then default snapshot_prefix from the file's path."""
    solver = read_text(path, caffe_pb2.SolverParameter(), "solver")
    upgrade.upgrade_solver(solver, path)
    upgrade.upgrade_snapshot_prefix(solver, path)
    return solver


def write_text(msg: message.Message, path: str) -> None:
    """Write ``msg`` as protobuf text, atomically (:func:`cct.io.atomic.atomic_write`)."""
    text = text_format.MessageToString(msg)

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, write)


def debug_string(msg, indent: int = 0) -> str:
    """Protobuf text as C++ ``DebugString`` prints it (Caffe logs parameters this way): fields
    in number order, floats with 6 significant digits (``lr_mult: 1``, not ``1.0``) or 9 when a
    value needs them to read back exactly."""
    pad = "  " * indent
    out = []
    for field, value in msg.ListFields():
        for v in (value if _is_repeated(field) else [value]):
            if field.cpp_type == field.CPPTYPE_MESSAGE:
                out.append(f"{pad}{field.name} {{\n{debug_string(v, indent + 1)}{pad}}}\n")
            else:
                out.append(f"{pad}{field.name}: {_text_scalar(field, v)}\n")
    return "".join(out)


def _is_repeated(field) -> bool:
    rep = getattr(field, "is_repeated", None)
    if rep is None:
        return field.label == field.LABEL_REPEATED
    return rep() if callable(rep) else rep


def _text_scalar(field, v) -> str:
    if field.cpp_type == field.CPPTYPE_STRING:
        if field.type == field.TYPE_BYTES:
            return '"' + text_encoding.CEscape(v, False) + '"'
        return '"' + text_encoding.CEscape(v, True) + '"'
    if field.cpp_type == field.CPPTYPE_ENUM:
        value = field.enum_type.values_by_number.get(v)
        return value.name if value is not None else str(v)
    if field.cpp_type == field.CPPTYPE_BOOL:
        return "true" if v else "false"
    if field.cpp_type in (field.CPPTYPE_FLOAT, field.CPPTYPE_DOUBLE):
        if not math.isfinite(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        single = field.cpp_type == field.CPPTYPE_FLOAT
        kind, short, full = (np.float32, 6, 9) if single else (float, 15, 17)
        text = "%.*g" % (short, v)
        return text if kind(text) == kind(v) else "%.*g" % (full, v)
    return str(v)
