"""A device net's iteration replayed as a CUDA graph (cct/graphed.py, issue 29 item 3), on the
CuPy-rules stand-in, whose capture records device operations and refuses what a real capture
refuses (a host copy or read, CuPy's cuBLAS): the replayed run gives the eager run's numbers
to the bit, loss by loss; a net with Dropout stays eager saying which layer; a capture that
fails, or a graph whose gradients disagree with an eager pass's, leaves the run eager with a
warning and loses nothing. On a GPU the same tests run on CuPy."""
import numpy as np
import pytest

from cct.api import Solver
from cct.backend import gpu, host
from cct.context import RunContext
from cct.graphed import WARMUP, GraphedSource
from cct.layers.neuron import ReLULayer

from .test_scheduler import data_list, solver_param  # noqa: F401

GPU_OK, GPU_REASON = gpu.available()
DEVICES = ["numpy", pytest.param("gpu", marks=pytest.mark.skipif(
    not GPU_OK, reason=f"no usable GPU: {GPU_REASON}"))]


def _solver(param, backend, graphs="on"):
    context = RunContext.of_solver(param, backend=backend).replace(cuda_graphs=graphs)
    context.apply()
    return Solver(param, backend=backend, context=context)


def _train(param, backend, graphs, iters=6):
    solver = _solver(param, backend, graphs)
    try:
        losses = []
        for _ in range(iters):
            solver.step(1)
            losses.append(float(solver.smoothed_loss))
        return ([np.array(host(p.data)) for p in solver.net.learnable_params], losses,
                solver.gradient_source)
    finally:
        solver.close()


@pytest.mark.parametrize("backend", DEVICES)
def test_a_replayed_iteration_gives_the_eager_numbers(data_list, tmp_path, capfd,  # noqa: F811
                                                      backend):
    param = solver_param(data_list, tmp_path, display=1)
    eager, eager_losses, source = _train(param, backend, "off")
    assert not isinstance(source, GraphedSource)
    got, got_losses, source = _train(param, backend, "on")
    assert isinstance(source, GraphedSource) and source.graph is not None
    assert source.replays == 6 - WARMUP
    err = capfd.readouterr().err
    assert "replay a CUDA graph of layers 'label_data_1_split' to 'acc'" in err
    if backend == "numpy":      # the same operations in the same order
        assert got_losses == eager_losses
        for a, b in zip(eager, got):
            np.testing.assert_array_equal(a, b)
    else:                       # cuDNN's engines may add in another order
        np.testing.assert_allclose(got_losses, eager_losses, rtol=1e-5)


def test_each_iterations_loss_is_its_own(data_list, tmp_path):  # noqa: F811
    """The graph writes its loss into the same arrays every launch: the pending losses the
    solver holds (read when the log needs them, here at the end of the step) are copies, one
    per iteration, so a smoothed loss over them is the eager run's."""
    param = solver_param(data_list, tmp_path, display=0, average_loss=6)
    smoothed = []
    for graphs in ("off", "on"):
        solver = _solver(param, "numpy", graphs)
        try:
            solver.step(6)           # two eager, the capture, three replays; read at the end
            smoothed.append(float(solver.smoothed_loss))
            assert solver.gradient_source.__class__.__name__ == (
                "GraphedSource" if graphs == "on" else "NetSource")
        finally:
            solver.close()
    assert smoothed[0] == smoothed[1]


def test_a_net_with_dropout_replays_with_fresh_masks(data_list, tmp_path):  # noqa: F811
    """Dropout's masks are drawn before each launch, in the forward's order, into the arrays
    the graph reads: the masks (and so the numbers) of the eager run, none repeated."""
    param = solver_param(data_list, tmp_path, display=0)
    relu = next(lp for lp in param.net_param.layer if lp.name == "relu")
    relu.type, relu.name = "Dropout", "drop"
    eager, eager_losses, _ = _train(param, "numpy", "off")
    got, got_losses, source = _train(param, "numpy", "on")
    assert source.graph is not None and source.replays == 6 - WARMUP
    assert got_losses == eager_losses
    for a, b in zip(eager, got):
        np.testing.assert_array_equal(a, b)


def test_a_python_layer_keeps_the_net_eager_and_says_why(data_list, tmp_path):  # noqa: F811
    from cct.graphed import graphs_refused
    from cct.net import Net
    param = solver_param(data_list, tmp_path)
    relu = next(lp for lp in param.net_param.layer if lp.name == "relu")
    net = Net(param.net_param, phase=0, backend="numpy")
    try:
        net.layers[net.layer_names.index("relu")].type = "Python"   # as a Python layer reads
        assert graphs_refused(net) == "layer 'relu' (Python) runs Python code on the host"
    finally:
        net.close()
    assert relu.name == "relu"


def test_a_capture_refused_leaves_the_run_eager_with_its_numbers(data_list, tmp_path, capfd,  # noqa: F811
                                                                 monkeypatch):
    """A layer that reads a device value on the host in its forward: the capture fails (as
    CUDA refuses a synchronous copy on a capturing stream), the run goes on eagerly, and the
    capture's iteration is the eager pass's."""
    param = solver_param(data_list, tmp_path, display=0)
    want, want_losses, _ = _train(param, "numpy", "off")
    forward = ReLULayer.forward

    def reads_the_host(self, bottom, top):
        float(bottom[0].data.max())
        return forward(self, bottom, top)
    monkeypatch.setattr(ReLULayer, "forward", reads_the_host)
    got, got_losses, source = _train(param, "numpy", "on")
    assert source.graph is None and source.replays == 0
    err = capfd.readouterr().err
    assert "the capture failed (RuntimeError: reading a device value on the host: operation " \
           "not permitted when stream is capturing)" in err
    assert got_losses == want_losses
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_a_graph_that_disagrees_with_the_eager_pass_is_dropped(data_list, tmp_path, capfd,  # noqa: F811
                                                              monkeypatch):
    param = solver_param(data_list, tmp_path, display=0)
    want, want_losses, _ = _train(param, "numpy", "off")
    from cct.backend import npdevice
    capture = npdevice.graphs.capture

    def wrong(fn):
        graph = capture(fn)
        launch = graph.launch

        def launch_and_spoil():
            launch()
            solver_net.learnable_params[0].diff[...] *= 2
        graph.launch = launch_and_spoil
        return graph
    monkeypatch.setattr(npdevice.graphs, "capture", wrong)
    solver = _solver(param, "numpy")
    solver_net = solver.net
    try:
        losses = []
        for _ in range(6):
            solver.step(1)
            losses.append(float(solver.smoothed_loss))
        got = [np.array(host(p.data)) for p in solver.net.learnable_params]
        assert solver.gradient_source.graph is None
    finally:
        solver.close()
    assert "its gradients differ from an eager pass's by 1 of their scale" in \
        capfd.readouterr().err
    assert losses == want_losses
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_cuda_graphs_off_and_the_cpu_use_the_plain_source(data_list, tmp_path):  # noqa: F811
    param = solver_param(data_list, tmp_path, display=0)
    for backend, graphs in (("cpu", "on"), ("numpy", "off")):
        solver = _solver(param, backend, graphs)
        try:
            assert not isinstance(solver.gradient_source, GraphedSource)
        finally:
            solver.close()


def test_cct_train_replays_a_graph_on_the_device_unless_told_not_to(data_list, tmp_path):  # noqa: F811
    """``cct train --devices=standin`` (the one-device path, ``-gpu 0`` on a GPU) replays the
    iteration as a graph by default and says so; ``-cuda-graphs=off`` runs it eagerly; the
    losses are the same; a bad value is refused naming the flag."""
    import subprocess
    import sys
    param = solver_param(data_list, tmp_path, max_iter=6, display=1)
    (tmp_path / "solver.prototxt").write_text(str(param))

    def train(*extra):
        return subprocess.run([sys.executable, "-m", "cct.cli", "train",
                               "--solver=solver.prototxt", "--devices=standin", *extra],
                              cwd=tmp_path, capture_output=True, text=True)
    on, off = train(), train("-cuda-graphs=off")
    assert on.returncode == 0 and off.returncode == 0, on.stderr[-2000:]
    assert "replay a CUDA graph" in on.stderr and "CUDA graph" not in off.stderr

    def losses(log):
        return [line.rsplit("=", 1)[1] for line in log.splitlines()
                if "solver.cpp" in line and ", loss = " in line]
    assert len(losses(on.stderr)) == 7 and losses(on.stderr) == losses(off.stderr)
    bad = train("-cuda-graphs=maybe")
    assert bad.returncode == 1 and "-cuda-graphs must be on or off, got 'maybe'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_arrays_replaced_after_the_capture_send_the_run_back_to_eager(data_list, tmp_path,  # noqa: F811
                                                                     capfd):
    param = solver_param(data_list, tmp_path, display=0)
    solver = _solver(param, "numpy")
    try:
        solver.step(WARMUP + 2)
        source = solver.gradient_source
        assert source.graph is not None and source.replays == 2
        p = solver.net.params_list[0]
        p._data = p._data.copy()        # what a share or a new allocation does
        solver.step(2)
        assert source.graph is None and source.replays == 2
    finally:
        solver.close()
    assert "layer 'conv''s param 0 holds other arrays than at the capture" in \
        capfd.readouterr().err


def test_a_restored_snapshot_goes_on_replaying_with_the_eager_numbers(data_list, tmp_path,  # noqa: F811
                                                                     capfd):
    """A snapshot restored into a replaying run writes into the arrays the graph holds: the
    run goes on replaying, and from the restored state it gives the eager run's numbers."""
    param = solver_param(data_list, tmp_path, display=0, snapshot=3)
    params = []
    for graphs in ("off", "on"):
        solver = _solver(param, "numpy", graphs)
        try:
            solver.step(6)
            solver.restore(str(tmp_path / "snap_iter_3.solverstate"))
            solver.step(3)
            params.append([np.array(host(p.data)) for p in solver.net.learnable_params])
            if graphs == "on":
                assert solver.gradient_source.graph is not None
                assert solver.gradient_source.replays == 6 - WARMUP + 3
        finally:
            solver.close()
    assert "run eagerly" not in capfd.readouterr().err
    for a, b in zip(*params):
        np.testing.assert_array_equal(a, b)


# -- the capture's rules, on the stand-in and on CuPy (the stand-in checked against CuPy) -----
def _graphs(backend):
    from cct import backend as backends
    return backends.get(backend)


@pytest.mark.parametrize("backend", DEVICES)
@pytest.mark.parametrize("what,body,error", [
    ("a host read", lambda xp, d: float(d.sum()), RuntimeError),
    ("a device-to-host copy", lambda xp, d: d.get(), RuntimeError),
    ("CuPy's cuBLAS", lambda xp, d: xp.matmul(d, d.T), NotImplementedError),
], ids=["host read", "get", "cupy matmul"])
def test_a_capture_refuses_what_cuda_and_cupy_refuse(backend, what, body, error):
    b = _graphs(backend)
    d = b.xp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(error):
        b.graphs.capture(lambda: body(b.xp, d))
    assert float(d.sum()) == 15.0           # the device is usable after the failed capture


@pytest.mark.parametrize("backend", DEVICES)
def test_a_graph_runs_only_when_launched_and_reads_the_values_then(backend):
    b = _graphs(backend)
    xp = b.xp
    x = xp.asarray(np.arange(4, dtype=np.float32))
    y = xp.zeros(4, dtype=xp.float32)
    w = xp.asarray(np.eye(4, dtype=np.float32) * 2)
    b.kernels.matmul(x.reshape(1, 4), w)    # the GEMM's first call (checked) outside

    def body():
        y[...] = b.kernels.matmul(x.reshape(1, 4), w).reshape(4) + 1   # cct's own GEMM
        xp.add(x, 1, out=x)
    graph = b.graphs.capture(body)
    np.testing.assert_array_equal(host(x), [0, 1, 2, 3])      # a capture computes nothing
    np.testing.assert_array_equal(host(y), [0, 0, 0, 0])
    graph.launch()
    np.testing.assert_array_equal(host(y), [1, 3, 5, 7])
    np.testing.assert_array_equal(host(x), [1, 2, 3, 4])
    x[...] = 10
    graph.launch()
    np.testing.assert_array_equal(host(y), [21, 21, 21, 21])
    np.testing.assert_array_equal(host(x), [11, 11, 11, 11])
