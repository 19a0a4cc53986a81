"""The GPU backend: the kernels of :mod:`cct.backend.array_kernels` on CuPy (cuBLAS GEMMs,
CuPy's gather and elementwise kernels), float32 like Caffe.

CuPy is an optional extra (``gpu`` for CUDA 12, ``gpu-cuda13`` for CUDA 13; the pip command is
:func:`cct.install.install_hint`'s). Importing this module never fails: without CuPy or without a usable device,
:func:`available` says why, and ``cct.backend.get("gpu")`` raises
:class:`cct.backend.BackendUnavailable` with that reason; ``cct.backend.resolve`` falls back to
the CPU with one warning.

Blob arrays live on the device; pycaffe's ``.data``/``.diff`` are host copies kept in step by
:class:`cct.blob.DeviceBlob` through :func:`to_host` and :func:`to_device`.
"""
from __future__ import annotations

import functools
import sys
import threading
from typing import Optional, Tuple

import numpy as np

from . import allocation_bytes, cupy_movement, reduced, register_device
from ..glog import warning
from ..install import install_hint
from .array_kernels import ArrayKernels

name = "gpu"
INSTALL_HINT = (f"{install_hint('gpu')} (CuPy for CUDA 12) or {install_hint('gpu-cuda13')} "
                "(CUDA 13), matching the NVIDIA driver")

try:
    import cupy
    _IMPORT_PROBLEM = ""
except ImportError as e:
    cupy = None
    _IMPORT_PROBLEM = f"CuPy is not installed ({e})"
except (OSError, RuntimeError) as e:  # a CuPy wheel that cannot load its CUDA libraries
    cupy = None
    _IMPORT_PROBLEM = f"CuPy cannot be imported ({e})"

xp = cupy


@functools.lru_cache(maxsize=None)
def _probe() -> Tuple[bool, str, int]:
    """(usable, reason, device count), found once per process."""
    if cupy is None:
        return False, f"{_IMPORT_PROBLEM}; to use a GPU: {INSTALL_HINT}", 0
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # CUDARuntimeError: no driver, driver too old, no device
        return False, f"CuPy finds no usable CUDA device ({e})", 0
    if count == 0:
        return False, "CuPy finds no CUDA device", 0
    try:
        # A kernel and a cuBLAS call: a CuPy wheel built for another CUDA than the driver's, or
        # missing NVRTC/cuBLAS libraries, fail here rather than in the first layer.
        with cupy.cuda.Device(0):
            a = cupy.arange(4, dtype=cupy.float32)
            float(cupy.matmul(a[None, :], a[:, None])[0, 0])
    except Exception as e:
        return False, f"CuPy cannot run on GPU 0 ({type(e).__name__}: {e}); {INSTALL_HINT}", 0
    return True, f"{count} CUDA device(s)", count


def available() -> Tuple[bool, str]:
    """(True, description) when CuPy runs on this machine's GPU, else (False, the reason and
    how to fix it)."""
    ok, reason, _ = _probe()
    return ok, reason


def device_count() -> int:
    return _probe()[2]


def _check_device(device_id: int) -> int:
    from . import BackendUnavailable
    from ..errors import CCTError
    ok, reason, count = _probe()
    if not ok:
        raise BackendUnavailable(f"the gpu backend cannot run here: {reason}")
    device_id = int(device_id)
    if not 0 <= device_id < count:
        raise CCTError(f"there is no GPU {device_id}: this machine has {count} "
                       f"(ids 0 to {count - 1})")
    return device_id


def use_device(device_id: int) -> None:
    """Make GPU ``device_id`` current for this thread (blobs and kernels allocate there)."""
    device_id = _check_device(device_id)
    cupy.cuda.Device(device_id).use()


def synchronize() -> None:
    """Wait for the current device's work (for timing)."""
    cupy.cuda.get_current_stream().synchronize()


def device() -> int:
    """The GPU this thread allocates on now."""
    return int(cupy.cuda.runtime.getDevice())


class EventTimer:
    """Caffe's Timer in GPU mode: the device time between two CUDA events recorded on the
    current stream. Kernels run after their launch returns, so host clocks around a layer
    measure its launches, and charge the queued work to whichever layer waits first (the
    loss layer, which reads its loss back)."""

    def __init__(self):
        self._start, self._stop = cupy.cuda.Event(), cupy.cuda.Event()
        self._stream = None
        self._running = False

    def start(self) -> None:
        # Event.record defaults to the null stream; the layers' kernels run on the current one.
        self._stream = cupy.cuda.get_current_stream()
        self._start.record(self._stream)
        self._running = True

    def stop(self) -> None:
        if self._running:
            self._stop.record(self._stream)
            self._stop.synchronize()
            self._running = False

    def milliseconds(self) -> float:
        """The device time from start to stop, stopping a running timer first (waiting for
        its work, as Caffe's Timer::MilliSeconds does); 0 for a timer never started."""
        if self._stream is None:
            return 0.0
        self.stop()
        return float(cupy.cuda.get_elapsed_time(self._start, self._stop))


def timer() -> EventTimer:
    """A timer of the current GPU's work (CUDA events on the current stream)."""
    return EventTimer()


def out_of_memory(exc: BaseException) -> Optional[int]:
    """The bytes asked for when ``exc`` is CuPy's memory pool running out of device memory
    (``cupy.cuda.memory.OutOfMemoryError``), else None."""
    if cupy is None or not isinstance(exc, cupy.cuda.memory.OutOfMemoryError):
        return None
    size = allocation_bytes(exc)
    return int(getattr(exc, "_size", 0)) if size is None else size


def is_device(array) -> bool:
    return cupy is not None and isinstance(array, cupy.ndarray)


class PinnedStaging:
    """Host-to-device copies that do not make the host wait: ``ndarray.set`` copies from
    pageable memory, which waits for all the GPU's queued work (a data layer's batch would
    stop every iteration there). The values go through a page-locked buffer of their size
    (one per size, reused once the GPU has read it) and an asynchronous copy on the current
    stream, so the kernels queued after it read them, in order."""

    def __init__(self):
        self._buffers: dict = {}
        self._broken = ""

    def __call__(self, out, values: np.ndarray) -> None:
        if self._broken:
            out.set(values)
            return
        try:
            self._stage(out, values)
        except Exception as e:  # pinned memory refused (a container's memlock limit, ...)
            self._broken = f"{type(e).__name__}: {e}"
            warning("gpu.py:0", f"host-to-device copies wait for the device: pinned staging "
                                f"failed ({self._broken})")
            out.set(values)

    def _stage(self, out, values: np.ndarray) -> None:
        nbytes = values.nbytes
        if nbytes == 0:
            return
        # one buffer per thread too: a driver's groups stage their batches at the same time
        key = (nbytes, cupy.cuda.runtime.getDevice(), threading.get_ident())
        entry = self._buffers.get(key)
        if entry is None:
            memory = cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
            entry = self._buffers[key] = (np.frombuffer(memory, np.uint8, nbytes),
                                          cupy.cuda.Event(), memory)
        buffer, done, _ = entry
        done.synchronize()   # the GPU has read the last values staged here
        np.copyto(buffer, values.reshape(-1).view(np.uint8))
        stream = cupy.cuda.get_current_stream()
        out.data.copy_from_host_async(buffer.ctypes.data, nbytes, stream)
        done.record(stream)


class AsideCopies:
    """Host<->device copies that do not queue behind the kernels of other threads: every
    thread's work on the current (legacy default) stream runs in the order it was queued, so a
    CPU replica's copy made after a GPU replica's forward was queued would wait for that whole
    forward and backward (the hybrid split, cct/scheduler.py). These copies run on a
    non-blocking stream of their own per thread and device, ordered after a :meth:`mark` taken
    on the current stream (the work that produced or must precede them), and return when done.
    ``out``/``src`` are contiguous, as ``ndarray.get(out=)`` and ``set`` need."""

    def __init__(self):
        self._local = threading.local()

    def _stream(self):
        streams = self._local.__dict__.setdefault("streams", {})
        device = cupy.cuda.runtime.getDevice()
        stream = streams.get(device)
        if stream is None:
            stream = streams[device] = cupy.cuda.Stream(non_blocking=True)
        return stream

    def mark(self):
        """An event after the work queued so far on this thread's current stream."""
        event = cupy.cuda.Event(disable_timing=True)
        event.record(cupy.cuda.get_current_stream())
        return event

    def to_host(self, src, out: np.ndarray, after=None) -> np.ndarray:
        stream = self._stream()
        if after is not None:
            stream.wait_event(after)
        return src.get(stream=stream, out=out)      # blocking: returns once copied

    def to_device(self, src: np.ndarray, out, after=None):
        stream = self._stream()
        if after is not None:
            stream.wait_event(after)
        out.set(src, stream=stream)
        stream.synchronize()
        return out


aside = AsideCopies() if cupy is not None else None


class Graphs:
    """CUDA graphs of a function's device work (issue 29, item 3), through CuPy's stream
    capture. :meth:`capture` runs ``fn`` once on a non-blocking stream of its own (CuPy cannot
    capture the default one) after the GPU's queued work, its GEMMs on cct's own cuBLAS handle
    set to that stream beforehand (cct/backend/cublas.py); what ``fn`` allocates comes from a
    memory pool of the graph's own, kept as long as the graph: blocks freed during the capture
    are reused inside it, as the replay reuses them, and never handed to anyone else (the
    graph writes them again at each launch). Whatever the capture refuses (a host copy or
    sync, CuPy's cuBLAS, a kernel that cannot be captured) raises, with the capture ended.
    ``launch()`` runs the graph on the current stream, ordered with the eager work around it.
    """

    def capture(self, fn) -> "_Replay":
        from .cublas import gemm
        current = cupy.cuda.get_current_stream()
        current.synchronize()
        stream = cupy.cuda.Stream(non_blocking=True)
        pool = cupy.cuda.MemoryPool()
        with cupy.cuda.using_allocator(pool.malloc), stream:
            gemm(cupy).use_stream(stream)
            stream.begin_capture()
            try:
                fn()
            except BaseException:
                try:
                    stream.end_capture()
                except Exception:      # an invalidated capture: fn's error is the one to see
                    pass
                raise
            graph = stream.end_capture()
        # The eager passes' temporaries, cached by CuPy's pool since, are the graph's pool's
        # now: hand the cached blocks back to the device.
        cupy.get_default_memory_pool().free_all_blocks()
        return _Replay(graph, pool, stream)


class _Replay:
    __slots__ = ("graph", "pool", "stream")

    def __init__(self, graph, pool, stream):
        self.graph, self.pool, self.stream = graph, pool, stream

    def launch(self) -> None:
        self.graph.launch(stream=cupy.cuda.get_current_stream())


graphs = Graphs() if cupy is not None else None


def _gemm(a, b, out=None):
    """The kernels' GEMM: cct's own cuBLAS handle (capturable, cct/backend/cublas.py), each
    geometry's first call checked against CuPy's matmul (the first calls are eager: a graph
    is captured after warm-up iterations), CuPy's taken for a geometry where they disagree."""
    precision = _own_gemm.precision
    key = (a.shape, a.strides, b.shape, b.strides, str(a.dtype), str(b.dtype), precision)

    def put(result):
        if out is None:
            return result
        out[...] = result
        return out

    def agree(got, want) -> str:
        # In a reduced precision CuPy's float32 product is the reference the tensor cores'
        # must stay near (reduced.ACCURACY).
        return _caffe_cuda._differs([got], [want], exact=False,
                                    tolerance=reduced.ACCURACY[precision])
    return _gemm_check(key, lambda into: _own_gemm.matmul(a, b, out=out if into else None),
                       lambda into: cupy.matmul(a, b, out=out if into else None),
                       agree, put)


def set_precision(name: str, source: str = "precision") -> str:
    """What the GEMMs and cuDNN's convolutions multiply in from now on (cct/backend/reduced.py:
    float32, tf32, bf16, fp16; storage stays float32); returns it. A CUDA graph captured before
    keeps the precision it was captured in: set it before training starts."""
    name = reduced.check(name, source)
    _own_gemm.precision = name
    if convolutions is not None:
        convolutions.precision = name
    return name


def precision() -> str:
    return _own_gemm.precision


# A device array's values in host memory (into ``out``: one device-to-host copy); host values
# on the current GPU (a new array, or into ``out``: one host-to-device copy, through pinned
# memory without waiting for the device).
to_host, to_device = cupy_movement(cupy, is_device,
                                   stage=PinnedStaging() if cupy is not None else None)


# The device generators of Dropout's draws, one per GPU and host generator: each is seeded by
# one draw of the run's host generator (cct.rng) the first time it is needed, so a seeded run
# repeats its masks, and a new seed (set_random_seed makes a new host generator) reseeds.
_generators: dict = {}


def _device_uniform(shape, rng):
    key = (cupy.cuda.runtime.getDevice(), id(rng))
    entry = _generators.get(key)
    if entry is None or entry[0] is not rng:
        seed = int(rng.integers(0, 2**63 - 1))
        entry = _generators[key] = (rng, cupy.random.RandomState(seed))
    return entry[1].random_sample(shape, dtype=cupy.float32)


def _sgemm_gflops(n: int, repeats: int, precision: str = "float32") -> float:
    """GFLOP/s of an n x n x n float32 GEMM: CuPy's matmul, or in a reduced precision cct's own
    cuBLAS handle with that compute type (the GEMMs -precision runs)."""
    a = cupy.random.standard_normal((n, n), dtype=cupy.float32)
    b = cupy.random.standard_normal((n, n), dtype=cupy.float32)
    c = cupy.empty((n, n), cupy.float32)
    if precision == "float32":
        def gemm():
            cupy.matmul(a, b, out=c)
    else:
        def gemm():
            _own_gemm.matmul(a, b, out=c)
    was = _own_gemm.precision
    _own_gemm.precision = precision
    try:
        seconds = milliseconds_per_call(gemm, repeats) / 1e3
    finally:
        _own_gemm.precision = was
    return 2.0 * n ** 3 / seconds / 1e9


def milliseconds_per_call(fn, repeats: int) -> float:
    """The device time of one call of ``fn`` (CUDA events on the current stream around
    ``repeats`` calls, after one untimed: handles, kernel selection, first-use checks)."""
    fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    stream = cupy.cuda.get_current_stream()
    start.record(stream)
    for _ in range(repeats):
        fn()
    stop.record(stream)
    stop.synchronize()
    return float(cupy.cuda.get_elapsed_time(start, stop)) / repeats


def describe(device_id: int = 0, gemm_size: int = 4096, repeats: int = 10) -> dict:
    """What ``cct device_query -gpu i`` prints: name, total memory (bytes), compute
    capability, multiprocessors, and the float32 GEMM rate measured on ``gemm_size`` square
    matrices (GFLOP/s; TF32 only when CUPY_TF32=1 asks for it), with the tensor cores' rates
    for the reduced precisions (``gemm_gflops``: precision -> GFLOP/s, float32 included)."""
    device_id = _check_device(device_id)
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    dev_name = props["name"]
    with cupy.cuda.Device(device_id):
        rates = {p: _sgemm_gflops(int(gemm_size), int(repeats), p) for p in reduced.PRECISIONS}
    gflops = rates["float32"]
    return {
        "id": device_id,
        "name": dev_name.decode() if isinstance(dev_name, bytes) else str(dev_name),
        "total_memory": int(props["totalGlobalMem"]),
        "compute_capability": f"{props['major']}.{props['minor']}",
        "multiprocessors": int(props["multiProcessorCount"]),
        "sgemm_gflops": float(gflops),
        "gemm_gflops": {p: float(g) for p, g in rates.items()},
    }


if cupy is not None:
    register_device(sys.modules[__name__])
    # int32 gather indices (half the index traffic of int64); the index arrays are cached per
    # device, since each GPU needs its own copy.
    from . import caffe_cuda as _caffe_cuda
    from .cublas import gemm as _cublas_gemm
    _own_gemm = _cublas_gemm(cupy)     # the handle is made at the first GEMM, not here
    _gemm_check = _caffe_cuda.FirstUseCheck(
        "the GEMM", "runs on CuPy's matmul (no CUDA graph can hold it): cct's own cuBLAS "
                    "handle")
    kernels = ArrayKernels(cupy, device=cupy.cuda.runtime.getDevice, index_dtype=np.int32,
                           to_host=to_host, uniform=_device_uniform, gemm=_gemm)
    # Convolutions on cuDNN where the frontend is installed (engine CAFFE and the geometries
    # cuDNN refuses stay lowered); without it, the lowering path alone, said once.
    from . import cudnn as _cudnn
    from .shapes import pair as _pair
    # Pooling, SoftmaxWithLoss's forward, ReLU, LRN and the SGD step in one CUDA kernel each,
    # each geometry checked once against the array kernels before it is taken
    # (cct/backend/caffe_cuda.py).
    _fused = _caffe_cuda.CaffeKernels(cupy)
    _gemm_check.release = _fused.release
    _caffe_cuda.wrap_all(kernels, _fused, _pair)
    convolutions = _cudnn.convolutions(cupy)
    if convolutions is not None:
        _cudnn.wrap_lowering(kernels, convolutions, _pair)
        # its engines kept with the CPU's plans: the machine's cache, a snapshot's side file
        from . import plans as _plans
        _plans.register_device_table("cudnn", convolutions.rows, convolutions.install_rows)
    kernels.bind(globals())
