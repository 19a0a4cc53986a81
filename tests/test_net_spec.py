"""NetSpec (cct.net_spec): the prototxt pycaffe's NetSpec writes, names, parameters, errors."""
import importlib

import pytest
from google.protobuf import text_format

import cct
from cct import layers as L
from cct import params as P
from cct.errors import CCTError
from cct.io.prototxt import net_from_text
from cct.net_spec import NetSpecError, Top, assign_proto, param_name_dict
from cct.proto import caffe_pb2


def reparsed(net):
    """The net after a trip through its prototxt text, parsed as cct parses prototxt files."""
    return net_from_text(str(net))


# -- the nets of pycaffe's own test_net_spec.py -------------------------------------------------

def lenet(batch_size):
    n = cct.NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[batch_size, 1, 28, 28]),
                                         dict(dim=[batch_size, 1, 1, 1])],
                                  transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20,
                            weight_filler=dict(type='xavier'))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50,
                            weight_filler=dict(type='xavier'))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type='xavier'))
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2 = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type='xavier'))
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    return n.to_proto()


def anon_lenet(batch_size):
    data, label = L.DummyData(shape=[dict(dim=[batch_size, 1, 28, 28]),
                                     dict(dim=[batch_size, 1, 1, 1])],
                              transform_param=dict(scale=1. / 255), ntop=2)
    conv1 = L.Convolution(data, kernel_size=5, num_output=20, weight_filler=dict(type='xavier'))
    pool1 = L.Pooling(conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    conv2 = L.Convolution(pool1, kernel_size=5, num_output=50, weight_filler=dict(type='xavier'))
    pool2 = L.Pooling(conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    ip1 = L.InnerProduct(pool2, num_output=500, weight_filler=dict(type='xavier'))
    relu1 = L.ReLU(ip1, in_place=True)
    ip2 = L.InnerProduct(relu1, num_output=10, weight_filler=dict(type='xavier'))
    loss = L.SoftmaxWithLoss(ip2, label)
    return loss.to_proto()


def silent_net():
    n = cct.NetSpec()
    n.data, n.data2 = L.DummyData(shape=dict(dim=3), ntop=2)
    n.silence_data = L.Silence(n.data, ntop=0)
    n.silence_data2 = L.Silence(n.data2, ntop=0)
    return n.to_proto()


def test_lenet_names_and_in_place():
    net = lenet(50)
    assert [l.name for l in net.layer] == ["data", "conv1", "pool1", "conv2", "pool2", "ip1",
                                           "relu1", "ip2", "loss"]
    assert list(net.layer[0].top) == ["data", "label"]
    relu = net.layer[6]
    assert relu.type == "ReLU" and list(relu.bottom) == list(relu.top) == ["ip1"]
    assert list(net.layer[7].bottom) == ["ip1"]
    assert list(net.layer[8].bottom) == ["ip2", "label"]
    assert [list(s.dim) for s in net.layer[0].dummy_data_param.shape] == [[50, 1, 28, 28],
                                                                         [50, 1, 1, 1]]
    assert net.layer[2].pooling_param.pool == caffe_pb2.PoolingParameter.MAX
    assert reparsed(net) == net


def test_anonymous_lenet_gets_pycaffe_auto_names():
    net = anon_lenet(50)
    got = [(l.name, list(l.bottom), list(l.top)) for l in net.layer]
    assert got == [
        ("DummyData1", [], ["DummyData1", "DummyData2"]),
        ("Convolution1", ["DummyData1"], ["Convolution1"]),
        ("Pooling1", ["Convolution1"], ["Pooling1"]),
        ("Convolution2", ["Pooling1"], ["Convolution2"]),
        ("Pooling2", ["Convolution2"], ["Pooling2"]),
        ("InnerProduct1", ["Pooling2"], ["InnerProduct1"]),
        ("ReLU1", ["InnerProduct1"], ["InnerProduct1"]),
        ("InnerProduct2", ["InnerProduct1"], ["InnerProduct2"]),
        ("SoftmaxWithLoss1", ["InnerProduct2", "DummyData2"], ["SoftmaxWithLoss1"]),
    ]
    assert reparsed(net) == net


def test_zero_top_layers_are_named_after_their_attribute():
    net = silent_net()
    assert [(l.name, l.type, list(l.bottom), list(l.top)) for l in net.layer] == [
        ("data", "DummyData", [], ["data", "data2"]),
        ("silence_data", "Silence", ["data"], []),
        ("silence_data2", "Silence", ["data2"], []),
    ]
    assert list(net.layer[0].dummy_data_param.shape[0].dim) == [3]
    assert isinstance(L.Silence(Top(None, 0), ntop=0), cct.net_spec.Function)


def test_non_top_input_raises_pycaffes_type_error():
    data = L.DummyData(ntop=2)
    with pytest.raises(TypeError, match=r"^Silence input 0 is not a Top \(type is <class "
                                        r"'tuple'>\)$"):
        L.Silence(data, ntop=0)
    L.Silence(*data, ntop=0)


def _needs_layers(*types):
    missing = [t for t in types if t not in cct.layer_type_list()]
    if missing:
        pytest.skip(f"layer types not implemented yet: {missing}")


def test_netspec_lenet_builds_a_net(tmp_path):
    _needs_layers("DummyData", "Convolution", "Pooling", "InnerProduct", "ReLU",
                  "SoftmaxWithLoss")
    for i, proto in enumerate((lenet(2), anon_lenet(2))):
        path = tmp_path / f"lenet{i}.prototxt"
        path.write_text(str(proto))
        net = cct.Net(str(path), cct.TEST)
        assert len(net.layers) == 9  # as in BVLC's test; the in-place ReLU makes no split


def test_netspec_zero_top_net_runs(tmp_path):
    _needs_layers("DummyData", "Silence")
    path = tmp_path / "silent.prototxt"
    path.write_text(str(silent_net()))
    assert len(cct.Net(str(path), cct.TEST).forward()) == 0


# -- LeNet of examples/mnist, as NetSpec can express it -------------------------------------------

def mnist_data(source, batch_size, phase):
    n = cct.NetSpec()
    n.data, n.label = L.Data(source=source, batch_size=batch_size, backend=P.Data.LMDB,
                             transform_param=dict(scale=0.00390625),
                             include=dict(phase=phase), ntop=2)
    n.mnist = n.data.fn  # a layer assigned by itself is named after its attribute
    return n.to_proto().layer[0]


def lenet_train_test():
    lr = [dict(lr_mult=1), dict(lr_mult=2)]
    fillers = dict(weight_filler=dict(type='xavier'), bias_filler=dict(type='constant'))
    n = cct.NetSpec()
    n.data, n.label = L.Data(ntop=2)  # stands for the two Data layers spliced in below
    n.conv1 = L.Convolution(n.data, param=lr, num_output=20, kernel_size=5, stride=1, **fillers)
    n.pool1 = L.Pooling(n.conv1, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    n.conv2 = L.Convolution(n.pool1, param=lr, num_output=50, kernel_size=5, stride=1,
                            **fillers)
    n.pool2 = L.Pooling(n.conv2, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    n.ip1 = L.InnerProduct(n.pool2, param=lr, num_output=500, **fillers)
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2 = L.InnerProduct(n.relu1, param=lr, num_output=10, **fillers)
    n.accuracy = L.Accuracy(n.ip2, n.label, include=dict(phase=cct.TEST))
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    body = n.to_proto()
    net = caffe_pb2.NetParameter(name="LeNet")
    net.layer.extend([mnist_data("examples/mnist/mnist_train_lmdb", 64, cct.TRAIN),
                      mnist_data("examples/mnist/mnist_test_lmdb", 100, cct.TEST)])
    net.layer.extend(body.layer[1:])
    return net


def test_lenet_train_test_matches_the_mnist_example(caffe_zoo):
    path = caffe_zoo / "examples" / "mnist" / "lenet_train_test.prototxt"
    expected = net_from_text(path.read_text(), str(path))
    built = lenet_train_test()
    assert built == expected, text_format.MessageToString(built)
    assert reparsed(built) == expected


def test_python_layer_matches_the_pycaffe_linreg_example(caffe_zoo):
    path = caffe_zoo / "examples" / "pycaffe" / "linreg.prototxt"
    expected = net_from_text(path.read_text(), str(path))
    n = cct.NetSpec()
    for name in ("x", "y"):
        n[name] = L.DummyData(shape=dict(dim=[10, 3, 2]), data_filler=dict(type='gaussian'))
    n.ipx = L.InnerProduct(n.x, num_output=10, weight_filler=dict(type='xavier'))
    n.ipy = L.InnerProduct(n.y, num_output=10, weight_filler=dict(type='xavier'))
    n.loss = L.Python(n.ipx, n.ipy, module='pyloss', layer='EuclideanLossLayer', loss_weight=1)
    built = n.to_proto()
    built.name = "LinearRegressionExample"
    assert built == expected
    loss = built.layer[-1]
    assert loss.python_param.module == "pyloss" and loss.python_param.layer == \
        "EuclideanLossLayer"
    assert list(loss.loss_weight) == [1.0]


# -- parameters -----------------------------------------------------------------------------------

def test_param_name_dict_follows_the_message_type_names():
    names = param_name_dict()
    assert names["Convolution"] == "convolution"
    assert names["InnerProduct"] == "inner_product"
    assert names["TanH"] == "tanh"
    assert names["HDF5Data"] == "hdf5_data"
    assert names["PReLU"] == "prelu"
    assert names["Python"] == "python"
    assert names["Input"] == "input"
    assert names["Transformation"] == "transform"
    assert "Deconvolution" not in names


def test_input_layer_and_repeated_fields():
    n = cct.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, 227, 227]))
    n.conv = L.Convolution(n.data, kernel_size=[3, 5], pad=(1, 2), num_output=4,
                           propagate_down=[False], loss_weight=[0.5],
                           exclude=[dict(stage=['deploy', 'x']), dict(phase=cct.TRAIN)])
    net = n.to_proto()
    assert net.layer[0].input_param.shape[0].dim == [1, 3, 227, 227]
    conv = net.layer[1]
    assert list(conv.convolution_param.kernel_size) == [3, 5]
    assert list(conv.convolution_param.pad) == [1, 2]
    assert list(conv.propagate_down) == [False] and list(conv.loss_weight) == [0.5]
    assert [list(r.stage) for r in conv.exclude] == [['deploy', 'x'], []]
    assert conv.exclude[1].phase == caffe_pb2.TRAIN
    assert reparsed(net) == net


def test_explicit_type_param_and_protobuf_messages():
    filler = caffe_pb2.FillerParameter(type="gaussian", std=0.01)
    top = L.Deconvolution(L.Input(shape=dict(dim=[1, 1, 4, 4])),
                          convolution_param=dict(num_output=2, kernel_size=4, stride=2,
                                                 weight_filler=filler))
    a = top.to_proto().layer[1]
    b = L.Deconvolution(L.Input(shape=dict(dim=[1, 1, 4, 4])), num_output=2, kernel_size=4,
                        stride=2, weight_filler=filler).to_proto().layer[1]
    assert a == b
    assert a.convolution_param.weight_filler == filler
    assert a.convolution_param.kernel_size == [4]


def test_params_give_enum_values():
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX
    assert P.Pooling.AVE == caffe_pb2.PoolingParameter.AVE
    assert P.Data.LMDB == caffe_pb2.DataParameter.LMDB
    assert P.Eltwise.SUM == caffe_pb2.EltwiseParameter.SUM
    with pytest.raises(CCTError, match=r"P.Pooling has no value 'MAXX'.*MAX, AVE, STOCHASTIC"):
        P.Pooling.MAXX
    with pytest.raises(CCTError, match=r"caffe_pb2 has no PoolParameter"):
        P.Pool.MAX


def test_assign_proto_like_pycaffe():
    layer = caffe_pb2.LayerParameter()
    assign_proto(layer, "top", "a")
    assign_proto(layer, "param", dict(lr_mult=3))
    assign_proto(layer, "convolution_param", dict(kernel_size=3, weight_filler=dict(std=2)))
    assign_proto(layer, "name", "x")
    assert list(layer.top) == ["a"] and layer.param[0].lr_mult == 3
    assert list(layer.convolution_param.kernel_size) == [3]
    assert layer.convolution_param.weight_filler.std == 2 and layer.name == "x"
    empty = caffe_pb2.LayerParameter()
    assign_proto(empty, "convolution_param", dict())
    assert not empty.HasField("convolution_param")


# -- names ----------------------------------------------------------------------------------------

def test_unassigned_intermediates_get_auto_names_shared_per_type():
    n = cct.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 2]))
    n.out = L.ReLU(L.InnerProduct(L.InnerProduct(n.data, num_output=3), num_output=2))
    names = [(l.name, list(l.top)) for l in n.to_proto().layer]
    assert names == [("data", ["data"]), ("InnerProduct1", ["InnerProduct1"]),
                     ("InnerProduct2", ["InnerProduct2"]), ("out", ["out"])]


def test_a_top_assigned_twice_takes_the_last_name_and_layers_are_not_repeated():
    n = cct.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 2]))
    n.first = n.second = L.TanH(n.data)
    n.out = L.Sigmoid(n.first)
    net = n.to_proto()
    assert [(l.name, list(l.top)) for l in net.layer] == [
        ("data", ["data"]), ("second", ["second"]), ("out", ["out"])]


def test_to_proto_of_several_tops_shares_their_layers():
    data = L.Input(shape=dict(dim=[1, 2]))
    a, b = L.ReLU(data), L.TanH(data)
    net = cct.to_proto(a, b)
    assert [(l.name, list(l.bottom), list(l.top)) for l in net.layer] == [
        ("Input1", [], ["Input1"]), ("ReLU1", ["Input1"], ["ReLU1"]),
        ("TanH1", ["Input1"], ["TanH1"])]


def test_item_access_and_missing_tops():
    n = cct.NetSpec()
    n["data"] = L.Input(shape=dict(dim=[1]))
    assert n["data"] is n.data
    with pytest.raises(AttributeError, match="NetSpec has no top 'nope'; assigned: data"):
        n.nope
    with pytest.raises(KeyError):
        n["nope"]
    assert not hasattr(n, "nope")


# -- errors ---------------------------------------------------------------------------------------

def test_unknown_keyword_names_the_layer_and_the_messages():
    n = cct.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, 8, 8]))
    n.conv1 = L.Convolution(n.data, num_ouput=3)
    with pytest.raises(NetSpecError, match=r"layer 'conv1' \(Convolution\): keyword 'num_ouput'"
                                           r" is a field of neither ConvolutionParameter nor "
                                           r"LayerParameter.*'num_output'"):
        n.to_proto()
    with pytest.raises(AttributeError):  # what pycaffe raises
        n.to_proto()


def test_keyword_of_a_type_without_param_message():
    n = cct.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3]))
    n.loss = L.SoftmaxWithLoss(n.data, n.data, normalize=False)
    with pytest.raises(CCTError, match=r"'loss' \(SoftmaxWithLoss\): keyword 'normalize' is no "
                                       r"LayerParameter field.*<name>_param=dict"):
        n.to_proto()


def test_nested_errors_name_the_field_path():
    n = cct.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, 8, 8]))
    n.conv1 = L.Convolution(n.data, weight_filler=dict(tipe='xavier'))
    with pytest.raises(CCTError, match=r"conv1' \(Convolution\)\.convolution_param\."
                                       r"weight_filler \(FillerParameter\) has no field 'tipe'"
                                       r".*'type'"):
        n.to_proto()
    n.conv1 = L.Convolution(n.data, kernel_size='a')
    with pytest.raises(CCTError, match=r"cannot set .*convolution_param.kernel_size = 'a'"):
        n.to_proto()
    n.conv1 = L.Convolution(n.data, weight_filler='xavier')
    with pytest.raises(CCTError, match=r"weight_filler is a FillerParameter message; give a "
                                       r"dict"):
        n.to_proto()


def test_assigning_a_tuple_of_tops_says_to_unpack():
    n = cct.NetSpec()
    with pytest.raises(TypeError, match=r"NetSpec.data: expected a Top.*got tuple; the layer "
                                        r"has 2 tops, unpack them"):
        n.data = L.Data(ntop=2)


# -- cct.layers is both the NetSpec pseudo-module and the layer package ---------------------------

def test_cct_layers_still_reaches_the_layer_package():
    base = importlib.import_module("cct.layers.base")
    assert cct.layers.base is base
    assert cct.layers.Layer is base.Layer
    import cct.layers.base as via_import
    assert via_import is base
    assert isinstance(L.Convolution(), Top)
