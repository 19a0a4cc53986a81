"""Caffe's on-load upgrades of legacy files (``upgrade_proto.cpp``).

A net is upgraded in Caffe's order (``UpgradeNetAsNeeded``):

1. V0 (``layers { layer { type: "conv" ... } }``) to V1: padding layers are folded into the
   conv/pool layer they feed as ``pad``, then each V0 layer becomes a V1LayerParameter;
2. data-layer transformation fields (``scale``, ``mean_file``, ``crop_size``, ``mirror`` in the
   V1 Data/ImageData/WindowData params) move into ``transform_param``;
3. V1 (``layers { type: CONVOLUTION blobs_lr: 1 ... }``) to the current
   ``layer { type: "Convolution" param { lr_mult: 1 } ... }``;
4. net-level ``input`` / ``input_dim`` / ``input_shape`` become one Input layer in front;
5. a BatchNorm layer still giving its three statistics blobs ``param`` specs gets lr_mult and
   decay_mult 0 in each (the statistics are not learned).

A solver read from a file: the ``solver_type`` enum becomes the ``type`` string
(``UpgradeSolverAsNeeded``), then ``snapshot_prefix`` defaults to the solver file's path
without extension, or gains the file's stem when it names a directory
(``UpgradeSnapshotPrefixProperty``).

Each step logs Caffe's lines with Caffe's source locations. Where Caffe aborts (an unknown V0
layer type, a padding layer feeding a non-conv layer) cct raises :class:`ProtoError` naming the
file and the layer; where Caffe logs an error and drops a V0 field that has no meaning for the
layer's type, so does cct.
"""
from __future__ import annotations

import os

from ..errors import ProtoError
from ..glog import info, logger, warning
from ..proto import caffe_pb2

_V1 = caffe_pb2.V1LayerParameter

# Caffe's UpgradeV0LayerType: V0 type string -> V1 LayerType.
V0_LAYER_TYPES = {
    "accuracy": _V1.ACCURACY,
    "bnll": _V1.BNLL,
    "concat": _V1.CONCAT,
    "conv": _V1.CONVOLUTION,
    "data": _V1.DATA,
    "dropout": _V1.DROPOUT,
    "euclidean_loss": _V1.EUCLIDEAN_LOSS,
    "flatten": _V1.FLATTEN,
    "hdf5_data": _V1.HDF5_DATA,
    "hdf5_output": _V1.HDF5_OUTPUT,
    "im2col": _V1.IM2COL,
    "images": _V1.IMAGE_DATA,
    "infogain_loss": _V1.INFOGAIN_LOSS,
    "innerproduct": _V1.INNER_PRODUCT,
    "lrn": _V1.LRN,
    "multinomial_logistic_loss": _V1.MULTINOMIAL_LOGISTIC_LOSS,
    "pool": _V1.POOLING,
    "relu": _V1.RELU,
    "sigmoid": _V1.SIGMOID,
    "softmax": _V1.SOFTMAX,
    "softmax_loss": _V1.SOFTMAX_LOSS,
    "split": _V1.SPLIT,
    "tanh": _V1.TANH,
    "window_data": _V1.WINDOW_DATA,
}

# Caffe's UpgradeV1LayerType: V1 LayerType -> the current type string.
V1_LAYER_TYPES = {
    _V1.NONE: "",
    _V1.ABSVAL: "AbsVal",
    _V1.ACCURACY: "Accuracy",
    _V1.ARGMAX: "ArgMax",
    _V1.BNLL: "BNLL",
    _V1.CONCAT: "Concat",
    _V1.CONTRASTIVE_LOSS: "ContrastiveLoss",
    _V1.CONVOLUTION: "Convolution",
    _V1.DECONVOLUTION: "Deconvolution",
    _V1.DATA: "Data",
    _V1.DROPOUT: "Dropout",
    _V1.DUMMY_DATA: "DummyData",
    _V1.EUCLIDEAN_LOSS: "EuclideanLoss",
    _V1.ELTWISE: "Eltwise",
    _V1.EXP: "Exp",
    _V1.FLATTEN: "Flatten",
    _V1.HDF5_DATA: "HDF5Data",
    _V1.HDF5_OUTPUT: "HDF5Output",
    _V1.HINGE_LOSS: "HingeLoss",
    _V1.IM2COL: "Im2col",
    _V1.IMAGE_DATA: "ImageData",
    _V1.INFOGAIN_LOSS: "InfogainLoss",
    _V1.INNER_PRODUCT: "InnerProduct",
    _V1.LRN: "LRN",
    _V1.MEMORY_DATA: "MemoryData",
    _V1.MULTINOMIAL_LOGISTIC_LOSS: "MultinomialLogisticLoss",
    _V1.MVN: "MVN",
    _V1.POOLING: "Pooling",
    _V1.POWER: "Power",
    _V1.RELU: "ReLU",
    _V1.SIGMOID: "Sigmoid",
    _V1.SIGMOID_CROSS_ENTROPY_LOSS: "SigmoidCrossEntropyLoss",
    _V1.SILENCE: "Silence",
    _V1.SOFTMAX: "Softmax",
    _V1.SOFTMAX_LOSS: "SoftmaxWithLoss",
    _V1.SPLIT: "Split",
    _V1.SLICE: "Slice",
    _V1.TANH: "TanH",
    _V1.WINDOW_DATA: "WindowData",
    _V1.THRESHOLD: "Threshold",
}

_DATA_SOURCES = {"data": "data_param", "hdf5_data": "hdf5_data_param",
                 "images": "image_data_param", "window_data": "window_data_param"}

# Caffe's UpgradeV0LayerParameter as a table, in Caffe's order: (V0 field, {V0 type, or "*"
# for any type: "target_param.field"}). A field set on a layer type the table does not list is
# dropped with Caffe's "Unknown parameter" error line.
_V0_FIELDS = (
    ("num_output", {"conv": "convolution_param.num_output",
                    "innerproduct": "inner_product_param.num_output"}),
    ("biasterm", {"conv": "convolution_param.bias_term",
                  "innerproduct": "inner_product_param.bias_term"}),
    ("weight_filler", {"conv": "convolution_param.weight_filler",
                       "innerproduct": "inner_product_param.weight_filler"}),
    ("bias_filler", {"conv": "convolution_param.bias_filler",
                     "innerproduct": "inner_product_param.bias_filler"}),
    ("pad", {"conv": "convolution_param.pad", "pool": "pooling_param.pad"}),
    ("kernelsize", {"conv": "convolution_param.kernel_size", "pool": "pooling_param.kernel_size"}),
    ("group", {"conv": "convolution_param.group"}),
    ("stride", {"conv": "convolution_param.stride", "pool": "pooling_param.stride"}),
    ("pool", {"pool": "pooling_param.pool"}),
    ("dropout_ratio", {"dropout": "dropout_param.dropout_ratio"}),
    ("local_size", {"lrn": "lrn_param.local_size"}),
    ("alpha", {"lrn": "lrn_param.alpha"}),
    ("beta", {"lrn": "lrn_param.beta"}),
    ("k", {"lrn": "lrn_param.k"}),
    ("source", dict({t: p + ".source" for t, p in _DATA_SOURCES.items()},
                    infogain_loss="infogain_loss_param.source")),
    ("scale", {"*": "transform_param.scale"}),
    ("meanfile", {"*": "transform_param.mean_file"}),
    ("batchsize", {t: p + ".batch_size" for t, p in _DATA_SOURCES.items()}),
    ("cropsize", {"*": "transform_param.crop_size"}),
    ("mirror", {"*": "transform_param.mirror"}),
    ("rand_skip", {"data": "data_param.rand_skip", "images": "image_data_param.rand_skip"}),
    ("shuffle_images", {"images": "image_data_param.shuffle"}),
    ("new_height", {"images": "image_data_param.new_height"}),
    ("new_width", {"images": "image_data_param.new_width"}),
    ("concat_dim", {"concat": "concat_param.concat_dim"}),
    ("det_fg_threshold", {"window_data": "window_data_param.fg_threshold"}),
    ("det_bg_threshold", {"window_data": "window_data_param.bg_threshold"}),
    ("det_fg_fraction", {"window_data": "window_data_param.fg_fraction"}),
    ("det_context_pad", {"window_data": "window_data_param.context_pad"}),
    ("det_crop_mode", {"window_data": "window_data_param.crop_mode"}),
    ("hdf5_output_param", {"hdf5_output": "hdf5_output_param"}),
)

# The name Caffe's "Unknown parameter" line gives a V0 field, where it is not the field's own.
_V0_FIELD_NAMES = {"shuffle_images": "shuffle"}

# The V1 data layers whose own params carried the transformation fields before
# TransformationParameter existed.
_DATA_TRANSFORM_PARAMS = {_V1.DATA: "data_param", _V1.IMAGE_DATA: "image_data_param",
                          _V1.WINDOW_DATA: "window_data_param"}
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")

SOLVER_TYPES = {
    caffe_pb2.SolverParameter.SGD: "SGD",
    caffe_pb2.SolverParameter.NESTEROV: "Nesterov",
    caffe_pb2.SolverParameter.ADAGRAD: "AdaGrad",
    caffe_pb2.SolverParameter.RMSPROP: "RMSProp",
    caffe_pb2.SolverParameter.ADADELTA: "AdaDelta",
    caffe_pb2.SolverParameter.ADAM: "Adam",
}


def _error(src: str, msg: str) -> None:
    logger.error(msg, extra={"caffe_src": src})


def _is_repeated(field) -> bool:
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def _assign(layer: caffe_pb2.V1LayerParameter, path: str, value) -> None:
    """Set ``layer.<path>`` to ``value``: append to a repeated field, copy a message."""
    if "." in path:
        sub_name, name = path.split(".")
        msg = getattr(layer, sub_name)
    else:
        msg, name = layer, path
    field = msg.DESCRIPTOR.fields_by_name[name]
    if _is_repeated(field):
        getattr(msg, name).append(value)
    elif field.message_type is not None:
        getattr(msg, name).CopyFrom(value)
    else:
        setattr(msg, name, value)


# ------------------------------------------------------------------------------------------------
# V0 -> V1
# ------------------------------------------------------------------------------------------------
def net_needs_v0_to_v1_upgrade(net: caffe_pb2.NetParameter) -> bool:
    return any(conn.HasField("layer") for conn in net.layers)


def upgrade_v0_padding_layers(net: caffe_pb2.NetParameter,
                              source: str = "<net>") -> caffe_pb2.NetParameter:
    """A copy of ``net`` without its V0 padding layers: each one's ``pad`` moves into the conv
    or pool layer it feeds, which then reads the padding layer's bottom directly."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    del out.layers[:]
    last_top = {name: -1 for name in net.input}
    for i, conn in enumerate(net.layers):
        v0 = conn.layer
        if v0.type != "padding":
            out.layers.add().CopyFrom(conn)
        for j, blob in enumerate(conn.bottom):
            if blob not in last_top:
                raise ProtoError(f"{source}: V0 layer '{v0.name}' takes bottom '{blob}' (bottom "
                                 f"{j}), which no earlier layer or net input produces")
            if last_top[blob] == -1:
                continue
            pad_layer = net.layers[last_top[blob]]
            if pad_layer.layer.type != "padding":
                continue
            if v0.type not in ("conv", "pool"):
                raise ProtoError(f"{source}: Padding layer '{pad_layer.layer.name}' feeds V0 "
                                 f"layer '{v0.name}' of type '{v0.type}'; a padding layer can "
                                 f"only feed a conv or pool layer")
            if len(conn.bottom) != 1:
                raise ProtoError(f"{source}: V0 layer '{v0.name}' is fed by padding layer "
                                 f"'{pad_layer.layer.name}' and must take a single bottom, "
                                 f"got {len(conn.bottom)}")
            if len(pad_layer.bottom) != 1 or len(pad_layer.top) != 1:
                raise ProtoError(f"{source}: Padding layer '{pad_layer.layer.name}' must take "
                                 f"one bottom and produce one top, got {len(pad_layer.bottom)} "
                                 f"and {len(pad_layer.top)}")
            out.layers[-1].layer.pad = pad_layer.layer.pad
            out.layers[-1].bottom[j] = pad_layer.bottom[0]
        for blob in conn.top:
            last_top[blob] = i
    return out


def upgrade_v0_layer(conn: caffe_pb2.V1LayerParameter,
                     source: str = "<net>") -> "tuple[caffe_pb2.V1LayerParameter, bool]":
    """Caffe's UpgradeV0LayerParameter: the V1 layer and whether every field carried over."""
    layer = caffe_pb2.V1LayerParameter()
    layer.bottom.extend(conn.bottom)
    layer.top.extend(conn.top)
    if not conn.HasField("layer"):
        return layer, True
    v0 = conn.layer
    if v0.HasField("name"):
        layer.name = v0.name
    if v0.HasField("type"):
        if v0.type not in V0_LAYER_TYPES:
            raise ProtoError(f"{source}: V0 layer '{v0.name}' has type '{v0.type}', which has "
                             f"no upgrade (Caffe: Unknown layer name: {v0.type}); known V0 "
                             f"types: {', '.join(sorted(V0_LAYER_TYPES))}")
        layer.type = V0_LAYER_TYPES[v0.type]
    for bp in v0.blobs:
        layer.blobs.add().CopyFrom(bp)
    layer.blobs_lr.extend(v0.blobs_lr)
    layer.weight_decay.extend(v0.weight_decay)
    complete = True
    for field, targets in _V0_FIELDS:
        if not v0.HasField(field):
            continue
        target = targets.get("*") or targets.get(v0.type)
        if target is None:
            _error("upgrade_proto.cpp:234", f"Unknown parameter "
                   f"{_V0_FIELD_NAMES.get(field, field)} for layer type {v0.type} (V0 layer "
                   f"'{v0.name}'); dropped")
            complete = False
            continue
        value = getattr(v0, field)
        if field == "pool":
            value = caffe_pb2.PoolingParameter.PoolMethod.Value(
                caffe_pb2.V0LayerParameter.PoolMethod.Name(value))
        _assign(layer, target, value)
    return layer, complete


def upgrade_v0_net(net: caffe_pb2.NetParameter, source: str = "<net>") -> bool:
    """Caffe's UpgradeV0Net, in place; False when some V0 field had to be dropped. Like Caffe,
    only the name, layers, input, input_dim and force_backward survive."""
    padded = upgrade_v0_padding_layers(net, source)
    net.Clear()
    if padded.HasField("name"):
        net.name = padded.name
    complete = True
    for conn in padded.layers:
        layer, ok = upgrade_v0_layer(conn, source)
        net.layers.add().CopyFrom(layer)
        complete &= ok
    net.input.extend(padded.input)
    net.input_dim.extend(padded.input_dim)
    if padded.HasField("force_backward"):
        net.force_backward = padded.force_backward
    return complete


# ------------------------------------------------------------------------------------------------
# Data transformation fields
# ------------------------------------------------------------------------------------------------
def net_needs_data_upgrade(net: caffe_pb2.NetParameter) -> bool:
    for layer in net.layers:
        name = _DATA_TRANSFORM_PARAMS.get(layer.type)
        if name is not None and any(getattr(layer, name).HasField(f)
                                    for f in _TRANSFORM_FIELDS):
            return True
    return False


def upgrade_net_data_transformation(net: caffe_pb2.NetParameter) -> None:
    """Move scale / mean_file / crop_size / mirror of V1 data layers into transform_param."""
    for layer in net.layers:
        name = _DATA_TRANSFORM_PARAMS.get(layer.type)
        if name is None:
            continue
        old = getattr(layer, name)
        # Caffe's mutable_*_param() calls mark both messages present even when nothing moves.
        old.SetInParent()
        layer.transform_param.SetInParent()
        for f in _TRANSFORM_FIELDS:
            if old.HasField(f):
                setattr(layer.transform_param, f, getattr(old, f))
                old.ClearField(f)


# ------------------------------------------------------------------------------------------------
# V1 -> current
# ------------------------------------------------------------------------------------------------
def net_needs_v1_to_v2_upgrade(net: caffe_pb2.NetParameter) -> bool:
    return len(net.layers) > 0


_V1_PARAM_MESSAGES = tuple(f.name for f in _V1.DESCRIPTOR.fields if f.name.endswith("_param"))


def upgrade_v1_layer(v1: caffe_pb2.V1LayerParameter,
                     layer: "caffe_pb2.LayerParameter | None" = None,
                     ) -> "tuple[caffe_pb2.LayerParameter, bool]":
    """Caffe's UpgradeV1LayerParameter: ``layer`` (a new one if not given) filled from ``v1``,
    and whether it is complete (a V0 ``layer`` still inside is ignored)."""
    if layer is None:
        layer = caffe_pb2.LayerParameter()
    layer.Clear()
    layer.bottom.extend(v1.bottom)
    layer.top.extend(v1.top)
    if v1.HasField("name"):
        layer.name = v1.name
    for rule in v1.include:
        layer.include.add().CopyFrom(rule)
    for rule in v1.exclude:
        layer.exclude.add().CopyFrom(rule)
    if v1.HasField("type"):
        layer.type = V1_LAYER_TYPES[v1.type]
    for bp in v1.blobs:
        layer.blobs.add().CopyFrom(bp)

    def spec(i: int) -> caffe_pb2.ParamSpec:
        while len(layer.param) <= i:
            layer.param.add()
        return layer.param[i]

    for i, name in enumerate(v1.param):
        spec(i).name = name
    for i, mode in enumerate(v1.blob_share_mode):
        spec(i).share_mode = caffe_pb2.ParamSpec.DimCheckMode.Value(
            _V1.DimCheckMode.Name(mode))
    for i, lr in enumerate(v1.blobs_lr):
        spec(i).lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        spec(i).decay_mult = decay
    layer.loss_weight.extend(v1.loss_weight)
    for name in _V1_PARAM_MESSAGES:
        if v1.HasField(name):
            getattr(layer, name).CopyFrom(getattr(v1, name))
    if v1.HasField("layer"):
        _error("upgrade_proto.cpp:946", "Input NetParameter has V0 layer -- ignoring.")
        return layer, False
    return layer, True


def upgrade_v1_net(net: caffe_pb2.NetParameter) -> bool:
    """Caffe's UpgradeV1Net, in place: every ``layers`` entry becomes a ``layer`` entry."""
    complete = True
    # Filled in place: a .caffemodel's blobs are copied once, not twice.
    for i, v1 in enumerate(net.layers):
        if not upgrade_v1_layer(v1, net.layer.add())[1]:
            _error("upgrade_proto.cpp:746", f"Upgrade of input layer {i} failed.")
            complete = False
    del net.layers[:]
    return complete


# ------------------------------------------------------------------------------------------------
# Net input fields -> Input layer
# ------------------------------------------------------------------------------------------------
def net_needs_input_upgrade(net: caffe_pb2.NetParameter) -> bool:
    return len(net.input) > 0


def upgrade_net_input(net: caffe_pb2.NetParameter, source: str = "<net>") -> None:
    """Caffe's UpgradeNetInput: net-level ``input`` with ``input_shape`` (preferred) or four
    ``input_dim`` each become the tops of one Input layer named "input", put first. Inputs with
    neither (an old .caffemodel) are simply dropped."""
    n = len(net.input)
    has_shape = len(net.input_shape) > 0
    has_dim = len(net.input_dim) > 0
    if has_shape and len(net.input_shape) < n:
        raise ProtoError(f"{source}: {n} net input(s) {list(net.input)} but only "
                         f"{len(net.input_shape)} input_shape(s); give one input_shape per input")
    if not has_shape and has_dim and len(net.input_dim) < 4 * n:
        raise ProtoError(f"{source}: {n} net input(s) {list(net.input)} need {4 * n} input_dim "
                         f"values (4 per input), got {len(net.input_dim)}")
    if has_shape or has_dim:
        layer = caffe_pb2.LayerParameter(name="input", type="Input")
        for i, name in enumerate(net.input):
            layer.top.append(name)
            shape = layer.input_param.shape.add()
            if has_shape:
                shape.CopyFrom(net.input_shape[i])
            else:
                shape.dim.extend(net.input_dim[4 * i:4 * i + 4])
        layers = [layer] + list(net.layer)
        del net.layer[:]
        net.layer.extend(layers)
    del net.input[:]
    del net.input_dim[:]
    del net.input_shape[:]


# ------------------------------------------------------------------------------------------------
# BatchNorm statistics params
# ------------------------------------------------------------------------------------------------
def _is_old_batch_norm(layer: caffe_pb2.LayerParameter) -> bool:
    return layer.type == "BatchNorm" and len(layer.param) == 3


def net_needs_batch_norm_upgrade(net: caffe_pb2.NetParameter) -> bool:
    return any(_is_old_batch_norm(layer) for layer in net.layer)


def upgrade_net_batch_norm(net: caffe_pb2.NetParameter) -> None:
    """Caffe's UpgradeNetBatchNorm: a BatchNorm layer with three ``param`` specs (the old way to
    keep the solver off its mean, variance and scale-factor blobs) keeps them, names and share
    modes included, with lr_mult and decay_mult set to 0."""
    for layer in net.layer:
        if _is_old_batch_norm(layer):
            for spec in layer.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0


# ------------------------------------------------------------------------------------------------
# The whole net
# ------------------------------------------------------------------------------------------------
def net_needs_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """Caffe's NetNeedsUpgrade: whether any of the upgrades below would change ``net``."""
    return (net_needs_v0_to_v1_upgrade(net) or net_needs_v1_to_v2_upgrade(net)
            or net_needs_data_upgrade(net) or net_needs_input_upgrade(net)
            or net_needs_batch_norm_upgrade(net))


def upgrade_net(net: caffe_pb2.NetParameter, source: str = "<net>") -> caffe_pb2.NetParameter:
    """Return ``net`` upgraded in place to the current format (Caffe's UpgradeNetAsNeeded)."""
    if len(net.layer) and len(net.layers):
        # Caffe logs an error and drops the 'layer' entries; a silently smaller net helps nobody.
        raise ProtoError(f"{source}: the net has both 'layer' entries (current format) and "
                         f"'layers' entries (deprecated V0/V1 format); Caffe would ignore the "
                         f"{len(net.layer)} 'layer' entries. Write every layer in one format "
                         f"(e.g. upgrade the file with upgrade_net_proto_text first).")
    if net_needs_v0_to_v1_upgrade(net):
        info("upgrade_proto.cpp:26", "Attempting to upgrade input file specified using "
             f"deprecated V0LayerParameter: {source}")
        if upgrade_v0_net(net, source):
            info("upgrade_proto.cpp:34", "Successfully upgraded file specified using "
                 "deprecated V0LayerParameter")
        else:
            _error("upgrade_proto.cpp:31", "Warning: had one or more problems upgrading "
                   "V0NetParameter to NetParameter (see above); continuing anyway.")
        warning("upgrade_proto.cpp:37", "Note that future Caffe releases will not support "
                "V0NetParameter; use ./build/tools/upgrade_net_proto_text for prototxt and "
                "./build/tools/upgrade_net_proto_binary for model weights upgrade this and "
                "any other net protos to the new format.")
    if net_needs_data_upgrade(net):
        info("upgrade_proto.cpp:44", "Attempting to upgrade input file specified using "
             f"deprecated transformation parameters: {source}")
        upgrade_net_data_transformation(net)
        info("upgrade_proto.cpp:47", "Successfully upgraded file specified using deprecated "
             "data transformation parameters.")
        warning("upgrade_proto.cpp:49", "Note that future Caffe releases will only support "
                "transform_param messages for transformation fields.")
    if net_needs_v1_to_v2_upgrade(net):
        info("upgrade_proto.cpp:53", "Attempting to upgrade input file specified using "
             f"deprecated V1LayerParameter: {source}")
        if upgrade_v1_net(net):
            info("upgrade_proto.cpp:61", "Successfully upgraded file specified using "
                 "deprecated V1LayerParameter")
        else:
            _error("upgrade_proto.cpp:58", "Warning: had one or more problems upgrading "
                   "V1LayerParameter (see above); continuing anyway.")
    if net_needs_input_upgrade(net):
        info("upgrade_proto.cpp:67", "Attempting to upgrade input file specified using "
             f"deprecated input fields: {source}")
        upgrade_net_input(net, source)
        info("upgrade_proto.cpp:70", "Successfully upgraded file specified using deprecated "
             "input fields.")
        warning("upgrade_proto.cpp:72", "Note that future Caffe releases will only support "
                "input layers and not input fields.")
    if net_needs_batch_norm_upgrade(net):
        info("upgrade_proto.cpp:77", "Attempting to upgrade batch norm layers using "
             f"deprecated params: {source}")
        upgrade_net_batch_norm(net)
        info("upgrade_proto.cpp:80", "Successfully upgraded batch norm layers using "
             "deprecated params.")
    return net


# ------------------------------------------------------------------------------------------------
# Solver
# ------------------------------------------------------------------------------------------------
def solver_needs_type_upgrade(solver: caffe_pb2.SolverParameter) -> bool:
    return solver.HasField("solver_type")


def upgrade_solver_type(solver: caffe_pb2.SolverParameter, source: str = "<solver>") -> None:
    """Caffe's UpgradeSolverType: ``solver_type: ADAM`` becomes ``type: "Adam"``. Like Caffe,
    giving both fields is an error even when they agree."""
    old = caffe_pb2.SolverParameter.SolverType.Name(solver.solver_type)
    if solver.HasField("type"):
        raise ProtoError(f"{source}: Failed to upgrade solver: old solver_type field (enum) and "
                         f"new type field (string) cannot be both specified in solver proto "
                         f"text (solver_type: {old}, type: \"{solver.type}\"); keep only "
                         f"type: \"{SOLVER_TYPES[solver.solver_type]}\" or your type string.")
    solver.type = SOLVER_TYPES[solver.solver_type]
    solver.ClearField("solver_type")


def upgrade_solver(solver: caffe_pb2.SolverParameter,
                   source: str = "<solver>") -> caffe_pb2.SolverParameter:
    """Return ``solver`` upgraded in place (Caffe's UpgradeSolverAsNeeded)."""
    if solver_needs_type_upgrade(solver):
        info("upgrade_proto.cpp:1084", "Attempting to upgrade input file specified using "
             f"deprecated 'solver_type' field (enum)': {source}")
        upgrade_solver_type(solver, source)
        info("upgrade_proto.cpp:1091", "Successfully upgraded file specified using deprecated "
             "'solver_type' field (enum) to 'type' field (string).")
        warning("upgrade_proto.cpp:1093", "Note that future Caffe releases will only support "
                "'type' field (string) for a solver's type.")
    return solver


def upgrade_snapshot_prefix(solver: caffe_pb2.SolverParameter, solver_file: str) -> None:
    """Caffe's UpgradeSnapshotPrefixProperty, applied to solvers read from a file: no
    ``snapshot_prefix`` means the solver file's path without its extension; a prefix naming an
    existing directory gains the solver file's stem (``snap/`` -> ``snap/lenet_solver``)."""
    if not solver.HasField("snapshot_prefix"):
        solver.snapshot_prefix = os.path.splitext(solver_file)[0]
        info("upgrade_proto.cpp:1108", "snapshot_prefix was not specified and is set to "
             + solver.snapshot_prefix)
    elif os.path.isdir(solver.snapshot_prefix):
        stem = os.path.splitext(os.path.basename(solver_file))[0]
        solver.snapshot_prefix = os.path.join(solver.snapshot_prefix, stem)
        info("upgrade_proto.cpp:1113", "snapshot_prefix was a directory and is replaced to "
             + solver.snapshot_prefix)
