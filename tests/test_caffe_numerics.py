"""Forward and backward numerics against real BVLC Caffe (fixtures/caffe/numerics).

Each fixture is a net, the parameters and inputs Caffe used, and every blob's data and diff
and every param's data and diff after one forward and one backward pass in Caffe. cct loads the
same parameters and inputs, runs the same passes in float32, and must agree to float32
rounding: the error of each array, relative to its largest magnitude, stays below 2e-5
(measured: see test output with -s; typically ~1e-6).
"""
import re

import numpy as np
import pytest

import cct
from cct.glog import set_quiet

FIXTURES = [
    ("lenet_train_test_b8", "TRAIN"),
    ("lenet_train_test_b8", "TEST"),
    ("cifar10_quick_train_test_b4", "TRAIN"),
    ("cifar10_quick_train_test_b4", "TEST"),
    ("layer_zoo", "TEST"),
]
REL_TOL = 2e-5


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    scale = float(np.abs(b).max()) if b.size else 0.0
    if scale == 0.0:
        return float(np.abs(a).max()) if a.size else 0.0
    return float(np.abs(a.astype(np.float64) - b).max() / scale)


def load_and_run(folder, name, phase, backend=None):
    """The fixture's net on ``backend`` after one forward and backward pass from Caffe's
    params and inputs, and Caffe's arrays (the fixture's npz)."""
    ref = np.load(folder / "numerics" / f"{name}.{phase}.npz")
    set_quiet(True)
    try:
        net = cct.Net(str(folder / "numerics" / f"{name}.prototxt"),
                      cct.TRAIN if phase == "TRAIN" else cct.TEST, backend=backend)
    finally:
        set_quiet(False)
    for key in ref.files:
        if key.startswith("param_init/"):
            _, layer, i, _ = key.split("/")
            net.params[layer][int(i)].data[...] = ref[key]
        elif key.startswith("input/"):
            net.blobs[key[len("input/"):]].data[...] = ref[key]
    net.forward_prefilled()
    net.clear_param_diffs()
    net.backward_all()
    return net, ref


def errors_against_caffe(net, ref) -> dict:
    """Relative error (rel_err) of each blob's and param's data and diff, and each net output,
    against Caffe's, keyed as in ``ref``; each must be a host NumPy array of Caffe's shape."""
    worst = {}
    for key in ref.files:
        parts = key.split("/")
        if parts[0] == "blob":
            blob = net.blobs[parts[1]]
            got = blob.data if parts[2] == "data" else blob.diff
        elif parts[0] == "param":
            blob = net.params[parts[1]][int(parts[2])]
            got = blob.data if parts[3] == "data" else blob.diff
        elif parts[0] == "output":
            got = net.blobs[parts[1]].data
        else:
            continue
        want = ref[key]
        assert type(got) is np.ndarray, f"{key}: {type(got).__name__}, not a host array"
        assert got.shape == want.shape, f"{key}: shape {got.shape}, Caffe {want.shape}"
        worst[key] = rel_err(got, want)
    return worst


def assert_within_tolerance(worst: dict, what: str) -> None:
    """Every error in ``worst`` at most REL_TOL; prints the largest (see it with -s)."""
    bad = {k: v for k, v in worst.items() if v > REL_TOL}
    print(f"\n{what}: {len(worst)} arrays, max relative error "
          f"{max(worst.values()):.2e} ({max(worst, key=worst.get)})")
    assert not bad, f"arrays off Caffe by more than {REL_TOL}: " + ", ".join(
        f"{k}={v:.2e}" for k, v in sorted(bad.items(), key=lambda kv: -kv[1]))


@pytest.mark.parametrize("name,phase", FIXTURES, ids=[f"{n}.{p}" for n, p in FIXTURES])
def test_blobs_and_params_match_caffe(caffe_fixtures, name, phase):
    net, ref = load_and_run(caffe_fixtures, name, phase)
    assert list(net.layer_names) == list(ref["meta/layer_names"])
    assert [l.type for l in net.layers] == list(ref["meta/layer_types"])
    assert list(net.blobs) == list(ref["meta/blob_names"])
    assert_within_tolerance(errors_against_caffe(net, ref), f"{name}.{phase}")


@pytest.mark.parametrize("name,phase", FIXTURES, ids=[f"{n}.{p}" for n, p in FIXTURES])
def test_init_log_top_shapes_match_caffe(caffe_fixtures, name, phase, capfd):
    """The "Top shape:" and "Memory required" lines cct logs equal Caffe's, in order."""
    cct.Net(str(caffe_fixtures / "numerics" / f"{name}.prototxt"),
            cct.TRAIN if phase == "TRAIN" else cct.TEST)
    ours = capfd.readouterr().err
    theirs = (caffe_fixtures / "numerics" / f"{name}.{phase}.log").read_text()
    pat = re.compile(r"\] ((?:Top shape|Memory required for data|Creating Layer|Setting up"
                     r"|This network produces output|    with loss weight).*|\S+ (?:needs|does "
                     r"not need) backward computation\.)$", re.M)
    assert pat.findall(ours) == pat.findall(theirs)
