"""A device backend's kernels called as the CPU's are, with host arrays: what lets the kernel
tests (tests/backend/kernel_cases.py) run every check on a device backend whose arrays host
code may not touch (the stand-in refuses it, as CuPy does)."""
from __future__ import annotations

import numpy as np

from cct.backend.array_kernels import KERNELS


class OnDevice:
    """``backend``'s kernels taking and giving host arrays. Each host array given is copied
    to the device once (the same array twice is one device array, so an ``out=`` that is an
    input still overlaps it); after the kernel, each writeable one gets its device copy's
    values back (in-place kernels and ``out=`` land where the test looks), and results come
    back to the host: one that is an argument's device copy as that host array itself."""

    def __init__(self, backend):
        self.backend = backend

    def __getattr__(self, name: str):
        fn = getattr(self.backend, name)
        if name not in KERNELS:
            return fn
        backend = self.backend

        def call(*args, **kwargs):
            copies = {}

            def down(v):
                if isinstance(v, np.ndarray):
                    if id(v) not in copies:
                        copies[id(v)] = (v, backend.to_device(v))
                    return copies[id(v)][1]
                if isinstance(v, (list, tuple)):
                    return type(v)(down(x) for x in v)
                return v

            result = fn(*down(args), **{k: down(v) for k, v in kwargs.items()})
            for host, dev in copies.values():
                if host.flags.writeable:
                    host[...] = backend.to_host(dev)
            by_device = {id(dev): host for host, dev in copies.values()}

            def up(v):
                if id(v) in by_device:
                    return by_device[id(v)]
                if backend.is_device(v):
                    return backend.to_host(v)
                if isinstance(v, (list, tuple)):
                    return type(v)(up(x) for x in v)
                return v
            return up(result)
        call.__name__ = name
        return call
