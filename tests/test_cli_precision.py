"""`cct train -precision=bf16`, the solver's `precision` field and `cct time -precision`: bf16
GEMMs with float32 weights and the same Caffe files out, the same bytes on a rerun, and on a
CPU without bf16 units a warning and float32 training."""
import json
import os

import numpy as np
import pytest

from cct import _C
from cct.backend import precision
from cct.install import install_hint
from cct.proto import caffe_pb2

from .test_cli_train import SOLVER, cct, workdir  # noqa: F401  (fixture)

needs_engine = pytest.mark.skipif(not precision.has_engine(),
                                  reason=f"no bf16 GEMM engine: {install_hint('bf16')} (MKL)")


def env(**extra):
    """The environment without a CCT_BF16 of the caller's, plus ``extra``."""
    out = {k: v for k, v in os.environ.items() if k != "CCT_BF16"}
    out.update(extra)
    return out


def weights(path):
    net = caffe_pb2.NetParameter()
    net.ParseFromString(path.read_bytes())
    return {layer.name: [np.array(b.data, np.float32) for b in layer.blobs]
            for layer in net.layer if layer.blobs}


@needs_engine
def test_train_in_bf16_writes_float32_caffe_files_and_repeats(workdir, tmp_path):  # noqa: F811
    cache = str(tmp_path / "plans")
    run = cct("train", "--solver=solver.prototxt", "--precision=bf16", cwd=workdir,
              env=env(CCT_BF16="emulate", CCT_PLAN_CACHE=cache))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Precision bf16: bf16 GEMM operands, float32 accumulation" in run.stderr
    assert "Optimization Done." in run.stderr
    bf16 = weights(workdir / "lenet_iter_40.caffemodel")
    # Caffe's float blobs, full float32 values (not bf16-rounded: the master weights are float32)
    low_bits = [np.count_nonzero(b.view(np.uint32) & 0xFFFF) for ws in bf16.values() for b in ws]
    assert sum(low_bits) > 0.9 * sum(b.size for ws in bf16.values() for b in ws)
    first = (workdir / "lenet_iter_40.caffemodel").read_bytes()
    # the engine is a kernel plan: the rerun takes the cache's, whichever the race chose
    (cached,) = (tmp_path / "plans").glob("plans-*.json")
    assert json.loads(cached.read_text())["bf16"] in precision.ENGINES
    again = cct("train", "--solver=solver.prototxt", "--precision=bf16", cwd=workdir,
                env=env(CCT_BF16="emulate", CCT_PLAN_CACHE=cache))
    assert again.returncode == 0, again.stderr[-3000:]
    assert (workdir / "lenet_iter_40.caffemodel").read_bytes() == first
    # and it is not the float32 run
    f32 = cct("train", "--solver=solver.prototxt", cwd=workdir, env=env(CCT_PLAN_CACHE=cache))
    assert f32.returncode == 0, f32.stderr[-3000:]
    float32 = weights(workdir / "lenet_iter_40.caffemodel")
    assert bf16.keys() == float32.keys()
    for name in bf16:
        for a, b in zip(bf16[name], float32[name]):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, atol=0.02)
    assert any(not np.array_equal(a, b) for n in bf16 for a, b in zip(bf16[n], float32[n]))


@needs_engine
def test_solver_field_asks_for_bf16(workdir):  # noqa: F811
    (workdir / "solver.prototxt").write_text(SOLVER.format(max_iter=10) + "precision: BF16\n")
    run = cct("train", "--solver=solver.prototxt", cwd=workdir, env=env(CCT_BF16="emulate"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Precision bf16" in run.stderr
    # -precision overrides the field
    run = cct("train", "--solver=solver.prototxt", "--precision=float32", cwd=workdir,
              env=env(CCT_BF16="emulate"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Precision bf16" not in run.stderr


@pytest.mark.skipif(_C.cpu_has_bf16_units(), reason="this CPU has bf16 units")
def test_without_bf16_units_train_says_so_and_trains_float32(workdir):  # noqa: F811
    (workdir / "solver.prototxt").write_text(SOLVER.format(max_iter=10))
    run = cct("train", "--solver=solver.prototxt", "--precision=bf16", cwd=workdir, env=env())
    assert run.returncode == 0, run.stderr[-3000:]
    assert ("train: -precision" not in run.stderr)  # the solver applies it, naming its file
    assert "solver.prototxt: precision: bf16 asked for, training in float32: this CPU has no " \
           "bf16 units" in run.stderr
    assert "Precision bf16" not in run.stderr


def test_missing_engine_is_named(workdir):  # noqa: F811
    (workdir / "solver.prototxt").write_text(SOLVER.format(max_iter=10))
    run = cct("train", "--solver=solver.prototxt", "--precision=bf16", cwd=workdir,
              env=env(CCT_BF16="emulate", CCT_BF16_ENGINE="mkl",
                      CCT_BF16_LIBRARY=str(workdir / "no_such_libmkl.so")))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "training in float32: the bf16 GEMM engine" in run.stderr
    assert "no_such_libmkl.so" in run.stderr


@pytest.mark.parametrize("args,needle", [
    (["train", "--solver=solver.prototxt", "--precision=half"],
     "cct: error: -precision must be one of float32, tf32, bf16, fp16, got 'half'"),
    (["time", "--model=lenet_train_test.prototxt", "--precision=half"],
     "cct: error: time: -precision: unknown precision 'half'; known: float32, tf32, bf16, fp16"),
])
def test_bad_precision_is_a_clear_error(workdir, args, needle):  # noqa: F811
    run = cct(*args, cwd=workdir)
    assert run.returncode == 1
    assert needle in run.stderr
    assert "Traceback" not in run.stderr


@needs_engine
def test_time_in_bf16(workdir):  # noqa: F811
    run = cct("time", "--model=lenet_train_test.prototxt", "--iterations=2", "--precision=bf16",
              cwd=workdir, env=env(CCT_BF16="emulate"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Precision bf16" in run.stderr
    assert "Average Forward pass" in run.stderr


def test_a_gpu_precision_asked_of_the_cpu_trains_float32_saying_so(workdir):  # noqa: F811
    (workdir / "solver.prototxt").write_text(SOLVER.format(max_iter=2))
    run = cct("train", "--solver=solver.prototxt", "--precision=fp16", cwd=workdir)
    assert run.returncode == 0, run.stderr[-3000:]
    assert ("fp16 is a GPU precision (tensor cores); the CPU trains in float32"
            in run.stderr)
