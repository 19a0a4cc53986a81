"""The ``numpy`` backend: the GPU backend's kernels (:mod:`cct.backend.array_kernels`) on NumPy,
with NumPy arrays standing in for device memory.

It exists so that CI, which has no GPU, runs the GPU code path end to end: the same
array-generic kernels, the same layers, and the same host/device synchronisation of blobs
(:class:`cct.blob.DeviceBlob`), whose "device" arrays here are NumPy arrays apart from the host
copies pycaffe code sees. ``xp`` is NumPy's namespace under another module object, so that a
blob can tell this memory from the CPU backend's.
"""
from __future__ import annotations

import types

import numpy as np

from ..blob import register_device_memory
from .array_kernels import ArrayKernels

name = "numpy"

xp = types.ModuleType("cct.backend.npdevice.xp", "NumPy, as the numpy backend's device module")
xp.__dict__.update({k: v for k, v in vars(np).items() if not k.startswith("__")})
# NumPy resolves some names lazily (numpy.__getattr__); so does this namespace.
xp.__getattr__ = lambda attr: getattr(np, attr)


def to_host(device_array, host_array) -> None:
    np.copyto(host_array, device_array)


def to_device(host_array, device_array) -> None:
    np.copyto(device_array, host_array)


register_device_memory(xp, to_host, to_device)

kernels = ArrayKernels(xp)
kernels.bind(globals())
