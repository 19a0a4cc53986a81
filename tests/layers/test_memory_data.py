"""MemoryData and pycaffe's Net.set_input_arrays: batches in order with wrap-around, and the
checks pycaffe makes on the arrays."""
import numpy as np
import pytest

import cct as caffe
from cct.errors import CCTError, NetError
from cct.io.prototxt import net_from_text
from cct.net import Net

NET = '''
layer { name: "mem" type: "MemoryData" top: "data" top: "label"
  memory_data_param { batch_size: 2 channels: 1 height: 2 width: 3 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
'''


def make_net(text=NET):
    return Net(net_from_text(text), phase=caffe.TRAIN)


def arrays(n=6):
    data = np.arange(n * 6, dtype=np.float32).reshape(n, 1, 2, 3)
    return data, (np.arange(n) % 3).astype(np.float32)


def test_batches_in_order_with_wrap_around_and_caffes_label_shape():
    net = make_net()
    data, labels = arrays(6)
    net.set_input_arrays(data, labels)
    seen = []
    for _ in range(4):
        loss = net.forward()["loss"]
        assert np.isfinite(loss)
        seen.append(net.blobs["data"].data[:, 0, 0, 0].copy())
        assert net.blobs["label"].shape == (2, 1, 1, 1)  # Caffe's Forward reshapes it so
    np.testing.assert_array_equal(np.concatenate(seen), data[[0, 1, 2, 3, 4, 5, 0, 1], 0, 0, 0])
    net.backward()
    assert np.any(net.params["ip"][0].diff != 0)


def test_labels_may_be_n_by_1_by_1_by_1_and_the_layer_can_be_named():
    net = make_net()
    data, labels = arrays(4)
    net.set_input_arrays(data, labels.reshape(4, 1, 1, 1), layer="mem")
    net.forward()
    np.testing.assert_array_equal(net.blobs["label"].data.ravel(), labels[:2])
    with pytest.raises(NetError, match="layer 'ip' is of type InnerProduct, not MemoryData"):
        net.set_input_arrays(data, labels, layer="ip")


@pytest.mark.parametrize("data,labels,message", [
    (np.zeros((4, 1, 2, 3)), np.zeros(4, np.float32), "must be float32, got float64"),
    (np.zeros((4, 1, 3, 2), np.float32).transpose(0, 1, 3, 2), np.zeros(4, np.float32),
     "must be C contiguous"),
    (np.zeros((4, 6), np.float32), np.zeros(4, np.float32), "must be 4-d"),
    (np.zeros((4, 2, 2, 3), np.float32), np.zeros(4, np.float32),
     r"rows of shape \(2, 2, 3\), the layer expects .* \(1, 2, 3\)"),
    (np.zeros((3, 1, 2, 3), np.float32), np.zeros(3, np.float32),
     "not a positive multiple of batch_size 2"),
    (np.zeros((4, 1, 2, 3), np.float32), np.zeros(2, np.float32), "same first dimension"),
    (np.zeros((4, 1, 2, 3), np.float32), np.zeros(4, np.int64), "labels array must be float32"),
])
def test_pycaffes_array_checks(data, labels, message):
    with pytest.raises(CCTError, match=message):
        make_net().set_input_arrays(data, labels)


def test_forward_before_set_input_arrays_and_nets_without_memory_data():
    with pytest.raises(CCTError, match=r"call net.set_input_arrays\(data, labels\)"):
        make_net().forward()
    net = make_net('layer { name: "in" type: "Input" top: "x" '
                   'input_param { shape { dim: 1 } } }')
    with pytest.raises(NetError, match="needs a MemoryData layer"):
        net.set_input_arrays(*arrays(2))


def test_memory_data_parameters_must_be_positive():
    with pytest.raises(CCTError, match="must be specified and positive"):
        make_net('layer { name: "m" type: "MemoryData" top: "d" top: "l" '
                 'memory_data_param { batch_size: 2 channels: 1 height: 0 width: 3 } }')


def test_transform_param_is_ignored_with_caffes_warning(capsys):
    net = make_net(NET.replace('top: "label"', 'top: "label" transform_param { scale: 2 }'))
    data, labels = arrays(2)
    net.set_input_arrays(data, labels)
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data, data)
    assert "memory_data_layer.cpp:90] MemoryData does not transform array data on Reset()" in (
        capsys.readouterr().err)


def test_data_state_resumes_at_the_same_row():
    net = make_net()
    data, labels = arrays(6)
    net.set_input_arrays(data, labels)
    net.forward()
    state = net.layers[0].data_state()
    other = make_net()
    other.set_input_arrays(data, labels)
    other.layers[0].load_data_state(state)
    other.forward()
    np.testing.assert_array_equal(other.blobs["data"].data, data[2:4])
