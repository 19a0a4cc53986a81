"""Mutated solver states (binary .solverstate, HDF5 .solverstate.h5) and side files, restored
into the solver they were written for, which then trains one iteration: every failure a
CCTError; a damaged side file only a warning."""
from __future__ import annotations

import copy
import json
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cct.solver import SIDE_SUFFIX

from .mutate import (apply, apply_h5, fuzz, h5_op, mutated_copy, mutations, number_op,
                     only_cct_errors, varint_op)


@pytest.fixture(scope="module")
def states(tiny, caffe_lenet):
    """{"binary"/"hdf5": [(state file, folder its learned_net is found from, solver)]}: cct's
    snapshot of the tiny net, and Caffe's LeNet state when the shared fixtures are there."""
    tiny_solver = tiny.solver()
    out = {"binary": [(tiny.state, tiny.folder, tiny_solver)],
           "hdf5": [(tiny.state_h5, tiny.folder, tiny_solver)]}
    if caffe_lenet is not None:
        lenet = caffe_lenet.solver()
        out["binary"].append((str(caffe_lenet.lenet_iter_1000_solverstate), caffe_lenet.folder,
                              lenet))
        out["hdf5"].append((str(caffe_lenet.lenet_iter_1000_solverstate_h5), caffe_lenet.folder,
                            lenet))
    yield out
    for solver in {id(s): s for kind in out.values() for _, _, s in kind}.values():
        solver.net.close()


def restore_and_train(solver, path: str) -> None:
    solver.restore(path)
    solver.step(1)


@given(seed=st.integers(0, 1), mutation=mutations(varint_op()))
@fuzz(default_examples=550)
def test_binary_solverstate(states, seed, mutation):
    source, folder, solver = states["binary"][seed % len(states["binary"])]
    path = folder / "fuzz.solverstate"
    data = mutated_copy(source, mutation, path)
    only_cct_errors(lambda: restore_and_train(solver, str(path)), "binary solverstate", data)


@given(seed=st.integers(0, 1), mutation=mutations(max_byte_ops=3))
@fuzz(default_examples=550)
def test_hdf5_solverstate_bytes(states, seed, mutation):
    source, folder, solver = states["hdf5"][seed % len(states["hdf5"])]
    path = folder / "fuzz_bytes.solverstate.h5"
    data = mutated_copy(source, mutation, path)
    only_cct_errors(lambda: restore_and_train(solver, str(path)), "HDF5 solverstate", data)


@given(seed=st.integers(0, 1), ops=st.lists(h5_op(), min_size=1, max_size=3))
@fuzz(default_examples=550)
def test_hdf5_solverstate_structure(states, seed, ops):
    source, folder, solver = states["hdf5"][seed % len(states["hdf5"])]
    path = str(folder / "fuzz_structure.solverstate.h5")
    shutil.copyfile(source, path)
    apply_h5(path, ops)
    only_cct_errors(lambda: restore_and_train(solver, path), "HDF5 solverstate")


# ------------------------------------------------------------------------------------------------
# The side file
# ------------------------------------------------------------------------------------------------
JSON_VALUES = (None, 0, -1, 1.5, 2 ** 31, 2 ** 64, -2 ** 63, "", "x", "ff", [], [1, "a"], {},
               {"type": "Data"}, True, float("nan"), float("inf"))


def json_paths(value, path=()):
    """Every path (keys and indices) into a JSON value, the root included."""
    yield path
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ())
    for k, v in items:
        yield from json_paths(v, path + (k,))


def json_op() -> st.SearchStrategy:
    """Replace (or, for an object's member, delete) the value at the i-th path."""
    return st.tuples(st.sampled_from(["replace", "replace", "delete"]), st.integers(0, 2 ** 16),
                     st.integers(0, len(JSON_VALUES) - 1))


def apply_json(text: bytes, ops) -> bytes:
    side = json.loads(text)
    for kind, i, v in ops:
        paths = [p for p in json_paths(side) if p]
        if not paths:
            break
        *parent_path, key = paths[i % len(paths)]
        parent = side
        for k in parent_path:
            parent = parent[k]
        if kind == "delete" and isinstance(parent, dict):
            del parent[key]
        else:
            parent[key] = copy.deepcopy(JSON_VALUES[v])   # never one object in two places
    return json.dumps(side).encode()


@given(ops=st.lists(json_op(), max_size=3), mutation=mutations(number_op(), max_byte_ops=2))
@fuzz(default_examples=550)
def test_side_file(tiny, states, ops, mutation):
    """The side file is cct's own, beside a sound state: whatever it holds, the resume goes
    on (with a warning), no error at all."""
    _, folder, solver = states["binary"][0]
    path = str(folder / "side_fuzz.solverstate")
    shutil.copyfile(tiny.state, path)
    with open(tiny.side, "rb") as f:
        data = apply(apply_json(f.read(), ops), mutation)
    with open(path + SIDE_SUFFIX, "wb") as f:
        f.write(data)
    only_cct_errors(lambda: restore_and_train(solver, path), "side file", data,
                    cct_errors=False)

