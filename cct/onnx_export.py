"""A Caffe net and its weights as an ONNX model (``cct export_onnx``, ``cct.export_onnx``).

cct has already read the net the way Caffe does (legacy files upgraded, shapes inferred, Split
layers inserted), so the exporter walks its layers in order and writes each as the ONNX
operators that compute exactly what Caffe computes, with Caffe's blob names as tensor names:

- A TRAIN/TEST net exports its deploy view: data layers become graph inputs (only the tops
  that a kept layer reads), loss and accuracy layers are dropped; a log line names them.
- In-place layers (``top: "conv1"`` over ``bottom: "conv1"``) write a new tensor each time
  (ONNX is single-assignment); the last writer of a blob gets the blob's own name, the others
  ``<blob>/<layer>``.
- Caffe's quirks are kept: pooling's ceil rounding and dropped last window become explicit end
  pads; average pooling's divisor follows Caffe's (padding inside ``pad`` counted, beyond it
  not, even where the last window reaches past the padding); BatchNorm's statistics are
  divided by its scale-factor blob; Scale/Bias broadcast from ``axis`` over ``num_axes``;
  InnerProduct flattens from ``axis``; ArgMax's indices are floats.
- A layer with no exact ONNX equivalent (a Python layer, stochastic pooling, ArgMax with
  top_k > 1...) is refused by name with the reason; nothing is approximated.

The batch is the first axis of every graph input: fixed (``batch=N``, or the net's own) or
symbolic (``batch="dynamic"``); shapes that mention it are written relative to it. The opset
is any from :data:`MIN_OPSET` to the newest that both the installed onnx and onnxruntime know
(:func:`opset_range`).
"""
from __future__ import annotations

import functools
import os
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .native import __version__
from .errors import CCTError
from .glog import info
from .install import install_hint
from .io.atomic import atomic_write
from .proto import caffe_pb2

#: The oldest opset that has every operator as written here (ReduceSum's axes, Split's sizes
#: and Clip's bounds as inputs came in 13).
MIN_OPSET = 13
DEFAULT_OPSET = MIN_OPSET
#: The opset from which ReduceMean, ReduceL1 and ReduceSumSquare take their axes as an input.
_REDUCE_AXES_INPUT = 18
_PP = caffe_pb2.PoolingParameter
_DATA_TYPES = {"Data", "ImageData", "HDF5Data", "MemoryData", "WindowData", "DummyData",
               "Input"}
_DROPPED_TYPES = {"Accuracy", "Silence"}


class ExportError(CCTError):
    """A net that cannot be written as ONNX exactly (the message names the layer and why)."""


class CheckError(CCTError):
    """ONNX Runtime could not load or run an exported model (the message names the node and
    the layer it was written for)."""


def _onnx():
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError:
        raise CCTError(f"export_onnx needs the onnx package: {install_hint('onnx')} (or pip "
                       f"install onnx)") from None
    return onnx, helper, numpy_helper


class _Graph:
    """The ONNX graph being written: nodes, initializers, and each Caffe blob's current tensor
    name."""

    def __init__(self, net, batch, opset: int = DEFAULT_OPSET):
        self.onnx, self.helper, self.numpy_helper = _onnx()
        self.net = net
        self.batch = batch
        self.opset = opset
        self.nodes: List = []
        self.initializers: List = []
        self.current: Dict[str, str] = {}
        self.used_names: set = set()
        self.net_batch: Optional[int] = None   # the net's own batch (the inputs' first axis)

    def unique(self, name: str) -> str:
        base, k = name, 1
        while name in self.used_names:
            k += 1
            name = f"{base}_{k}"
        self.used_names.add(name)
        return name

    def const(self, name: str, array) -> str:
        name = self.unique(name)
        self.initializers.append(self.numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: Sequence[str], outputs: Sequence[str], name: str, **attrs):
        self.nodes.append(self.helper.make_node(op, list(inputs), list(outputs), name=name,
                                                **attrs))

    def reduce(self, op: str, x: str, axes: Sequence[int], outs: Sequence[str], name: str,
               keepdims: int):
        """A Reduce* node: its axes an input where the opset wants one (ReduceSum from 13, the
        others from 18), an attribute before."""
        if op == "ReduceSum" or self.opset >= _REDUCE_AXES_INPUT:
            self.node(op, [x, self.const(f"{name}/axes", np.array(list(axes), np.int64))],
                      outs, name, keepdims=keepdims)
        else:
            self.node(op, [x], outs, name, axes=list(axes), keepdims=keepdims)

    def io_shape(self, shape: Sequence[int]) -> list:
        """A graph input's or output's shape: the batch (a leading axis of the net's batch)
        symbolic or fixed as asked."""
        dims = [int(d) for d in shape]
        if dims and dims[0] == self.net_batch and self.batch is not None:
            dims[0] = "batch" if self.batch == "dynamic" else int(self.batch)
        return dims

    def shape_const(self, layer: str, shape: Sequence[int], batch_leads: bool = True) -> str:
        """A Reshape target: the net's shape, with a leading batch as 0 (copied from the input,
        whose first axis is the batch) or -1 (``batch_leads`` False: it is folded in)."""
        dims = [int(d) for d in shape]
        if self.batch is not None and dims and dims[0] == self.net_batch:
            dims[0] = 0 if batch_leads else -1
        return self.const(f"{layer}/shape", np.array(dims, np.int64))


# -- the layer table: Caffe type -> writer(graph, layer, inputs, outputs, ctx) -----------------
Writer = Callable[["_Graph", object, List[str], List[str], "_Layer"], None]
_WRITERS: Dict[str, Writer] = {}


def _writes(*types: str):
    def register(fn: Writer) -> Writer:
        for t in types:
            _WRITERS[t] = fn
        return fn
    return register


class _Layer:
    """What a writer needs of one cct layer: its param, blobs and the shapes around it."""

    def __init__(self, net, index: int):
        self.index = index
        self.layer = net.layers[index]
        self.param = self.layer.layer_param
        self.name = self.param.name
        self.bottom_shapes = [tuple(b.shape) for b in net.bottom_blobs(index)]
        self.top_shapes = [tuple(t.shape) for t in net.top_blobs(index)]

    def blob(self, i: int) -> np.ndarray:
        return np.asarray(self.layer.blobs[i].cpu_data(), np.float32)

    def refuse(self, why: str) -> ExportError:
        return ExportError(f"layer '{self.name}' ({self.param.type}) has no exact ONNX "
                           f"equivalent: {why}")


def _canonical(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


@_writes("Convolution", "Deconvolution")
def _conv(g, L, ins, outs, ctx):
    c = ctx.layer
    if c.channel_axis != 1 or len(ctx.bottom_shapes[0]) != 4:
        raise ctx.refuse("only 2-D convolutions over axis 1 (N, C, H, W) are written")
    w = g.const(f"{ctx.name}/weight", ctx.blob(0))
    inputs = [ins[0], w] + ([g.const(f"{ctx.name}/bias", ctx.blob(1))] if c.bias_term else [])
    op = "Conv" if ctx.param.type == "Convolution" else "ConvTranspose"
    g.node(op, inputs, outs[:1], ctx.name, kernel_shape=list(c.kernel), strides=list(c.stride),
           pads=[c.pad[0], c.pad[1], c.pad[0], c.pad[1]], dilations=list(c.dilation),
           group=int(c.group))


@_writes("Pooling")
def _pool(g, L, ins, outs, ctx):
    p, layer = ctx.param.pooling_param, ctx.layer
    if p.pool == _PP.STOCHASTIC:
        raise ctx.refuse("stochastic pooling draws at random")
    mx = p.pool == _PP.MAX
    if layer.global_pooling:
        g.node("GlobalMaxPool" if mx else "GlobalAveragePool", ins[:1], outs[:1], ctx.name)
        return
    if len(outs) > 1:
        raise ctx.refuse("the max pooling mask top has no ONNX output")
    (_, c, h, w), (_, _, oh, ow) = ctx.bottom_shapes[0], ctx.top_shapes[0]
    ends = []
    for size, o, k, s, pad in zip((h, w), (oh, ow), layer.kernel, layer.stride, layer.pad):
        # Caffe's size as floor rounding over [pad, size, end pad]: the end pad that reaches
        # exactly the last window Caffe keeps.
        ends.append(max((o - 1) * s + k - size - pad, 0))
    attrs = dict(kernel_shape=list(layer.kernel), strides=list(layer.stride),
                 pads=[layer.pad[0], layer.pad[1], ends[0], ends[1]])
    if mx:
        g.node("MaxPool", ins[:1], outs[:1], ctx.name, **attrs)
        return
    if not max(layer.pad) or all(end <= pad for end, pad in zip(ends, layer.pad)):
        # Caffe divides by the window clipped to the padded bottom: with pad 0, the valid
        # cells (ONNX without pads counted); with pad and no window past it, the full window
        # (ONNX with pads counted).
        g.node("AveragePool", ins[:1], outs[:1], ctx.name,
               count_include_pad=1 if max(layer.pad) else 0, **attrs)
        return
    # A last window past the padding (ceil rounding, e.g. SqueezeNet's kernel 3 stride 2 pad 1
    # on an even plane): ONNX counts all of it or only the bottom's cells, Caffe the part inside
    # [-pad, size + pad). The sum over the window as a depthwise Conv of ones (the padding adds
    # zeros), divided by Caffe's divisors computed here from the shapes: Caffe's own arithmetic.
    kh, kw = layer.kernel
    window = g.unique(f"{ctx.name}/window_sum")
    g.node("Conv", [ins[0], g.const(f"{ctx.name}/ones", np.ones((c, 1, kh, kw), np.float32))],
           [window], f"{ctx.name}/window_sum", group=int(c), **attrs)
    counts = [_ave_counts(o, size, k, s, pad) for o, size, k, s, pad in
              zip((oh, ow), (h, w), layer.kernel, layer.stride, layer.pad)]
    divisor = np.outer(counts[0], counts[1]).astype(np.float32).reshape(1, 1, oh, ow)
    g.node("Div", [window, g.const(f"{ctx.name}/divisor", divisor)], outs[:1], ctx.name)


def _ave_counts(pooled: int, size: int, kernel: int, stride: int, pad: int) -> np.ndarray:
    """Caffe's AVE divisor along one axis, per output position: the window
    [start, start + kernel) with start = i stride - pad, clipped at size + pad."""
    start = np.arange(pooled) * stride - pad
    return np.minimum(start + kernel, size + pad) - start


@_writes("InnerProduct")
def _inner_product(g, L, ins, outs, ctx):
    p = ctx.param.inner_product_param
    shape = ctx.bottom_shapes[0]
    axis = _canonical(p.axis, len(shape))
    flat = g.unique(f"{ctx.name}/flat")
    g.node("Flatten", ins[:1], [flat], f"{ctx.name}/flatten", axis=axis)
    w = ctx.blob(0)
    inputs = [flat, g.const(f"{ctx.name}/weight", w)]
    if p.bias_term:
        inputs.append(g.const(f"{ctx.name}/bias", ctx.blob(1).reshape(-1)))
    transposed = not p.transpose   # Caffe's weight is (N, K) unless transpose: (K, N)
    if axis == 1:
        g.node("Gemm", inputs, outs[:1], ctx.name, transB=int(transposed))
        return
    gemm = g.unique(f"{ctx.name}/gemm")
    g.node("Gemm", inputs, [gemm], ctx.name, transB=int(transposed))
    g.node("Reshape", [gemm, g.shape_const(ctx.name, ctx.top_shapes[0], batch_leads=False)],
           outs[:1], f"{ctx.name}/reshape")


@_writes("ReLU")
def _relu(g, L, ins, outs, ctx):
    slope = ctx.param.relu_param.negative_slope
    if slope:
        g.node("LeakyRelu", ins, outs, ctx.name, alpha=float(slope))
    else:
        g.node("Relu", ins, outs, ctx.name)


@_writes("Sigmoid", "TanH", "AbsVal")
def _unary(g, L, ins, outs, ctx):
    op = {"Sigmoid": "Sigmoid", "TanH": "Tanh", "AbsVal": "Abs"}[ctx.param.type]
    g.node(op, ins, outs, ctx.name)


@_writes("BNLL")
def _bnll(g, L, ins, outs, ctx):
    g.node("Softplus", ins, outs, ctx.name)      # log(1 + exp(x))


@_writes("Threshold")
def _threshold(g, L, ins, outs, ctx):
    above = g.unique(f"{ctx.name}/above")
    t = np.float32(ctx.param.threshold_param.threshold)
    g.node("Greater", [ins[0], g.const(f"{ctx.name}/threshold", t)], [above], ctx.name)
    g.node("Cast", [above], outs, f"{ctx.name}/float", to=1)


@_writes("Clip")
def _clip(g, L, ins, outs, ctx):
    p = ctx.param.clip_param
    g.node("Clip", [ins[0], g.const(f"{ctx.name}/min", np.float32(p.min)),
                    g.const(f"{ctx.name}/max", np.float32(p.max))], outs, ctx.name)


@_writes("Swish")
def _swish(g, L, ins, outs, ctx):
    beta = ctx.param.swish_param.beta
    x = ins[0]
    if beta != 1.0:
        x = g.unique(f"{ctx.name}/beta_x")
        g.node("Mul", [ins[0], g.const(f"{ctx.name}/beta", np.float32(beta))], [x],
               f"{ctx.name}/beta")
    gate = g.unique(f"{ctx.name}/sigmoid")
    g.node("Sigmoid", [x], [gate], f"{ctx.name}/sigmoid")
    g.node("Mul", [ins[0], gate], outs, ctx.name)


@_writes("ELU")
def _elu(g, L, ins, outs, ctx):
    g.node("Elu", ins, outs, ctx.name, alpha=float(ctx.param.elu_param.alpha))


@_writes("PReLU")
def _prelu(g, L, ins, outs, ctx):
    slope = ctx.blob(0)
    if slope.size > 1:        # one per channel: broadcast over the axes after axis 1
        slope = slope.reshape((-1,) + (1,) * (len(ctx.bottom_shapes[0]) - 2))
    g.node("PRelu", [ins[0], g.const(f"{ctx.name}/slope", slope)], outs, ctx.name)


@_writes("Dropout")
def _dropout(g, L, ins, outs, ctx):
    # A deploy net runs Dropout in TEST phase: the identity (Caffe scales while training).
    g.node("Identity", ins, outs, ctx.name)


@_writes("Power")
def _power(g, L, ins, outs, ctx):
    p = ctx.param.power_param
    x = _scale_shift(g, ins[0], ctx, p.scale, p.shift)
    if p.power == 1.0:
        g.node("Identity", [x], outs, ctx.name)
    else:
        g.node("Pow", [x, g.const(f"{ctx.name}/power", np.float32(p.power))], outs, ctx.name)


@_writes("Exp")
def _exp(g, L, ins, outs, ctx):
    p = ctx.param.exp_param
    x = _scale_shift(g, ins[0], ctx, p.scale, p.shift)
    if p.base != -1.0:        # base^x = exp(x ln base)
        x2 = g.unique(f"{ctx.name}/ln_base")
        g.node("Mul", [x, g.const(f"{ctx.name}/log_base", np.float32(np.log(p.base)))], [x2],
               f"{ctx.name}/mul_log_base")
        x = x2
    g.node("Exp", [x], outs, ctx.name)


@_writes("Log")
def _log(g, L, ins, outs, ctx):
    p = ctx.param.log_param
    x = _scale_shift(g, ins[0], ctx, p.scale, p.shift)
    if p.base == -1.0:
        g.node("Log", [x], outs, ctx.name)
        return
    ln = g.unique(f"{ctx.name}/ln")
    g.node("Log", [x], [ln], f"{ctx.name}/ln")
    g.node("Mul", [ln, g.const(f"{ctx.name}/inv_log_base", np.float32(1 / np.log(p.base)))],
           outs, ctx.name)


def _scale_shift(g, x: str, ctx, scale: float, shift: float) -> str:
    """shift + scale x as nodes (none where scale is 1 and shift 0)."""
    if scale != 1.0:
        y = g.unique(f"{ctx.name}/scaled")
        g.node("Mul", [x, g.const(f"{ctx.name}/scale", np.float32(scale))], [y],
               f"{ctx.name}/scale")
        x = y
    if shift != 0.0:
        y = g.unique(f"{ctx.name}/shifted")
        g.node("Add", [x, g.const(f"{ctx.name}/shift", np.float32(shift))], [y],
               f"{ctx.name}/shift")
        x = y
    return x


@_writes("LRN")
def _lrn(g, L, ins, outs, ctx):
    p = ctx.param.lrn_param
    if p.norm_region == caffe_pb2.LRNParameter.ACROSS_CHANNELS:
        g.node("LRN", ins, outs, ctx.name, size=int(p.local_size), alpha=float(p.alpha),
               beta=float(p.beta), bias=float(p.k))
        return
    # Within a channel Caffe computes x (1 + alpha avg(x^2))^-beta, avg over a local_size^2
    # window padded by (local_size - 1) / 2 and divided by local_size^2 everywhere (k unused).
    n, pad = int(p.local_size), (int(p.local_size) - 1) // 2
    sq, avg, scaled, shifted, power = (g.unique(f"{ctx.name}/{t}") for t in
                                       ("sq", "avg", "scaled", "shifted", "power"))
    g.node("Mul", [ins[0], ins[0]], [sq], f"{ctx.name}/sq")
    g.node("AveragePool", [sq], [avg], f"{ctx.name}/avg", kernel_shape=[n, n],
           strides=[1, 1], pads=[pad, pad, pad, pad], count_include_pad=1)
    g.node("Mul", [avg, g.const(f"{ctx.name}/alpha", np.float32(p.alpha))], [scaled],
           f"{ctx.name}/alpha")
    g.node("Add", [scaled, g.const(f"{ctx.name}/one", np.float32(1))], [shifted],
           f"{ctx.name}/one")
    g.node("Pow", [shifted, g.const(f"{ctx.name}/beta", np.float32(-p.beta))], [power],
           f"{ctx.name}/pow")
    g.node("Mul", [ins[0], power], outs, ctx.name)


@_writes("Softmax")
def _softmax(g, L, ins, outs, ctx):
    axis = _canonical(ctx.param.softmax_param.axis, len(ctx.bottom_shapes[0]))
    g.node("Softmax", ins, outs, ctx.name, axis=axis)


@_writes("Concat")
def _concat(g, L, ins, outs, ctx):
    p = ctx.param.concat_param
    axis = p.concat_dim if p.HasField("concat_dim") else p.axis
    g.node("Concat", ins, outs, ctx.name, axis=_canonical(axis, len(ctx.bottom_shapes[0])))


@_writes("Eltwise")
def _eltwise(g, L, ins, outs, ctx):
    op = ctx.layer.op
    E = caffe_pb2.EltwiseParameter
    if op == E.PROD:          # left to right, as Caffe multiplies
        acc = ins[0]
        for k in range(1, len(ins)):
            out = outs[0] if k == len(ins) - 1 else g.unique(f"{ctx.name}/prod{k}")
            g.node("Mul", [acc, ins[k]], [out], f"{ctx.name}/mul{k}")
            acc = out
    elif op == E.MAX:
        g.node("Max", ins, outs, ctx.name)
    else:
        terms = []
        for k, (x, c) in enumerate(zip(ins, ctx.layer.coeffs)):
            if c == 1:
                terms.append(x)
            else:
                y = g.unique(f"{ctx.name}/coeff{k}")
                g.node("Mul", [x, g.const(f"{ctx.name}/c{k}", np.float32(c))], [y],
                       f"{ctx.name}/coeff{k}")
                terms.append(y)
        g.node("Sum", terms, outs, ctx.name)


@_writes("BatchNorm")
def _batch_norm(g, L, ins, outs, ctx):
    p = ctx.param.batch_norm_param
    if p.HasField("use_global_stats") and not p.use_global_stats:
        raise ctx.refuse("use_global_stats: false normalises by each batch's own statistics")
    factor = ctx.blob(2).reshape(-1)[0]
    scale = 0.0 if factor == 0 else 1.0 / factor
    mean, var = ctx.blob(0) * np.float32(scale), ctx.blob(1) * np.float32(scale)
    c = mean.size
    g.node("BatchNormalization",
           [ins[0], g.const(f"{ctx.name}/gamma", np.ones(c, np.float32)),
            g.const(f"{ctx.name}/beta", np.zeros(c, np.float32)),
            g.const(f"{ctx.name}/mean", mean.astype(np.float32)),
            g.const(f"{ctx.name}/var", var.astype(np.float32))],
           outs, ctx.name, epsilon=float(p.eps))


@_writes("Scale", "Bias")
def _scale_bias(g, L, ins, outs, ctx):
    is_scale = ctx.param.type == "Scale"
    p = ctx.param.scale_param if is_scale else ctx.param.bias_param
    shape = ctx.bottom_shapes[0]
    axis = _canonical(p.axis, len(shape))
    trailing = (1,) * (len(shape) - axis - len(ctx.bottom_shapes[1] if len(ins) > 1 else
                                                ctx.layer.blobs[0].shape))
    if len(ins) > 1:
        factor = g.unique(f"{ctx.name}/factor")
        g.node("Reshape", [ins[1], g.const(f"{ctx.name}/factor_shape", np.array(
            tuple(ctx.bottom_shapes[1]) + trailing, np.int64))], [factor],
            f"{ctx.name}/factor_shape")
        params = [factor]
        blobs = list(range(len(ctx.layer.blobs)))
    else:
        first = ctx.blob(0)
        params = [g.const(f"{ctx.name}/{'scale' if is_scale else 'bias'}",
                          first.reshape(first.shape + trailing))]
        blobs = list(range(1, len(ctx.layer.blobs)))
    x = ins[0]
    if is_scale and blobs:         # the bias term after the scale
        y = g.unique(f"{ctx.name}/scaled")
        g.node("Mul", [x, params[0]], [y], f"{ctx.name}/mul")
        b = ctx.blob(blobs[0])
        g.node("Add", [y, g.const(f"{ctx.name}/bias", b.reshape(b.shape + trailing))], outs,
               ctx.name)
    else:
        g.node("Mul" if is_scale else "Add", [x, params[0]], outs, ctx.name)


@_writes("Flatten", "Reshape")
def _reshape(g, L, ins, outs, ctx):
    g.node("Reshape", [ins[0], g.shape_const(ctx.name, ctx.top_shapes[0])], outs, ctx.name)


@_writes("Slice")
def _slice(g, L, ins, outs, ctx):
    p = ctx.param.slice_param
    axis = p.slice_dim if p.HasField("slice_dim") else p.axis
    axis = _canonical(axis, len(ctx.bottom_shapes[0]))
    sizes = [s[axis] for s in ctx.top_shapes]
    g.node("Split", [ins[0], g.const(f"{ctx.name}/split", np.array(sizes, np.int64))], outs,
           ctx.name, axis=axis)


@_writes("Crop")
def _crop(g, L, ins, outs, ctx):
    p = ctx.param.crop_param
    shape, ref = ctx.bottom_shapes[0], ctx.bottom_shapes[1]
    axis = _canonical(p.axis, len(shape))
    axes = list(range(axis, len(shape)))
    offsets = list(p.offset)
    if len(offsets) == 1:
        offsets = offsets * len(axes)
    elif not offsets:
        offsets = [0] * len(axes)
    starts = np.array(offsets, np.int64)
    ends = starts + np.array([ref[a] for a in axes], np.int64)
    g.node("Slice", [ins[0], g.const(f"{ctx.name}/starts", starts),
                     g.const(f"{ctx.name}/ends", ends),
                     g.const(f"{ctx.name}/axes", np.array(axes, np.int64))], outs, ctx.name)


@_writes("Tile")
def _tile(g, L, ins, outs, ctx):
    p = ctx.param.tile_param
    shape = ctx.bottom_shapes[0]
    axis = _canonical(p.axis, len(shape))
    # Caffe tiles the block of axes [axis, end) as a whole: repeating axis ``axis`` alone
    # does that in row-major order.
    repeats = np.ones(len(shape), np.int64)
    repeats[axis] = p.tiles
    g.node("Tile", [ins[0], g.const(f"{ctx.name}/repeats", repeats)], outs, ctx.name)


@_writes("Reduction")
def _reduction(g, L, ins, outs, ctx):
    p = ctx.param.reduction_param
    R = caffe_pb2.ReductionParameter
    shape = ctx.bottom_shapes[0]
    axis = _canonical(p.axis, len(shape))
    if axis == 0 and g.batch == "dynamic":
        raise ctx.refuse("a reduction over the batch axis gives a scalar whatever the batch; "
                         "export it with a fixed --batch")
    axes = list(range(axis, len(shape)))
    coeff = float(p.coeff) / (int(np.prod(shape[axis:])) if p.operation == R.MEAN else 1)
    reduced = g.unique(f"{ctx.name}/reduced")
    op = {R.SUM: "ReduceSum", R.MEAN: "ReduceSum", R.ASUM: "ReduceL1",
          R.SUMSQ: "ReduceSumSquare"}[p.operation]
    g.reduce(op, ins[0], axes, [reduced], ctx.name, keepdims=0)
    if coeff == 1.0:
        g.node("Identity", [reduced], outs, f"{ctx.name}/coeff")
    else:
        g.node("Mul", [reduced, g.const(f"{ctx.name}/coeff", np.float32(coeff))], outs,
               f"{ctx.name}/coeff")


@_writes("MVN")
def _mvn(g, L, ins, outs, ctx):
    layer = ctx.layer
    shape = ctx.bottom_shapes[0]
    axes = list(range(1 if layer.across_channels else 2, len(shape)))
    mean, centred = g.unique(f"{ctx.name}/mean"), g.unique(f"{ctx.name}/centred")
    g.reduce("ReduceMean", ins[0], axes, [mean], f"{ctx.name}/mean", keepdims=1)
    g.node("Sub", [ins[0], mean], [centred if layer.normalize_variance else outs[0]],
           f"{ctx.name}/centre")
    if not layer.normalize_variance:
        return
    sq, var, std, std_eps = (g.unique(f"{ctx.name}/{t}") for t in ("sq", "var", "std", "eps"))
    g.node("Mul", [centred, centred], [sq], f"{ctx.name}/sq")
    g.reduce("ReduceMean", sq, axes, [var], f"{ctx.name}/var", keepdims=1)
    g.node("Sqrt", [var], [std], f"{ctx.name}/std")
    # Caffe divides by sqrt(var) + eps (not sqrt(var + eps)).
    g.node("Add", [std, g.const(f"{ctx.name}/eps", np.float32(layer.eps))], [std_eps],
           f"{ctx.name}/eps")
    g.node("Div", [centred, std_eps], outs, ctx.name)


@_writes("Embed")
def _embed(g, L, ins, outs, ctx):
    index = g.unique(f"{ctx.name}/index")
    g.node("Cast", ins[:1], [index], f"{ctx.name}/index", to=7)    # float indices -> int64
    weight = g.const(f"{ctx.name}/weight", ctx.blob(0))
    if not ctx.param.embed_param.bias_term:
        g.node("Gather", [weight, index], outs, ctx.name, axis=0)
        return
    rows = g.unique(f"{ctx.name}/rows")
    g.node("Gather", [weight, index], [rows], ctx.name, axis=0)
    g.node("Add", [rows, g.const(f"{ctx.name}/bias", ctx.blob(1).reshape(-1))], outs,
           f"{ctx.name}/bias")


@_writes("Parameter")
def _parameter(g, L, ins, outs, ctx):
    g.node("Identity", [g.const(f"{ctx.name}/value", ctx.blob(0))], outs, ctx.name)


@_writes("ArgMax")
def _argmax(g, L, ins, outs, ctx):
    p = ctx.param.argmax_param
    if p.out_max_val or p.top_k != 1:
        raise ctx.refuse("only top_k 1 without out_max_val (ONNX's ArgMax gives one index)")
    idx = g.unique(f"{ctx.name}/index")
    if p.HasField("axis"):
        g.node("ArgMax", ins, [idx], ctx.name, axis=_canonical(p.axis, len(ctx.bottom_shapes[0])),
               keepdims=1)
        g.node("Cast", [idx], outs, f"{ctx.name}/float", to=1)
        return
    flat, cast = g.unique(f"{ctx.name}/flat"), g.unique(f"{ctx.name}/float")
    g.node("Flatten", ins, [flat], f"{ctx.name}/flatten", axis=1)
    g.node("ArgMax", [flat], [idx], ctx.name, axis=1, keepdims=1)
    g.node("Cast", [idx], [cast], f"{ctx.name}/float", to=1)
    g.node("Reshape", [cast, g.shape_const(ctx.name, ctx.top_shapes[0])], outs,
           f"{ctx.name}/reshape")


# -- the walk --------------------------------------------------------------------------------
def _is_loss(layer) -> bool:
    t = layer.layer_param.type
    return t.endswith("Loss") or t in _DROPPED_TYPES


def _deploy_view(net) -> Tuple[List[int], List[str], List[int]]:
    """(kept layer indices, dropped layer names, input layer indices): data layers become
    inputs, loss and accuracy layers are dropped."""
    kept, dropped, inputs = [], [], []
    for i, layer in enumerate(net.layers):
        t = layer.layer_param.type
        if t in _DATA_TYPES:
            inputs.append(i)
        elif _is_loss(layer):
            dropped.append(layer.layer_param.name)
        else:
            kept.append(i)
    # The Splits inserted for the dropped layers' bottoms (the labels') feed nothing left.
    read = {b for i in kept for b in net.bottom_ids(i)}
    kept = [i for i in kept if net.layers[i].layer_param.type != "Split"
            or any(b in read for b in net.top_ids(i))]
    return kept, dropped, inputs


def export_onnx(net, path: str, opset: int = DEFAULT_OPSET,
                batch: Union[int, str, None] = None, sources: Sequence[str] = ()) -> "object":
    """Write ``net`` (a cct Net with its weights) to ``path`` as ONNX; returns the ModelProto.
    ``batch``: ``"dynamic"``, a number, or None (the net's own). ``sources`` name the files
    it came from (the model's doc string). ``opset``: from :data:`MIN_OPSET` to the newest
    that the installed onnx and onnxruntime know (:func:`opset_range`)."""
    onnx = _onnx()[0]
    check_opset(opset)
    g = _Graph(net, batch, opset)
    kept, dropped, inputs = _deploy_view(net)
    if dropped:
        info("onnx_export.py:0", f"Deploy view: dropped {', '.join(dropped)} (loss and "
             f"accuracy layers)")
    read = {net.blob_names[b] for i in kept for b in net.bottom_ids(i)}
    graph_inputs = []
    for i in inputs:
        for b in net.top_ids(i):
            name = net.blob_names[b]
            if name not in read:
                continue
            shape = list(net.blobs_list[b].shape)
            g.net_batch = g.net_batch if g.net_batch is not None else shape[0]
            shape = g.io_shape(shape)
            g.current[name] = name
            g.used_names.add(name)
            graph_inputs.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                                   shape))
    if not graph_inputs:
        raise ExportError(f"net '{net.name}' has no input blob to export (no Input or data "
                          f"layer whose top a kept layer reads)")
    last_writer: Dict[str, int] = {}
    for i in kept:
        for b in net.top_ids(i):
            last_writer[net.blob_names[b]] = i
    last_reader: Dict[str, int] = {}
    for i in kept:
        for b in net.bottom_ids(i):
            last_reader[net.blob_names[b]] = i
    for i in kept:
        layer = net.layers[i]
        ctx = _Layer(net, i)
        ins = [g.current[net.blob_names[b]] for b in net.bottom_ids(i)]
        top_names = [net.blob_names[b] for b in net.top_ids(i)]
        if ctx.param.type == "Split":
            for name in top_names:
                g.current[name] = ins[0]
            continue
        writer = _WRITERS.get(ctx.param.type)
        if writer is None:
            why = ("a Python layer runs arbitrary Python" if ctx.param.type == "Python"
                   else "cct has no ONNX writer for it")
            raise ctx.refuse(why)
        # The last writer of a blob names its tensor after it; earlier (in-place) writers not.
        outs = [g.unique(name if last_writer[name] == i and name not in g.used_names
                         else f"{name}/{ctx.name}") for name in top_names]
        writer(g, layer, ins, outs, ctx)
        for name, out in zip(top_names, outs):
            g.current[name] = out
    # The outputs: blobs no kept layer reads after their last write (Caffe's net outputs).
    outputs = [onnx.helper.make_tensor_value_info(g.current[name], onnx.TensorProto.FLOAT,
                                                  g.io_shape(net.blob_by_name(name).shape))
               for name, i in last_writer.items() if last_reader.get(name, -1) <= i]
    graph = onnx.helper.make_graph(g.nodes, net.name or "net", graph_inputs, outputs,
                                   g.initializers)
    doc = f"Exported by cct {__version__}" + (f" from {', '.join(sources)}" if sources else "")
    model = onnx.helper.make_model(graph, producer_name="cct", producer_version=__version__,
                                   doc_string=doc,
                                   opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = _ir_version(opset)
    onnx.checker.check_model(model)
    data = model.SerializeToString()

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write(os.fspath(path), write)
    return model


def _ir_version(opset: int) -> int:
    """The model's IR version: 8 (what runtimes of opset 13's time read) unless the opset came
    later than IR 8, then the first IR version that knows it."""
    helper = _onnx()[1]
    return max(8, helper.find_min_ir_version_for([helper.make_opsetid("", opset)]))


@functools.lru_cache(maxsize=None)
def opset_range() -> Tuple[int, int, str]:
    """(lowest, highest, what sets the highest): the opsets this exporter writes, from
    :data:`MIN_OPSET` to the newest that the installed onnx knows and, where onnxruntime is
    installed, that it loads (found by loading a one-node model, newest first)."""
    onnx = _onnx()[0]
    high = onnx.defs.onnx_opset_version()
    try:
        import onnxruntime as ort
    except ImportError:
        return MIN_OPSET, high, f"onnx {onnx.__version__} knows"
    helper = onnx.helper
    options = ort.SessionOptions()
    options.log_severity_level = 3        # no warning for an opset newer than ort's release
    for opset in range(high, MIN_OPSET - 1, -1):
        x, y = (helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1]) for n in "xy")
        probe = helper.make_model(
            helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y]),
            opset_imports=[helper.make_opsetid("", opset)])
        probe.ir_version = _ir_version(opset)
        try:
            ort.InferenceSession(probe.SerializeToString(), options,
                                 providers=["CPUExecutionProvider"])
        except _ort_errors():     # too new an opset, or the IR version it needs
            continue
        if opset < high:
            return MIN_OPSET, opset, f"onnxruntime {ort.__version__} loads"
        return MIN_OPSET, high, f"onnx {onnx.__version__} and onnxruntime {ort.__version__} know"
    return MIN_OPSET, MIN_OPSET - 1, f"onnxruntime {ort.__version__} loads"


def check_opset(opset: int) -> None:
    """Refuse an opset outside :func:`opset_range`: a model stamped with it would be refused
    by ONNX Runtime, or not say what its nodes mean."""
    low, high, by = opset_range()
    if not low <= opset <= high:
        raise ExportError(f"export_onnx: -opset {opset} is outside {low}..{high}: {low} is the "
                          f"oldest opset with every operator as this exporter writes it, {high} "
                          f"the newest that {by}; give -opset in {low}..{high} (default "
                          f"{DEFAULT_OPSET})")


def check_batches(model) -> List[int]:
    """The batches ``--check`` feeds: the model's own where its batch is fixed, 1 and 8 where
    it is symbolic.

    The export keeps the net's batch unless asked (``-batch``): a Caffe deploy net declares its
    input's num (CaffeNet's 10 crops) and a deployed model should accept what its prototxt
    says; a symbolic batch is not always possible (a Reduction over axis 0). So the check
    feeds the model what it declares, never a batch it would refuse."""
    dim = model.graph.input[0].type.tensor_type.shape.dim
    if dim and dim[0].HasField("dim_value"):
        return [int(dim[0].dim_value)]
    return [1, 8]


def _ort_errors() -> tuple:
    """ONNX Runtime's exception classes (they derive from Exception directly)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return tuple(getattr(state, n) for n in
                 ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError",
                  "RuntimeException", "InvalidProtobuf", "ModelLoaded", "NotImplemented",
                  "InvalidGraph", "EPFail") if hasattr(state, n))


def _runtime_error(net, e: Exception, batch: int) -> CheckError:
    """ONNX Runtime's exception as one line naming the node and the Caffe layer it was
    written for (a node is named after its layer, or ``<layer>/<step>``)."""
    text = " ".join(str(e).split())
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    where = ""
    # A node that failed while running ("... node. Name:'x' Status Message: ...") or that
    # has no kernel ("... for Op(22) node with name 'x'").
    found = re.search(r"Name:'([^']*)'|node with name '([^']*)'", text)
    if found:
        node = found.group(1) if found.group(1) is not None else found.group(2)
        layers = [l.layer_param.name for l in net.layers
                  if node == l.layer_param.name or node.startswith(l.layer_param.name + "/")]
        where = f" at node '{node}'" + (f" (layer '{max(layers, key=len)}')" if layers else "")
        text = text.split("Status Message:", 1)[-1].strip()
    if len(text) > 300:
        text = text[:297] + "..."
    return CheckError(f"export_onnx --check: ONNX Runtime failed{where} at batch {batch}: "
                      f"{text}")


def run_check(net, model, batch: Optional[int] = None, seed: int = 0,
              given: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, float]:
    """ONNX Runtime and cct on the same input at ``batch`` (standard normal, or ``given``
    arrays by input name, e.g. Embed's indices): the largest absolute difference, relative to
    the largest magnitude, per output. ``batch`` None: the model's own where it is fixed, else
    1. An ONNX Runtime failure is a :class:`CheckError` naming the node and its layer."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise CCTError(f"--check needs onnxruntime: {install_hint('onnx')}") from None
    own = check_batches(model)
    if batch is None:
        batch = own[0]
    elif len(own) == 1 and batch != own[0]:
        raise CheckError(f"export_onnx --check: the model's batch is fixed at {own[0]}, got "
                         f"batch {batch}; check it at {own[0]} or export with -batch=dynamic")
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in model.graph.input:
        blob = net.blob_by_name(inp.name).host_view()
        # The model's own shape, its symbolic batch set: an input whose first axis is not the
        # batch keeps its size.
        shape = tuple(batch if d.HasField("dim_param") else int(d.dim_value)
                      for d in inp.type.tensor_type.shape.dim)
        feeds[inp.name] = (np.asarray(given[inp.name], np.float32) if given and inp.name in given
                           else rng.standard_normal(shape).astype(np.float32))
        blob.reshape(*shape)
        blob.data[...] = feeds[inp.name]
    # the exported layers only: data layers would overwrite the input
    net.forward_layers(_deploy_view(net)[0])
    names = [o.name for o in model.graph.output]
    try:
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        results = session.run(names, feeds)
    except _ort_errors() as e:
        raise _runtime_error(net, e, batch) from None
    diffs = {}
    for name, got in zip(names, results):
        # An output that is an input blob rewritten in place is named "<blob>/<layer>".
        blob = net.blob_by_name(name if net.has_blob(name) else name.rsplit("/", 1)[0])
        want = np.asarray(blob.host_view().data)
        scale = max(float(np.abs(want).max()), 1e-30)
        diffs[name] = float(np.abs(got.reshape(want.shape) - want).max()) / scale
    return diffs
