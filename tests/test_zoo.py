"""Every net of Caffe's example and model zoo builds in both phases and runs forward and
backward at a small batch, with the top shapes Caffe computes."""
import pathlib
import sys

import numpy as np
import pytest

import cct
from cct.io.prototxt import read_net_text
from cct.glog import set_quiet
from cct.net import Net

from .conftest import CAFFE_ZOO
from .zoo_util import fill_inputs, swap_data_layers

sys.path.insert(0, str(pathlib.Path(__file__).parent / "zoo_layers"))


def zoo_nets():
    if not CAFFE_ZOO.exists():
        return [pytest.param(None, marks=pytest.mark.skip(
            reason=f"{CAFFE_ZOO} is absent (set CCT_SHARED to the folder holding caffe-zoo/)"))]
    return sorted(p for p in CAFFE_ZOO.rglob("*.prototxt") if "solver" not in p.name)


# Shapes Caffe reports in its "Top shape:" lines for these nets (batch replaced by B).
KNOWN_SHAPES = {
    "models/bvlc_reference_caffenet/deploy.prototxt": {
        "conv1": (96, 55, 55), "pool1": (96, 27, 27), "norm1": (96, 27, 27),
        "conv2": (256, 27, 27), "pool2": (256, 13, 13), "conv5": (256, 13, 13),
        "pool5": (256, 6, 6), "fc6": (4096,), "fc8": (1000,), "prob": (1000,)},
    "models/bvlc_alexnet/train_val.prototxt": {
        "conv1": (96, 55, 55), "norm1": (96, 55, 55), "pool1": (96, 27, 27),
        "pool2": (256, 13, 13), "pool5": (256, 6, 6), "fc7": (4096,), "fc8": (1000,)},
    "models/bvlc_googlenet/deploy.prototxt": {
        "conv1/7x7_s2": (64, 112, 112), "pool1/3x3_s2": (64, 56, 56),
        "pool2/3x3_s2": (192, 28, 28), "inception_3a/output": (256, 28, 28),
        "inception_3b/output": (480, 28, 28), "inception_4e/output": (832, 14, 14),
        "inception_5b/output": (1024, 7, 7), "pool5/7x7_s1": (1024, 1, 1),
        "loss3/classifier": (1000,), "prob": (1000,)},
    "examples/cifar10/cifar10_quick_train_test.prototxt": {
        "conv1": (32, 32, 32), "pool1": (32, 16, 16), "pool2": (32, 8, 8),
        "pool3": (64, 4, 4), "ip1": (64,), "ip2": (10,)},
    "examples/mnist/lenet_train_test.prototxt": {
        "conv1": (20, 24, 24), "pool1": (20, 12, 12), "conv2": (50, 8, 8),
        "pool2": (50, 4, 4), "ip1": (500,), "ip2": (10,)},
    "examples/net_surgery/bvlc_caffenet_full_conv.prototxt": {
        "conv1": (96, 111, 111), "pool5": (256, 13, 13), "fc6-conv": (4096, 8, 8),
        "fc8-conv": (1000, 8, 8)},
}
BATCH = 2
# Nets whose TEST phase needs a stage (their solvers set test_state { stage: ... }).
TEST_STAGES = {"examples/mnist/mnist_autoencoder.prototxt": ["test-on-test"]}


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
@pytest.mark.parametrize("path", zoo_nets(), ids=lambda p: str(p.relative_to(CAFFE_ZOO)) if p else "absent")
def test_zoo_net_builds_and_runs(path, phase):
    rel = str(path.relative_to(CAFFE_ZOO))
    batch = 1 if "full_conv" in rel else BATCH
    param = swap_data_layers(read_net_text(str(path)), batch)
    set_quiet(True)
    try:
        net = Net(param, phase=cct.TRAIN if phase == "TRAIN" else cct.TEST,
                  stages=TEST_STAGES.get(rel) if phase == "TEST" else None, source=str(path))
    finally:
        set_quiet(False)
    fill_inputs(net)
    loss = net.forward_prefilled()
    net.backward_all()
    assert np.isfinite(loss)
    for name, blob in net.blobs.items():
        assert np.all(np.isfinite(blob.data)), f"{rel}: blob {name} not finite"
    for name, shape in KNOWN_SHAPES.get(rel, {}).items():
        assert net.blobs[name].shape == (batch,) + shape, f"{rel}: {name}"


@pytest.mark.parametrize("path", zoo_nets(), ids=lambda p: str(p.relative_to(CAFFE_ZOO)) if p else "absent")
def test_zoo_net_on_the_device_gives_the_cpus_numbers(path):
    """Each zoo net's forward and backward (TRAIN phase) on the CuPy-rules stand-in (the GPU
    path) against the CPU: every blob, param diff and the loss. In float64, since in float32
    a near-tie in a MAX pooling window may go either way under another summation order and
    move that window's gradient (seen on CaffeNet: a handful of elements of conv5's weight
    diff, none of its bias diff)."""
    rel = str(path.relative_to(CAFFE_ZOO))
    batch = 1 if "full_conv" in rel else BATCH
    param = swap_data_layers(read_net_text(str(path)), batch)
    nets, losses = [], []
    for backend in ("cpu", "numpy"):
        set_quiet(True)
        try:
            cct.rng.set_random_seed(11)
            net = Net(param, phase=cct.TRAIN, source=str(path), backend=backend,
                      dtype=np.float64)
        finally:
            set_quiet(False)
        fill_inputs(net)
        cct.rng.set_random_seed(12)        # Dropout's masks, drawn on the host
        losses.append(net.forward_prefilled())
        # a layer at a time, as pycaffe's backward(): every blob diff as Caffe leaves it (in
        # training the CPU stacks a Split's 1x1 convolutions: their param diffs are below)
        net.backward_from_to(len(net.layers) - 1, 0)
        nets.append(net)
    cpu, dev = nets
    assert losses[1] == pytest.approx(losses[0], rel=1e-9, abs=1e-12)

    def close(a, b, what):
        scale = max(float(np.abs(a).max(initial=0.0)), 1e-30)
        assert float(np.abs(a - b).max(initial=0.0)) <= 1e-9 * scale, f"{rel}: {what}"
    for name, blob in cpu.blobs.items():
        close(blob.data, dev.blobs[name].data, f"blob {name} data")
        close(blob.diff, dev.blobs[name].diff, f"blob {name} diff")
    for name, blobs in cpu.params.items():
        for i, b in enumerate(blobs):
            close(b.diff, dev.params[name][i].diff, f"param {name}/{i} diff")
    for net in nets:                       # training's backward pass, the same forward
        net.clear_param_diffs()
        net.backward_all()
    for name, blobs in cpu.params.items():
        for i, b in enumerate(blobs):
            close(b.diff, dev.params[name][i].diff, f"param {name}/{i} diff in training")
