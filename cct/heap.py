"""glibc's malloc told to keep freed memory for the next allocation.

A training iteration's NumPy expressions (neuron layers, BatchNorm's parameters, data
transforms) make temporaries of a blob's size and free them. Above 128 KiB glibc takes such a
block straight from the kernel (mmap) and gives it back on free, so every iteration faults
fresh pages in, which on these machines runs at about 0.3 GiB/s: CIFAR10-full-BN's Sigmoid
layers took 16 ms an iteration instead of 4.4. With mmap reserved for blocks over 64 MiB and
the heap trimmed only past 256 MiB free, the temporaries reuse the heap's pages:
CIFAR10-full-BN's iteration 66 -> 55 ms; nets whose layers are all C++ kernels (bench_train's)
train as fast as before, their peak RSS within +66 / -16 MB (bench/RESULTS.md). Done once, when the first net is built (not at import: a script that
only reads prototxts keeps its allocator as it was); left alone where the user set glibc's
MALLOC_* variables, where ``CCT_MALLOC=default``, or off glibc.
"""
from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 256 << 20
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                  "MALLOC_MMAP_MAX_")

_state = {"done": False}


def keep_freed_memory() -> bool:
    """Sets the two thresholds once per process; True when they were set by this call."""
    if _state["done"]:
        return False
    _state["done"] = True
    if (os.environ.get("CCT_MALLOC", "") == "default"
            or any(v in os.environ for v in _USER_SETTINGS)
            or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # mallopt returns 1 on success; the trim threshold first, as setting either turns glibc's
    # dynamic adjustment of both off.
    return bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                and libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
