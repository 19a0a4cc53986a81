"""A bad GPU request is one clear line: a GPU id the machine does not have, and a device that
runs out of memory in a layer's forward or backward pass (the layer named, the bytes it asked
for, and the fix: a smaller batch). The out-of-memory path runs on the ``numpy`` stand-in,
whose OutOfMemoryError is CuPy's; the real one where CuPy has a GPU. (-gpu without a GPU
backend: tests/test_cli_devices.py.)"""
import numpy as np
import pytest

from cct import backend as backends
from cct import cli
from cct.backend import cpu, gpu, npdevice, standin
from cct.errors import LayerError
from cct.layers.inner_product import InnerProductLayer
from tests.test_cli_time import NET

GPU_OK, GPU_REASON = gpu.available()
needs_gpu = pytest.mark.skipif(not GPU_OK, reason=f"no usable GPU: {GPU_REASON}")


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("cct: error: ")
    return last


# --------------------------------------------------------------------------------------------
# A GPU id the machine does not have
# --------------------------------------------------------------------------------------------
@pytest.fixture
def one_gpu(monkeypatch):
    """A machine with one GPU, as far as the checks before CuPy's first call can tell."""
    monkeypatch.setattr(gpu, "_probe", lambda: (True, "1 CUDA device(s)", 1))


@pytest.mark.parametrize("command,want", [
    ("time", "time: -gpu 5: there is no GPU 5: this machine has 1 (ids 0 to 0)"),
    ("test", "test: -gpu 5: there is no GPU 5: this machine has 1 (ids 0 to 0)"),
    ("train", "train: -gpu 5: device 'gpu5': there are 1 GPU(s) (0..0)."),
])
def test_a_gpu_the_machine_does_not_have(tmp_path, capsys, one_gpu, command, want):
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(
        f'net: "{tmp_path / "net.prototxt"}" base_lr: 0.1 lr_policy: "fixed" max_iter: 1')
    args = {"time": ["-model", str(tmp_path / "net.prototxt")],
            "test": ["-model", str(tmp_path / "net.prototxt"), "-weights", "w.caffemodel"],
            "train": ["-solver", str(tmp_path / "solver.prototxt")]}[command]
    assert cli.main([command, *args, "-gpu", "5"]) == 1
    assert _one_error_line(capsys) == f"cct: error: {want}"


def test_solver_device_id_the_machine_does_not_have(tmp_path, capsys, one_gpu):
    """solver_mode: GPU falls back to the CPU only where no GPU backend runs; a device_id the
    GPUs do not have is a mistake to fix, as for -gpu."""
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(
        f'net: "{tmp_path / "net.prototxt"}" base_lr: 0.1 lr_policy: "fixed" max_iter: 1 '
        f'solver_mode: GPU device_id: 3')
    assert cli.main(["train", "-solver", str(tmp_path / "solver.prototxt")]) == 1
    assert _one_error_line(capsys) == ("cct: error: train: solver_mode: GPU (device_id 3): "
                                       "device 'gpu3': there are 1 GPU(s) (0..0).")


# --------------------------------------------------------------------------------------------
# Out of memory in a layer
# --------------------------------------------------------------------------------------------
def test_standin_out_of_memory_error_says_what_cupys_says():
    e = standin.OutOfMemoryError(1024, 0)
    assert isinstance(e, MemoryError)
    assert str(e) == "Out of memory allocating 1,024 bytes (allocated so far: 0 bytes)."
    assert str(standin.OutOfMemoryError(512, 2048, 4096)) == (
        "Out of memory allocating 512 bytes (allocated so far: 2,048 bytes, limit set to: "
        "4,096 bytes).")
    assert npdevice.OutOfMemoryError is standin.OutOfMemoryError


def test_each_backend_knows_its_own_out_of_memory_error():
    device_oom = standin.OutOfMemoryError(3_221_225_472, 1_000)
    assert npdevice.out_of_memory(device_oom) == 3_221_225_472
    assert npdevice.out_of_memory(MemoryError("host")) is None
    assert npdevice.out_of_memory(ValueError("Out of memory allocating 8 bytes")) is None
    assert gpu.out_of_memory(device_oom) is None  # not CuPy's
    with pytest.raises(MemoryError) as host:
        np.empty((1 << 40, 1 << 12), np.float32)
    assert cpu.out_of_memory(host.value) == 4 << 52
    assert cpu.out_of_memory(device_oom) is None
    assert backends.allocation_bytes(ValueError("no size here")) is None


def _oom(monkeypatch, method: str, exc: BaseException) -> None:
    def raise_it(self, *args):
        raise exc
    monkeypatch.setattr(InnerProductLayer, method, raise_it)


@pytest.mark.parametrize("method", ["forward", "backward"])
def test_out_of_memory_in_a_layer_is_one_line(tmp_path, capsys, monkeypatch, method):
    (tmp_path / "net.prototxt").write_text(NET)
    monkeypatch.setattr(cli, "_net_backend", lambda flags, where: "numpy")
    _oom(monkeypatch, method, standin.OutOfMemoryError(1024, 0))
    assert cli.main(["time", "-model", str(tmp_path / "net.prototxt"), "-iterations", "1"]) == 1
    assert _one_error_line(capsys) == (
        f"cct: error: InnerProduct layer 'ip': out of memory on numpy device 0 allocating 1,024 "
        f"bytes in the {method} pass; lower the batch size (the data layer's batch_size, or an "
        f"Input shape's first dim)")


def test_out_of_memory_reaches_pycaffe_as_a_layer_error(monkeypatch):
    from tests.test_gpu_backend import _small_net
    net = _small_net("numpy")
    _oom(monkeypatch, "forward", standin.OutOfMemoryError(2 ** 33, 2 ** 30))
    with pytest.raises(LayerError, match=r"^InnerProduct layer 'ip': out of memory on numpy "
                                         r"device 0 allocating 8,589,934,592 bytes") as e:
        net.forward()
    assert isinstance(e.value.__cause__, standin.OutOfMemoryError)


def test_other_memory_errors_pass_through(monkeypatch):
    from tests.test_gpu_backend import _small_net
    net = _small_net("numpy")
    mine = MemoryError("not the device's")
    _oom(monkeypatch, "forward", mine)
    with pytest.raises(MemoryError) as e:
        net.forward()
    assert e.value is mine


@needs_gpu
def test_cupy_out_of_memory_is_recognised():
    import cupy
    gpu.use_device(0)
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError) as e:
        cupy.empty((1 << 48,), cupy.uint8)  # 256 TiB
    assert gpu.out_of_memory(e.value) == 1 << 48
    assert gpu.out_of_memory(MemoryError()) is None
