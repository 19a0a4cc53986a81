"""bench/bench_backward_fusions.py's arms: each old arm (NumPy slices; a layer's backward, then
its ReLUs' own) against the new one on the same arrays, leaving the same bits, as the bench
checks before it times them."""
import importlib.util
import pathlib

import numpy as np

from tests.test_net import CONCAT_RELUS, POOL_RELUS, inception_net

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_backward_fusions",
                                              ROOT / "bench" / "bench_backward_fusions.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_arms_leave_the_same_bits_and_the_old_forward_is_numpys():
    net = inception_net(CONCAT_RELUS)
    net.forward_backward()
    top = net.blobs["cat"]
    top.diff[...] = np.random.default_rng(3).standard_normal(top.shape)
    arms = bench.arms(net)
    assert [name for name, *_ in arms] == ["cat forward", "cat backward (2 ReLUs)"]
    for name, old, new, bits in arms:
        old()
        want = bits()
        for b in net.bottom_vecs[net.layer_names.index("cat")]:
            b.diff[...] = np.nan
        top.data[...] = np.nan
        new()
        assert bits() == want, name
    arms[0][1]()   # the old forward: NumPy's slices
    bottoms = [net.blobs[n].data for n in ("a", "b", "c", "d", "e_out")]
    assert top.data.tobytes() == np.concatenate(bottoms, 1).tobytes()


def test_a_max_poolings_and_an_lrns_arms_leave_the_same_bits():
    net = inception_net(POOL_RELUS)
    net.forward_backward()
    arms = bench.arms(net)
    assert [name for name, *_ in arms] == ["pool1 backward (1 ReLU)", "norm2 backward (1 ReLU)"]
    for (name, old, new, bits), blob in zip(arms, ("conv1", "conv2")):
        old()
        want = bits()
        net.blobs[blob].diff[...] = np.nan
        new()
        assert bits() == want, name
