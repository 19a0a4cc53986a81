"""``cct time`` (Caffe's ``caffe time``) times each layer with its net's backend's timer: host
clocks on the CPU and the ``numpy`` stand-in, CUDA events on the device's stream on a GPU
(Caffe's Timer in GPU mode), never host clocks around asynchronous launches."""
import re
import time

import pytest

from cct import backend as backends
from cct import cli
from cct.backend import HostTimer, gpu, npdevice

GPU_OK, GPU_REASON = gpu.available()
needs_gpu = pytest.mark.skipif(not GPU_OK, reason=f"no usable GPU: {GPU_REASON}")

NET = """name: "t"
layer { name: "data" type: "DummyData" top: "x" top: "y"
        dummy_data_param { shape { dim: 4 dim: 3 dim: 5 dim: 5 } shape { dim: 4 }
                           data_filler { type: "gaussian" } data_filler { type: "constant" } } }
layer { name: "conv" type: "Convolution" bottom: "x" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "y" top: "loss" }
"""
LAYERS = ("data", "conv", "relu", "ip", "loss")


class CountingTimer(HostTimer):
    """The stand-in's timer, counting the regions it timed."""

    started = 0

    def start(self) -> None:
        CountingTimer.started += 1
        super().start()


def _per_layer(err: str):
    """{(layer, "forward"|"backward"): ms} from cct time's "Average time per layer" lines."""
    return {(m[1], m[2]): float(m[3])
            for m in re.finditer(r"\] +(\S+)\t(forward|backward): (\S+) ms\.", err)}


def test_host_timer_stops_when_read():
    t = HostTimer()
    assert t.milliseconds() == 0.0            # never started: Caffe's Timer reads 0 too
    t.start()
    time.sleep(0.01)
    first = t.milliseconds()                  # stops it
    time.sleep(0.01)
    assert 5 < first == t.milliseconds()
    assert backends.get("cpu").timer().milliseconds() == 0.0


def test_time_on_the_numpy_backend_uses_its_timer(tmp_path, capsys, monkeypatch):
    """The GPU code path end to end: the net on the stand-in device, every region timed by the
    backend's timer, every layer reported in Caffe's lines."""
    (tmp_path / "net.prototxt").write_text(NET)
    monkeypatch.setattr(cli, "_net_backend", lambda flags, where: "numpy")
    monkeypatch.setattr(npdevice, "timer", CountingTimer)
    monkeypatch.setattr(CountingTimer, "started", 0)
    iterations = 3
    assert cli.main(["time", "-model", str(tmp_path / "net.prototxt"),
                     "-iterations", str(iterations)]) == 0
    err = capsys.readouterr().err
    times = _per_layer(err)
    assert set(times) == {(name, d) for name in LAYERS for d in ("forward", "backward")}
    assert all(ms >= 0 for ms in times.values())
    # Caffe's timers: total once; per iteration the iteration, forward, backward, and one a
    # layer each way.
    assert CountingTimer.started == 1 + iterations * (3 + 2 * len(LAYERS))
    assert err.count("forward-backward time: ") == iterations
    assert "*** Benchmark ends ***" in err


def test_time_lines_on_the_cpu(tmp_path, capsys):
    """Caffe's lines, in Caffe's order; the passes' averages are the layers' sums or more."""
    (tmp_path / "net.prototxt").write_text(NET)
    assert cli.main(["time", "-model", str(tmp_path / "net.prototxt"), "-iterations", "2"]) == 0
    err = capsys.readouterr().err
    times = _per_layer(err)
    order = [m[1] for m in re.finditer(r"\] +(\S+)\tforward: ", err)]
    assert order == list(LAYERS)

    def ms(label):
        return float(re.search(rf"{label}: (\S+) ms\.", err)[1])
    assert ms("Average Forward pass") >= sum(times[n, "forward"] for n in LAYERS) * 0.99
    assert ms("Average Backward pass") >= sum(times[n, "backward"] for n in LAYERS) * 0.99
    assert ms("Total Time") == pytest.approx(2 * ms("Average Forward-Backward"), rel=1e-5)


@needs_gpu
def test_gpu_timer_measures_the_device_with_cuda_events():
    """The GEMMs run after their launches return: host clocks see the launches, the events
    the work, and reading the timer waits for it."""
    import cupy
    gpu.use_device(0)
    a = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32)
    cupy.matmul(a, a)
    cupy.cuda.get_current_stream().synchronize()
    timer, launches = gpu.timer(), HostTimer()
    timer.start()
    launches.start()
    for _ in range(20):
        cupy.matmul(a, a)
    launched_ms = launches.milliseconds()
    device_ms = timer.milliseconds()
    assert cupy.cuda.get_current_stream().done
    assert device_ms > launched_ms > 0
    assert timer.milliseconds() == device_ms  # stopped when first read


@needs_gpu
def test_time_on_the_gpu_reports_every_layer(tmp_path, capsys):
    (tmp_path / "net.prototxt").write_text(NET)
    assert cli.main(["time", "-model", str(tmp_path / "net.prototxt"), "-iterations", "2",
                     "-gpu", "0"]) == 0
    err = capsys.readouterr().err
    assert "Use GPU with device ID 0" in err
    times = _per_layer(err)
    assert set(times) == {(name, d) for name in LAYERS for d in ("forward", "backward")}
    assert all(ms >= 0 for ms in times.values())
