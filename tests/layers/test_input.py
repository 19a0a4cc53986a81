"""Input, DummyData, Parameter: shapes, fill/refill rules, param gradient, bad parameters."""
import numpy as np
import pytest

from cct.errors import LayerError
from cct.io.prototxt import net_from_text
from cct.net import Net
from tests.gradient_check import build_layer, check_gradient, run_forward


# ------------------------------------------------------------------------------------------
# Input
# ------------------------------------------------------------------------------------------
def test_input_one_shape_per_top():
    layer, _, top = build_layer(
        'type: "Input" input_param { shape { dim: 2 dim: 3 } shape { dim: 4 } }', [],
        num_tops=2)
    assert [t.shape for t in top] == [(2, 3), (4,)]


def test_input_single_shape_for_all_tops_and_no_shape():
    _, _, top = build_layer('type: "Input" input_param { shape { dim: 5 dim: 1 } }', [],
                            num_tops=3)
    assert [t.shape for t in top] == [(5, 1)] * 3
    _, _, top = build_layer('type: "Input"', [], num_tops=2)
    assert [t.shape for t in top] == [(), ()]


def test_input_forward_and_reshape_keep_user_data_and_shape():
    layer, bottom, top = build_layer('type: "Input" input_param { shape { dim: 2 dim: 3 } }',
                                     [])
    top[0].data[...] = 7.0
    top[0].reshape(4, 3)
    top[0].data[...] = 8.0
    run_forward(layer, bottom, top)
    assert top[0].shape == (4, 3)
    assert (top[0].data == 8.0).all()


def test_input_bad_params():
    with pytest.raises(LayerError, match=r"Input layer 'under_test': give 'shape' once, once "
                                         r"per top blob, or not at all: 3 tops vs\. 2 shapes"):
        build_layer('type: "Input" input_param { shape { dim: 1 } shape { dim: 2 } }', [],
                    num_tops=3)
    with pytest.raises(LayerError, match="negative dimension"):
        build_layer('type: "Input" input_param { shape { dim: -1 } }', [])
    with pytest.raises(LayerError, match="exactly 0 bottom"):
        build_layer('type: "Input" input_param { shape { dim: 1 } }', [np.zeros(1)])


def test_input_in_a_net_feeds_the_next_layer():
    net = Net(net_from_text("""
        layer { name: "in" type: "Input" top: "data"
                input_param { shape { dim: 2 dim: 3 dim: 2 } } }
        layer { name: "flat" type: "Flatten" bottom: "data" top: "flat" }
    """), dtype=np.float64)
    assert net.inputs == ["data"]
    x = np.arange(12.0).reshape(2, 3, 2)
    out = net.forward(data=x)
    np.testing.assert_array_equal(out["flat"], x.reshape(2, 6))


# ------------------------------------------------------------------------------------------
# DummyData
# ------------------------------------------------------------------------------------------
def test_dummy_data_default_is_constant_zero_and_never_refilled():
    layer, bottom, top = build_layer(
        'type: "DummyData" dummy_data_param { shape { dim: 2 dim: 3 } }', [])
    assert top[0].shape == (2, 3)
    assert not top[0].data.any()
    top[0].data[...] = 5.0
    run_forward(layer, bottom, top)
    assert (top[0].data == 5.0).all()


def test_dummy_data_refills_non_constant_fillers_every_forward():
    layer, bottom, top = build_layer(
        'type: "DummyData" dummy_data_param { shape { dim: 50 } '
        'data_filler { type: "constant" value: 3 } '
        'data_filler { type: "gaussian" std: 2 } }', [], num_tops=2)
    assert (top[0].data == 3.0).all()
    # A non-constant filler is not run at setup (Caffe inverts refill_ for that first pass).
    assert not top[1].data.any()
    layer.forward(bottom, top)
    first = top[1].data.copy()
    layer.forward(bottom, top)
    assert first.std() > 0.5 and not np.array_equal(first, top[1].data)
    top[0].data[...] = 1.0
    layer.forward(bottom, top)
    assert (top[0].data == 1.0).all()


def test_dummy_data_one_filler_for_all_tops():
    layer, bottom, top = build_layer(
        'type: "DummyData" dummy_data_param { shape { dim: 2 } shape { dim: 3 } '
        'data_filler { type: "uniform" min: 1 max: 2 } }', [], num_tops=2)
    layer.forward(bottom, top)
    assert [t.shape for t in top] == [(2,), (3,)]
    for t in top:
        assert ((t.data >= 1) & (t.data <= 2)).all()


def test_dummy_data_legacy_dims():
    _, _, top = build_layer(
        'type: "DummyData" dummy_data_param { num: 2 num: 5 channels: 3 height: 4 width: 1 '
        'data_filler { type: "constant" value: 1 } }', [], num_tops=2)
    assert [t.shape for t in top] == [(2, 3, 4, 1), (5, 3, 4, 1)]
    assert all((t.data == 1).all() for t in top)


def test_dummy_data_bad_params():
    with pytest.raises(LayerError, match="DummyData layer 'under_test': give 'shape' once"):
        build_layer('type: "DummyData"', [])
    with pytest.raises(LayerError, match="number of data fillers"):
        build_layer('type: "DummyData" dummy_data_param { shape { dim: 1 } '
                    'data_filler { } data_filler { } }', [], num_tops=3)
    with pytest.raises(LayerError, match="either shape or the legacy"):
        build_layer('type: "DummyData" dummy_data_param { shape { dim: 1 } num: 1 channels: 1 '
                    'height: 1 width: 1 }', [])
    with pytest.raises(LayerError, match="give 'height' once"):
        build_layer('type: "DummyData" dummy_data_param { num: 1 channels: 1 width: 1 }', [])
    with pytest.raises(LayerError, match="unknown filler type 'nope'"):
        build_layer('type: "DummyData" dummy_data_param { shape { dim: 1 } '
                    'data_filler { type: "nope" } }', [])


# ------------------------------------------------------------------------------------------
# Parameter
# ------------------------------------------------------------------------------------------
def test_parameter_exposes_its_blob_and_accumulates_diff():
    layer, bottom, top = build_layer(
        'type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } }', [])
    assert len(layer.blobs) == 1 and layer.blobs[0].shape == (2, 3)
    assert not layer.blobs[0].data.any()
    w = np.arange(6.0).reshape(2, 3)
    layer.blobs[0].data[...] = w
    run_forward(layer, bottom, top)
    np.testing.assert_array_equal(top[0].data, w)
    layer.blobs[0].diff[...] = 1.0
    top[0].diff[...] = w
    layer.backward(top, [], bottom)
    np.testing.assert_array_equal(layer.blobs[0].diff, w + 1.0)
    check_gradient(layer, bottom, top)


def test_parameter_rejects_negative_shape():
    with pytest.raises(LayerError, match="Parameter layer 'under_test'.*negative"):
        build_layer('type: "Parameter" parameter_param { shape { dim: -2 } }', [])
