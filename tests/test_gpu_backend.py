"""The GPU code path: backend selection (cct.backend.get/resolve, caffe.set_mode_gpu), blobs
whose host copies sync lazily with the device (cct.blob.DeviceBlob), and whole nets, solver
steps and layer gradients on the ``numpy`` backend (the GPU's array-generic kernels on NumPy
memory behind CuPy's rules, cct.backend.standin). The same Caffe numerics run on the ``gpu``
backend where CuPy has a GPU, and skip here saying why."""
import numpy as np
import pytest

import cct
from cct import backend as backends
from cct.backend import BackendUnavailable, gpu
from cct.backend import npdevice
from cct.blob import Blob, DeviceBlob, HostBlob
from cct.errors import CCTError
from cct.glog import set_quiet
from cct.layers import create_layer
from tests.gradient_check import check_gradient, make_layer_param
from tests.test_caffe_numerics import (FIXTURES, assert_within_tolerance, errors_against_caffe,
                                       load_and_run)
from tests.test_solver import lenet_sgd_solver

GPU_OK, GPU_REASON = gpu.available()
needs_gpu = pytest.mark.skipif(not GPU_OK, reason=f"no usable GPU: {GPU_REASON}")
no_gpu = pytest.mark.skipif(GPU_OK, reason="a GPU is present")


@pytest.fixture
def fresh_warnings():
    """resolve() warns once per reason per process; each test starts with none given."""
    backends._warned.clear()
    yield
    backends._warned.clear()
    cct.set_mode_cpu()


# --------------------------------------------------------------------------------------------
# Choosing the backend
# --------------------------------------------------------------------------------------------
@no_gpu
def test_gpu_backend_without_a_gpu_says_what_is_missing():
    with pytest.raises(BackendUnavailable, match=r"gpu backend cannot run here: .*pip install"):
        backends.get("gpu")
    assert issubclass(BackendUnavailable, CCTError)
    assert not GPU_OK and GPU_REASON


@no_gpu
def test_resolve_falls_back_to_the_cpu_once(capfd, fresh_warnings):
    assert backends.resolve("cpu", 0) == "cpu"
    assert backends.resolve("GPU", 0) == "cpu"
    assert backends.resolve("gpu", 3) == "cpu"
    err = capfd.readouterr().err
    assert err.count("Running on the CPU") == 1 and GPU_REASON in err
    assert "Traceback" not in err
    with pytest.raises(CCTError, match="Caffe's modes are 'cpu' and 'gpu'"):
        backends.resolve("tpu", 0)


@no_gpu
def test_set_mode_gpu_without_a_gpu_runs_nets_on_the_cpu(capfd, fresh_warnings):
    cct.set_device(0)
    cct.set_mode_gpu()
    cct.set_mode_gpu()
    assert capfd.readouterr().err.count("no GPU backend here") == 1
    assert cct.get_solver_mode() == "cpu" and cct.api.current_backend() == "cpu"
    assert _small_net().backend.name == "cpu"


@needs_gpu
def test_set_mode_gpu_runs_nets_on_the_gpu(fresh_warnings):
    cct.set_device(0)
    cct.set_mode_gpu()
    assert cct.get_solver_mode() == "gpu"
    net = _small_net()
    assert net.backend.name == "gpu"
    assert isinstance(net.forward()["prob"], np.ndarray)
    with pytest.raises(CCTError, match="there is no GPU 99"):
        backends.resolve("gpu", 99)


@needs_gpu
def test_describe_reports_the_device():
    info = gpu.describe(0, gemm_size=1024, repeats=3)
    assert info["name"] and info["total_memory"] > 0 and info["sgemm_gflops"] > 0
    assert set(info["gemm_gflops"]) == {"float32", "tf32", "bf16", "fp16"}
    assert all(g > 0 for g in info["gemm_gflops"].values())
    assert info["compute_capability"].count(".") == 1


def test_backends_by_name():
    assert backends.get("cpu").name == "cpu" and backends.get("numpy").name == "numpy"
    with pytest.raises(CCTError, match="unknown backend 'tpu'"):
        backends.get("tpu")


# --------------------------------------------------------------------------------------------
# Blobs on a device: lazy host copies (Caffe's SyncedMemory)
# --------------------------------------------------------------------------------------------
class CountingDevice:
    """The stand-in device, whose copies are counted, so that tests see when the host and
    device copies move."""

    xp = npdevice.xp

    def counts(self):
        return npdevice.copies.to_host, npdevice.copies.to_device


@pytest.fixture
def dev():
    with npdevice.copies.counting():
        yield CountingDevice()


def test_cpu_blobs_are_their_own_host_view():
    b = Blob((2, 3))
    assert type(b) is Blob and b.host_view() is b
    with pytest.raises(ValueError, match="read-only"):
        b.cpu_data()[0, 0] = 1


def test_host_reads_copy_device_writes_once(dev):
    b = Blob((2, 3), np.float32, dev.xp)
    assert isinstance(b, DeviceBlob) and isinstance(b.host_view(), HostBlob)
    view = b.host_view()
    assert view is b.host_view() and view.shape == (2, 3) and view.count == 6
    b.data[...] = 3                        # device code writes
    held = view.data
    assert isinstance(held, np.ndarray) and (held == 3).all()
    assert (view.data == 3).all()
    assert dev.counts() == (1, 0)          # the second read copied nothing
    # pycaffe's .data is mutable: device code touching the blob next copies the host array
    # back first (the user may have written it), as Caffe's mutable_cpu_data makes it do.
    b.data[...] = 7
    assert dev.counts() == (1, 1)
    view.data                              # the held array refreshes in place, as in pycaffe
    assert (held == 7).all() and dev.counts() == (2, 1)


def test_device_code_sees_host_writes(dev):
    b = Blob((4,), np.float32, dev.xp)
    b.host_view().data[...] = [1, 2, 3, 4]
    assert dev.counts() == (1, 0)
    assert b.data.tolist() == [1, 2, 3, 4] and dev.counts() == (2, 1)
    b.data                                 # the device copy is current: no copy
    assert dev.counts() == (2, 1)
    b.host_view().diff = 5                 # assigning every element: no copy from the device
    assert dev.counts() == (2, 1)
    assert (b.diff == 5).all() and dev.counts() == (3, 2)  # bool() of a device array: a copy
    with pytest.raises(ValueError):        # a bad assignment leaves the blob as it was
        b.host_view().data = np.zeros(3)
    assert b.data.tolist() == [1, 2, 3, 4]


def test_cpu_data_reads_without_taking_the_head(dev):
    b = Blob((3,), np.float32, dev.xp)
    b.data[...] = 2
    ro = b.cpu_data()
    assert (ro == 2).all() and not ro.flags.writeable
    b.data                                 # nothing to copy back: the host only read
    assert dev.counts() == (1, 0)


def test_shared_blobs_share_their_sync_state(dev):
    """In-place layers, Flatten's ShareData and shared params: a host write through one blob
    is seen by device code through the other."""
    a = Blob((2, 6), np.float32, dev.xp)
    flat = Blob((12,), np.float32, dev.xp)
    flat.share_data(a)
    flat.share_diff(a)
    a.host_view().data[...] = np.arange(12).reshape(2, 6)
    np.testing.assert_array_equal(flat.data.get(), np.arange(12))
    flat.diff[...] = 1
    assert (a.host_view().diff == 1).all()


def test_reshape_keeps_values_or_starts_fresh(dev):
    b = Blob((2, 3), np.float32, dev.xp)
    b.host_view().data[...] = np.arange(6).reshape(2, 3)
    b.reshape(3, 2)                        # same count: same memory, pending host write kept
    np.testing.assert_array_equal(b.data.get(), np.arange(6).reshape(3, 2))
    np.testing.assert_array_equal(b.host_view().data, np.arange(6).reshape(3, 2))
    b.reshape(4, 2)
    assert (b.host_view().data == 0).all() and b.host_view().data.shape == (4, 2)


# --------------------------------------------------------------------------------------------
# Nets and solvers on the numpy backend
# --------------------------------------------------------------------------------------------
SMALL_NET = """
name: "small"
force_backward: true
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 9 dim: 9 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 group: 1
                            weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
        pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "norm" type: "LRN" bottom: "pool" top: "norm" lrn_param { local_size: 3 } }
layer { name: "ip" type: "InnerProduct" bottom: "norm" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


def _small_net(backend=None):
    from google.protobuf import text_format
    from cct.proto import caffe_pb2
    set_quiet(True)
    try:
        cct.rng.set_random_seed(5)
        return cct.Net(text_format.Parse(SMALL_NET, caffe_pb2.NetParameter()), cct.TEST,
                       backend=backend)
    finally:
        set_quiet(False)


def test_pycaffe_on_the_numpy_backend_matches_the_cpu():
    cpu_net, np_net = _small_net("cpu"), _small_net("numpy")
    assert np_net.backend.name == "numpy"
    assert all(isinstance(b, HostBlob) for b in np_net.blobs.values())
    assert all(isinstance(b, HostBlob) for blobs in np_net.params.values() for b in blobs)
    for name, blobs in cpu_net.params.items():  # the same weights, written from the host
        for mine, theirs in zip(np_net.params[name], blobs):
            mine.data[...] = theirs.data
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 9)).astype(np.float32)
    top = np.random.default_rng(1).standard_normal((2, 5)).astype(np.float32)
    want = cpu_net.forward(data=x)["prob"]
    got = np_net.forward(data=x)["prob"]
    assert type(got) is np.ndarray
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    want_dx = cpu_net.backward(prob=top)["data"]
    got_dx = np_net.backward(prob=top)["data"]
    np.testing.assert_allclose(got_dx, want_dx, rtol=1e-4, atol=1e-6)
    for name, blobs in cpu_net.params.items():
        for mine, theirs in zip(np_net.params[name], blobs):
            np.testing.assert_allclose(mine.diff, theirs.diff, rtol=1e-4, atol=1e-5)
    # A write into a param's host array is what the next forward pass uses. (Biases that
    # differ, so that the softmax sees them, and small: at a logit of 100 one float32 step is
    # 7.6e-6, and two GEMMs' last roundings may differ by it.)
    bias = np.array([-1.0, 0.5, 2.0, 0.0, 1.0], np.float32)
    np_net.params["ip"][1].data[...] = bias
    cpu_net.params["ip"][1].data[...] = bias
    got = np_net.forward(data=x)["prob"]
    assert np.abs(got - want).max() > 0.01
    np.testing.assert_allclose(got, cpu_net.forward(data=x)["prob"], rtol=1e-5, atol=1e-6)


def test_the_numpy_backend_runs_the_gpus_wrappers_and_their_checks(monkeypatch):
    """npdevice wraps its kernels as gpu.py does (caffe_cuda's wrappers over a stand-in for
    Caffe's CUDA kernels, cudnn's over a stand-in for its convolutions), so a net there calls
    each wrapper with the layer's own arguments, checks its first call against the array
    kernels and then takes the fast kernel: MAX pooling, ReLU and LRN forward and backward,
    and the convolution's three, here."""
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 9)).astype(np.float32)
    top = np.random.default_rng(1).standard_normal((2, 5)).astype(np.float32)
    names = {npdevice._caffe_kernels: ("max_forward", "max_backward", "relu_forward",
                                       "relu_backward", "lrn_forward", "lrn_backward"),
             npdevice._convolutions: ("forward", "backward_data", "backward_weight")}
    calls = []
    for fast, methods in names.items():
        for name in methods:
            def counted(*args, _name=name, _call=getattr(fast, name), **kwargs):
                calls.append(_name)
                return _call(*args, **kwargs)
            monkeypatch.setattr(fast, name, counted)
    net = _small_net("numpy")
    net.forward(data=x)       # each call checked (or checked by an earlier test)
    net.backward(prob=top)
    verdicts = npdevice.kernels.first_use_checks["max_pool_forward"].verdicts
    assert verdicts[((2, 4, 9, 9), "float32", (3, 3), (2, 2), (0, 0), (4, 4))] is True
    calls.clear()
    net.forward(data=x)       # the fast kernels only, now
    net.backward(prob=top)
    assert sorted(calls) == sorted(n for methods in names.values() for n in methods)


@pytest.mark.parametrize("backend", ["numpy", pytest.param("gpu", marks=needs_gpu)])
@pytest.mark.parametrize("name,phase", FIXTURES, ids=[f"{n}.{p}" for n, p in FIXTURES])
def test_caffe_numerics(caffe_fixtures, name, phase, backend):
    """Every blob's and param's data and diff after one forward and backward pass in real
    Caffe, read back through pycaffe's host arrays."""
    net, ref = load_and_run(caffe_fixtures, name, phase, backend)
    assert_within_tolerance(errors_against_caffe(net, ref), f"{backend} {name}.{phase}")


@pytest.mark.parametrize("backend", ["numpy", pytest.param("gpu", marks=needs_gpu)])
def test_two_lenet_sgd_steps_match_caffe(caffe_fixtures, monkeypatch, backend):
    """Caffe's two SGD steps on LeNet (forward, backward, the fused SGD update) with the
    params set and read through the solver net's host arrays."""
    s, z = lenet_sgd_solver(caffe_fixtures, monkeypatch, backend)
    for k in (1, 2):
        s.net.blobs["data"].data[...] = z[f"step{k}/input/data"]
        s.net.blobs["label"].data[...] = z[f"step{k}/input/label"]
        s.step(1)
        assert s.smoothed_loss == pytest.approx(float(z[f"step{k}/loss"]), rel=1e-5)
        for name, blobs in s.net.params.items():
            for i, b in enumerate(blobs):
                np.testing.assert_allclose(b.data, z[f"step{k}/after/{name}/{i}/data"],
                                           rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------------------------
# Layer gradients on the numpy backend (float64 finite differences)
# --------------------------------------------------------------------------------------------
GRADIENT_LAYERS = [
    ('type: "Convolution" convolution_param { num_output: 4 kernel_size: 3 stride: 2 pad: 1 '
     'group: 2 dilation: 1 weight_filler { type: "gaussian" } '
     'bias_filler { type: "gaussian" } }', [(2, 4, 6, 5)], {}),
    ('type: "Convolution" convolution_param { num_output: 2 kernel_h: 2 kernel_w: 3 '
     'dilation: 2 stride_h: 3 stride_w: 1 weight_filler { type: "gaussian" } }',
     [(1, 3, 7, 8)], {}),
    ('type: "Deconvolution" convolution_param { num_output: 3 kernel_size: 3 stride: 2 '
     'pad: 1 weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } }',
     [(2, 2, 4, 3)], {}),
    ('type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }',
     [(2, 2, 7, 6)], {}),
    ('type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 }', [(2, 2, 7, 6)],
     {}),
    ('type: "LRN" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 }', [(2, 5, 3, 3)], {}),
    ('type: "ReLU" relu_param { negative_slope: 0.1 }', [(2, 3, 4)],
     dict(kink=0.0, kink_range=1e-3)),
    ('type: "InnerProduct" inner_product_param { num_output: 3 '
     'weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } }', [(2, 3, 2, 2)],
     {}),
    ('type: "Softmax"', [(2, 4, 3)], {}),
]


@pytest.mark.parametrize("body,shapes,opts", GRADIENT_LAYERS, ids=lambda v: str(v)[:40])
def test_layer_gradients(body, shapes, opts):
    numpy_backend = backends.get("numpy")
    cct.rng.set_random_seed(3)
    layer = create_layer(make_layer_param(body), numpy_backend, np.float64)
    rng = np.random.default_rng(4)
    bottom = []
    for shape in shapes:
        b = Blob(shape, np.float64, numpy_backend.xp)
        b.host_view().data[...] = rng.standard_normal(shape)
        bottom.append(b)
    top = [Blob((), np.float64, numpy_backend.xp)]
    layer.setup(bottom, top)
    assert isinstance(top[0], DeviceBlob)
    check_gradient(layer, bottom, top, **opts)


def test_softmax_with_loss_gradient():
    numpy_backend = backends.get("numpy")
    layer = create_layer(make_layer_param(
        'type: "SoftmaxWithLoss" loss_param { ignore_label: 2 }'), numpy_backend, np.float64)
    x = Blob((3, 4, 2), np.float64, numpy_backend.xp)
    x.host_view().data[...] = np.random.default_rng(5).standard_normal((3, 4, 2))
    label = Blob((3, 2), np.float64, numpy_backend.xp)
    label.host_view().data[...] = [[0, 2], [3, 1], [2, 1]]
    top = [Blob((), np.float64, numpy_backend.xp)]
    layer.setup([x, label], top)
    check_gradient(layer, [x, label], top, check_bottom=[0])


# --------------------------------------------------------------------------------------------
# Copies off the current stream (the hybrid split's, cct/scheduler.py)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["numpy", pytest.param("gpu", marks=needs_gpu)])
def test_aside_copies_come_after_the_work_queued_before_their_mark(backend):
    """A device-to-host copy after a mark sees what the kernels queued before the mark wrote,
    and a host-to-device copy lands whole before the call returns, on both device backends."""
    b = backends.get(backend)
    xp = b.xp
    x = xp.arange(1 << 20, dtype=xp.float32)
    for _ in range(20):          # queued work the copy must wait for (a GPU is still at it)
        x *= 1.5
        x /= 1.5
    x += 1
    mark = b.aside.mark()
    out = np.empty(1 << 20, np.float32)
    b.aside.to_host(x, out, after=mark)
    np.testing.assert_array_equal(out, np.arange(1 << 20, dtype=np.float32) + 1)
    back = xp.zeros(1 << 20, dtype=xp.float32)
    b.aside.to_device(out * 2, back, after=b.aside.mark())
    assert float((back - 2 * x).max()) == 0.0
