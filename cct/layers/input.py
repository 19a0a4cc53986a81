"""Layers without bottoms that supply blobs: Input, DummyData, Parameter (Caffe's
``input_layer.cpp``, ``dummy_data_layer.cpp``, ``parameter_layer.hpp``).

As Caffe's data layers, Input and DummyData are shaped once at setup and their ``reshape`` does
nothing, so a user may reshape an input blob and call the net's reshape to propagate it.
"""
from __future__ import annotations

from typing import List

from ..filler import fill
from ..proto import caffe_pb2
from .base import Layer, register

# Caffe's GetFiller rejects an unknown type at setup, before any forward pass fills.
_FILLER_TYPES = ("constant", "uniform", "gaussian", "positive_unitball", "xavier", "msra",
                 "bilinear")


def _dims(layer: Layer, blob_shape, what: str) -> List[int]:
    dims = [int(d) for d in blob_shape.dim]
    if any(d < 0 for d in dims):
        raise layer.error(f"{what} {dims} has a negative dimension.")
    return dims


@register("Input")
class InputLayer(Layer):
    """Tops shaped by ``input_param.shape``: once per top, once for all tops, or not at all
    (the tops stay as they are). Forward does nothing: the user fills the tops."""

    exact_num_bottom_blobs = 0
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        shapes = self.layer_param.input_param.shape
        if len(shapes) not in (0, 1, len(top)):
            raise self.error(f"give 'shape' once, once per top blob, or not at all: "
                             f"{len(top)} tops vs. {len(shapes)} shapes.")
        for i, t in enumerate(top):
            if shapes:
                t.reshape(_dims(self, shapes[0 if len(shapes) == 1 else i], f"shape of top {i}"))

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass


@register("DummyData")
class DummyDataLayer(Layer):
    """Tops filled by ``dummy_data_param.data_filler`` (none: constant 0; one: used for every
    top; else one per top), shaped by ``shape`` (once or once per top) or by the legacy
    ``num``/``channels``/``height``/``width`` lists (each once or once per top).

    As in Caffe, a top with a constant filler is filled once at setup; any other filler refills
    its tops on every forward pass.
    """

    exact_num_bottom_blobs = 0
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.dummy_data_param
        n = len(top)
        fillers = list(p.data_filler)
        if len(fillers) not in (0, 1, n):
            raise self.error(f"the number of data fillers must be 0, 1 or the number of tops "
                             f"({n}); got {len(fillers)}.")
        if not fillers:
            fillers = [caffe_pb2.FillerParameter(type="constant", value=0)]
        for f in fillers:
            if f.type not in _FILLER_TYPES:
                raise self.error(f"unknown filler type '{f.type}'; known: "
                                 f"{', '.join(_FILLER_TYPES)}.")
        self.fillers = fillers
        self.refill = [f.type != "constant" for f in fillers]

        legacy = {name: list(getattr(p, name)) for name in ("num", "channels", "height", "width")}
        if any(legacy.values()):
            if len(p.shape):
                raise self.error("give either shape or the legacy num/channels/height/width "
                                 "fields, not both.")
            for name, values in legacy.items():
                if len(values) not in (1, n):
                    raise self.error(f"give '{name}' once, or once per top blob ({n}); got "
                                     f"{len(values)}.")
            shapes = [[legacy[name][0 if len(legacy[name]) == 1 else i]
                       for name in ("num", "channels", "height", "width")] for i in range(n)]
            for i, s in enumerate(shapes):
                if any(d < 0 for d in s):
                    raise self.error(f"shape of top {i} {s} has a negative dimension.")
        else:
            if len(p.shape) not in (1, n):
                raise self.error(f"give 'shape' once, or once per top blob ({n}); got "
                                 f"{len(p.shape)}.")
            shapes = [_dims(self, p.shape[0 if len(p.shape) == 1 else i], f"shape of top {i}")
                      for i in range(n)]
        for t, s in zip(top, shapes):
            t.reshape(s)
        self._fill(top, refilled=False)

    def _fill(self, top, refilled: bool) -> None:
        """Fill the tops whose filler is (``refilled``) or is not refilled every forward."""
        for i, t in enumerate(top):
            k = i if len(self.fillers) > 1 else 0
            if self.refill[k] == refilled:
                fill(t.data, self.fillers[k], f"{self.type} layer '{self.name}': ")

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        self._fill(top, refilled=True)


@register("Parameter")
class ParameterLayer(Layer):
    """Exposes one learnable param blob of ``parameter_param.shape`` (zero-initialised, no
    filler) as its top. The top shares the param's data; backward adds the top diff to the
    param diff."""

    exact_num_bottom_blobs = 0
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        if not self.blobs:
            shape = _dims(self, self.layer_param.parameter_param.shape, "parameter_param.shape")
            self.blobs.append(self.new_blob(shape))

    def reshape(self, bottom, top):
        top[0].reshape(self.blobs[0].shape)
        top[0].share_data(self.blobs[0])

    def forward(self, bottom, top):
        top[0].share_data(self.blobs[0])

    def backward(self, top, propagate_down, bottom):
        if self.param_propagate_down[0]:
            self.blobs[0].diff[...] += top[0].diff
