"""Caffe's upgrades of legacy nets and solvers (upgrade_proto.cpp), checked field by field on
hand-written V0 / V1 / input-field / BatchNorm / solver_type files."""
import logging

import numpy as np
import pytest
from google.protobuf import text_format

from cct.errors import ProtoError
from cct.io import upgrade
from cct.io.prototxt import net_from_text, read_net, read_net_binary, read_net_text, \
    read_solver_text
from cct.proto import caffe_pb2

V1_LENET_TRAIN_TEST = """
name: "LeNet"
layers {
  name: "mnist"
  type: DATA
  top: "data"
  top: "label"
  data_param {
    source: "examples/mnist/mnist_train_lmdb"
    backend: LMDB
    batch_size: 64
    scale: 0.00390625
  }
  include: { phase: TRAIN }
}
layers {
  name: "mnist"
  type: DATA
  top: "data"
  top: "label"
  data_param {
    source: "examples/mnist/mnist_test_lmdb"
    backend: LMDB
    batch_size: 100
    scale: 0.00390625
    mirror: true
  }
  include: { phase: TEST }
}
layers {
  name: "conv1"
  type: CONVOLUTION
  bottom: "data"
  top: "conv1"
  blobs_lr: 1
  blobs_lr: 2
  weight_decay: 1
  weight_decay: 0
  convolution_param {
    num_output: 20
    kernel_size: 5
    stride: 1
    weight_filler { type: "xavier" }
    bias_filler { type: "constant" }
  }
}
layers {
  name: "pool1"
  type: POOLING
  bottom: "conv1"
  top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 }
}
layers {
  name: "ip1"
  type: INNER_PRODUCT
  bottom: "pool1"
  top: "ip1"
  blobs_lr: 1
  blobs_lr: 2
  inner_product_param {
    num_output: 500
    weight_filler { type: "xavier" }
    bias_filler { type: "constant" }
  }
}
layers { name: "relu1" type: RELU bottom: "ip1" top: "ip1" }
layers {
  name: "accuracy"
  type: ACCURACY
  bottom: "ip1"
  bottom: "label"
  top: "accuracy"
  include: { phase: TEST }
}
layers {
  name: "loss"
  type: SOFTMAX_LOSS
  bottom: "ip1"
  bottom: "label"
  top: "loss"
  loss_weight: 2
}
"""

V1_LENET_DEPLOY = """
name: "LeNet"
input: "data"
input_dim: 64
input_dim: 1
input_dim: 28
input_dim: 28
layers {
  name: "conv1" type: CONVOLUTION bottom: "data" top: "conv1"
  blobs_lr: 1 blobs_lr: 2
  convolution_param { num_output: 20 kernel_size: 5 stride: 1
                      weight_filler { type: "xavier" } bias_filler { type: "constant" } }
}
layers {
  name: "pool1" type: POOLING bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 }
}
layers {
  name: "conv2" type: CONVOLUTION bottom: "pool1" top: "conv2"
  blobs_lr: 1 blobs_lr: 2
  convolution_param { num_output: 50 kernel_size: 5 stride: 1
                      weight_filler { type: "xavier" } bias_filler { type: "constant" } }
}
layers {
  name: "pool2" type: POOLING bottom: "conv2" top: "pool2"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 }
}
layers {
  name: "ip1" type: INNER_PRODUCT bottom: "pool2" top: "ip1"
  blobs_lr: 1 blobs_lr: 2
  inner_product_param { num_output: 500 weight_filler { type: "xavier" }
                        bias_filler { type: "constant" } }
}
layers { name: "relu1" type: RELU bottom: "ip1" top: "ip1" }
layers {
  name: "ip2" type: INNER_PRODUCT bottom: "ip1" top: "ip2"
  blobs_lr: 1 blobs_lr: 2
  inner_product_param { num_output: 10 weight_filler { type: "xavier" }
                        bias_filler { type: "constant" } }
}
layers { name: "prob" type: SOFTMAX bottom: "ip2" top: "prob" }
"""

# Caffe's own V0 test net (imagenet-style) shrunk: a padding layer before conv2, every V0
# field the upgrade knows on the layer types that accept it.
V0_NET = """
name: "CaffeNet"
input: "extra"
input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 4
layers {
  layer {
    name: "data" type: "data" source: "/home/jiayq/Data/ILSVRC12/train-leveldb"
    meanfile: "/home/jiayq/Data/ILSVRC12/image_mean.binaryproto"
    batchsize: 256 cropsize: 227 mirror: true scale: 0.5 rand_skip: 3
  }
  top: "data"
  top: "label"
}
layers {
  layer {
    name: "conv1" type: "conv" num_output: 96 kernelsize: 11 stride: 4 group: 1
    biasterm: false
    weight_filler { type: "gaussian" std: 0.01 }
    bias_filler { type: "constant" value: 0. }
    blobs_lr: 1. blobs_lr: 2. weight_decay: 1. weight_decay: 0.
  }
  bottom: "data"
  top: "conv1"
}
layers { layer { name: "relu1" type: "relu" } bottom: "conv1" top: "conv1" }
layers {
  layer { name: "pool1" type: "pool" pool: AVE kernelsize: 3 stride: 2 }
  bottom: "conv1"
  top: "pool1"
}
layers {
  layer { name: "norm1" type: "lrn" local_size: 5 alpha: 0.0001 beta: 0.75 k: 2 }
  bottom: "pool1"
  top: "norm1"
}
layers { layer { name: "pad2" type: "padding" pad: 2 } bottom: "norm1" top: "pad2" }
layers {
  layer { name: "conv2" type: "conv" num_output: 256 group: 2 kernelsize: 5 }
  bottom: "pad2"
  top: "conv2"
}
layers {
  layer { name: "fc8" type: "innerproduct" num_output: 1000
          weight_filler { type: "gaussian" std: 0.01 } }
  bottom: "conv2"
  top: "fc8"
}
layers { layer { name: "drop" type: "dropout" dropout_ratio: 0.4 } bottom: "fc8" top: "fc8" }
layers {
  layer { name: "loss" type: "softmax_loss" }
  bottom: "fc8"
  bottom: "label"
}
"""


class LogLines(logging.Handler):
    """Collects cct's log records as (level letter, Caffe source:line, message)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelname[0], getattr(record, "caffe_src", None),
                           record.getMessage()))


@pytest.fixture
def log_lines():
    handler = LogLines()
    logger = logging.getLogger("cct")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def parse(text: str) -> caffe_pb2.NetParameter:
    return text_format.Parse(text, caffe_pb2.NetParameter())


def by_name(net, name, index=0):
    return [lp for lp in net.layer if lp.name == name][index]


# ------------------------------------------------------------------------------------------------
# V1 -> current
# ------------------------------------------------------------------------------------------------
def test_v1_lenet_upgraded_field_by_field(log_lines):
    net = net_from_text(V1_LENET_TRAIN_TEST, "lenet_v1.prototxt")
    assert len(net.layers) == 0
    assert [lp.name for lp in net.layer] == ["mnist", "mnist", "conv1", "pool1", "ip1", "relu1",
                                             "accuracy", "loss"]
    assert [lp.type for lp in net.layer] == ["Data", "Data", "Convolution", "Pooling",
                                             "InnerProduct", "ReLU", "Accuracy",
                                             "SoftmaxWithLoss"]
    train, test = net.layer[0], net.layer[1]
    assert list(train.top) == ["data", "label"]
    assert train.include[0].phase == caffe_pb2.TRAIN and test.include[0].phase == caffe_pb2.TEST
    # The data-transformation upgrade ran before V1 -> V2: scale/mirror now in transform_param.
    assert train.transform_param.scale == pytest.approx(0.00390625)
    assert not train.data_param.HasField("scale")
    assert train.data_param.source == "examples/mnist/mnist_train_lmdb"
    assert train.data_param.batch_size == 64
    assert train.data_param.backend == caffe_pb2.DataParameter.LMDB
    assert test.transform_param.mirror is True and not test.data_param.HasField("mirror")
    assert not train.transform_param.HasField("mirror")

    conv1 = by_name(net, "conv1")
    assert list(conv1.bottom) == ["data"] and list(conv1.top) == ["conv1"]
    assert [(p.lr_mult, p.decay_mult) for p in conv1.param] == [(1, 1), (2, 0)]
    assert conv1.convolution_param.num_output == 20
    assert list(conv1.convolution_param.kernel_size) == [5]
    assert list(conv1.convolution_param.stride) == [1]
    assert conv1.convolution_param.weight_filler.type == "xavier"
    assert conv1.convolution_param.bias_filler.type == "constant"
    ip1 = by_name(net, "ip1")
    assert [p.lr_mult for p in ip1.param] == [1, 2]
    assert not any(p.HasField("decay_mult") for p in ip1.param)
    assert ip1.inner_product_param.num_output == 500
    pool1 = by_name(net, "pool1")
    assert pool1.pooling_param.pool == caffe_pb2.PoolingParameter.MAX
    assert pool1.pooling_param.kernel_size == 2 and pool1.pooling_param.stride == 2
    assert list(by_name(net, "relu1").top) == ["ip1"]
    assert list(by_name(net, "loss").loss_weight) == [2.0]
    assert list(by_name(net, "accuracy").bottom) == ["ip1", "label"]

    messages = [(lvl, src, msg) for lvl, src, msg in log_lines if src.startswith("upgrade")]
    assert messages == [
        ("I", "upgrade_proto.cpp:44", "Attempting to upgrade input file specified using "
         "deprecated transformation parameters: lenet_v1.prototxt"),
        ("I", "upgrade_proto.cpp:47", "Successfully upgraded file specified using deprecated "
         "data transformation parameters."),
        ("W", "upgrade_proto.cpp:49", "Note that future Caffe releases will only support "
         "transform_param messages for transformation fields."),
        ("I", "upgrade_proto.cpp:53", "Attempting to upgrade input file specified using "
         "deprecated V1LayerParameter: lenet_v1.prototxt"),
        ("I", "upgrade_proto.cpp:61", "Successfully upgraded file specified using deprecated "
         "V1LayerParameter"),
    ]


def test_v1_layer_type_table_covers_every_enum_value():
    for value in caffe_pb2.V1LayerParameter.LayerType.values():
        assert value in upgrade.V1_LAYER_TYPES
    expected = {"CONVOLUTION": "Convolution", "SOFTMAX_LOSS": "SoftmaxWithLoss",
                "INNER_PRODUCT": "InnerProduct", "DATA": "Data", "IMAGE_DATA": "ImageData",
                "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output", "TANH": "TanH",
                "ABSVAL": "AbsVal", "BNLL": "BNLL", "LRN": "LRN", "MVN": "MVN",
                "IM2COL": "Im2col", "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss",
                "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss", "NONE": "",
                "DUMMY_DATA": "DummyData", "MEMORY_DATA": "MemoryData",
                "WINDOW_DATA": "WindowData", "DECONVOLUTION": "Deconvolution"}
    for name, type_string in expected.items():
        layer_type = caffe_pb2.V1LayerParameter.LayerType.Value(name)
        v1 = caffe_pb2.V1LayerParameter(name="x", type=layer_type)
        layer, complete = upgrade.upgrade_v1_layer(v1)
        assert complete and layer.type == type_string


def test_v1_param_names_share_modes_blobs_and_every_param_message():
    v1 = caffe_pb2.V1LayerParameter(name="ip", type=caffe_pb2.V1LayerParameter.INNER_PRODUCT)
    v1.param.extend(["w", "b"])
    v1.blob_share_mode.extend([caffe_pb2.V1LayerParameter.PERMISSIVE])
    v1.blobs_lr.extend([1, 2, 3])
    v1.weight_decay.extend([0.5])
    blob = v1.blobs.add()
    blob.shape.dim.extend([2, 3])
    blob.data.extend(np.arange(6, dtype=np.float32))
    param_messages = [f.name for f in caffe_pb2.V1LayerParameter.DESCRIPTOR.fields
                      if f.name.endswith("_param")]
    assert len(param_messages) == 30
    for name in param_messages:
        getattr(v1, name).SetInParent()
    v1.inner_product_param.num_output = 7
    layer, complete = upgrade.upgrade_v1_layer(v1)
    assert complete
    assert [p.name for p in layer.param] == ["w", "b", ""]
    assert layer.param[0].share_mode == caffe_pb2.ParamSpec.PERMISSIVE
    assert not layer.param[1].HasField("share_mode")
    assert [p.lr_mult for p in layer.param] == [1, 2, 3]
    assert layer.param[0].decay_mult == 0.5 and not layer.param[1].HasField("decay_mult")
    assert list(layer.blobs[0].shape.dim) == [2, 3]
    assert list(layer.blobs[0].data) == list(range(6))
    for name in param_messages:
        assert layer.HasField(name), name
    assert layer.inner_product_param.num_output == 7


def test_image_and_window_data_transform_fields_move(log_lines):
    net = net_from_text("""
        layers { name: "img" type: IMAGE_DATA top: "d" top: "l"
                 image_data_param { source: "list.txt" batch_size: 2 mean_file: "m.binaryproto"
                                    crop_size: 7 mirror: true scale: 0.25 } }
        layers { name: "win" type: WINDOW_DATA top: "w" top: "wl"
                 window_data_param { source: "w.txt" crop_size: 9 } }
        layers { name: "plain" type: DATA top: "p" top: "pl"
                 data_param { source: "db" batch_size: 4 }
                 transform_param { scale: 3 } }
    """)
    img, win, plain = net.layer
    assert img.type == "ImageData"
    tp = img.transform_param
    assert (tp.mean_file, tp.crop_size, tp.mirror, tp.scale) == ("m.binaryproto", 7, True, 0.25)
    for f in ("mean_file", "crop_size", "mirror", "scale"):
        assert not img.image_data_param.HasField(f)
    assert img.image_data_param.source == "list.txt"
    assert win.type == "WindowData" and win.transform_param.crop_size == 9
    assert not win.window_data_param.HasField("crop_size")
    assert plain.transform_param.scale == 3 and plain.data_param.batch_size == 4


def test_net_using_both_layer_and_layers_is_refused(tmp_path):
    path = tmp_path / "mixed.prototxt"
    path.write_text('layer { name: "a" type: "ReLU" bottom: "x" top: "x" }\n'
                    'layers { name: "b" type: RELU bottom: "x" top: "x" }\n')
    with pytest.raises(ProtoError, match=r"mixed\.prototxt.*both 'layer'.*'layers'"):
        read_net_text(str(path))


def test_current_format_nets_are_left_alone(caffe_zoo):
    path = caffe_zoo / "examples" / "mnist" / "lenet_train_test.prototxt"
    original = text_format.Parse(path.read_text(), caffe_pb2.NetParameter())
    assert not upgrade.net_needs_upgrade(original)
    assert read_net_text(str(path)) == original


def test_v1_caffemodel_read_binary(tmp_path):
    net = parse(V1_LENET_DEPLOY)
    w = net.layers[0].blobs.add()
    w.num, w.channels, w.height, w.width = 20, 1, 5, 5
    w.data.extend(np.linspace(-1, 1, 500, dtype=np.float32))
    path = tmp_path / "lenet_v1.caffemodel"
    path.write_bytes(net.SerializeToString())
    for read in (read_net_binary, read_net):
        upgraded = read(str(path))
        assert upgraded.layer[0].type == "Input" and upgraded.layer[1].name == "conv1"
        blob = upgraded.layer[1].blobs[0]
        assert (blob.num, blob.channels, blob.height, blob.width) == (20, 1, 5, 5)
        assert np.allclose(blob.data, np.linspace(-1, 1, 500))


# ------------------------------------------------------------------------------------------------
# V0 -> V1 -> current
# ------------------------------------------------------------------------------------------------
def test_v0_net_upgraded_field_by_field(log_lines):
    net = net_from_text(V0_NET, "caffenet_v0.prototxt")
    assert net.name == "CaffeNet"
    assert not len(net.layers) and not len(net.input) and not len(net.input_dim)
    assert [lp.name for lp in net.layer] == ["input", "data", "conv1", "relu1", "pool1",
                                             "norm1", "conv2", "fc8", "drop", "loss"]
    assert [lp.type for lp in net.layer] == ["Input", "Data", "Convolution", "ReLU", "Pooling",
                                             "LRN", "Convolution", "InnerProduct", "Dropout",
                                             "SoftmaxWithLoss"]
    inp = net.layer[0]
    assert list(inp.top) == ["extra"] and list(inp.input_param.shape[0].dim) == [1, 2, 3, 4]
    data = by_name(net, "data")
    assert data.data_param.source == "/home/jiayq/Data/ILSVRC12/train-leveldb"
    assert data.data_param.batch_size == 256 and data.data_param.rand_skip == 3
    tp = data.transform_param
    assert tp.mean_file == "/home/jiayq/Data/ILSVRC12/image_mean.binaryproto"
    assert (tp.crop_size, tp.mirror, tp.scale) == (227, True, 0.5)
    assert list(data.top) == ["data", "label"]
    conv1 = by_name(net, "conv1").convolution_param
    assert conv1.num_output == 96 and list(conv1.kernel_size) == [11]
    assert list(conv1.stride) == [4] and conv1.group == 1 and conv1.bias_term is False
    assert not len(conv1.pad)
    assert conv1.weight_filler.type == "gaussian"
    assert conv1.weight_filler.std == pytest.approx(0.01)
    assert conv1.bias_filler.type == "constant"
    assert [(p.lr_mult, p.decay_mult) for p in by_name(net, "conv1").param] == [(1, 1), (2, 0)]
    pool1 = by_name(net, "pool1").pooling_param
    assert pool1.pool == caffe_pb2.PoolingParameter.AVE
    assert (pool1.kernel_size, pool1.stride) == (3, 2)
    lrn = by_name(net, "norm1").lrn_param
    assert lrn.local_size == 5 and lrn.k == 2
    assert lrn.alpha == pytest.approx(1e-4) and lrn.beta == pytest.approx(0.75)
    # The padding layer is gone: its pad moved into conv2, which reads its bottom directly.
    conv2 = by_name(net, "conv2")
    assert list(conv2.bottom) == ["norm1"]
    assert list(conv2.convolution_param.pad) == [2]
    assert conv2.convolution_param.group == 2
    assert by_name(net, "fc8").inner_product_param.num_output == 1000
    assert by_name(net, "drop").dropout_param.dropout_ratio == pytest.approx(0.4)
    assert list(by_name(net, "loss").bottom) == ["fc8", "label"]

    sources = [src for _, src, _ in log_lines]
    assert sources == ["upgrade_proto.cpp:26", "upgrade_proto.cpp:34", "upgrade_proto.cpp:37",
                       "upgrade_proto.cpp:53", "upgrade_proto.cpp:61",
                       "upgrade_proto.cpp:67", "upgrade_proto.cpp:70", "upgrade_proto.cpp:72"]
    assert log_lines[0][2] == ("Attempting to upgrade input file specified using deprecated "
                               "V0LayerParameter: caffenet_v0.prototxt")
    assert log_lines[1][2] == ("Successfully upgraded file specified using deprecated "
                               "V0LayerParameter")
    assert log_lines[2][0] == "W" and "V0NetParameter" in log_lines[2][2]


def test_v0_padding_before_pool_and_drops_other_net_fields():
    net = net_from_text("""
        name: "n" force_backward: true debug_info: true
        input: "x" input_dim: 1 input_dim: 1 input_dim: 4 input_dim: 4
        layers { layer { name: "pad" type: "padding" pad: 1 } bottom: "x" top: "xp" }
        layers { layer { name: "pool" type: "pool" kernelsize: 2 } bottom: "xp" top: "y" }
    """)
    assert net.force_backward is True
    # UpgradeV0Net keeps only name, layers, inputs and force_backward.
    assert not net.HasField("debug_info")
    pool = by_name(net, "pool")
    assert list(pool.bottom) == ["x"]
    assert pool.pooling_param.pad == 1 and pool.pooling_param.kernel_size == 2


def test_v0_field_meaningless_for_type_is_dropped_with_caffe_error(log_lines):
    net = net_from_text("""
        input: "x" input_dim: 1 input_dim: 1 input_dim: 1 input_dim: 1
        layers { layer { name: "r" type: "relu" num_output: 3 kernelsize: 2 } bottom: "x"
                 top: "x" }
    """)
    assert by_name(net, "r").type == "ReLU"
    errors = [msg for lvl, _, msg in log_lines if lvl == "E"]
    assert errors[0].startswith("Unknown parameter num_output for layer type relu")
    assert errors[1].startswith("Unknown parameter kernelsize for layer type relu")
    assert errors[2].startswith("Warning: had one or more problems upgrading V0NetParameter")
    assert not any("Successfully upgraded file specified using deprecated V0" in msg
                   for _, _, msg in log_lines)


@pytest.mark.parametrize("v0_layer, new_type, expected", [
    ('type: "images" source: "l.txt" batchsize: 3 rand_skip: 2 shuffle_images: true '
     'new_height: 8 new_width: 9', "ImageData",
     {"image_data_param": 'source: "l.txt" batch_size: 3 rand_skip: 2 shuffle: true '
                          'new_height: 8 new_width: 9'}),
    ('type: "window_data" source: "w.txt" batchsize: 4 det_fg_threshold: 0.6 '
     'det_bg_threshold: 0.4 det_fg_fraction: 0.3 det_context_pad: 16 det_crop_mode: "square"',
     "WindowData",
     {"window_data_param": 'source: "w.txt" batch_size: 4 fg_threshold: 0.6 bg_threshold: 0.4 '
                           'fg_fraction: 0.3 context_pad: 16 crop_mode: "square"'}),
    ('type: "hdf5_data" source: "h.txt" batchsize: 5', "HDF5Data",
     {"hdf5_data_param": 'source: "h.txt" batch_size: 5'}),
    ('type: "infogain_loss" source: "H.binaryproto"', "InfogainLoss",
     {"infogain_loss_param": 'source: "H.binaryproto"'}),
    ('type: "concat" concat_dim: 2', "Concat", {"concat_param": "concat_dim: 2"}),
    ('type: "hdf5_output" hdf5_output_param { file_name: "out.h5" }', "HDF5Output",
     {"hdf5_output_param": 'file_name: "out.h5"'}),
    ('type: "innerproduct" num_output: 3 biasterm: false bias_filler { value: 1 }',
     "InnerProduct",
     {"inner_product_param": "num_output: 3 bias_term: false bias_filler { value: 1 }"}),
])
def test_v0_fields_land_in_their_params(v0_layer, new_type, expected):
    net = net_from_text(f'layers {{ layer {{ name: "l" {v0_layer} }} top: "t" }}')
    layer = net.layer[0]
    assert layer.type == new_type
    for param, text in expected.items():
        want = text_format.Parse(text, type(getattr(layer, param))())
        assert getattr(layer, param) == want, param


@pytest.mark.parametrize("body, match", [
    ('layers { layer { name: "wat" type: "frobnicate" } top: "y" }',
     r"v0\.prototxt: V0 layer 'wat' has type 'frobnicate'"),
    ('layers { layer { name: "pad" type: "padding" pad: 1 } bottom: "x" top: "xp" }\n'
     'layers { layer { name: "r" type: "relu" } bottom: "xp" top: "y" }',
     r"v0\.prototxt: Padding layer 'pad' feeds V0 layer 'r' of type 'relu'"),
    ('layers { layer { name: "c" type: "conv" } bottom: "nowhere" top: "y" }',
     r"v0\.prototxt: V0 layer 'c' takes bottom 'nowhere'"),
])
def test_v0_upgrade_failures_name_file_and_layer(tmp_path, body, match):
    path = tmp_path / "v0.prototxt"
    path.write_text('input: "x" input_dim: 1 input_dim: 1 input_dim: 4 input_dim: 4\n' + body)
    with pytest.raises(ProtoError, match=match):
        read_net_text(str(path))


# ------------------------------------------------------------------------------------------------
# Input fields
# ------------------------------------------------------------------------------------------------
def test_input_dim_fields_become_input_layer_in_front(log_lines):
    net = net_from_text("""
        input: "data" input_dim: 10 input_dim: 3 input_dim: 227 input_dim: 227
        input: "rois" input_dim: 1 input_dim: 5 input_dim: 1 input_dim: 1
        layer { name: "relu" type: "ReLU" bottom: "data" top: "data" }
    """, "deploy.prototxt")
    assert not len(net.input) and not len(net.input_dim) and not len(net.input_shape)
    inp = net.layer[0]
    assert (inp.name, inp.type, list(inp.top)) == ("input", "Input", ["data", "rois"])
    assert [list(s.dim) for s in inp.input_param.shape] == [[10, 3, 227, 227], [1, 5, 1, 1]]
    assert net.layer[1].name == "relu"
    assert log_lines == [
        ("I", "upgrade_proto.cpp:67", "Attempting to upgrade input file specified using "
         "deprecated input fields: deploy.prototxt"),
        ("I", "upgrade_proto.cpp:70", "Successfully upgraded file specified using deprecated "
         "input fields."),
        ("W", "upgrade_proto.cpp:72", "Note that future Caffe releases will only support input "
         "layers and not input fields."),
    ]


def test_input_shape_fields_preferred_over_input_dim():
    net = net_from_text("""
        input: "data" input_shape { dim: 2 dim: 3 } input_dim: 9 input_dim: 9
        layer { name: "relu" type: "ReLU" bottom: "data" top: "r" }
    """)
    assert [list(s.dim) for s in net.layer[0].input_param.shape] == [[2, 3]]


def test_input_without_shape_is_dropped_like_an_old_caffemodel():
    net = net_from_text('input: "data"\nlayer { name: "ip" type: "InnerProduct" }')
    assert [lp.name for lp in net.layer] == ["ip"] and not len(net.input)


@pytest.mark.parametrize("fields, match", [
    ('input: "a" input: "b" input_shape { dim: 1 }', r"2 net input\(s\).*1 input_shape"),
    ('input: "a" input_dim: 1 input_dim: 2', r"need 4 input_dim values.*got 2"),
])
def test_input_fields_too_few_shapes(tmp_path, fields, match):
    path = tmp_path / "in.prototxt"
    path.write_text(fields)
    with pytest.raises(ProtoError, match=r"in\.prototxt: .*" + match):
        read_net_text(str(path))


# ------------------------------------------------------------------------------------------------
# BatchNorm
# ------------------------------------------------------------------------------------------------
def test_batch_norm_three_params_get_zero_lr_and_decay(log_lines):
    net = net_from_text("""
        layer { name: "bn" type: "BatchNorm" bottom: "x" top: "x"
                param { lr_mult: 0 } param { lr_mult: 0 name: "shared_var" }
                param { lr_mult: 1 decay_mult: 1 } }
        layer { name: "bn1" type: "BatchNorm" bottom: "x" top: "y" param { lr_mult: 0 } }
        layer { name: "bn0" type: "BatchNorm" bottom: "y" top: "z" }
        layer { name: "scale" type: "Scale" bottom: "z" top: "z"
                param { lr_mult: 1 } param { lr_mult: 1 } param { lr_mult: 1 } }
    """, "bn.prototxt")
    bn = by_name(net, "bn")
    assert [(p.lr_mult, p.decay_mult) for p in bn.param] == [(0, 0)] * 3
    assert bn.param[1].name == "shared_var"
    assert [(p.lr_mult, p.HasField("decay_mult")) for p in by_name(net, "bn1").param] == \
        [(0, False)]
    assert not len(by_name(net, "bn0").param)
    assert [p.lr_mult for p in by_name(net, "scale").param] == [1, 1, 1]
    assert log_lines == [
        ("I", "upgrade_proto.cpp:77", "Attempting to upgrade batch norm layers using deprecated "
         "params: bn.prototxt"),
        ("I", "upgrade_proto.cpp:80", "Successfully upgraded batch norm layers using deprecated "
         "params."),
    ]


def test_zoo_batch_norm_net_upgraded(caffe_zoo):
    path = caffe_zoo / "examples" / "cifar10" / "cifar10_full_sigmoid_train_test_bn.prototxt"
    net = read_net_text(str(path))
    bns = [lp for lp in net.layer if lp.type == "BatchNorm"]
    assert len(bns) == 3
    for lp in bns:
        assert [(p.lr_mult, p.decay_mult) for p in lp.param] == [(0, 0)] * 3


def test_upgrade_order_matches_caffe(log_lines):
    # A V1 net with data transform fields, input fields and a BatchNorm-like layer: every
    # upgrade runs once, in UpgradeNetAsNeeded's order.
    net_from_text("""
        input: "x" input_dim: 1 input_dim: 1 input_dim: 2 input_dim: 2
        layers { name: "d" type: DATA top: "a" top: "b" data_param { source: "s" mirror: true } }
        layers { name: "r" type: RELU bottom: "x" top: "x" }
    """)
    infos = [src for lvl, src, _ in log_lines if lvl == "I"]
    assert infos == ["upgrade_proto.cpp:44", "upgrade_proto.cpp:47", "upgrade_proto.cpp:53",
                     "upgrade_proto.cpp:61", "upgrade_proto.cpp:67", "upgrade_proto.cpp:70"]


# ------------------------------------------------------------------------------------------------
# A V1 LeNet builds into the same net as the current-format one
# ------------------------------------------------------------------------------------------------
def test_upgraded_v1_lenet_builds_like_current_lenet(caffe_zoo, tmp_path):
    import cct.api
    from cct.layers import LAYER_REGISTRY
    from cct.net import TEST, Net

    missing = {"Input", "Convolution", "Pooling", "InnerProduct", "ReLU",
               "Softmax"} - set(LAYER_REGISTRY)
    if missing:
        pytest.skip(f"layer types not implemented yet: {sorted(missing)}")
    current = Net(read_net_text(str(caffe_zoo / "examples" / "mnist" / "lenet.prototxt")),
                  phase=TEST)
    upgraded = Net(net_from_text(V1_LENET_DEPLOY, "lenet_v1_deploy.prototxt"), phase=TEST)
    assert upgraded.blob_names == current.blob_names
    assert [b.shape for b in upgraded.blobs_list] == [b.shape for b in current.blobs_list]
    shapes = lambda net: [[b.shape for b in layer.blobs] for layer in net.layers]  # noqa: E731
    assert shapes(upgraded) == shapes(current)
    path = tmp_path / "lenet_v1_deploy.prototxt"
    path.write_text(V1_LENET_DEPLOY)
    via_api = cct.api.Net(str(path), TEST)
    assert [b.shape for b in via_api.blobs_list] == [b.shape for b in current.blobs_list]


# ------------------------------------------------------------------------------------------------
# Solvers
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("enum_name, type_string", [
    ("SGD", "SGD"), ("NESTEROV", "Nesterov"), ("ADAGRAD", "AdaGrad"), ("RMSPROP", "RMSProp"),
    ("ADADELTA", "AdaDelta"), ("ADAM", "Adam")])
def test_solver_type_enum_becomes_type_string(tmp_path, log_lines, enum_name, type_string):
    path = tmp_path / "solver.prototxt"
    path.write_text(f'net: "n.prototxt"\nbase_lr: 0.1\nsolver_type: {enum_name}\n'
                    f'snapshot_prefix: "snap"\n')
    solver = read_solver_text(str(path))
    assert solver.type == type_string and not solver.HasField("solver_type")
    assert solver.base_lr == pytest.approx(0.1)
    assert log_lines == [
        ("I", "upgrade_proto.cpp:1084", "Attempting to upgrade input file specified using "
         f"deprecated 'solver_type' field (enum)': {path}"),
        ("I", "upgrade_proto.cpp:1091", "Successfully upgraded file specified using deprecated "
         "'solver_type' field (enum) to 'type' field (string)."),
        ("W", "upgrade_proto.cpp:1093", "Note that future Caffe releases will only support "
         "'type' field (string) for a solver's type."),
    ]


@pytest.mark.parametrize("type_string", ["Adam", "SGD"])
def test_solver_with_both_type_fields_is_refused(tmp_path, type_string):
    path = tmp_path / "solver.prototxt"
    path.write_text(f'solver_type: SGD\ntype: "{type_string}"\n')
    with pytest.raises(ProtoError, match=r"solver\.prototxt: Failed to upgrade solver: old "
                                         r"solver_type field \(enum\) and new type field"):
        read_solver_text(str(path))


def test_current_solver_left_alone(log_lines):
    solver = caffe_pb2.SolverParameter(type="Adam", base_lr=0.5)
    assert upgrade.upgrade_solver(solver, "s.prototxt") == \
        caffe_pb2.SolverParameter(type="Adam", base_lr=0.5)
    assert log_lines == []


def test_snapshot_prefix_defaults_from_solver_file(tmp_path, log_lines):
    path = tmp_path / "lenet_solver.prototxt"
    path.write_text('type: "SGD"\n')
    assert read_solver_text(str(path)).snapshot_prefix == str(tmp_path / "lenet_solver")
    assert log_lines[-1] == ("I", "upgrade_proto.cpp:1108", "snapshot_prefix was not specified "
                             f"and is set to {tmp_path / 'lenet_solver'}")
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    path.write_text(f'snapshot_prefix: "{snaps}"\n')
    assert read_solver_text(str(path)).snapshot_prefix == str(snaps / "lenet_solver")
    assert log_lines[-1][1] == "upgrade_proto.cpp:1113"
    path.write_text(f'snapshot_prefix: "{snaps}/run1"\n')
    assert read_solver_text(str(path)).snapshot_prefix == f"{snaps}/run1"


def test_snapshot_prefix_default_matches_caffes_log(caffe_fixtures, monkeypatch, log_lines):
    numerics = caffe_fixtures / "numerics"
    caffe_line = next(line for line in (numerics / "lenet_sgd_step.log").read_text().splitlines()
                      if "snapshot_prefix was not specified" in line)
    monkeypatch.chdir(numerics)
    solver = read_solver_text("lenet_sgd_solver.prototxt")
    assert solver.snapshot_prefix == "lenet_sgd_solver"
    level, src, msg = log_lines[-1]
    assert caffe_line.endswith(f"{src}] {msg}")
