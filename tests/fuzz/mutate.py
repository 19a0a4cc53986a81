"""Mutations of valid files, drawn by hypothesis, and the one assertion every fuzz target makes.

A mutation is a short list of operations applied to a seed (a valid file's bytes): structured
ones first, on the seed itself (a protobuf varint or a number in a text prototxt replaced by an
extreme value), then byte-level ones (flip a bit, overwrite, insert, delete, duplicate a range,
truncate, splice a 32-bit extreme). The drawn operations are what hypothesis prints for a
failing example: short, and replayed by :func:`apply`, where the bytes themselves may be
megabytes. HDF5 files are also changed through h5py (:func:`apply_h5`: objects deleted,
replaced by datasets of the wrong type or shape, renamed, turned into broken links), which
reaches the readers' checks of Caffe's layout where byte changes mostly break the file.

Settings: every target runs a bounded, derandomized number of examples (the CI default); the
environment variable ``CCT_FUZZ_EXAMPLES`` sets the number of examples per target for long
runs, and ``CCT_FUZZ_SEED`` replaces the fixed seed by the given one (fresh inputs).
"""
from __future__ import annotations

import functools
import os
import re
import struct
import traceback
from typing import Callable, List, Optional, Tuple

from hypothesis import HealthCheck, Phase, event, note, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import UnsatisfiedAssumption

from cct.errors import CCTError

# Integers around the int32/uint32/int64 boundaries: what a stored count, size or index can
# hold at the edge of its type.
INT_EXTREMES = (0, 1, -1, 2, 255, 65535, 2 ** 31 - 1, 2 ** 31, -2 ** 31, -2 ** 31 - 1,
                2 ** 32 - 1, 2 ** 32, 2 ** 63 - 1, -2 ** 63, 2 ** 64 - 1)
# The same as prototxt text, plus floats a field may be given.
TEXT_EXTREMES = tuple(str(v) for v in INT_EXTREMES) + (
    "18446744073709551616", "-0", "1e400", "-1e400", "nan", "inf", "-inf", "3.5e38", "1e-45",
    "0.5", "-0.5", "0x7fffffff", "0xffffffff", "true", "false", '""', '"x"')
# 32-bit words as they sit in a file: uint32 extremes and float specials.
WORDS = tuple(struct.pack(order + "I", v & 0xFFFFFFFF) for v in INT_EXTREMES
              for order in "<>") + tuple(
    struct.pack("<f", f) for f in (float("nan"), float("inf"), -float("inf"), 3.4e38, -0.0))

BYTE_OPS = ("flip", "set", "insert", "delete", "dup", "truncate", "word")


def _base_settings(default_examples: int) -> dict:
    examples = int(os.environ.get("CCT_FUZZ_EXAMPLES", default_examples))
    return dict(max_examples=examples, deadline=None, database=None, print_blob=False,
                derandomize="CCT_FUZZ_SEED" not in os.environ,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate, Phase.shrink])


def fuzz(default_examples: int):
    """Decorator for a hypothesis test: the bounded CI settings, or those the environment
    asks for (see the module doc)."""
    def deco(test):
        test = settings(**_base_settings(default_examples))(test)
        if "CCT_FUZZ_SEED" in os.environ:
            test = hypothesis_seed(int(os.environ["CCT_FUZZ_SEED"]))(test)
        return test
    return deco


# ------------------------------------------------------------------------------------------------
# Drawing mutations
# ------------------------------------------------------------------------------------------------
# Positions are drawn large and taken modulo the current length, so that one drawn operation
# means something on any seed; most land in the first bytes, where the headers are.
_positions = st.one_of(st.integers(0, 63), st.integers(0, 4095), st.integers(0, 2 ** 31))


@st.composite
def byte_op(draw) -> tuple:
    kind = draw(st.sampled_from(BYTE_OPS))
    pos = draw(_positions)
    if kind == "flip":
        return (kind, pos, draw(st.integers(0, 7)))
    if kind == "set":
        return (kind, pos, draw(st.integers(0, 255)))
    if kind == "insert":
        return (kind, pos, draw(st.binary(min_size=1, max_size=8)))
    if kind == "delete":
        return (kind, pos, draw(st.integers(1, 16)))
    if kind == "dup":
        return (kind, pos, draw(_positions), draw(st.integers(1, 64)))
    if kind == "truncate":
        return (kind, pos)
    return (kind, pos, draw(st.sampled_from(WORDS)))


def mutations(structured: Optional[st.SearchStrategy] = None, max_byte_ops: int = 4):
    """(structured ops, byte ops): structured ones only, byte ones only, or both, in about
    equal shares (byte changes mostly break a file's framing, structured ones mostly keep
    it and reach deeper); none at all is the seed itself, which must read too."""
    byte_ops = st.lists(byte_op(), min_size=1, max_size=max_byte_ops)
    if structured is None:
        return st.tuples(st.just([]), st.one_of(st.just([]), byte_ops))
    some = st.lists(structured, min_size=1, max_size=3)
    return st.one_of(st.tuples(st.just([]), st.just([])), st.tuples(some, st.just([])),
                     st.tuples(st.just([]), byte_ops), st.tuples(some, byte_ops))


def varint_op() -> st.SearchStrategy:
    """Replace the i-th varint of the seed (modulo their number) by an extreme value: mostly
    a field's value, which keeps the message parseable; else any (a tag or a length)."""
    return st.tuples(st.sampled_from(["value", "value", "value", "varint"]),
                     st.integers(0, 2 ** 16), st.sampled_from(INT_EXTREMES))


def number_op() -> st.SearchStrategy:
    """Replace the i-th number of a text seed (modulo their number) by an extreme."""
    return st.tuples(st.just("number"), st.integers(0, 2 ** 16), st.sampled_from(TEXT_EXTREMES))


# ------------------------------------------------------------------------------------------------
# Applying them
# ------------------------------------------------------------------------------------------------
def varint_spans(data: bytes, depth: int = 0) -> List[Tuple[int, int, bool]]:
    """(start, end, is a value) of every varint (tags, values, lengths) of a protobuf
    message, recursing into length-delimited fields that parse as messages; what a parse
    would read."""
    spans: List[Tuple[int, int, bool]] = []
    i = 0
    while i < len(data):
        start = i
        tag, i = _varint(data, i)
        if tag is None:
            break
        spans.append((start, i, False))
        wire = tag & 7
        if wire == 0:
            start = i
            value, i = _varint(data, i)
            if value is None:
                break
            spans.append((start, i, True))
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            start = i
            length, i = _varint(data, i)
            if length is None or i + length > len(data):
                break
            spans.append((start, i, False))
            # Packed floats and strings may parse as garbage "messages": the inner varints
            # count only when the whole field walks as a message.
            if depth < 6 and _walks(data[i:i + length]):
                spans += [(i + a, i + b, v) for a, b, v in varint_spans(data[i:i + length],
                                                                         depth + 1)]
            i += length
        else:
            break
    return spans


@functools.lru_cache(maxsize=16)
def _seed_spans(seed: bytes) -> List[Tuple[int, int, bool]]:
    return varint_spans(seed)


def _walks(data: bytes) -> bool:
    i = 0
    while i < len(data):
        tag, i = _varint(data, i)
        if tag is None or tag >> 3 == 0:
            return False
        wire = tag & 7
        if wire == 0:
            v, i = _varint(data, i)
            if v is None:
                return False
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = _varint(data, i)
            if n is None:
                return False
            i += n
        else:
            return False
    return i == len(data)


def _varint(data: bytes, i: int):
    value = shift = 0
    while i < len(data) and shift < 70:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i
    return None, i


def encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32/int64 values are written as 10-byte varints
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


_NUMBER = re.compile(rb"(?<=: )-?\d+(\.\d*)?([eE][-+]?\d+)?")  # a field's value


def apply(seed: bytes, mutation) -> bytes:
    """The seed with the drawn mutation applied (see the module doc)."""
    structured, byte_ops = mutation
    replacements = []  # (start, end, new bytes) in the seed
    for op in structured:
        if op[0] in ("value", "varint"):
            spans = [s for s in _seed_spans(seed) if s[2] or op[0] == "varint"]
            if spans:
                a, b, _ = spans[op[1] % len(spans)]
                replacements.append((a, b, encode_varint(op[2])))
        elif op[0] == "number":
            numbers = list(_NUMBER.finditer(seed))
            if numbers:
                m = numbers[op[1] % len(numbers)]
                replacements.append((m.start(), m.end(), op[2].encode()))
        else:
            raise ValueError(f"unknown structured op {op!r}")
    data = seed
    end = len(seed) + 1
    # Back to front, so that the positions found in the seed stay valid; one per span.
    for a, b, new in sorted(replacements, reverse=True):
        if b <= end:
            data = data[:a] + new + data[b:]
            end = a
    buf = bytearray(data)
    for op in byte_ops:
        kind, pos = op[0], op[1] % (len(buf) + 1)
        if kind == "flip" and pos < len(buf):
            buf[pos] ^= 1 << op[2]
        elif kind == "set" and pos < len(buf):
            buf[pos] = op[2]
        elif kind == "insert":
            buf[pos:pos] = op[2]
        elif kind == "delete":
            del buf[pos:pos + op[2]]
        elif kind == "dup":
            src = op[2] % (len(buf) + 1)
            buf[pos:pos] = buf[src:src + op[3]]
        elif kind == "truncate":
            del buf[pos:]
        elif kind == "word":
            buf[pos:pos + 4] = op[2]
    return bytes(buf)


# ------------------------------------------------------------------------------------------------
# HDF5 structure
# ------------------------------------------------------------------------------------------------
H5_OPS = ("delete", "replace", "group", "add", "link", "rename")
H5_NAMES = ("0", "1", "2", "01", "-1", "a", "10", "data", "history", "iter", "\u00e9", " 1")


def _h5_values():
    """What a dataset may be replaced by: wrong types, shapes, sizes and values."""
    import h5py
    import numpy as np
    return (np.float32(1.5), np.zeros(0, np.float32), np.ones((2, 3), np.float32),
            np.zeros((1, 0, 5), np.float32), np.array([2 ** 40], np.int64),
            np.array([-2 ** 31], np.int32), np.array([2 ** 31 - 1], np.int32),
            np.array([np.nan]), np.array([1, 2], np.int32), np.array([True]),
            np.bytes_(b"\xff\xfe\0"), np.bytes_(b"x.caffemodel\0"), "\u00e9t\u00e9",
            np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]), h5py.Empty("f4"),
            np.arange(6, dtype=np.uint8), np.array([b"ab", b"cd"]))


def h5_op() -> st.SearchStrategy:
    """One change to an HDF5 file's structure: (kind, object index, name index, value
    index), indices taken modulo what the file holds."""
    return st.tuples(st.sampled_from(H5_OPS), st.integers(0, 2 ** 16),
                     st.integers(0, len(H5_NAMES) - 1), st.integers(0, 2 ** 8))


def mutated_copy(source, mutation, path) -> bytes:
    """Write ``source``'s bytes with the mutation applied to ``path``; returns them."""
    with open(source, "rb") as f:
        data = apply(f.read(), mutation)
    with open(path, "wb") as f:
        f.write(data)
    return data


def apply_h5(path: str, ops) -> None:
    """Change the HDF5 file at ``path`` in place by ``ops`` (from :func:`h5_op`)."""
    import h5py
    values = _h5_values()
    with h5py.File(path, "r+") as f:
        for kind, i, name, v in ops:
            objects = []
            f.visit(objects.append)
            if not objects:
                return
            target = objects[i % len(objects)]
            parent = target.rsplit("/", 1)[0] if "/" in target else "/"
            value = values[v % len(values)]
            if kind == "delete":
                del f[target]
            elif kind == "replace":
                del f[target]
                f.create_dataset(target, data=value)
            elif kind == "group":
                del f[target]
                f.create_group(target)
            elif kind == "add":
                group = f[target] if isinstance(f[target], h5py.Group) else f[parent]
                if H5_NAMES[name] not in group:
                    group.create_dataset(H5_NAMES[name], data=value)
            elif kind == "link":
                del f[target]
                f[target] = h5py.SoftLink("/nowhere")
            elif kind == "rename":
                new = f"{parent}/{H5_NAMES[name]}".lstrip("/")
                if new not in f:
                    f.move(target, new)


# ------------------------------------------------------------------------------------------------
# The assertion
# ------------------------------------------------------------------------------------------------
def only_cct_errors(read: Callable[[], object], what: str, data: bytes = b"",
                    cct_errors: bool = True) -> None:
    """Run ``read``: it may succeed or raise a CCTError (none at all with ``cct_errors``
    False); anything else fails the example with the traceback and (when short) the input.
    A CCTError wrapping another exception is the prefetch thread's report of a bug, and fails
    too."""
    try:
        read()
        event("read")
    except UnsatisfiedAssumption:  # an example the harness drops (conftest.BLOB_BUDGET)
        raise
    except CCTError as e:
        wrapped = e.__cause__ is not None and not isinstance(e.__cause__, CCTError)
        if cct_errors and not wrapped:
            note(f"CCTError: {e}")
            event("CCTError: " + re.sub(r"'[^']*'|\S*[\d/]\S*", "_", str(e))[:48]
                  .split("\n")[0])
            return
        _fail(what, e, data)
    except Exception as e:  # noqa: BLE001 - the point of the fuzzer
        _fail(what, e, data)


def _fail(what: str, e: Exception, data: bytes) -> None:
    shown = repr(data) if len(data) <= 2048 else f"{len(data)} bytes"
    cause = e.__cause__ if isinstance(e, CCTError) and e.__cause__ is not None else e
    raise AssertionError(
        f"{what}: {type(e).__name__} escaped: {e}\ninput: {shown}\n"
        + "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    ) from None


def write_bytes(path: os.PathLike, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return os.fspath(path)

