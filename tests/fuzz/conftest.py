"""Valid files to mutate, written once per session: a LeNet prototxt and solver from
examples/mnist, a tiny net's snapshot by cct (binary and HDF5 caffemodel and solverstate, with
the side file), an LMDB of raw and encoded Datums, and Caffe's own LeNet files when the shared
fixtures are there."""
from __future__ import annotations

import math
import pathlib
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import reject

from cct import blob, glog
from cct.io.db import LMDBCursor
from cct.proto import caffe_pb2
from cct.solver import SIDE_SUFFIX, Solver
from tests.conftest import CAFFE_FIXTURES, REPO
from tests.layers.test_data import encoded_datum, image_bytes, raw_datum, write_lmdb
from tests.test_solver_rules import solver_param


# Values per blob beyond which an example is dropped: a mutated prototxt may ask for blobs up
# to Caffe's limit of INT_MAX values (8 GiB each), which this machine cannot hold, and whose
# refusal by the readers is not what is tested. The INT_MAX refusal itself runs first.
BLOB_BUDGET = 1 << 22


@pytest.fixture(scope="module", autouse=True)
def _fuzz_conditions():
    """Thousands of nets are built: INFO lines off (warnings still show), blobs within
    BLOB_BUDGET."""
    original = blob.checked_shape

    def within_budget(shape):
        shape = original(shape)
        if math.prod(shape) > BLOB_BUDGET:
            reject()
        return shape

    level = glog.logger.level
    glog.set_quiet()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(blob, "checked_shape", within_budget)
        yield
    glog.logger.setLevel(level)


@pytest.fixture(scope="session")
def fuzz_dir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("fuzz")


def datums() -> list:
    """Datums of every kind a Data layer reads: raw uint8, float_data, encoded PNG (grey and
    colour) and JPEG, all 1 or 3 x 6 x 6; and the first digit of Caffe's own MNIST LMDB when
    the shared fixtures are there."""
    r = np.random.default_rng(5)
    rgb = r.integers(0, 256, (6, 6, 3), dtype=np.uint8)
    grey = r.integers(0, 256, (6, 6), dtype=np.uint8)
    out = [raw_datum(r.integers(0, 256, (3, 6, 6), dtype=np.uint8), 0),
           raw_datum(r.random((3, 6, 6)).astype(np.float32), 1),
           encoded_datum(image_bytes(rgb, "PNG"), 2),
           encoded_datum(image_bytes(grey, "PNG"), 3),
           encoded_datum(image_bytes(rgb, "JPEG", quality=90), 4)]
    caffes = CAFFE_FIXTURES / "mnist10k_test_lmdb"
    if caffes.exists():
        cursor = LMDBCursor(str(caffes))
        out.append(caffe_pb2.Datum.FromString(cursor.value()))
        cursor.close()
    return out


# A net small enough to build a thousand times: Data -> Convolution -> Pooling -> InnerProduct
# -> SoftmaxWithLoss, with a mirror transform so the side file holds a transformer RNG state.
TINY_NET = """
name: "tiny"
layer {{ name: "data" type: "Data" top: "data" top: "label"
  data_param {{ source: "{db}" batch_size: 2 backend: LMDB }}
  transform_param {{ mirror: true scale: 0.00390625 }} }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param {{ num_output: 2 kernel_size: 3 stride: 1 pad: 1
                       weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
  inner_product_param {{ num_output: 5 weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""


@pytest.fixture(scope="session")
def datum_db(fuzz_dir) -> pathlib.Path:
    """A colour LMDB (raw only, so every batch has one shape) for the tiny net's training."""
    r = np.random.default_rng(3)
    return write_lmdb(fuzz_dir / "train_lmdb",
                      [raw_datum(r.integers(0, 256, (3, 6, 6), dtype=np.uint8), i % 5)
                       for i in range(6)])


def tiny_solver(db: pathlib.Path, prefix: pathlib.Path, **fields) -> Solver:
    net = TINY_NET.format(db=db)
    return Solver(solver_param(net, type="SGD", momentum=0.9, base_lr=0.01, lr_policy="inv",
                               gamma=0.0001, power=0.75, snapshot_prefix=str(prefix), **fields),
                  "<fuzz solver>")


@pytest.fixture(scope="session")
def tiny(fuzz_dir, datum_db) -> SimpleNamespace:
    """The tiny net's snapshot after 3 iterations, in both formats; ``solver()`` builds a fresh
    solver that can restore them."""
    out = fuzz_dir / "snap"
    out.mkdir()
    s = tiny_solver(datum_db, out / "tiny")
    s.step(3)
    model = s.snapshot()
    s.param.snapshot_format = caffe_pb2.SolverParameter.HDF5
    model_h5 = s.snapshot()
    s.net.close()
    state = str(out / "tiny_iter_3.solverstate")
    return SimpleNamespace(
        folder=out, caffemodel=model, caffemodel_h5=model_h5, state=state,
        state_h5=state + ".h5", side=state + SIDE_SUFFIX,
        solver=lambda: tiny_solver(datum_db, fuzz_dir / "resumed"))


def lenet_text(batch: int = 2) -> str:
    """examples/mnist's LeNet with Input layers, batch ``batch`` (fast to build and run)."""
    text = (REPO / "examples" / "mnist" / "lenet_input_train_test.prototxt").read_text()
    return re.sub(r"dim: (64|100)\b", f"dim: {batch}", text)


def lenet_solver(prefix: pathlib.Path) -> Solver:
    """Caffe's LeNet solver settings on :func:`lenet_text`: restores Caffe's LeNet states."""
    p = caffe_pb2.SolverParameter()
    text_format.Parse((REPO / "examples" / "mnist" / "lenet_solver.prototxt").read_text(), p)
    p.ClearField("net")
    p.test_iter[0] = 1
    text_format.Parse(lenet_text(), p.net_param)
    p.snapshot_prefix = str(prefix)
    return Solver(p, "<fuzz lenet solver>")


@pytest.fixture(scope="session")
def caffe_lenet(fuzz_dir) -> SimpleNamespace:
    """Caffe's LeNet snapshot files (None when the shared fixtures are absent), copied so that
    a mutated state finds its learned_net beside it."""
    if not CAFFE_FIXTURES.exists():
        return None
    folder = fuzz_dir / "caffe"
    folder.mkdir()
    names = ["lenet_iter_1000.caffemodel", "lenet_iter_1000.caffemodel.h5",
             "lenet_iter_1000.solverstate", "lenet_iter_1000.solverstate.h5",
             "lenet_train_test.prototxt", "lenet_solver.prototxt"]
    for name in names:
        shutil.copy(CAFFE_FIXTURES / name, folder / name)
    return SimpleNamespace(folder=folder, **{n.replace(".", "_"): folder / n for n in names},
                           solver=lambda: lenet_solver(fuzz_dir / "lenet_resumed"))
