"""Mutated weights files (binary .caffemodel and HDF5 .caffemodel.h5), read and copied into
the net they were written for: every failure a CCTError."""
from __future__ import annotations

import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

import cct
from cct.net import TEST

from .conftest import TINY_NET, lenet_text
from .mutate import apply_h5, fuzz, h5_op, mutated_copy, mutations, only_cct_errors, varint_op


@pytest.fixture(scope="module")
def nets(fuzz_dir, datum_db, tiny, caffe_lenet):
    """(weights file, net it fits) pairs: cct's snapshot of the tiny net, and Caffe's LeNet
    when the shared fixtures are there."""
    (fuzz_dir / "tiny_test.prototxt").write_text(TINY_NET.format(db=datum_db))
    (fuzz_dir / "lenet_test.prototxt").write_text(lenet_text())
    tiny_net = cct.Net(str(fuzz_dir / "tiny_test.prototxt"), TEST)
    binary, hdf5 = [(tiny.caffemodel, tiny_net)], [(tiny.caffemodel_h5, tiny_net)]
    if caffe_lenet is not None:
        lenet = cct.Net(str(fuzz_dir / "lenet_test.prototxt"), TEST)
        binary.append((str(caffe_lenet.lenet_iter_1000_caffemodel), lenet))
        hdf5.append((str(caffe_lenet.lenet_iter_1000_caffemodel_h5), lenet))
    yield {"binary": binary, "hdf5": hdf5}
    tiny_net.close()


@given(seed=st.integers(0, 1), mutation=mutations(varint_op()))
@fuzz(default_examples=800)
def test_caffemodel(fuzz_dir, nets, seed, mutation):
    source, net = nets["binary"][seed % len(nets["binary"])]
    path = fuzz_dir / "fuzz.caffemodel"
    data = mutated_copy(source, mutation, path)
    only_cct_errors(lambda: net.copy_trained_layers_from(str(path)), "caffemodel", data)


@given(seed=st.integers(0, 1), mutation=mutations(max_byte_ops=3))
@fuzz(default_examples=550)
def test_hdf5_weights_bytes(fuzz_dir, nets, seed, mutation):
    source, net = nets["hdf5"][seed % len(nets["hdf5"])]
    path = fuzz_dir / "fuzz_bytes.caffemodel.h5"
    data = mutated_copy(source, mutation, path)
    only_cct_errors(lambda: net.copy_trained_layers_from(str(path)), "HDF5 weights", data)


@given(seed=st.integers(0, 1), ops=st.lists(h5_op(), min_size=1, max_size=3))
@fuzz(default_examples=550)
def test_hdf5_weights_structure(fuzz_dir, nets, seed, ops):
    source, net = nets["hdf5"][seed % len(nets["hdf5"])]
    path = str(fuzz_dir / "fuzz_structure.caffemodel.h5")
    shutil.copyfile(source, path)
    apply_h5(path, ops)
    only_cct_errors(lambda: net.copy_trained_layers_from(path), "HDF5 weights")
