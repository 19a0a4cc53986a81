"""Blob diffs sharing memory (cct/blob_memory.py): the backward pass gives the same param diffs,
bit for bit, as with a diff per blob, on every net of Caffe's zoo; the blobs that must keep
their own diff do; the shared layout is smaller."""
import pathlib
import sys

import numpy as np
import pytest

import cct
from cct import blob_memory, rng
from cct.glog import set_quiet
from cct.io.prototxt import read_net_text, net_from_text
from cct.net import Net

from .conftest import CAFFE_ZOO
from .zoo_util import fill_inputs, swap_data_layers

sys.path.insert(0, str(pathlib.Path(__file__).parent / "zoo_layers"))


def zoo_train_nets():
    if not CAFFE_ZOO.exists():
        return [pytest.param(None, marks=pytest.mark.skip(
            reason=f"{CAFFE_ZOO} is absent (set CCT_SHARED to the folder holding caffe-zoo/)"))]
    return sorted(p for p in CAFFE_ZOO.rglob("*.prototxt")
                  if "solver" not in p.name and "deploy" not in p.name)


def build(param, phase=cct.TRAIN) -> Net:
    set_quiet(True)
    try:
        return Net(param, phase=phase)
    finally:
        set_quiet(False)


def param_diffs_after_passes(net: Net, passes: int = 2) -> list:
    """Param diffs of each of `passes` forward-backward passes on fresh inputs (Dropout's
    masks drawn from the same seed for every net)."""
    out = []
    rng.set_random_seed(7)
    for k in range(passes):
        for p in net.params_list:
            p.diff[...] = 0
        fill_inputs(net, seed=k)
        net.forward_prefilled()
        net.backward_all()
        out.append([p.diff.copy() for p in net.params_list])
    return out


def twin_nets(param):
    """Two nets with the same weights; the second's diffs shared and poisoned with NaN, so a
    layer that reads a diff it has not written (or leaves part unwritten) shows."""
    plain, shared = build(param), build(param)
    for a, b in zip(plain.params_list, shared.params_list):
        b.data[...] = a.data
    own, used = blob_memory.share_blob_diffs(shared)
    for _, ids in blob_memory.plan(shared):
        shared.blobs_list[ids[0]]._diff.base[...] = np.nan
    return plain, shared, own, used


@pytest.mark.parametrize("path", zoo_train_nets(),
                         ids=lambda p: str(p.relative_to(CAFFE_ZOO)) if p else "absent")
def test_shared_diffs_give_the_same_param_diffs_on_zoo_nets(path):
    param = read_net_text(str(path))
    if any(lp.type == "Python" for lp in param.layer):
        pytest.skip("Python layers may read any blob: cct train keeps their nets' diffs apart")
    batch = 1 if "full_conv" in path.name else 2
    plain, shared, own, used = twin_nets(swap_data_layers(param, batch))
    assert used <= own
    for got, want in zip(param_diffs_after_passes(shared), param_diffs_after_passes(plain)):
        for i, (g, w) in enumerate(zip(got, want)):
            assert np.array_equal(g, w), f"{path.name}: param {i} differs with shared diffs"


BRANCHY = """
name: "branchy"
layer { name: "data" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 3 dim: 2 dim: 6 dim: 6 } shape { dim: 3 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "convA" type: "Convolution" bottom: "conv1" top: "convA"
  convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "convB" type: "Convolution" bottom: "conv1" top: "convB"
  convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "sum" type: "Eltwise" bottom: "convA" bottom: "convB" top: "sum" }
layer { name: "cat" type: "Concat" bottom: "sum" bottom: "convA" top: "cat" }
layer { name: "drop" type: "Dropout" bottom: "cat" top: "cat" dropout_param { dropout_ratio: 0 } }
layer { name: "flat" type: "Flatten" bottom: "cat" top: "flat" }
layer { name: "ip" type: "InnerProduct" bottom: "flat" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss"
  loss_weight: 3 }
"""


def test_branches_in_place_layers_and_splits_give_the_same_param_diffs():
    plain, shared, _, _ = twin_nets(net_from_text(BRANCHY))
    for got, want in zip(param_diffs_after_passes(shared, 3), param_diffs_after_passes(plain, 3)):
        for g, w in zip(got, want):
            assert np.array_equal(g, w)


def test_blobs_read_before_written_keep_their_own_diffs():
    net = build(net_from_text(BRANCHY))
    shared_ids = {b for _, ids in blob_memory.plan(net) for b in ids}
    names = net.blob_names
    # Net input, loss top (its diff holds the loss weight), and the split of `ip` feeding
    # Accuracy (no backward: the Split sums it as zeros) are read before any pass writes them.
    for name in ("data", "label", "loss"):
        assert names.index(name) not in shared_ids, name
    accuracy_input = net.bottom_id_vecs[net.layer_names.index("acc")][0]
    assert accuracy_input not in shared_ids
    blob_memory.share_blob_diffs(net)
    assert float(net.blobs["loss"].diff) == 3.0


def test_no_two_blobs_in_one_buffer_are_alive_together():
    net = build(net_from_text(BRANCHY))
    lives = blob_memory._lifetimes(net)
    for _, ids in blob_memory.plan(net):
        spans = sorted(lives[b] for b in ids)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end < start


def test_shared_diffs_on_a_device_backend_give_the_same_param_diffs():
    """On a device backend (the stand-in: the GPU's kernels behind CuPy's rules) the shared
    buffers are device arrays, each blob's diff a view with its own host-sync head, and the
    backward pass gives the param diffs of a diff per blob, to the bit."""
    param = net_from_text(BRANCHY)
    set_quiet(True)
    try:
        plain, shared = (Net(param, phase=cct.TRAIN, backend="numpy") for _ in range(2))
    finally:
        set_quiet(False)
    for a, b in zip(plain.params_list, shared.params_list):
        b.data[...] = a.data
    own, used = blob_memory.share_blob_diffs(shared)
    assert 0 < used < own
    xp = shared.backend.xp
    for _, ids in blob_memory.plan(shared):
        for b in ids:
            blob = shared.blobs_list[b]
            assert type(blob._diff) is type(xp.zeros(1)), "the buffer is the device's"
            blob._diff[...] = np.nan    # a diff read before the pass writes it would show
    for got, want in zip(param_diffs_after_passes(shared), param_diffs_after_passes(plain)):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(shared.backend.to_host(g), plain.backend.to_host(w))


def test_caffenet_shares_about_half_its_diffs():
    path = CAFFE_ZOO / "models/bvlc_reference_caffenet/train_val.prototxt"
    if not path.exists():
        pytest.skip(f"{path} is absent (set CCT_SHARED to the folder holding caffe-zoo/)")
    net = build(swap_data_layers(read_net_text(str(path)), 8))
    own, used = blob_memory.share_blob_diffs(net)
    assert used < 0.6 * own
    # Each blob's diff is a view of its buffer in the blob's own shape.
    for blob in net.blobs_list:
        if blob._diff is not None:
            assert blob._diff.shape == blob.shape


def test_reshape_to_a_larger_blob_leaves_the_buffer():
    net = build(net_from_text(BRANCHY))
    blob_memory.share_blob_diffs(net)
    blob = net.blobs["conv1"]
    before = blob._diff
    blob.reshape(5, 4, 4, 4)
    assert not np.shares_memory(blob.diff, before)
