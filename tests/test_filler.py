"""Caffe's fillers: each draws from the distribution filler.hpp documents."""
import numpy as np
import pytest
from google.protobuf import text_format

from cct.errors import LayerError
from cct.filler import fill
from cct.proto import caffe_pb2
from cct.rng import set_random_seed


def filled(text: str, shape) -> np.ndarray:
    set_random_seed(5)
    fp = text_format.Parse(text, caffe_pb2.FillerParameter())
    a = np.zeros(shape, np.float64)
    fill(a, fp)
    return a


def test_constant():
    assert np.all(filled('type: "constant" value: 2.5', (3, 4)) == 2.5)
    assert np.all(filled('', (3,)) == 0)  # Caffe's default filler: constant 0


def test_uniform_range():
    a = filled('type: "uniform" min: -2 max: 3', (200, 50))
    assert a.min() >= -2 and a.max() <= 3 and abs(a.mean() - 0.5) < 0.05


def test_gaussian_moments_and_sparse():
    a = filled('type: "gaussian" mean: 1 std: 2', (300, 100))
    assert abs(a.mean() - 1) < 0.05 and abs(a.std() - 2) < 0.05
    s = filled('type: "gaussian" std: 1 sparse: 5', (50, 400))
    # Each weight is kept with probability sparse / num_outputs = 5 / 50.
    assert abs((s != 0).mean() - 0.1) < 0.01


def test_positive_unitball_rows_sum_to_one():
    a = filled('type: "positive_unitball"', (6, 3, 4, 5))
    assert np.all(a >= 0)
    np.testing.assert_allclose(a.reshape(6, -1).sum(axis=1), 1.0)


@pytest.mark.parametrize("norm,fan", [("FAN_IN", 3 * 5 * 5), ("FAN_OUT", 64 * 5 * 5),
                                      ("AVERAGE", (3 * 25 + 64 * 25) / 2)])
def test_xavier_and_msra_scale(norm, fan):
    x = filled(f'type: "xavier" variance_norm: {norm}', (64, 3, 5, 5))
    bound = np.sqrt(3.0 / fan)
    assert x.max() <= bound and x.min() >= -bound and x.max() > 0.9 * bound
    m = filled(f'type: "msra" variance_norm: {norm}', (64, 3, 5, 5))
    assert abs(m.std() / np.sqrt(2.0 / fan) - 1) < 0.06


def test_bilinear_matches_caffes_upsampling_kernel():
    # Caffe's doc example: factor-2 upsampling uses kernel 4, whose 1-D profile is
    # 0.25 0.75 0.75 0.25.
    a = filled('type: "bilinear"', (2, 1, 4, 4))
    prof = np.array([0.25, 0.75, 0.75, 0.25])
    np.testing.assert_allclose(a[0, 0], np.outer(prof, prof))
    np.testing.assert_allclose(a[1, 0], a[0, 0])


def test_unknown_filler_type_is_a_clear_error():
    with pytest.raises(LayerError, match="unknown filler type 'xavir'"):
        filled('type: "xavir"', (2, 2))


@pytest.mark.parametrize("text,reference", [
    ('type: "uniform" min: -2 max: 3', lambda g, s: g.uniform(-2, 3, s)),
    ('type: "gaussian" mean: 1 std: 2', lambda g, s: g.normal(1, 2, s)),
    ('type: "gaussian" std: 1 sparse: 3', lambda g, s: g.normal(0, 1, s) * (g.random(s) < 0.3)),
    ('type: "positive_unitball"', lambda g, s: (lambda v: v / v.sum(axis=1, keepdims=True))(
        g.uniform(0, 1, s))),
])
def test_drawing_in_blocks_gives_the_values_of_one_float64_draw(monkeypatch, text, reference):
    """Fillers draw a block at a time to save memory: the float32 values are those of one
    float64 draw of the whole blob, rounded (what cct has always drawn for a seed)."""
    import cct.filler

    monkeypatch.setattr(cct.filler, "_BLOCK", 7)
    fp = text_format.Parse(text, caffe_pb2.FillerParameter())
    set_random_seed(5)
    a = np.zeros((10, 9), np.float32)
    fill(a, fp)
    want = reference(np.random.default_rng(5), (10, 9)).astype(np.float32)
    np.testing.assert_array_equal(a, want)
