"""Mixed precision on the device backends (issue 29, item 4; cct/backend/reduced.py,
cct/solver/loss_scale.py), on the stand-in device, whose GEMM rounds its operands as a tensor
core does: the rounding itself against known values (and PyTorch's conversions where
installed), the GEMM in each precision, training in bf16 and fp16 (float32 weights, history
and files), and the loss scale: exact where nothing overflows, an overflow skipping the update
and halving the scale, growth, a NaN of the net's own stopping the run, the scale kept across
a snapshot."""
import numpy as np
import pytest

from cct.api import Solver
from cct.backend import gpu, host, npdevice, reduced
from cct.errors import CCTError
from cct.proto import caffe_pb2
from cct.solver import loss_scale

from .test_scheduler import data_list, solver_param  # noqa: F401


GPU_OK, GPU_REASON = gpu.available()
DEVICES = ["numpy", pytest.param("gpu", marks=pytest.mark.skipif(
    not GPU_OK, reason=f"no usable GPU: {GPU_REASON}"))]


@pytest.fixture(autouse=True)
def float32_after():
    yield
    npdevice.set_precision("float32")
    if GPU_OK:
        gpu.set_precision("float32")


def f32(*values):
    return np.array(values, np.float32)


# -- the rounding ------------------------------------------------------------------------------
def test_bf16_rounds_to_nearest_even():
    one = 1.0
    ulp = 2.0 ** -7                          # bf16 keeps 7 mantissa bits
    got = reduced.round_operand(f32(one + ulp / 2, one + 3 * ulp / 2, one + ulp / 2 + 2 ** -20,
                                    -(one + 3 * ulp / 2), 3.4028235e38, np.inf, np.nan, 0.0),
                                "bf16")
    want = f32(one, one + 2 * ulp, one + ulp, -(one + 2 * ulp), np.inf, np.inf, np.nan, 0.0)
    np.testing.assert_array_equal(got, want)          # ties to even; overflow to infinity


def test_tf32_keeps_ten_mantissa_bits():
    ulp = 2.0 ** -10
    got = reduced.round_operand(f32(1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 4), "tf32")
    np.testing.assert_array_equal(got, f32(1.0, 1 + 2 * ulp, 1.0))


def test_fp16_overflows_and_vanishes_as_ieee_half():
    got = reduced.round_operand(f32(70000.0, 65504.0, 1e-8, 3e-8, 1.0 + 2 ** -11), "fp16")
    np.testing.assert_array_equal(got, f32(np.inf, 65504.0, 0.0, 2.0 ** -24, 1.0))


def test_float32_is_left_alone():
    a = np.random.RandomState(0).randn(5).astype(np.float32)
    assert reduced.round_operand(a, "float32") is a


def test_the_rounding_is_pytorchs():
    torch = pytest.importorskip("torch", reason="PyTorch's conversions as a second reference")
    a = np.random.RandomState(1).randn(10000).astype(np.float32) * np.float32(1000)
    a[:100] *= np.float32(1e-30)
    t = torch.from_numpy(a)
    np.testing.assert_array_equal(reduced.round_operand(a, "bf16"),
                                  t.to(torch.bfloat16).to(torch.float32).numpy())
    np.testing.assert_array_equal(reduced.round_operand(a, "fp16"),
                                  t.to(torch.float16).to(torch.float32).numpy())


def test_bf16_storage_round_trips():
    a = np.random.RandomState(2).randn(100).astype(np.float32)
    bits = reduced.bf16_bits(a)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(reduced.from_bf16_bits(bits), reduced.round_operand(a, "bf16"))


def test_an_unknown_precision_is_named():
    with pytest.raises(CCTError, match="solver.prototxt: unknown precision 'half'; known: "
                                       "float32, tf32, bf16, fp16"):
        npdevice.set_precision("half", source="solver.prototxt")


# -- the stand-in's GEMM -----------------------------------------------------------------------
@pytest.mark.parametrize("precision", reduced.PRECISIONS)
def test_the_gemm_multiplies_rounded_operands(precision):
    rs = np.random.RandomState(3)
    a, b = rs.randn(8, 50).astype(np.float32), rs.randn(50, 6).astype(np.float32)
    npdevice.set_precision(precision)
    got = host(npdevice.kernels.matmul(npdevice.to_device(a), npdevice.to_device(b)))
    want = reduced.round_operand(a, precision) @ reduced.round_operand(b, precision)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float32
    if precision != "float32":
        assert not np.array_equal(got, a @ b)


def test_a_captured_gemm_rounds_what_its_arrays_hold_at_each_launch():
    from cct.backend import standin
    npdevice.set_precision("bf16")
    rs = np.random.RandomState(4)
    a = npdevice.to_device(rs.randn(4, 30).astype(np.float32))
    b = npdevice.to_device(rs.randn(30, 3).astype(np.float32))
    out = npdevice.xp.zeros((4, 3), np.float32)
    graph = npdevice.graphs.capture(lambda: npdevice.kernels.matmul(a, b, out=out))
    fresh = rs.randn(4, 30).astype(np.float32)
    a[...] = npdevice.to_device(fresh)
    graph.launch()
    want = reduced.round_operand(fresh, "bf16") @ reduced.round_operand(host(b), "bf16")
    np.testing.assert_array_equal(host(out), want)
    assert not standin.capturing()


# -- training ----------------------------------------------------------------------------------
def _solver(data_list, tmp_path, precision, backend="numpy", **fields):  # noqa: F811
    param = solver_param(data_list, tmp_path, display=0, **fields)
    param.precision = caffe_pb2.SolverParameter.Precision.Value(precision.upper())
    return Solver(param, backend=backend)


def _params(solver):
    return [np.array(host(p.data)) for p in solver.net.learnable_params]


@pytest.mark.parametrize("backend", DEVICES)
@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp16"])
def test_training_in_a_reduced_precision_stays_near_float32(data_list, tmp_path,  # noqa: F811
                                                            precision, backend):
    # Two updates: the rounding's difference, not yet the trajectory's drift
    exact = _solver(data_list, tmp_path, "float32", backend)
    exact.step(2)
    want = _params(exact)
    exact.close()
    solver = _solver(data_list, tmp_path, precision, backend)
    assert solver.net.backend.precision() == precision
    solver.step(2)
    got = _params(solver)
    assert all(g.dtype == np.float32 for g in got)      # the weights stay float32
    assert any(not np.array_equal(g, w) for g, w in zip(got, want))   # it did round
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=reduced.ACCURACY[precision] * np.abs(w).max())
    assert (solver.loss_scale is not None) == (precision == "fp16")
    solver.close()


def test_the_loss_scale_is_exact_where_nothing_overflows(data_list, tmp_path,  # noqa: F811
                                                          monkeypatch):
    # In float32 arithmetic a power-of-two scale changes no rounding: the scaled run is the
    # plain run, bit for bit (fp16's own rounding aside, this is all the scale does).
    plain = _solver(data_list, tmp_path, "float32")
    plain.step(4)
    want = _params(plain)
    plain.close()
    solver = _solver(data_list, tmp_path, "float32")
    solver.loss_scale = loss_scale.LossScale(solver.net, scale=2.0 ** 20)
    solver.step(4)
    for g, w in zip(_params(solver), want):
        np.testing.assert_array_equal(g, w)
    solver.close()


def _seeded(solver, scale):
    """Whether every loss top's diff is its loss weight times ``scale``."""
    net = solver.net
    return all(np.all(np.array(host(t.diff)) == np.float32(w * scale))
               for i, layer in enumerate(net.layers)
               for t, w in zip(net.top_vecs[i], layer.loss_weights) if w)


def test_an_overflow_skips_the_update_and_halves_the_scale(data_list, tmp_path,  # noqa: F811
                                                           capfd):
    solver = _solver(data_list, tmp_path, "fp16")
    scale = solver.loss_scale
    assert scale.scale == loss_scale.INIT_SCALE
    assert _seeded(solver, loss_scale.INIT_SCALE)
    solver.step(1)
    before = _params(solver)
    history = [np.array(host(h)) for h in solver.history]
    solver.net.clear_param_diffs()
    solver.net.forward_backward()
    solver.net.learnable_params[0].diff[0] = np.inf
    solver.apply_update()
    for g, w in zip(_params(solver), before):
        np.testing.assert_array_equal(g, w)                 # nothing moved
    for g, w in zip([np.array(host(h)) for h in solver.history], history):
        np.testing.assert_array_equal(g, w)
    assert scale.scale == loss_scale.INIT_SCALE / 2
    assert _seeded(solver, scale.scale)                     # backward's new seed
    assert ("Iteration 1: fp16 gradients overflowed at loss scale 65536; update skipped, loss "
            "scale now 32768" in capfd.readouterr().err)
    solver.step(2)                                          # and training goes on
    assert scale.skipped == 0 and scale.good == 2
    solver.close()


def test_the_scale_grows_after_a_run_of_good_updates(data_list, tmp_path,  # noqa: F811
                                                     monkeypatch):
    monkeypatch.setattr(loss_scale, "GROWTH_INTERVAL", 3)
    solver = _solver(data_list, tmp_path, "fp16")
    solver.step(3)
    assert solver.loss_scale.scale == 2 * loss_scale.INIT_SCALE
    assert solver.loss_scale.good == 0
    assert _seeded(solver, 2 * loss_scale.INIT_SCALE)
    solver.close()


def test_gradients_never_finite_stop_the_run_naming_the_iteration(data_list,  # noqa: F811
                                                                   tmp_path, monkeypatch):
    monkeypatch.setattr(loss_scale, "MAX_SKIPS", 3)
    solver = _solver(data_list, tmp_path, "fp16")
    solver.net.learnable_params[2].data[...] = np.nan     # ip's weights: a NaN of the net's
    with pytest.raises(CCTError, match=r"not finite at iteration 3 at every loss scale down to "
                                       r"8192 \(4 updates skipped in a row\)"):
        solver.step(10)
    solver.close()


def test_a_snapshot_keeps_the_scale(data_list, tmp_path):  # noqa: F811
    solver = _solver(data_list, tmp_path, "fp16", snapshot=2)
    solver.loss_scale._set(1024.0)
    solver.step(2)
    state = solver.last_snapshot
    solver.close()
    resumed = _solver(data_list, tmp_path, "fp16")
    assert resumed.loss_scale.scale == loss_scale.INIT_SCALE
    resumed.restore(state)
    assert resumed.loss_scale.scale == 1024.0 and resumed.loss_scale.good == 2
    assert _seeded(resumed, 1024.0)
    resumed.close()


# -- cct train ---------------------------------------------------------------------------------
def _train(tmp_path, *flags):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "cct.cli", "train", "--solver=solver.prototxt",
                           *flags], cwd=tmp_path, capture_output=True, text=True)


def _losses(log):
    return [float(line.rsplit("=", 1)[1]) for line in log.splitlines()
            if "solver.cpp" in line and ", loss = " in line]


def test_cct_train_in_fp16_on_a_device(data_list, tmp_path):  # noqa: F811
    param = solver_param(data_list, tmp_path, max_iter=4, display=1, snapshot=4)
    (tmp_path / "solver.prototxt").write_text(str(param))
    want = _train(tmp_path, "--devices=standin")
    got = _train(tmp_path, "--devices=standin", "--precision=fp16")
    assert want.returncode == 0 and got.returncode == 0, got.stderr[-2000:]
    assert ("Precision fp16 on the numpy backend: tensor-core GEMMs and convolutions on fp16 "
            "operands" in got.stderr)
    assert len(_losses(got.stderr)) == len(_losses(want.stderr)) >= 4
    np.testing.assert_allclose(_losses(got.stderr), _losses(want.stderr), rtol=1e-2)
    assert _losses(got.stderr) != _losses(want.stderr)
    side = (tmp_path / "snap_iter_4.solverstate.cct.json").read_text()
    assert '"loss_scale": {"scale": 65536.0, "good": 4}' in side


def test_fp16_with_a_split_batch_is_a_clear_error(data_list, tmp_path):  # noqa: F811
    param = solver_param(data_list, tmp_path, max_iter=2)
    (tmp_path / "solver.prototxt").write_text(str(param))
    run = _train(tmp_path, "--devices=cpu:1,standin", "--precision=fp16")
    assert run.returncode == 1
    assert ("cct: error: -precision fp16 trains with a loss scale on one device (-gpu N, or "
            "-devices with one GPU)" in run.stderr)
    assert "Traceback" not in run.stderr


def test_pycaffe_set_precision_in_gpu_mode_scales_a_solvers_loss(data_list, tmp_path,  # noqa: F811
                                                                 monkeypatch):
    import cct
    from cct import api
    monkeypatch.setattr(api, "_backend", "numpy")      # the stand-in, as GPU mode's device
    assert cct.set_precision("fp16") == "fp16"
    assert npdevice.precision() == "fp16"
    param = solver_param(data_list, tmp_path, display=0)
    solver = Solver(param, backend="numpy")            # the solver file says no precision
    assert solver.loss_scale is not None
    solver.step(1)
    solver.close()


def test_cct_time_on_a_device_in_bf16(data_list, tmp_path):  # noqa: F811
    import subprocess
    import sys
    param = solver_param(data_list, tmp_path)
    (tmp_path / "net.prototxt").write_text(str(param.net_param))
    run = subprocess.run([sys.executable, "-m", "cct.cli", "time", "--model=net.prototxt",
                          "--iterations=2", "--devices=standin", "--precision=bf16"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Precision bf16 on the numpy backend" in run.stderr
    assert "Average Forward-Backward" in run.stderr


@pytest.mark.skipif(not GPU_OK, reason=f"no usable GPU: {GPU_REASON}")
def test_the_gpus_bf16_casts_are_the_numpy_rounding():
    """cuDNN's bf16 operands (cudnn.Convolutions' cast kernels, reduced.BF16_KERNELS) hold
    exactly round_operand's values: ties to even, infinities, NaN."""
    import cupy
    kernels = {way: cupy.ElementwiseKernel(*spec) for way, spec in reduced.BF16_KERNELS.items()}
    a = np.random.RandomState(5).randn(100000).astype(np.float32) * np.float32(100)
    a[:6] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.4028235e38, np.inf, -np.inf, np.nan]
    bits = cupy.asnumpy(kernels["to"](cupy.asarray(a)))
    want = reduced.bf16_bits(a)
    np.testing.assert_array_equal(bits[6:], want[6:])
    np.testing.assert_array_equal(reduced.from_bf16_bits(bits[:5]),
                                  reduced.round_operand(a[:5], "bf16"))
    assert np.isnan(reduced.from_bf16_bits(bits[5:6]))[0]
    back = cupy.asnumpy(kernels["from"](cupy.asarray(bits)))
    np.testing.assert_array_equal(back[:5], reduced.round_operand(a[:5], "bf16"))
