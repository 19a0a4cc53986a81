"""Backends: one module per kind of device, one function per kernel.

Layers receive a backend module and call its kernels (``conv_forward``, ``pool_forward``,
``lrn_forward`` ...) and its array module ``xp`` for simple array arithmetic; they never test
which device they run on. The CPU backend is :mod:`cct.backend.cpu`.
"""
from importlib import import_module
from types import ModuleType

_BACKENDS = {"cpu": "cct.backend.cpu"}


def get(name: str = "cpu") -> ModuleType:
    try:
        return import_module(_BACKENDS[name])
    except KeyError:
        from ..errors import CCTError
        raise CCTError(f"unknown backend {name!r}; known: {', '.join(sorted(_BACKENDS))}") from None
