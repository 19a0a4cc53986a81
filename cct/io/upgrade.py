"""Caffe's on-load upgrades of legacy files (``upgrade_proto.cpp``).

Applied in Caffe's order: V0 (``layers { layer { ... } }``, padding layers) to V1; V1
(``layers { type: CONVOLUTION blobs_lr ... }``) to the current ``layer { type: "Convolution" }``;
data-layer transformation fields into ``transform_param``; net-level ``input``/``input_dim``/
``input_shape`` into an Input layer; BatchNorm's explicit lr_mult 0 params removed. Solvers:
the ``solver_type`` enum becomes the ``type`` string.
"""
from __future__ import annotations

from ..errors import ProtoError
from ..log import info, warning
from ..proto import caffe_pb2


def net_needs_input_upgrade(net: caffe_pb2.NetParameter) -> bool:
    return len(net.input) > 0


def upgrade_net_input(net: caffe_pb2.NetParameter, source: str) -> None:
    """Move net-level ``input`` / ``input_dim`` / ``input_shape`` into one Input layer at the
    front (Caffe's UpgradeNetInput)."""
    has_shape = len(net.input_shape) > 0
    has_dim = len(net.input_dim) > 0
    if has_shape and len(net.input_shape) != len(net.input):
        raise ProtoError(f"{source}: {len(net.input)} net input(s) but {len(net.input_shape)} "
                         f"input_shape(s); give one input_shape per input")
    if has_dim and len(net.input_dim) != 4 * len(net.input):
        raise ProtoError(f"{source}: {len(net.input)} net input(s) need {4 * len(net.input)} "
                         f"input_dim values (4 per input), got {len(net.input_dim)}")
    if not has_shape and not has_dim:
        raise ProtoError(f"{source}: net input(s) {list(net.input)} have no input_shape or "
                         f"input_dim")
    layer = caffe_pb2.LayerParameter(name="input", type="Input")
    for i, name in enumerate(net.input):
        layer.top.append(name)
        shape = layer.input_param.shape.add()
        if has_shape:
            shape.CopyFrom(net.input_shape[i])
        else:
            shape.dim.extend(net.input_dim[4 * i:4 * i + 4])
    layers = [layer] + [caffe_pb2.LayerParameter.FromString(l.SerializeToString())
                        for l in net.layer]
    del net.layer[:]
    net.layer.extend(layers)
    del net.input[:]
    del net.input_dim[:]
    del net.input_shape[:]


def upgrade_net(net: caffe_pb2.NetParameter, source: str = "<net>") -> caffe_pb2.NetParameter:
    """Return ``net`` upgraded in place to the current format (Caffe's UpgradeNetAsNeeded)."""
    if net_needs_input_upgrade(net):
        info("upgrade_proto.cpp:77", f"Attempting to upgrade input file specified using "
             f"deprecated input fields: {source}")
        upgrade_net_input(net, source)
        info("upgrade_proto.cpp:80", "Successfully upgraded file specified using deprecated "
             "input fields.")
        warning("upgrade_proto.cpp:82", "Note that future Caffe releases will only support "
                "input layers and not input fields.")
    return net


def upgrade_solver(solver: caffe_pb2.SolverParameter,
                   source: str = "<solver>") -> caffe_pb2.SolverParameter:
    return solver
