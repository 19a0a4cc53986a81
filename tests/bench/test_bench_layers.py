"""bench/bench_layers.py's counts: each layer's FLOPs and bytes on the bundled LeNet, worked
out by hand from Caffe's shapes, and the roofline each row is held against."""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_layers", ROOT / "bench" / "bench_layers.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

BATCH = 4


@pytest.fixture(scope="module")
def lenet():
    return bench.synthetic_net(ROOT / "examples" / "mnist" / "lenet_train_test.prototxt", BATCH)


def index(net, name):
    return list(net.layer_names).index(name)


def test_convolution_flops_skip_the_data_gradient_of_the_first_layer(lenet):
    # conv1: 20 filters of 1x5x5 over 28x28 -> 24x24; its bottom is data, so backward is the
    # weight gradient alone. conv2: 50 of 20x5x5 over 12x12 -> 8x8, and a bottom diff too.
    conv1 = 2.0 * BATCH * 20 * 24 * 24 * 25
    assert bench.layer_flops(lenet, index(lenet, "conv1")) == (conv1, conv1)
    conv2 = 2.0 * BATCH * 50 * 8 * 8 * 20 * 25
    assert bench.layer_flops(lenet, index(lenet, "conv2")) == (conv2, 2 * conv2)
    ip1 = 2.0 * BATCH * 500 * 800
    assert bench.layer_flops(lenet, index(lenet, "ip1")) == (ip1, 2 * ip1)
    assert bench.layer_flops(lenet, index(lenet, "pool1")) == (0.0, 0.0)


def test_bytes_count_each_blob_once(lenet):
    f = 4  # float32
    top, params = BATCH * 20 * 24 * 24 * f, (20 * 25 + 20) * f
    bottom = BATCH * 28 * 28 * f
    # Backward: top diff and bottom read, no bottom diff, params read, their diffs read+written.
    assert bench.layer_bytes(lenet, index(lenet, "conv1")) == (
        bottom + top + params, top + bottom + 3 * params)
    pooled = BATCH * 20 * 12 * 12 * f
    assert bench.layer_bytes(lenet, index(lenet, "pool1")) == (
        top + pooled, pooled + top + top)
    assert bench.layer_bytes(lenet, index(lenet, "mnist")) == (0, 0)


def test_a_split_moves_only_its_diffs():
    from cct.net import Net
    from cct.proto import caffe_pb2
    from google.protobuf import text_format

    param = text_format.Parse("""
        layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
        layer { name: "a" type: "InnerProduct" bottom: "x" top: "a"
                inner_product_param { num_output: 4 } }
        layer { name: "b" type: "InnerProduct" bottom: "x" top: "b"
                inner_product_param { num_output: 5 } }
        layer { name: "loss" type: "EuclideanLoss" bottom: "a" bottom: "a" top: "l" }
        layer { name: "loss2" type: "EuclideanLoss" bottom: "b" bottom: "b" top: "l2" }
        force_backward: true""", caffe_pb2.NetParameter())
    net = Net(param, phase=caffe_pb2.TRAIN)
    split = next(i for i, layer in enumerate(net.layers) if layer.type == "Split")
    # forward: the two tops share x's data; backward: two top diffs read, their sum written
    assert bench.layer_bytes(net, split) == (0, 3 * 2 * 3 * 4)


def test_roofline_names_the_bound_whose_time_is_longer():
    row = {"seconds": (0.5, 0.5), "flops": (100e9, 100e9), "bytes": (1e9, 1e9)}
    gflops, gbs, bound, roof = bench.roofline(row, peak=400.0, bandwidth=10.0)
    assert (gflops, gbs, bound) == (200.0, 2.0, "compute")
    assert roof == pytest.approx(50.0)  # 0.5 s of FLOPs at the peak in a 1 s row
    gflops, gbs, bound, roof = bench.roofline(row, peak=400.0, bandwidth=1.0)
    assert bound == "memory" and roof == pytest.approx(200.0)  # a cached blob beats DRAM


def test_family_rows_sum_by_type_slowest_first():
    rows = [{"name": "a", "type": "ReLU", "seconds": (1.0, 1.0), "flops": (0, 0), "bytes": (4, 8)},
            {"name": "b", "type": "Convolution", "seconds": (2.0, 3.0), "flops": (1, 2),
             "bytes": (1, 1)},
            {"name": "c", "type": "ReLU", "seconds": (0.5, 0.5), "flops": (0, 0),
             "bytes": (4, 8)}]
    out = bench.family_rows(rows)
    assert [r["name"] for r in out] == ["Convolution x1", "ReLU x2"]
    assert out[1]["seconds"] == (1.5, 1.5) and out[1]["bytes"] == (8, 16)


def profiles_both_ways(net_file):
    """(fusion, {layer name: row}) of one iteration at batch 2, with and without fusion."""
    for fusion in (True, False):
        yield fusion, {r["name"]: r for r in bench.profile(net_file, 2, warmup=0, iters=1,
                                                           fusion=fusion)}


def test_profile_runs_a_fused_relu_inside_its_convolution_as_training_does(tmp_path):
    """A convolution with an in-place ReLU after it: the profile times the pair as the
    convolution's forward (the training step fuses them), the ReLU's forward row 0 with no
    forward bytes; --no-fusion times the ReLU alone, as cct time does."""
    net_file = tmp_path / "conv_relu.prototxt"
    net_file.write_text("""
        layer { name: "x" type: "Input" top: "x" top: "label"
                input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } shape { dim: 2 } } }
        layer { name: "conv" type: "Convolution" bottom: "x" top: "c"
                convolution_param { num_output: 4 kernel_size: 3
                                    weight_filler { type: "gaussian" std: 0.1 } } }
        layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
        layer { name: "ip" type: "InnerProduct" bottom: "c" top: "ip"
                inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
        layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "l" }
    """)
    for fusion, rows in profiles_both_ways(net_file):
        relu = rows["relu"]
        assert relu["fused"] is fusion
        assert (relu["seconds"][0] == 0.0) is fusion and relu["seconds"][1] > 0.0
        assert (relu["bytes"][0] == 0) is fusion and relu["bytes"][1] > 0
        assert rows["conv"]["seconds"][0] > 0.0 and not rows["conv"]["fused"]


def test_profile_runs_a_concats_relus_inside_its_backward_as_training_does(tmp_path):
    """A Concat whose bottom has an in-place ReLU: the profile times the ReLU's backward
    inside the Concat's (training's backward_all), the ReLU's backward row 0 with no backward
    bytes; --no-fusion times it alone."""
    net_file = tmp_path / "concat_relu.prototxt"
    net_file.write_text("""
        layer { name: "x" type: "Input" top: "x" top: "label"
                input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } shape { dim: 2 } } }
        layer { name: "a" type: "Convolution" bottom: "x" top: "a"
                convolution_param { num_output: 4 kernel_size: 3
                                    weight_filler { type: "gaussian" std: 0.1 } } }
        layer { name: "b" type: "Pooling" bottom: "x" top: "b"
                pooling_param { pool: MAX kernel_size: 3 } }
        layer { name: "relu" type: "ReLU" bottom: "a" top: "a" relu_param { negative_slope: 0.1 } }
        layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" top: "cat" }
        layer { name: "ip" type: "InnerProduct" bottom: "cat" top: "ip"
                inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
        layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "l" }
    """)
    for fusion, rows in profiles_both_ways(net_file):
        relu = rows["relu"]
        assert relu["fused_backward"] is fusion and not relu["fused"]
        assert (relu["seconds"][1] == 0.0) is fusion and relu["seconds"][0] > 0.0
        assert (relu["bytes"][1] == 0) is fusion and relu["bytes"][0] > 0
        assert rows["cat"]["seconds"][1] > 0.0 and not rows["cat"]["fused_backward"]
