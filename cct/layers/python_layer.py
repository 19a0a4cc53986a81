"""Layers written in Python (Caffe's python_layer.hpp with pycaffe's ``caffe.Layer``).

A prototxt layer ``type: "Python"`` names a class with ``python_param { module: "m" layer: "C"
param_str: "..." }``; ``m`` is imported with importlib from ``sys.path`` as it is, and ``C`` is
instantiated with the LayerParameter (pycaffe's ``caffe.Layer.__init__(param)``) if it accepts
one argument, else with none. The instance follows pycaffe's interface::

    setup(bottom, top)        # once; read self.param_str, add params with self.blobs.add_blob
    reshape(bottom, top)      # before every forward: top[i].reshape(*shape)
    forward(bottom, top)      # top[i].data[...] = ...
    backward(top, propagate_down, bottom)   # bottom[i].diff[...] = ... where propagate_down[i]

with the attributes ``param_str``, ``phase`` (0 TRAIN, 1 TEST) and ``blobs`` set before
``setup``. bottom and top are lists of :class:`cct.blob.Blob`. The class may subclass
:class:`PythonLayer` (exported as ``cct.Layer``, pycaffe's ``caffe.Layer``) or not. A module
written for Caffe (``import caffe``, ``class L(caffe.Layer)``) runs unchanged: where no real
Caffe is installed, its ``caffe`` is cct (see :mod:`cct.caffe_alias`).
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence
from typing import List

import numpy as np

from .. import caffe_alias
from ..backend import device_of_xp
from ..blob import Blob, HostBlob
from .base import Layer, register


class BlobVec(list):
    """A layer's param blobs (pycaffe's BlobVec): a list of Blob with ``add_blob(*shape)``."""

    def __init__(self, blobs=(), dtype=np.float32, xp=np):
        super().__init__(blobs)
        self.dtype = np.dtype(dtype)
        self.xp = xp

    def add_blob(self, *shape: int) -> None:
        """Append a zero-filled blob of the given shape (pycaffe's ``blobs.add_blob``)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        self.append(Blob(shape, self.dtype, self.xp))


class HostBlobVec(Sequence):
    """A device layer's BlobVec as the user's Python code sees it: each blob's host view
    (NumPy ``data`` and ``diff``, as pycaffe's blobs are on any device: Caffe's cpu_data), read
    afresh from the layer's param list on each access; ``add_blob`` adds a device blob there."""

    def __init__(self, blobs: BlobVec):
        self.params = blobs

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [b.host_view() for b in self.params[i]]
        return self.params[i].host_view()

    def __len__(self) -> int:
        return len(self.params)

    def add_blob(self, *shape: int) -> None:
        self.params.add_blob(*shape)


class PythonLayer:
    """Base class for layers written in Python (pycaffe's ``caffe.Layer``, exported as
    ``cct.Layer``). Subclasses override ``setup``, ``reshape``, ``forward`` and ``backward``;
    ``param_str``, ``phase`` and ``blobs`` are set by cct before ``setup``."""

    type = "Python"

    def __init__(self, layer_param=None):
        self.blobs = BlobVec()
        self.param_str = layer_param.python_param.param_str if layer_param is not None else ""
        self.phase = int(layer_param.phase) if layer_param is not None else 0

    def setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        """Called once, before the first reshape."""

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        """Called before every forward pass; set the top shapes here."""

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement forward()")

    def backward(self, top: List[Blob], propagate_down: List[bool],
                 bottom: List[Blob]) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement backward()")


@register("Python")
class PythonLayerAdapter(Layer):
    """Runs a user's Python layer class (see the module docstring) as a cct Layer.

    The user object's ``blobs`` is this layer's param list, so blobs added in ``setup`` are
    learnable params of the net, as in Caffe. Attributes the adapter lacks are looked up on the
    user object, so ``net.layer_dict[name].my_attribute`` reaches it as in pycaffe."""

    def __init__(self, layer_param, backend, dtype=np.float32):
        super().__init__(layer_param, backend, dtype)
        self.blobs = BlobVec(self.blobs, self.dtype, self.xp)
        cls = self._import_class()
        self.impl = cls(layer_param) if _accepts_one_argument(cls) else cls()
        self.impl.param_str = layer_param.python_param.param_str
        self.impl.phase = int(self.phase)
        self.impl.blobs = self._user_blobs()

    def __getattr__(self, name):
        impl = self.__dict__.get("impl")
        if impl is None:
            raise AttributeError(name)
        return getattr(impl, name)

    def _import_class(self):
        pp = self.layer_param.python_param
        module_name, class_name = pp.module, pp.layer
        if not module_name or not class_name:
            raise self.error(f"python_param needs both module and layer (got module "
                             f"'{module_name}', layer '{class_name}').")
        real_caffe = caffe_alias.caffe_for_layer_module(module_name)
        try:
            module = importlib.import_module(module_name)
        except Exception as e:
            raise self.error(f"cannot import module '{module_name}' (python_param.module) for "
                             f"layer class '{class_name}': {type(e).__name__}: {e}. The module "
                             f"must be importable from sys.path (e.g. add its folder to "
                             f"PYTHONPATH).") from e
        cls = getattr(module, class_name, None)
        if cls is None:
            where = getattr(module, "__file__", None) or module_name
            raise self.error(f"module '{module_name}' ({where}) has no class '{class_name}' "
                             f"(python_param.layer).")
        if not callable(cls):
            raise self.error(f"'{module_name}.{class_name}' (python_param.layer) is not a "
                             f"class.")
        if real_caffe is not None and _subclasses_caffe_layer(cls):
            raise self.error(f"'{module_name}.{class_name}' (python_param.layer) subclasses the "
                             f"installed Caffe's caffe.Layer ({real_caffe}), which cct cannot "
                             f"run; make `import caffe` give cct: run with "
                             f"{caffe_alias.ENV}=1, or uninstall or hide that Caffe.")
        return cls

    def _method(self, name: str):
        fn = getattr(self.impl, name, None)
        if fn is not None:
            return fn
        if name in ("setup", "reshape"):
            return lambda *args: None
        raise self.error(f"the Python layer class '{type(self.impl).__name__}' has no "
                         f"{name}() method.")

    def layer_setup(self, bottom: List[Blob], top: List[Blob]) -> None:
        self._method("forward")
        self._method("setup")(_host(bottom), _host(top))
        if self.impl.blobs is not self._user_view:
            # The user rebound self.blobs (e.g. to a plain list); keep it as the param list.
            self.blobs = BlobVec([b.blob if isinstance(b, HostBlob) else b
                                  for b in self.impl.blobs], self.dtype, self.xp)
            self.impl.blobs = self._user_blobs()

    def _user_blobs(self):
        """The param list the user's object holds as ``self.blobs``: the list itself on the
        CPU; on a device, its host views, since the user's NumPy code would mix host arrays
        with device ones (which CuPy refuses) in ``self.blobs[0].data * bottom[0].data``."""
        self._user_view = (self.blobs if device_of_xp(self.xp) is None
                           else HostBlobVec(self.blobs))
        return self._user_view

    def reshape(self, bottom: List[Blob], top: List[Blob]) -> None:
        self._method("reshape")(_host(bottom), _host(top))

    def forward(self, bottom: List[Blob], top: List[Blob]) -> None:
        self._method("forward")(_host(bottom), _host(top))

    def backward(self, top: List[Blob], propagate_down: List[bool], bottom: List[Blob]) -> None:
        self._method("backward")(_host(top), list(propagate_down), _host(bottom))


def _host(blobs: List[Blob]) -> list:
    """The blobs as pycaffe code sees them: NumPy ``data``/``diff`` on any backend (a Python
    layer is the user's NumPy code, as in Caffe, where it reads cpu_data)."""
    return [b.host_view() for b in blobs]


def _subclasses_caffe_layer(cls) -> bool:
    """Whether ``cls`` derives from a Layer class of a real (non-cct) ``caffe`` package."""
    return any(base.__name__ == "Layer" and base.__module__.split(".")[0] == "caffe"
               for base in getattr(cls, "__mro__", ())[1:])


def _accepts_one_argument(cls) -> bool:
    try:
        inspect.signature(cls).bind(None)
    except TypeError:
        return False
    except ValueError:
        return True
    return True
