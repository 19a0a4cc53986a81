"""Layers, one module per Caffe layer family; each class registers its Caffe ``type`` name.

The registry (:data:`cct.layers.base.LAYER_REGISTRY`) is the one place that lists what cct
supports; importing this package loads every family.
"""
from . import base  # noqa: F401
from .base import LAYER_REGISTRY, Layer, create_layer, layer_type_list, register  # noqa: F401

_FAMILIES = ("input", "conv", "pooling", "inner_product", "neuron", "lrn", "normalization",
             "scale_bias", "eltwise", "structure", "reduction", "softmax", "loss", "accuracy",
             "embed", "python_layer", "data", "image_data", "hdf5_data", "memory_data",
             "filter", "im2col", "spp", "hdf5_output", "recurrent")


def _import_families():
    from importlib import import_module
    for fam in _FAMILIES:
        import_module(f"{__name__}.{fam}")


_import_families()
