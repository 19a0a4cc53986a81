"""Backends: one module per kind of device, one function per kernel.

Layers receive a backend module and call its kernels (``conv_forward``, ``max_pool_forward``,
``lrn_across_forward`` ...) and its array module ``xp`` for simple array arithmetic; they never
test which device they run on. The backends:

* ``cpu`` (:mod:`cct.backend.cpu`): NumPy arrays, the kernels in C++.
* ``gpu`` (:mod:`cct.backend.gpu`): CuPy arrays on a GPU, the array-generic kernels of
  :mod:`cct.backend.array_kernels`; needs the ``gpu`` extra.
* ``numpy`` (:mod:`cct.backend.npdevice`): those same array-generic kernels on NumPy memory
  behind CuPy's rules (:mod:`cct.backend.standin`): the GPU code path, runnable without a GPU.

Every backend also owns the movement of its arrays (Caffe's SyncedMemory, tinygrad's
Allocator): ``to_host(a, out=None)`` gives a host (NumPy) array, ``to_device(host, out=None)``
a device one, ``synchronize()`` waits for queued work, ``is_device(a)`` says whether ``a`` is
its memory. Nothing else copies between host and device: code that holds arrays of unknown
side asks :func:`host` and :func:`copy` here, which find the owner (:func:`owner`).

Every backend also knows its own device's clock and failures (:data:`RUNTIME`): ``timer()``
times a region of its work (Caffe's Timer: host clocks where kernels finish when they return,
CUDA events on the GPU, whose kernels run after their launch returns), and
``out_of_memory(exc)`` gives the bytes an allocation asked for when ``exc`` is its device
running out of memory, else None, so the net can name the layer that asked.
"""
import functools
import re
import time
from importlib import import_module
from types import ModuleType
from typing import Callable, List, Optional, Tuple

import numpy as np

from ..errors import CCTError
from ..glog import warning

_BACKENDS = {"cpu": "cct.backend.cpu", "gpu": "cct.backend.gpu",
             "numpy": "cct.backend.npdevice"}

#: what every backend module has besides its kernels: the movement of its arrays
MOVEMENT = ("is_device", "to_host", "to_device", "synchronize", "device")
#: ... and what it knows of its device at run time: its clock and its out-of-memory error
RUNTIME = ("timer", "out_of_memory")


class BackendUnavailable(CCTError):
    """A backend this machine cannot run (the GPU backend without CuPy or without a GPU)."""


def get(name: str = "cpu") -> ModuleType:
    """The backend module ``name``; raises BackendUnavailable, saying what is missing and how
    to install it, when it cannot run here."""
    try:
        module = import_module(_BACKENDS[name])
    except KeyError:
        raise CCTError(f"unknown backend {name!r}; known: {', '.join(sorted(_BACKENDS))}") from None
    check = getattr(module, "available", None)
    if check is not None:
        ok, reason = check()
        if not ok:
            raise BackendUnavailable(f"the {name} backend cannot run here: {reason}")
    return module


# The device backends imported so far (a backend registers itself when imported: an array
# can only be one of theirs once its module is loaded).
_DEVICES: List[ModuleType] = []


def register_device(module: ModuleType) -> None:
    """Declare a backend module's arrays device memory (called by the module at import)."""
    if module not in _DEVICES:
        _DEVICES.append(module)


def cupy_movement(xp, is_device: Callable[[object], bool],
                  stage: Optional[Callable] = None) -> Tuple[Callable, Callable]:
    """``to_host(array, out=None)`` and ``to_device(host, out=None)`` for an array module with
    CuPy's copy API (``ndarray.get(out=)``, ``ndarray.set``, ``xp.asarray``): the GPU
    backend's, and the stand-in's, which so runs the very code a GPU runs. Each is one copy;
    values already on the side asked for are not copied (but into ``out``). ``stage(out,
    host)``, where given, copies host values into a contiguous device ``out`` without making
    the host wait (the GPU's: through pinned memory, ordered on the current stream); without
    it ``ndarray.set`` copies, which waits for the device."""
    def to_host(array, out: Optional[np.ndarray] = None) -> np.ndarray:
        if is_device(array):
            if out is not None and not (array.flags.c_contiguous and out.flags.c_contiguous):
                np.copyto(out, array.get())   # ndarray.get(out=) copies contiguous memory only
                return out
            return array.get(out=out)
        if out is None:
            return np.asarray(array)
        np.copyto(out, array)
        return out

    def to_device(host, out=None):
        if is_device(host):
            if out is None:
                return host
            out[...] = host
            return out
        if out is None:
            return xp.asarray(host)
        if not out.flags.c_contiguous:   # ndarray.set writes contiguous memory only
            out[...] = xp.asarray(host)
            return out
        values = np.ascontiguousarray(host, dtype=out.dtype).reshape(out.shape)
        if stage is not None:
            stage(out, values)
        else:
            out.set(values)
        return out
    return to_host, to_device


def owner(array) -> ModuleType:
    """The backend whose memory ``array`` is: a device backend's, else the CPU's (NumPy arrays,
    scalars, lists)."""
    for module in _DEVICES:
        if module.is_device(array):
            return module
    return _cpu()


@functools.lru_cache(maxsize=None)
def _cpu() -> ModuleType:
    # owner() runs for every param a scheduler or driver step moves: the module, looked up once.
    return get("cpu")


def device_of_xp(xp):
    """The device backend whose array module is ``xp``, or None (host memory)."""
    for module in _DEVICES:
        if module.xp is xp:
            return module
    return None


def host(array) -> np.ndarray:
    """``array`` as a host (NumPy) array: a copy from its device, or itself on the host."""
    return owner(array).to_host(array)


def alongside(ref, array):
    """``array`` where ``ref`` lives: copied to ``ref``'s device, or to the host, when it is
    not there already."""
    side = owner(ref)
    return side.to_device(array) if side.name != "cpu" else host(array)


def copy(dst, src) -> None:
    """``dst[...] = src`` wherever each lives: a host-to-device copy by ``dst``'s backend, a
    device-to-host copy by ``src``'s, through the host between two devices' memories."""
    to, frm = owner(dst), owner(src)
    if to is frm:
        dst[...] = src
    elif frm.name == "cpu":
        to.to_device(src, out=dst)
    elif to.name == "cpu":
        frm.to_host(src, out=dst)
    else:
        to.to_device(frm.to_host(src), out=dst)


_warned = set()


def resolve(mode: str, device_id: int = 0) -> str:
    """The backend for Caffe's mode ``mode`` ("cpu" or "gpu", any case) on device
    ``device_id``: "gpu" when asked for and usable (making ``device_id`` the current GPU),
    else "cpu", after one warning per reason saying why. A device id that the machine's GPUs
    do not have is a user mistake and raises a CCTError."""
    mode = str(mode).lower()
    if mode == "cpu":
        return "cpu"
    if mode != "gpu":
        raise CCTError(f"unknown mode {mode!r}: Caffe's modes are 'cpu' and 'gpu'")
    from . import gpu
    ok, reason = gpu.available()
    if ok:
        gpu.use_device(device_id)
        return "gpu"
    if reason not in _warned:
        _warned.add(reason)
        warning("common.cpp:0", f"GPU mode asked for, but there is no GPU backend here: "
                f"{reason}. Running on the CPU.")
    return "cpu"


class HostTimer:
    """Caffe's Timer in CPU mode: wall-clock time between :meth:`start` and :meth:`stop`
    (``time.perf_counter``). Right for backends whose kernels have finished when they return
    (the CPU, the ``numpy`` stand-in); a GPU's timer records events on its stream instead."""

    def __init__(self):
        self._start = self._stop = None

    def start(self) -> None:
        self._start, self._stop = time.perf_counter(), None

    def stop(self) -> None:
        if self._start is not None and self._stop is None:
            self._stop = time.perf_counter()

    def milliseconds(self) -> float:
        """The time from start to stop, stopping a running timer first (as Caffe's
        Timer::MilliSeconds does); 0 for a timer never started."""
        if self._start is None:
            return 0.0
        self.stop()
        return (self._stop - self._start) * 1e3


_ALLOCATING = re.compile(r"allocating ([\d,]+) bytes")


def allocation_bytes(exc: BaseException) -> Optional[int]:
    """The bytes asked for, read from an out-of-memory message in CuPy's words ("Out of memory
    allocating 1,024 bytes (allocated so far: 0 bytes)."); None when the message has none.
    CuPy keeps the size only in the message (its ``args`` hold the text alone)."""
    found = _ALLOCATING.search(str(exc))
    return int(found.group(1).replace(",", "")) if found else None
