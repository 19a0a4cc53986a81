"""BatchReindex and Filter: forward against NumPy indexing, backward (accumulating repeated
picks, zeroing what was left out), gradient checks, Caffe's checks and refusals, a net that
reshapes the Filter top per batch, and the same results on the numpy (device) backend."""
import numpy as np
import pytest

import cct as caffe
from cct import backend as backends
from cct.blob import Blob
from cct.errors import LayerError
from cct.io.prototxt import net_from_text
from cct.layers import create_layer
from cct.net import Net
from tests.gradient_check import build_layer, check_gradient, make_layer_param, run_forward

RNG = np.random.default_rng(7)


def on_backend(name, body, arrays, num_tops=1):
    """The layer set up on backend ``name`` (float64), with its bottoms and tops."""
    be = backends.get(name)
    layer = create_layer(make_layer_param(body), be, np.float64)
    bottom = []
    for a in arrays:
        b = Blob(a.shape, np.float64, be.xp)
        b.data[...] = be.xp.asarray(a)
        bottom.append(b)
    top = [Blob((), np.float64, be.xp) for _ in range(num_tops)]
    layer.setup(bottom, top)
    return layer, bottom, top


# ------------------------------------------------------------------------------------------------
# BatchReindex
# ------------------------------------------------------------------------------------------------
REINDEX = 'type: "BatchReindex"'


def test_batch_reindex_forward_matches_caffes_test():
    # Caffe's test_batch_reindex_layer.cpp: a 5 x 4 x 3 x 2 bottom reindexed by
    # [4, 0, 1, 2, 3, 4, 4, 2] (repeats and omissions).
    x = RNG.standard_normal((5, 4, 3, 2))
    perm = np.array([4, 0, 1, 2, 3, 4, 4, 2], float)
    layer, bottom, top = build_layer(REINDEX, [x, perm])
    run_forward(layer, bottom, top)
    assert top[0].shape == (8, 4, 3, 2)
    np.testing.assert_array_equal(top[0].data, x[perm.astype(int)])


def test_batch_reindex_truncates_float_indices_like_caffe():
    x = RNG.standard_normal((3, 2))
    layer, bottom, top = build_layer(REINDEX, [x, np.array([2.9, 0.5, 1.0])])
    run_forward(layer, bottom, top)
    np.testing.assert_array_equal(top[0].data, x[[2, 0, 1]])


def test_batch_reindex_backward_accumulates_repeated_picks():
    x = RNG.standard_normal((4, 3))
    perm = np.array([1, 3, 1, 1], float)
    layer, bottom, top = build_layer(REINDEX, [x, perm])
    run_forward(layer, bottom, top)
    dy = RNG.standard_normal((4, 3))
    top[0].diff[...] = dy
    bottom[0].diff[...] = 7.0  # overwritten, as Caffe's caffe_set(0) first
    layer.backward(top, [True, False], bottom)
    want = np.zeros((4, 3))
    want[1] = dy[0] + dy[2] + dy[3]
    want[3] = dy[1]
    np.testing.assert_allclose(bottom[0].diff, want, rtol=1e-15)


def test_batch_reindex_gradient():
    x = RNG.standard_normal((5, 2, 3))
    layer, bottom, top = build_layer(REINDEX, [x, np.array([4, 0, 4, 2, 2, 2], float)])
    check_gradient(layer, bottom, top, check_bottom=[0])


@pytest.mark.parametrize("perm,match", [
    ([0, -1], r"index 1 of bottom\[1\] is -1.0, negative: indices must lie in \[0, 3\)"),
    ([-0.5], r"is -0.5, negative"),
    ([3, 0], r"index 0 of bottom\[1\] is 3.0, not smaller than the batch size"),
    ([np.nan], r"not a number"),
])
def test_batch_reindex_refuses_out_of_range_indices(perm, match):
    layer, bottom, top = build_layer(REINDEX, [np.zeros((3, 2)), np.array(perm, float)])
    with pytest.raises(LayerError, match=r"^BatchReindex layer 'under_test': .*" + match):
        run_forward(layer, bottom, top)


def test_batch_reindex_refuses_bad_shapes_and_index_gradient():
    with pytest.raises(LayerError, match=r"bottom\[1\] \(the indices\) must have exactly 1 "
                                         r"axis, got shape \(2, 1\)"):
        build_layer(REINDEX, [np.zeros((3, 2)), np.zeros((2, 1))])
    with pytest.raises(LayerError, match=r"takes exactly 2 bottom blob\(s\)"):
        build_layer(REINDEX, [np.zeros((3, 2))])
    layer, bottom, top = build_layer(REINDEX, [np.zeros((3, 2)), np.array([0.0])])
    run_forward(layer, bottom, top)
    with pytest.raises(LayerError, match=r"cannot backpropagate to bottom\[1\] \(the "
                                         r"indices\); set propagate_down: false"):
        layer.backward(top, [True, True], bottom)


def test_batch_reindex_empty_index_gives_empty_top():
    layer, bottom, top = build_layer(REINDEX, [np.ones((3, 2)), np.zeros((0,))])
    run_forward(layer, bottom, top)
    assert top[0].shape == (0, 2)
    layer.backward(top, [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 0)


# ------------------------------------------------------------------------------------------------
# Filter
# ------------------------------------------------------------------------------------------------
FILTER = 'type: "Filter"'


def caffe_filter_setup():
    """Caffe's test_filter_layer.cpp: selector [0, 1, 1, 0] over 4-item bottoms."""
    sel = np.array([0, 1, 1, 0], float).reshape(4, 1)
    data = RNG.standard_normal((4, 3, 6, 4))
    labels = RNG.standard_normal((4, 1, 1, 1))
    return data, labels, sel


def test_filter_setup_keeps_the_whole_batch_then_forward_filters():
    data, labels, sel = caffe_filter_setup()
    layer, bottom, top = build_layer(FILTER, [data, labels, sel], num_tops=2)
    # Set-up runs before selector values exist: the tops keep N items, as in Caffe.
    assert top[0].shape == (4, 3, 6, 4) and top[1].shape == (4, 1, 1, 1)
    run_forward(layer, bottom, top)
    assert top[0].shape == (2, 3, 6, 4) and top[1].shape == (2, 1, 1, 1)
    np.testing.assert_array_equal(top[0].data, data[[1, 2]])
    np.testing.assert_array_equal(top[1].data, labels[[1, 2]])


def test_filter_backward_copies_selected_rows_and_zeroes_the_rest():
    data, labels, sel = caffe_filter_setup()
    layer, bottom, top = build_layer(FILTER, [data, labels, sel], num_tops=2)
    run_forward(layer, bottom, top)
    dy = RNG.standard_normal(top[0].shape)
    top[0].diff[...] = dy
    bottom[0].diff[...] = 5.0
    layer.backward(top, [True, False, False], bottom)
    want = np.zeros_like(data)
    want[[1, 2]] = dy
    np.testing.assert_array_equal(bottom[0].diff, want)


def test_filter_gradient():
    data, labels, sel = caffe_filter_setup()
    layer, bottom, top = build_layer(FILTER, [data[:, :, :2, :2], labels, sel], num_tops=2)
    check_gradient(layer, bottom, top, check_bottom=[0, 1])


def test_filter_nothing_selected_and_a_flat_selector():
    layer, bottom, top = build_layer(FILTER, [np.ones((3, 2)), np.zeros(3)])
    run_forward(layer, bottom, top)
    assert top[0].shape == (0, 2)
    layer.backward(top, [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 0)


def test_filter_refusals():
    with pytest.raises(LayerError, match=r"^Filter layer 'under_test': needs one top per "
                                         r"filtered bottom, i\.e\. 1 top\(s\) for 2 bottoms"):
        build_layer(FILTER, [np.ones((3, 2)), np.ones(3)], num_tops=2)
    with pytest.raises(LayerError, match=r"takes at least 2 bottom"):
        build_layer(FILTER, [np.ones((3, 2))])
    with pytest.raises(LayerError, match=r"the selector \(bottom\[1\]\) must have shape \(N,\) "
                                         r"or \(N, 1, \.\.\.\).*got \(3, 2\)"):
        build_layer(FILTER, [np.ones((3, 2)), np.ones((3, 2))])
    with pytest.raises(LayerError, match=r"same first dimension as the selector \(3, shape "
                                         r"\(3, 1\)\); bottom\[0\] has shape \(4, 2\)"):
        build_layer(FILTER, [np.ones((4, 2)), np.ones((3, 1))])
    layer, bottom, top = build_layer(FILTER, [np.ones((3, 2)), np.ones(3)])
    run_forward(layer, bottom, top)
    with pytest.raises(LayerError, match=r"cannot backpropagate to bottom\[1\] \(the "
                                         r"selector\)"):
        layer.backward(top, [True, True], bottom)


NET = '''
layer { name: "in" type: "Input" top: "x" top: "sel" top: "idx" top: "target"
  input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } shape { dim: 3 }
                shape { dim: 3 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
layer { name: "f" type: "Filter" bottom: "ip" bottom: "sel" top: "kept" }
layer { name: "r" type: "BatchReindex" bottom: "kept" bottom: "idx" top: "re" }
layer { name: "loss" type: "EuclideanLoss" bottom: "re" bottom: "target" top: "loss" }
'''


def test_filter_and_batch_reindex_in_a_net():
    net = Net(net_from_text(NET), phase=caffe.TRAIN, dtype=np.float64)
    x = RNG.standard_normal((4, 3))
    target = RNG.standard_normal((3, 2))
    net.blobs["x"].data[...] = x
    net.blobs["sel"].data[...] = [1, 0, 1, 1]
    net.blobs["idx"].data[...] = [1, 0, 1]
    net.blobs["target"].data[...] = target
    net.forward()
    w = net.params["ip"][0].data
    ip = x @ w.T
    assert net.blobs["kept"].shape == (3, 2)
    np.testing.assert_allclose(net.blobs["kept"].data, ip[[0, 2, 3]], rtol=1e-13)
    np.testing.assert_allclose(net.blobs["re"].data, ip[[2, 0, 2]], rtol=1e-13)
    net.params["ip"][0].diff[...] = 0
    net.backward()
    # d loss / d ip rows: (re - target) / num, routed back through both layers
    d_re = (ip[[2, 0, 2]] - target) / 3
    d_ip = np.zeros((4, 2))
    d_ip[2] = d_re[0] + d_re[2]
    d_ip[0] = d_re[1]
    np.testing.assert_allclose(net.params["ip"][0].diff, d_ip.T @ x, rtol=1e-12)
    # a smaller selection next batch reshapes the Filter top
    net.blobs["sel"].data[...] = [0, 0, 1, 1]
    net.blobs["idx"].data[...] = [1, 1, 0]
    net.forward()
    assert net.blobs["kept"].shape == (2, 2)
    np.testing.assert_allclose(net.blobs["re"].data, ip[[3, 3, 2]], rtol=1e-13)


@pytest.mark.parametrize("body,arrays,num_tops,pd", [
    (REINDEX, [RNG.standard_normal((5, 3)), np.array([4, 0, 4, 1], float)], 1,
     [True, False]),
    (FILTER, [RNG.standard_normal((4, 3)), RNG.standard_normal((4, 2, 1)),
              np.array([1, 0, 0, 1], float)], 2, [True, True, False]),
])
def test_numpy_backend_matches_cpu(body, arrays, num_tops, pd):
    results = []
    for name in ("cpu", "numpy"):
        layer, bottom, top = on_backend(name, body, arrays, num_tops)
        layer.reshape(bottom, top)
        layer.forward(bottom, top)
        for t in top:
            t.diff[...] = 1.5
        layer.backward(top, pd, bottom)
        results.append([np.array(t.cpu_data()) for t in top]
                       + [np.array(b.cpu_diff()) for b, p in zip(bottom, pd) if p])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
