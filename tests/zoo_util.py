"""Swap database-backed data layers of zoo nets for Input layers of the same top shapes, so a
net builds without its database (as the numerics fixtures were made from Caffe's examples)."""
from __future__ import annotations

import numpy as np

from cct.proto import caffe_pb2

DATA_TYPES = {"Data", "ImageData", "HDF5Data", "WindowData", "MemoryData"}


def _example_shape(lp: caffe_pb2.LayerParameter) -> tuple:
    """(channels, height, width) of one example, or (features,) for HDF5 vectors."""
    source = (lp.data_param.source or lp.image_data_param.source or lp.hdf5_data_param.source
              or lp.window_data_param.source)
    crop = lp.transform_param.crop_size
    if lp.type == "HDF5Data":
        return (4,)  # hdf5_classification: sklearn's 4-feature example
    if "siamese" in source:
        return (2, 28, 28)
    if "mnist" in source:
        return (1, 28, 28)
    if "cifar" in source:
        return (3, 32, 32)
    if crop:
        return (3, crop, crop)
    raise ValueError(f"no known example shape for data layer '{lp.name}' ({source})")


def swap_data_layers(param: caffe_pb2.NetParameter, batch: int) -> caffe_pb2.NetParameter:
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    for lp in out.layer:
        if lp.type in DATA_TYPES:
            shape = _example_shape(lp)
            new = caffe_pb2.LayerParameter(name=lp.name, type="Input", top=list(lp.top))
            new.include.extend(lp.include)
            new.exclude.extend(lp.exclude)
            new.input_param.shape.add().dim.extend((batch,) + shape)
            for _ in lp.top[1:]:
                new.input_param.shape.add().dim.append(batch)
            lp.CopyFrom(new)
        elif lp.type == "Input":
            for s in lp.input_param.shape:
                s.dim[0] = batch
    return out


def fill_inputs(net, seed: int = 0) -> None:
    """Random inputs for a net built from swap_data_layers: labels 0 or 1, data in [0, 1)."""
    rng = np.random.default_rng(seed)
    for name in net.inputs:
        blob = net.blobs[name]
        if blob.num_axes == 1:  # labels
            blob.data[...] = rng.integers(0, 2, blob.shape)
        else:
            blob.data[...] = rng.random(blob.shape)
