"""cct.coord_map (pycaffe's caffe.coord_map), checked against the expectations of Caffe's
python/caffe/test/test_coord_map.py, with the random pads and offsets made parameters."""
import numpy as np
import pytest

import cct
from cct import glog
from cct import layers as L
from cct import params as P
from cct.coord_map import (AxisMismatchException, UndefinedMapException, compose,
                           coord_map, coord_map_from_to, crop, inverse)


def coord_net_spec(ks=3, stride=1, pad=0, pool=2, dstride=2, dpad=0):
    """Caffe's conv-pool-deconv net: 100 x 100 data, a 20 x 20 aux input."""
    n = cct.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 1, 100, 100]))
    n.aux = L.Input(shape=dict(dim=[2, 1, 20, 20]))
    n.conv = L.Convolution(n.data, num_output=10, kernel_size=ks, stride=stride, pad=pad)
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=pool, stride=pool, pad=0)
    deconv_ks = [s * 2 for s in dstride] if isinstance(dstride, list) else dstride * 2
    n.deconv = L.Deconvolution(n.pool, num_output=10, kernel_size=deconv_ks, stride=dstride,
                               pad=dpad)
    return n


def test_conv_pool_deconv():
    n = coord_net_spec()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert (ax, a, b) == (1, 1, 0)   # 2x pool, 2x deconv: identity
    n = coord_net_spec(pool=4, dstride=4)
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert (ax, a, b) == (1, 1, -1)  # 4x pool, 4x deconv: shift by one


def test_pass_through_and_1x1_conv_are_identity():
    n = coord_net_spec()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    n.relu = L.ReLU(n.deconv)
    n.conv1x1 = L.Convolution(n.relu, num_output=10, kernel_size=1, stride=1, pad=0)
    for top in (n.relu, n.conv1x1):
        assert coord_map_from_to(top, n.data) == (ax, a, b)


@pytest.mark.parametrize("pad", [0, 1, 7, 10])
def test_padding(pad):
    n = coord_net_spec()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    n = coord_net_spec(pad=pad)   # conv padding adds offset
    _, a_pad, b_pad = coord_map_from_to(n.deconv, n.data)
    assert a == a_pad and b - pad == b_pad
    n = coord_net_spec(dpad=pad)  # deconv padding subtracts it
    _, a_pad, b_pad = coord_map_from_to(n.deconv, n.data)
    assert a == a_pad and b + pad == b_pad
    n = coord_net_spec(pad=pad, dpad=pad)
    _, a_pad, b_pad = coord_map_from_to(n.deconv, n.data)
    assert a == a_pad and b == b_pad


def test_multi_bottom_conv_maps_each_top_alike():
    n = coord_net_spec()
    n.conv_data, n.conv_aux = L.Convolution(n.data, n.aux, ntop=2, num_output=10,
                                            kernel_size=5, stride=2, pad=0)
    assert coord_map_from_to(n.conv_data, n.data) == coord_map_from_to(n.conv_aux, n.aux)


def test_rect_mapping_is_its_isotropic_parts():
    n3x3 = coord_net_spec(ks=3, stride=1, pad=0)
    n5x5 = coord_net_spec(ks=5, stride=2, pad=10)
    n3x5 = coord_net_spec(ks=[3, 5], stride=[1, 2], pad=[0, 10])
    ax_3x3, a_3x3, b_3x3 = coord_map_from_to(n3x3.deconv, n3x3.data)
    ax_5x5, a_5x5, b_5x5 = coord_map_from_to(n5x5.deconv, n5x5.data)
    ax_3x5, a_3x5, b_3x5 = coord_map_from_to(n3x5.deconv, n3x5.data)
    assert ax_3x3 == ax_5x5 == ax_3x5
    assert a_3x3 == a_3x5[0] and b_3x3 == b_3x5[0]
    assert a_5x5 == a_3x5[1] and b_5x5 == b_3x5[1]
    # by hand: 5x5 s2 p10 is (1/2, 4), pool (1/2, -1/4), deconv (2, 3/2); deconv -> data
    # composes to (1/2, 5), whose inverse is (2, -10)
    assert b_3x3 == 0 and a_5x5 == 2 and b_5x5 == -10


def test_nd_conv():
    n = cct.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3, 100, 100, 100]))
    n.conv = L.Convolution(n.data, num_output=10, kernel_size=[3, 3, 3], stride=[1, 1, 1],
                           pad=[0, 1, 2])
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=2, stride=2, pad=0)
    n.deconv = L.Deconvolution(n.pool, num_output=10, kernel_size=4, stride=2, pad=0)
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert ax == 1 and len(a) == len(b) == 3 and np.all(a == 1)
    assert b[0] - 1 == b[1] and b[1] - 1 == b[2]


@pytest.mark.parametrize("offset", [0, 3, 10])
def test_crop_of_crop(offset):
    n = coord_net_spec()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    n.crop = L.Crop(n.deconv, n.data, axis=2, offset=offset)
    ax_crop, a_crop, b_crop = coord_map_from_to(n.crop, n.data)
    assert ax == ax_crop and a == a_crop and b + offset == b_crop


def test_crop_helper_defines_a_crop_layer_that_builds():
    n = coord_net_spec(pool=4, dstride=4)
    n.score = crop(n.deconv, n.data)
    layer = n.to_proto().layer[-1]
    assert layer.type == "Crop" and list(layer.bottom) == ["deconv", "data"]
    assert layer.crop_param.axis == 2 and list(layer.crop_param.offset) == [1]
    with glog.quiet():
        net = cct.Net(n.to_proto(), cct.TEST)
    assert net.blobs["score"].data.shape == (2, 10, 100, 100)


def test_catch_unconnected():
    n = coord_net_spec()
    n.ip = L.InnerProduct(n.deconv, num_output=10)
    with pytest.raises(RuntimeError, match="connected by spatial layers"):
        coord_map_from_to(n.ip, n.data)


def test_catch_scale_mismatch():
    n = coord_net_spec(pool=3, dstride=2)
    with pytest.raises(AssertionError, match="scale mismatch"):
        crop(n.deconv, n.data)


def test_catch_negative_crop():
    n = coord_net_spec(dpad=10)
    with pytest.raises(AssertionError, match="negative offset"):
        crop(n.deconv, n.data)


def test_map_algebra():
    conv = coord_map(L.Convolution(L.Input(), kernel_size=5, stride=2, pad=1).fn)
    assert conv[0] == 1 and conv[1] == 0.5 and conv[2] == -0.5
    ax, a, b = compose(conv, inverse(conv))
    assert ax == 1 and a == 1 and b == 0
    with pytest.raises(AxisMismatchException):
        compose((1, 1, 0), (2, 1, 0))
    with pytest.raises(UndefinedMapException, match="InnerProduct"):
        coord_map(L.InnerProduct(L.Input(), num_output=1).fn)
