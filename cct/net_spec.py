"""pycaffe's net specification (``caffe.NetSpec``, ``caffe.layers``, ``caffe.params``,
``caffe.to_proto``): write a net in Python and get the NetParameter Caffe's NetSpec would give.

    n = NetSpec()
    n.data, n.label = L.Data(batch_size=64, backend=P.Data.LMDB, source='x', ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20)
    n.loss = L.SoftmaxWithLoss(n.conv1, n.label)
    print(n.to_proto())

``L.<Type>(*bottoms, **kwargs)`` makes a layer of that ``type``. The keyword arguments ``ntop``
(default 1: the call returns one Top, a tuple of Tops for more, the layer itself for 0) and
``in_place`` (tops named as the bottoms) are NetSpec's own. Any other keyword ending in ``param``
is a LayerParameter field (``param``, ``transform_param``, ``convolution_param``, ...); the rest
go to the layer's ``<type>_param`` message when it has that field and to LayerParameter otherwise
(``loss_weight``, ``include``, ``name``, ...). Values map onto protobuf fields as in pycaffe: a
dict fills a message, a list fills a repeated field (a single value becomes a one-item list), a
list of dicts adds one message per dict, anything else is assigned as is.

Names follow pycaffe exactly: ``NetSpec.to_proto`` names each top after the attribute it was
assigned to and each layer after its first top; unnamed tops and layers get ``<Type><k>``, with
one counter per type shared by tops and layers, in depth-first order of the bottoms.
"""
from __future__ import annotations

import sys
from collections import Counter, OrderedDict
from typing import Dict, Optional, Tuple, Union

import numpy as np
from google.protobuf.message import Message

from .errors import CCTError, close_matches
from .proto import caffe_pb2


class NetSpecError(CCTError, AttributeError):
    """A NetSpec keyword names no protobuf field or carries a value the field cannot hold.

    An AttributeError too, since that is what pycaffe raises for an unknown field."""


def param_name_dict() -> Dict[str, str]:
    """Layer type -> ``<name>`` of its ``<name>_param`` field, from LayerParameter's fields
    ending in ``_param`` keyed by their message type less ``Parameter`` (``TanH`` -> ``tanh``,
    ``HDF5Data`` -> ``hdf5_data``), as pycaffe builds it."""
    names = {}
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param") and field.message_type is not None:
            type_name = field.message_type.name
            if type_name.endswith("Parameter"):
                names[type_name[:-len("Parameter")]] = field.name[:-len("_param")]
    return names


# Types whose parameter message is named after another type; pycaffe has no entry for them, so
# there their keywords only work spelled out as e.g. convolution_param=dict(...).
_SHARED_PARAM_NAMES = {"Deconvolution": "convolution", "Im2col": "convolution",
                       "LSTM": "recurrent", "RNN": "recurrent"}

_param_names = {**_SHARED_PARAM_NAMES, **param_name_dict()}

_SEQUENCES = (list, tuple, np.ndarray)


def _fail(where: str, val, err: Exception) -> NetSpecError:
    return NetSpecError(f"NetSpec: cannot set {where} = {val!r}: {err}")


def _assign(msg: Message, name: str, val, path: str) -> None:
    fields = msg.DESCRIPTOR.fields_by_name
    if name not in fields:
        raise NetSpecError(f"NetSpec: {path} ({msg.DESCRIPTOR.name}) has no field '{name}'."
                           + close_matches(name, fields))
    where = f"{path}.{name}"
    current = getattr(msg, name)
    is_message = fields[name].message_type is not None
    if hasattr(current, "extend"):
        items = list(val) if isinstance(val, _SEQUENCES) else [val]
        if not is_message:
            try:
                current.extend(items)
            except (TypeError, ValueError) as e:
                raise _fail(where, val, e) from None
            return
        for item in items:
            if isinstance(item, dict):
                sub = current.add()
                for k, v in item.items():
                    _assign(sub, k, v, where)
            elif isinstance(item, Message):
                try:
                    current.add().CopyFrom(item)
                except TypeError as e:
                    raise _fail(where, item, e) from None
            else:
                raise NetSpecError(f"NetSpec: {where} holds {fields[name].message_type.name} "
                                   f"messages; give a dict (or a list of dicts), got {item!r}")
    elif is_message:
        if isinstance(val, dict):
            for k, v in val.items():
                _assign(current, k, v, where)
        elif isinstance(val, Message):
            try:
                current.CopyFrom(val)
            except TypeError as e:
                raise _fail(where, val, e) from None
        else:
            raise NetSpecError(f"NetSpec: {where} is a {fields[name].message_type.name} message; "
                               f"give a dict of its fields, got {val!r}")
    else:
        try:
            setattr(msg, name, val)
        except (TypeError, ValueError) as e:
            raise _fail(where, val, e) from None


def assign_proto(proto: Message, name: str, val) -> None:
    """Assign a Python value to field ``name`` of ``proto`` the way pycaffe does: dicts fill
    messages, lists fill repeated fields (a lone value becomes a one-item list), lists of dicts
    add messages, anything else is set directly."""
    _assign(proto, name, val, proto.DESCRIPTOR.name)


class Top:
    """One output blob of a layer (the ``n``-th top of Function ``fn``)."""

    def __init__(self, fn: "Function", n: int):
        self.fn = fn
        self.n = n

    def to_proto(self) -> caffe_pb2.NetParameter:
        """The NetParameter of every layer needed to compute this top (names are automatic)."""
        return to_proto(self)

    def _to_proto(self, layers, names, autonames) -> None:
        self.fn._to_proto(layers, names, autonames)


class Function:
    """One layer: its type, its bottoms (Tops of other layers) and its keyword parameters."""

    def __init__(self, type_name: str, inputs: tuple, params: dict):
        self.type_name = type_name
        for index, inp in enumerate(inputs):
            if not isinstance(inp, Top):
                raise TypeError(f"{type_name} input {index} is not a Top (type is {type(inp)})")
        self.inputs = inputs
        self.params = params
        self.ntop = self.params.pop("ntop", 1)
        self.in_place = self.params.pop("in_place", False)
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _get_name(self, names, autonames) -> str:
        if self not in names and self.ntop > 0:
            names[self] = self._get_top_name(self.tops[0], names, autonames)
        elif self not in names:
            autonames[self.type_name] += 1
            names[self] = self.type_name + str(autonames[self.type_name])
        return names[self]

    def _get_top_name(self, top: Top, names, autonames) -> str:
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = top.fn.type_name + str(autonames[top.fn.type_name])
        return names[top]

    def _to_proto(self, layers, names, autonames) -> None:
        if self in layers:
            return
        bottom_names = []
        for inp in self.inputs:
            inp._to_proto(layers, names, autonames)
            bottom_names.append(layers[inp.fn].top[inp.n])
        layer = caffe_pb2.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(bottom_names)
        if self.in_place:
            layer.top.extend(layer.bottom)
        else:
            for top in self.tops:
                layer.top.append(self._get_top_name(top, names, autonames))
        layer.name = self._get_name(names, autonames)

        param_name = _param_names.get(self.type_name)
        type_param = getattr(layer, param_name + "_param") if param_name else None
        layer_fields = caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name
        for k, v in self.params.items():
            where = f"layer '{layer.name}' ({self.type_name})"
            if not k.endswith("param") and type_param is not None \
                    and k in type_param.DESCRIPTOR.fields_by_name:
                _assign(type_param, k, v, f"{where}.{param_name}_param")
            elif k in layer_fields:
                _assign(layer, k, v, where)
            elif type_param is None:
                raise NetSpecError(
                    f"NetSpec: {where}: keyword '{k}' is no LayerParameter field, and type "
                    f"{self.type_name} has no parameter message of its own; pass it inside "
                    f"the right <name>_param=dict(...)." + close_matches(k, layer_fields))
            else:
                known = list(layer_fields) + list(type_param.DESCRIPTOR.fields_by_name)
                raise NetSpecError(
                    f"NetSpec: {where}: keyword '{k}' is a field of neither "
                    f"{type_param.DESCRIPTOR.name} nor LayerParameter." + close_matches(k, known))
        layers[self] = layer


class NetSpec:
    """A set of named Tops: assign Tops as attributes (or items), then ``to_proto()`` gives the
    NetParameter of every layer they need, tops and layers named after the attributes."""

    def __init__(self):
        super().__setattr__("tops", OrderedDict())

    def __setattr__(self, name: str, value: Union[Top, Function]) -> None:
        if not isinstance(value, (Top, Function)):
            hint = ""
            if isinstance(value, tuple) and value and all(isinstance(t, Top) for t in value):
                hint = (f"; the layer has {len(value)} tops, unpack them: "
                        f"n.a, n.b = L.{value[0].fn.type_name}(..., ntop={len(value)})")
            raise TypeError(f"NetSpec.{name}: expected a Top (what L.<Type>(...) returns) or a "
                            f"top-less layer (ntop=0), got {type(value).__name__}{hint}")
        self.tops[name] = value

    def __getattr__(self, name: str):
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(f"NetSpec has no top '{name}'; assigned: "
                                 f"{', '.join(self.tops) or 'none'}") from None

    def __setitem__(self, key: str, value) -> None:
        self.__setattr__(key, value)

    def __getitem__(self, item: str):
        return self.tops[item]

    def to_proto(self) -> caffe_pb2.NetParameter:
        names = {v: k for k, v in self.tops.items()}
        autonames = Counter()
        layers = OrderedDict()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        net = caffe_pb2.NetParameter()
        net.layer.extend(layers.values())
        return net


def to_proto(*tops: Union[Top, Function]) -> caffe_pb2.NetParameter:
    """The NetParameter of every layer needed to compute ``tops``, with automatic names."""
    layers = OrderedDict()
    autonames = Counter()
    for top in tops:
        fn = top if isinstance(top, Function) else top.fn
        fn._to_proto(layers, {}, autonames)
    net = caffe_pb2.NetParameter()
    net.layer.extend(layers.values())
    return net


class Layers:
    """pycaffe's ``caffe.layers`` pseudo-module: ``L.<Type>(*bottoms, **params)`` makes a layer.

    With ``package`` set, attributes of that module come first, so the object can stand as
    ``cct.layers`` (pycaffe's name) while ``cct.layers.<family>`` and ``import cct.layers.<x> as
    y`` still reach the layer package; its names (``base``, ``conv``, ``Layer``, ``register``,
    ...) are no Caffe layer types.
    """

    def __init__(self, package: Optional[str] = None):
        self._package = package

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        package_name = self.__dict__.get("_package")
        package = sys.modules.get(package_name) if package_name else None
        if package is not None and hasattr(package, name):
            return getattr(package, name)

        def layer_fn(*args, **kwargs) -> Union[Top, Tuple[Top, ...], Function]:
            fn = Function(name, args, kwargs)
            if fn.ntop == 0:
                return fn
            if fn.ntop == 1:
                return fn.tops[0]
            return fn.tops
        layer_fn.__name__ = name
        return layer_fn


class _Param:
    def __init__(self, type_name: str):
        self._type_name = type_name

    def __getattr__(self, value_name: str):
        if value_name.startswith("__"):
            raise AttributeError(value_name)
        message = getattr(caffe_pb2, self._type_name + "Parameter", None)
        if message is None:
            raise NetSpecError(f"P.{self._type_name}: caffe_pb2 has no {self._type_name}Parameter"
                               + close_matches(self._type_name + "Parameter",
                                               caffe_pb2.DESCRIPTOR.message_types_by_name))
        try:
            return getattr(message, value_name)
        except AttributeError:
            values = [v.name for e in message.DESCRIPTOR.enum_types for v in e.values]
            raise NetSpecError(f"P.{self._type_name} has no value '{value_name}'; its enum "
                               f"values are {', '.join(values) or 'none'}") from None


class Parameters:
    """pycaffe's ``caffe.params`` pseudo-module: ``P.<Type>.<VALUE>`` is the enum value
    ``caffe_pb2.<Type>Parameter.<VALUE>`` (``P.Pooling.MAX``, ``P.Data.LMDB``)."""

    def __getattr__(self, name: str) -> _Param:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Param(name)


layers = Layers(package=__name__.rpartition(".")[0] + ".layers")
params = Parameters()
