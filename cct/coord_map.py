"""pycaffe's ``caffe.coord_map``: how coordinates of one top map to another's through the
spatial layers of a NetSpec net, and :func:`crop`, the Crop layer that aligns two tops (used by
FCN's net surgery, ``from caffe.coord_map import crop``).

A coordinate map is ``(axis, scale a, shift b)``: output coordinate ``a * x + b`` for input
coordinate ``x`` along every axis from ``axis`` on (``a`` and ``b`` are per-axis arrays). The
identity, as for pointwise layers, is ``(None, 1, 0)``. For a Convolution, Pooling or Im2col
with stride s, extent k = (kernel - 1) x dilation + 1 and pad p::

    a = 1 / s,  b = (p - (k - 1) / 2) / s

Deconvolution is the inverse, ``a = s, b = (k - 1) / 2 - p``; a Crop with offset o at ``axis``
maps with ``a = 1, b = -o`` on axis - 1.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from .errors import CCTError
from .net_spec import Function, Layers, Top

PASS_THROUGH_LAYERS = ["AbsVal", "BatchNorm", "Bias", "BNLL", "Dropout", "Eltwise", "ELU", "Log",
                       "LRN", "Exp", "MVN", "Power", "ReLU", "PReLU", "Scale", "Sigmoid", "Split",
                       "TanH", "Threshold"]

CoordMap = Tuple[Optional[int], object, object]

_L = Layers()


class UndefinedMapException(CCTError):
    """A layer type with no coordinate mapping (InnerProduct, Reshape, ...)."""


class AxisMismatchException(CCTError):
    """Two maps to be composed act on different axes."""


class CoordMapError(CCTError, RuntimeError):
    """The two tops are not connected through layers with coordinate maps. A RuntimeError too,
    as pycaffe raises."""


class CropError(CCTError, AssertionError):
    """The Crop :func:`crop` would define is impossible. An AssertionError too, as pycaffe's
    asserts raise."""


def conv_params(fn: Function):
    """``(axis, stride, extent, pad)`` of a Convolution, Deconvolution, Im2col (read from
    convolution_param) or Pooling (its own fields), each as a 1-d array; extent is the
    dilated kernel size (kernel - 1) x dilation + 1."""
    params = fn.params.get("convolution_param", fn.params)
    legacy = {"pad_h", "pad_w", "kernel_h", "kernel_w", "stride_h", "stride_w"} & set(params)
    if legacy:
        raise CoordMapError(f"coord_map: {fn.type_name} layer sets {', '.join(sorted(legacy))}; "
                            f"cropping does not support the legacy _h/_w params, give "
                            f"kernel_size/stride/pad as lists instead")
    if "kernel_size" not in params:
        raise CoordMapError(f"coord_map: {fn.type_name} layer has no kernel_size (global "
                            f"pooling has no coordinate map)")
    axis = params.get("axis", 1)
    ks = np.array(params["kernel_size"], ndmin=1)
    dilation = np.array(params.get("dilation", 1), ndmin=1)
    return (axis, np.array(params.get("stride", 1), ndmin=1), (ks - 1) * dilation + 1,
            np.array(params.get("pad", 0), ndmin=1))


def crop_params(fn: Function):
    """``(axis, offset)`` of a Crop layer; axis 2 (the spatial axes of N x C x H x W) and
    offset 0 by default."""
    params = fn.params.get("crop_param", fn.params)
    return params.get("axis", 2), np.array(params.get("offset", 0), ndmin=1)


def coord_map(fn: Function) -> CoordMap:
    """The coordinate map of one layer, from its bottoms to its tops (see the module doc)."""
    if fn.type_name in ("Convolution", "Pooling", "Im2col"):
        axis, stride, ks, pad = conv_params(fn)
        return axis, 1 / stride, (pad - (ks - 1) / 2) / stride
    if fn.type_name == "Deconvolution":
        axis, stride, ks, pad = conv_params(fn)
        return axis, stride, (ks - 1) / 2 - pad
    if fn.type_name in PASS_THROUGH_LAYERS:
        return None, 1, 0
    if fn.type_name == "Crop":
        axis, offset = crop_params(fn)
        return axis - 1, 1, -offset  # axis - 1: the last axis that is not cropped
    raise UndefinedMapException(f"coord_map: {fn.type_name} layers have no coordinate map")


def compose(base_map: CoordMap, next_map: CoordMap) -> CoordMap:
    """``base_map`` after ``next_map``: scales multiply, and the further shift is scaled by
    the base scale, ``(a1 a2, a1 b2 + b1)``."""
    ax1, a1, b1 = base_map
    ax2, a2, b2 = next_map
    if ax1 is None:
        ax = ax2
    elif ax2 is None or ax1 == ax2:
        ax = ax1
    else:
        raise AxisMismatchException(f"coord_map: cannot compose a map on axis {ax1} with one "
                                    f"on axis {ax2}")
    return ax, a1 * a2, a1 * b2 + b1


def inverse(coord_map: CoordMap) -> CoordMap:
    """The map back: ``(1 / a, -b / a)``, the mapping of the gradient."""
    ax, a, b = coord_map
    return ax, 1 / a, -b / a


def _mapped_bottoms(top: Top):
    """The bottoms a top's coordinates map to: all of its layer's, except that a Crop maps
    only its first (cropped) bottom, not the reference one."""
    bottoms = top.fn.inputs
    return bottoms[:1] if top.fn.type_name == "Crop" else bottoms


def coord_map_from_to(top_from: Top, top_to: Top) -> CoordMap:
    """The map taking coordinates of ``top_from`` to those of ``top_to``: walk back from each
    to a common ancestor blob, composing the maps on the way, and invert the ``from`` side."""
    from_maps = {top_from: (None, 1, 0)}
    frontier = {top_from}
    while frontier:
        top = frontier.pop()
        try:
            for bottom in _mapped_bottoms(top):
                from_maps[bottom] = compose(from_maps[top], coord_map(top.fn))
                frontier.add(bottom)
        except UndefinedMapException:
            pass
    to_maps = {top_to: (None, 1, 0)}
    frontier = {top_to}
    while frontier:
        top = frontier.pop()
        if top in from_maps:
            return compose(to_maps[top], inverse(from_maps[top]))
        try:
            for bottom in _mapped_bottoms(top):
                to_maps[bottom] = compose(to_maps[top], coord_map(top.fn))
                frontier.add(bottom)
        except UndefinedMapException:
            continue
    raise CoordMapError("Could not compute map between tops; are they connected by spatial "
                        "layers? (Only Convolution, Deconvolution, Pooling, Im2col, Crop and "
                        "pointwise layers have coordinate maps.)")


def crop(top_from: Top, top_to: Top) -> Top:
    """A Crop layer (NetSpec top) cropping ``top_from`` to the size and position of
    ``top_to``: ``crop_param { axis offset }`` from their coordinate map, which must have
    scale 1 and a non-positive integer shift."""
    ax, a, b = coord_map_from_to(top_from, top_to)
    if not np.all(np.asarray(a) == 1):
        raise CropError(f"scale mismatch on crop (a = {a}): the two tops are at different "
                        f"strides")
    if not np.all(np.asarray(b) <= 0):
        raise CropError(f"cannot crop negative offset (b = {b}): the top to crop is smaller "
                        f"than the reference")
    if not np.all(np.round(b) == b):
        raise CropError(f"cannot crop noninteger offset (b = {b})")
    offset = [int(o) for o in -np.round(np.asarray(b, dtype=np.float64).ravel())]
    return _L.Crop(top_from, top_to, crop_param=dict(axis=ax + 1, offset=offset))
