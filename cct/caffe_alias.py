"""``import caffe`` answered by cct, for code written for pycaffe.

A Python layer module written for Caffe starts with ``import caffe`` and subclasses
``caffe.Layer``. When cct imports such a module (python_param.module) and no real Caffe is
importable, ``caffe`` is made to be the ``cct`` package (:func:`caffe_for_layer_module`); an
installed Caffe is never shadowed unless the user asks with ``CCT_AS_CAFFE=1``. The log says
which ``caffe`` a layer module got.

A user's own script keeps ``import cct as caffe``, or opts in: :func:`install_as_caffe` (call it
before ``import caffe``), or ``python -m cct.as_caffe script.py args`` for unchanged scripts.
Once installed, ``caffe.X`` is ``cct.X`` for submodules too (``from caffe.proto import
caffe_pb2``, ``import caffe.io``).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
from typing import Optional

from . import glog

ENV = "CCT_AS_CAFFE"


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``caffe.X`` as the module ``cct.X`` (the same object, not a second copy)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("caffe.") or sys.modules.get("caffe") is not _cct():
            return None
        target_name = "cct" + fullname[len("caffe"):]
        try:
            module = importlib.import_module(target_name)
        except ModuleNotFoundError as e:
            if e.name != target_name:
                raise
            return None
        spec = importlib.util.spec_from_loader(fullname, self, origin=module.__spec__.origin)
        spec.loader_state = (module, module.__spec__)
        return spec

    def create_module(self, spec):
        return spec.loader_state[0]

    def exec_module(self, module):
        # The import system stamped the alias spec on cct's module; give it its own back.
        module.__spec__ = module.__spec__.loader_state[1]


_FINDER = _AliasFinder()


def _cct():
    return sys.modules["cct"]


def install_as_caffe() -> None:
    """Make ``import caffe`` (and ``import caffe.X``) give cct, even where a real Caffe is
    installed: an explicit opt-in. Call it before the first ``import caffe``."""
    cct = _cct()
    sys.modules["caffe"] = cct
    for name, module in list(sys.modules.items()):
        if name.startswith("cct."):
            sys.modules.setdefault("caffe" + name[len("cct"):], module)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def real_caffe_origin() -> Optional[str]:
    """Where an installed Caffe would be imported from, or None if ``import caffe`` would fail,
    already gives cct, or finds only a folder named caffe without ``__init__.py`` (a namespace
    package, such as a Caffe source checkout in the working directory)."""
    loaded = sys.modules.get("caffe")
    if loaded is not None:
        return None if loaded is _cct() else getattr(loaded, "__file__", None)
    try:
        spec = importlib.util.find_spec("caffe")
    except (ImportError, ValueError):
        return None
    return None if spec is None else spec.origin


_reported = set()


def caffe_for_layer_module(module_name: str) -> Optional[str]:
    """Before importing a Python layer's module: give it cct as ``caffe`` unless a real Caffe is
    importable (or with ``CCT_AS_CAFFE=1``, always), and log once per module which it gets.
    Returns the real Caffe's location when that is what the module gets, else None.

    The alias stays in place: a module keeps its ``caffe`` reference, and an ``import caffe``
    inside its methods must find the same package later."""
    origin = None if os.environ.get(ENV) == "1" else real_caffe_origin()
    if origin is None:
        install_as_caffe()
        msg = (f"`import caffe` in Python layer module '{module_name}' is cct "
               f"{_cct().__version__}" + (f" ({ENV}=1)" if os.environ.get(ENV) == "1"
                                          else " (no Caffe installed)"))
    else:
        msg = (f"`import caffe` in Python layer module '{module_name}' is the installed Caffe "
               f"at {origin}")
    if module_name not in _reported:
        _reported.add(module_name)
        glog.info("python_layer.py:0", msg)
    return origin
