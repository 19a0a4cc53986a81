"""Backends: one module per kind of device, one function per kernel.

Layers receive a backend module and call its kernels (``conv_forward``, ``max_pool_forward``,
``lrn_across_forward`` ...) and its array module ``xp`` for simple array arithmetic; they never
test which device they run on. The backends:

* ``cpu`` (:mod:`cct.backend.cpu`): NumPy arrays, the kernels in C++.
* ``gpu`` (:mod:`cct.backend.gpu`): CuPy arrays on a GPU, the array-generic kernels of
  :mod:`cct.backend.array_kernels`; needs the ``gpu`` extra.
* ``numpy`` (:mod:`cct.backend.npdevice`): those same array-generic kernels on NumPy, with
  NumPy arrays treated as device memory: the GPU code path, runnable without a GPU.
"""
from importlib import import_module
from types import ModuleType

from ..errors import CCTError
from ..glog import warning

_BACKENDS = {"cpu": "cct.backend.cpu", "gpu": "cct.backend.gpu",
             "numpy": "cct.backend.npdevice"}


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
