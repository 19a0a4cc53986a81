"""Concat, Slice, Split, Flatten, Reshape, Crop, Tile, Silence: forward against NumPy, gradient
checks, shape rules, bad parameters, and the real-Caffe layer zoo fixture."""
import numpy as np
import pytest

from cct.blob import Blob
from cct.errors import LayerError
from tests.caffe_layer_fixture import assert_matches_caffe, run_fixture_layer
from tests.gradient_check import build_layer, check_gradient, run_forward

rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape)


# ------------------------------------------------------------------------------------------
# Layer zoo fixture (real Caffe): run one layer on Caffe's bottoms, compare tops and diffs
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["crop", "concat", "slice", "reshape", "flat_softmax",
                                  "flat_pool_ave_ceil", "features"])
def test_layer_zoo(caffe_fixtures, name):
    d = caffe_fixtures / "numerics"
    # tighter than the default: these layers only copy, add or multiply
    assert_matches_caffe(run_fixture_layer(d / "layer_zoo.TEST.npz", d / "layer_zoo.prototxt",
                                           name), atol=5e-8)


# ------------------------------------------------------------------------------------------
# Concat
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("param, axis", [("", 1), ("concat_param { axis: -1 }", 3),
                                         ("concat_param { concat_dim: 0 }", 0)])
def test_concat_forward_and_gradient(param, axis):
    shapes = [[2, 3, 2, 2], [2, 3, 2, 2], [2, 3, 2, 2]]
    for s, extra in zip(shapes, (1, 2, 3)):
        s[axis] = extra
    a, b, c = (rand(*s) for s in shapes)
    layer, bottom, top = build_layer(f'type: "Concat" {param}', [a, b, c])
    run_forward(layer, bottom, top)
    np.testing.assert_array_equal(top[0].data, np.concatenate([a, b, c], axis=axis))
    check_gradient(layer, bottom, top)


def test_concat_single_bottom_is_identity():
    a = rand(2, 3)
    layer, bottom, top = build_layer('type: "Concat"', [a])
    run_forward(layer, bottom, top)
    np.testing.assert_array_equal(top[0].data, a)
    check_gradient(layer, bottom, top)


def test_concat_shape_mismatch_names_bottom_and_shapes():
    with pytest.raises(LayerError, match=r"Concat layer 'under_test'.*bottom\[1\] has shape "
                                         r"\(2, 3, 5\).*\(2, 4, 4\)"):
        build_layer('type: "Concat"', [rand(2, 4, 4), rand(2, 3, 5)])
    with pytest.raises(LayerError, match="same number of axes"):
        build_layer('type: "Concat"', [rand(2, 4, 4), rand(2, 3)])


def test_concat_bad_params():
    with pytest.raises(LayerError, match="either axis or concat_dim"):
        build_layer('type: "Concat" concat_param { axis: 1 concat_dim: 1 }', [rand(2, 2)] * 2)
    with pytest.raises(LayerError, match="axis 2 is out of range"):
        build_layer('type: "Concat" concat_param { axis: 2 }', [rand(2, 2)] * 2)
    with pytest.raises(LayerError, match="concat_dim 2 is out of range"):
        build_layer('type: "Concat" concat_param { concat_dim: 2 }', [rand(2, 2)] * 2)


# ------------------------------------------------------------------------------------------
# Slice
# ------------------------------------------------------------------------------------------
def test_slice_points_forward_and_gradient():
    x = rand(2, 7, 3)
    layer, bottom, top = build_layer(
        'type: "Slice" slice_param { axis: 1 slice_point: 2 slice_point: 3 }', [x], num_tops=3)
    run_forward(layer, bottom, top)
    for t, ref in zip(top, np.split(x, [2, 3], axis=1)):
        np.testing.assert_array_equal(t.data, ref)
    check_gradient(layer, bottom, top)


def test_slice_equal_parts_and_legacy_slice_dim():
    x = rand(6, 2, 2)
    layer, bottom, top = build_layer('type: "Slice" slice_param { slice_dim: 0 }', [x],
                                     num_tops=3)
    run_forward(layer, bottom, top)
    for t, ref in zip(top, np.split(x, 3, axis=0)):
        np.testing.assert_array_equal(t.data, ref)
    check_gradient(layer, bottom, top)


def test_slice_bad_params():
    with pytest.raises(LayerError, match=r"number of tops \(4\) must evenly divide"):
        build_layer('type: "Slice"', [rand(2, 6)], num_tops=4)
    with pytest.raises(LayerError, match="1 slice_point value.*3 tops"):
        build_layer('type: "Slice" slice_param { slice_point: 2 }', [rand(2, 6)], num_tops=3)
    with pytest.raises(LayerError, match="strictly increasing"):
        build_layer('type: "Slice" slice_param { slice_point: 3 slice_point: 2 }',
                    [rand(2, 6)], num_tops=3)
    with pytest.raises(LayerError, match="strictly increasing"):
        build_layer('type: "Slice" slice_param { slice_point: 6 }', [rand(2, 6)], num_tops=2)
    with pytest.raises(LayerError, match="either axis or slice_dim"):
        build_layer('type: "Slice" slice_param { axis: 1 slice_dim: 1 }', [rand(2, 6)],
                    num_tops=2)


# ------------------------------------------------------------------------------------------
# Split
# ------------------------------------------------------------------------------------------
def test_split_shares_data_and_sums_diffs():
    x = rand(2, 3)
    layer, bottom, top = build_layer('type: "Split"', [x], num_tops=3)
    run_forward(layer, bottom, top)
    for t in top:
        np.testing.assert_array_equal(t.data, x)
    bottom[0].data[0, 0] = 42.0
    assert all(t.data[0, 0] == 42.0 for t in top)
    diffs = [rand(2, 3) for _ in top]
    for t, d in zip(top, diffs):
        t.diff[...] = d
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, diffs[0] + diffs[1] + diffs[2])
    check_gradient(layer, bottom, top)


def test_split_follows_a_reshaped_bottom():
    layer, bottom, top = build_layer('type: "Split"', [rand(2, 3)], num_tops=2)
    bottom[0].reshape(4, 5)
    x = rand(4, 5)
    bottom[0].data[...] = x
    run_forward(layer, bottom, top)
    for t in top:
        np.testing.assert_array_equal(t.data, x)


def test_split_rejects_in_place():
    lp = 'name: "s" type: "Split"'
    from cct import backend
    from cct.layers import create_layer
    from tests.gradient_check import make_layer_param
    layer = create_layer(make_layer_param(lp), backend.get("cpu"), np.float64)
    b = Blob((2, 2), np.float64)
    with pytest.raises(LayerError, match="Split layer 's'.*in-place"):
        layer.setup([b], [Blob((), np.float64), b])


# ------------------------------------------------------------------------------------------
# Flatten
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("param, shape", [
    ("", (2, 60)),
    ("flatten_param { axis: 2 }", (2, 3, 20)),
    ("flatten_param { axis: 0 end_axis: 1 }", (6, 4, 5)),
    ("flatten_param { axis: 1 end_axis: -2 }", (2, 12, 5)),
    ("flatten_param { axis: 2 end_axis: 1 }", (2, 3, 1, 4, 5)),
])
def test_flatten_shapes(param, shape):
    x = rand(2, 3, 4, 5)
    layer, bottom, top = build_layer(f'type: "Flatten" {param}', [x])
    run_forward(layer, bottom, top)
    assert top[0].shape == shape
    np.testing.assert_array_equal(top[0].data, x.reshape(shape))


def test_flatten_gradient_and_reshaped_bottom():
    layer, bottom, top = build_layer('type: "Flatten"', [rand(2, 3, 2)])
    check_gradient(layer, bottom, top)
    bottom[0].reshape(3, 2, 2)
    x = rand(3, 2, 2)
    bottom[0].data[...] = x
    run_forward(layer, bottom, top)
    assert top[0].shape == (3, 4)
    np.testing.assert_array_equal(top[0].data, x.reshape(3, 4))
    top[0].diff[...] = 7.0
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, np.full((3, 2, 2), 7.0))


def test_flatten_bad_axes():
    with pytest.raises(LayerError, match="Flatten layer 'under_test': end_axis 0 comes before "
                                         "axis 2"):
        build_layer('type: "Flatten" flatten_param { axis: 2 end_axis: 0 }', [rand(2, 3, 4)])
    with pytest.raises(LayerError, match="axis 3 is out of range"):
        build_layer('type: "Flatten" flatten_param { axis: 3 }', [rand(2, 3, 4)])


# ------------------------------------------------------------------------------------------
# Reshape
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("param, shape", [
    ("shape { dim: 0 dim: -1 dim: 9 }", (2, 27, 9)),
    ("shape { dim: 6 dim: 0 dim: -1 }", (6, 3, 27)),
    ("shape { dim: -1 }", (486,)),
    ("shape { dim: 1 dim: 2 dim: 243 }", (1, 2, 243)),
    ("axis: 1 shape { dim: 3 dim: 81 }", (2, 3, 81)),
    ("axis: 1 num_axes: 1 shape { dim: 1 dim: 3 }", (2, 1, 3, 9, 9)),
    ("axis: -1 shape { dim: 1 }", (2, 3, 9, 9, 1)),
    ("axis: 0 num_axes: 0 shape { dim: 1 }", (1, 2, 3, 9, 9)),
    ("axis: 2 num_axes: 2 shape { dim: -1 }", (2, 3, 81)),
    ("axis: 1 num_axes: 2 shape { dim: 0 dim: -1 }", (2, 3, 9, 9)),
])
def test_reshape_shapes(param, shape):
    x = rand(2, 3, 9, 9)
    layer, bottom, top = build_layer(f'type: "Reshape" reshape_param {{ {param} }}', [x])
    run_forward(layer, bottom, top)
    assert top[0].shape == shape
    np.testing.assert_array_equal(top[0].data, x.reshape(shape))


def test_reshape_gradient_and_new_bottom_shape():
    layer, bottom, top = build_layer(
        'type: "Reshape" reshape_param { shape { dim: 0 dim: -1 } }', [rand(2, 3, 2)])
    check_gradient(layer, bottom, top)
    bottom[0].reshape(4, 2, 5)
    run_forward(layer, bottom, top)
    assert top[0].shape == (4, 10)


def test_reshape_errors():
    with pytest.raises(LayerError, match=r"Reshape layer 'under_test': bottom count \(24\) "
                                         r"must be divisible by the product of the specified "
                                         r"dimensions \(5\)"):
        build_layer('type: "Reshape" reshape_param { shape { dim: 5 dim: -1 } }',
                    [rand(2, 3, 4)])
    with pytest.raises(LayerError, match="multiple -1"):
        build_layer('type: "Reshape" reshape_param { shape { dim: -1 dim: -1 } }',
                    [rand(2, 3)])
    with pytest.raises(LayerError, match="output count must match input count"):
        build_layer('type: "Reshape" reshape_param { shape { dim: 5 } }', [rand(2, 3)])
    with pytest.raises(LayerError, match="no bottom axis 2 to copy"):
        build_layer('type: "Reshape" reshape_param { shape { dim: 0 dim: 0 dim: 0 } }',
                    [rand(2, 3)])
    with pytest.raises(LayerError, match="end_axis = axis \\+ num_axes"):
        build_layer('type: "Reshape" reshape_param { axis: 1 num_axes: 3 shape { dim: -1 } }',
                    [rand(2, 3)])
    with pytest.raises(LayerError, match="below -1"):
        build_layer('type: "Reshape" reshape_param { shape { dim: -2 } }', [rand(2, 3)])


# ------------------------------------------------------------------------------------------
# Crop
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("param, slices", [
    ("", (slice(None), slice(None), slice(0, 3), slice(0, 2))),
    ("crop_param { offset: 1 }", (slice(None), slice(None), slice(1, 4), slice(1, 3))),
    ("crop_param { axis: 1 offset: 1 offset: 2 offset: 0 }",
     (slice(None), slice(1, 3), slice(2, 5), slice(0, 2))),
    ("crop_param { axis: -1 offset: 3 }", (slice(None), slice(None), slice(None), slice(3, 5))),
])
def test_crop_forward_and_gradient(param, slices):
    x = rand(2, 4, 5, 5)
    ref = rand(1, 2, 3, 2)
    layer, bottom, top = build_layer(f'type: "Crop" {param}', [x, ref])
    run_forward(layer, bottom, top)
    np.testing.assert_array_equal(top[0].data, x[slices])
    check_gradient(layer, bottom, top, check_bottom=[0])
    bottom[1].diff[...] = 5.0
    layer.backward(top, [True, True], bottom)
    assert not bottom[1].diff.any()


def test_crop_errors():
    with pytest.raises(LayerError, match="Crop layer 'under_test': the crop for axis 2 is out "
                                         "of bounds"):
        build_layer('type: "Crop" crop_param { offset: 2 }', [rand(1, 1, 4, 4),
                                                               rand(1, 1, 3, 3)])
    with pytest.raises(LayerError, match="2 offset values"):
        build_layer('type: "Crop" crop_param { axis: 1 offset: 1 offset: 1 }',
                    [rand(1, 2, 4, 4), rand(1, 1, 3, 3)])
    with pytest.raises(LayerError, match="fewer axes"):
        build_layer('type: "Crop"', [rand(1, 2, 4, 4), rand(1, 1, 3)])


# ------------------------------------------------------------------------------------------
# Tile
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_tile_forward_and_gradient(axis):
    x = rand(2, 3, 2)
    reps = [1, 1, 1]
    reps[axis] = 3
    layer, bottom, top = build_layer(
        f'type: "Tile" tile_param {{ axis: {axis} tiles: 3 }}', [x])
    run_forward(layer, bottom, top)
    np.testing.assert_array_equal(top[0].data, np.tile(x, reps))
    check_gradient(layer, bottom, top)


def test_tile_bad_params():
    with pytest.raises(LayerError, match="Tile layer 'under_test': tile_param.tiles"):
        build_layer('type: "Tile"', [rand(2, 2)])
    with pytest.raises(LayerError, match="tiles must be positive"):
        build_layer('type: "Tile" tile_param { tiles: 0 }', [rand(2, 2)])


# ------------------------------------------------------------------------------------------
# Silence
# ------------------------------------------------------------------------------------------
def test_silence_zeroes_diffs_where_asked():
    layer, bottom, top = build_layer('type: "Silence"', [rand(2, 2), rand(3)], num_tops=0)
    run_forward(layer, bottom, top)
    for b in bottom:
        b.diff[...] = 1.0
    layer.backward(top, [True, False], bottom)
    assert not bottom[0].diff.any()
    assert (bottom[1].diff == 1.0).all()


def test_silence_needs_a_bottom():
    with pytest.raises(LayerError, match="at least 1 bottom"):
        build_layer('type: "Silence"', [], num_tops=0)
