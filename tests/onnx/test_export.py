"""`cct export_onnx`: every mapped layer type, Caffe's quirks included, computes in ONNX Runtime
what cct computes (which the layer tests tie to Caffe); the zoo's deploy nets at batch 1, 8 and
dynamic; layers without an exact equivalent refused by name; the CLI and its check mode."""
import subprocess
import sys

import numpy as np
import pytest
from google.protobuf import text_format

import cct
from cct.errors import CCTError
from cct.install import install_hint
from cct.onnx_export import ExportError, export_onnx, run_check
from cct.proto import caffe_pb2

onnx = pytest.importorskip("onnx", reason=f"the onnx package is not installed "
                                          f"({install_hint('onnx')})")
pytest.importorskip("onnxruntime", reason=f"onnxruntime is not installed "
                                          f"({install_hint('onnx')})")

TOL = 1e-4


def net_of(text: str, seed: int = 0) -> cct.Net:
    """A TEST-phase net from prototxt text, its params drawn at a scale that keeps activations
    in range (std 1/sqrt(fan in)); BatchNorm's statistics positive."""
    param = text_format.Parse(text, caffe_pb2.NetParameter())
    net = cct.Net(param, cct.TEST)
    rng = np.random.default_rng(seed)
    for name, blobs in net.params.items():
        kind = net.layer_dict[name].layer_param.type
        for i, b in enumerate(blobs):
            shape = b.data.shape
            if kind == "BatchNorm":
                b.data[...] = (rng.uniform(0.5, 2.0, shape) if i else rng.standard_normal(shape))
                if i == 2:
                    b.data[...] = 2.0
                continue
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            b.data[...] = rng.standard_normal(shape) / np.sqrt(fan_in)
    return net


def exported(net, tmp_path, batch="dynamic"):
    model = export_onnx(net, tmp_path / "m.onnx", batch=batch)
    onnx.checker.check_model(onnx.load(str(tmp_path / "m.onnx")))
    return model


def assert_exact(net, tmp_path, batches=(1, 3)):
    model = exported(net, tmp_path)
    for n in batches:
        for name, diff in run_check(net, model, n).items():
            assert diff < TOL, (name, n, diff)
    return model


INPUT = 'layer {{ name: "in" type: "Input" top: "x" input_param {{ shape {{ dim: 2 {dims} }} }} }}\n'

#: (layer text, the input's dims after the batch of 2): every mapped layer type and its quirks.
LAYER_CASES = [
    # convolution: pad, stride, dilation, groups, rectangular, no bias
    ('layer { name: "c" type: "Convolution" bottom: "x" top: "y" convolution_param { '
     'num_output: 6 kernel_h: 3 kernel_w: 2 stride: 2 pad: 1 dilation: 2 group: 2 } }',
     "dim: 4 dim: 11 dim: 9"),
    ('layer { name: "c" type: "Convolution" bottom: "x" top: "y" convolution_param { '
     'num_output: 3 kernel_size: 1 bias_term: false } }', "dim: 4 dim: 5 dim: 5"),
    ('layer { name: "d" type: "Deconvolution" bottom: "x" top: "y" convolution_param { '
     'num_output: 4 kernel_size: 4 stride: 2 pad: 1 group: 2 } }', "dim: 2 dim: 5 dim: 6"),
    # pooling: ceil rounding, the dropped last window, average divisor with and without pad
    ('layer { name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: MAX '
     'kernel_size: 3 stride: 2 } }', "dim: 3 dim: 8 dim: 8"),
    ('layer { name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: MAX '
     'kernel_size: 3 stride: 2 pad: 1 } }', "dim: 3 dim: 6 dim: 7"),
    ('layer { name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: AVE '
     'kernel_size: 3 stride: 2 } }', "dim: 3 dim: 8 dim: 8"),
    ('layer { name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: AVE '
     'kernel_size: 3 stride: 1 pad: 1 } }', "dim: 3 dim: 5 dim: 5"),
    ('layer { name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: MAX '
     'kernel_size: 2 stride: 2 round_mode: FLOOR } }', "dim: 3 dim: 7 dim: 7"),
    ('layer { name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: AVE '
     'global_pooling: true } }', "dim: 3 dim: 5 dim: 4"),
    # inner product: axis, transpose
    ('layer { name: "f" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { '
     'num_output: 5 } }', "dim: 3 dim: 4 dim: 2"),
    ('layer { name: "f" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { '
     'num_output: 5 axis: 2 transpose: true } }', "dim: 3 dim: 4 dim: 2"),
    # neurons
    ('layer { name: "r" type: "ReLU" bottom: "x" top: "x" relu_param { negative_slope: 0.1 } }',
     "dim: 3"),
    ('layer { name: "r" type: "PReLU" bottom: "x" top: "y" }', "dim: 3 dim: 2 dim: 2"),
    ('layer { name: "r" type: "PReLU" bottom: "x" top: "y" prelu_param { channel_shared: true } }',
     "dim: 3 dim: 2"),
    ('layer { name: "s" type: "Sigmoid" bottom: "x" top: "a" }'
     'layer { name: "t" type: "TanH" bottom: "a" top: "b" }'
     'layer { name: "e" type: "ELU" bottom: "b" top: "c" elu_param { alpha: 0.5 } }'
     'layer { name: "v" type: "AbsVal" bottom: "c" top: "y" }', "dim: 4"),
    ('layer { name: "p" type: "Power" bottom: "x" top: "a" power_param { power: 2 scale: 0.5 '
     'shift: 3 } }'
     'layer { name: "e" type: "Exp" bottom: "a" top: "b" exp_param { base: 2 scale: 0.1 '
     'shift: -1 } }'
     'layer { name: "l" type: "Log" bottom: "b" top: "y" log_param { base: 10 scale: 2 '
     'shift: 1 } }', "dim: 4"),
    ('layer { name: "d" type: "Dropout" bottom: "x" top: "x" }', "dim: 4"),
    # normalization
    ('layer { name: "n" type: "LRN" bottom: "x" top: "y" lrn_param { local_size: 5 alpha: 0.1 '
     'beta: 0.75 k: 2 } }', "dim: 7 dim: 3 dim: 3"),
    ('layer { name: "n" type: "LRN" bottom: "x" top: "y" lrn_param { local_size: 3 alpha: 0.1 '
     'beta: 0.75 norm_region: WITHIN_CHANNEL } }', "dim: 2 dim: 5 dim: 5"),
    ('layer { name: "b" type: "BatchNorm" bottom: "x" top: "x" }'
     'layer { name: "s" type: "Scale" bottom: "x" top: "x" scale_param { bias_term: true } }',
     "dim: 3 dim: 4 dim: 4"),
    ('layer { name: "s" type: "Scale" bottom: "x" top: "y" scale_param { axis: 1 num_axes: 2 } }',
     "dim: 3 dim: 4 dim: 2"),
    ('layer { name: "s" type: "Bias" bottom: "x" top: "y" bias_param { axis: 2 num_axes: 1 } }',
     "dim: 3 dim: 4 dim: 2"),
    ('layer { name: "s" type: "Softmax" bottom: "x" top: "y" softmax_param { axis: 2 } }',
     "dim: 3 dim: 4"),
    # structure
    ('layer { name: "a" type: "ReLU" bottom: "x" top: "a" }'
     'layer { name: "c" type: "Concat" bottom: "x" bottom: "a" top: "y" concat_param { axis: 2 } }',
     "dim: 3 dim: 4"),
    ('layer { name: "a" type: "ReLU" bottom: "x" top: "a" }'
     'layer { name: "e" type: "Eltwise" bottom: "x" bottom: "a" bottom: "x" top: "y" '
     'eltwise_param { coeff: 1 coeff: -0.5 coeff: 2 } }', "dim: 3"),
    ('layer { name: "a" type: "ReLU" bottom: "x" top: "a" }'
     'layer { name: "e" type: "Eltwise" bottom: "x" bottom: "a" bottom: "x" top: "y" '
     'eltwise_param { operation: PROD } }', "dim: 3"),
    ('layer { name: "a" type: "ReLU" bottom: "x" top: "a" }'
     'layer { name: "e" type: "Eltwise" bottom: "x" bottom: "a" top: "y" '
     'eltwise_param { operation: MAX } }', "dim: 3"),
    ('layer { name: "f" type: "Flatten" bottom: "x" top: "y" flatten_param { axis: 2 } }',
     "dim: 3 dim: 4 dim: 2"),
    ('layer { name: "r" type: "Reshape" bottom: "x" top: "y" reshape_param { shape { dim: 0 '
     'dim: -1 dim: 2 } } }', "dim: 3 dim: 4"),
    ('layer { name: "s" type: "Slice" bottom: "x" top: "a" top: "b" top: "c" slice_param { '
     'axis: 1 slice_point: 1 slice_point: 3 } }', "dim: 5 dim: 2"),
    ('layer { name: "a" type: "Pooling" bottom: "x" top: "a" pooling_param { pool: MAX '
     'kernel_size: 2 stride: 2 } }'
     'layer { name: "c" type: "Crop" bottom: "x" bottom: "a" top: "y" crop_param { axis: 2 '
     'offset: 1 offset: 2 } }', "dim: 3 dim: 6 dim: 7"),
    ('layer { name: "b" type: "BNLL" bottom: "x" top: "a" }'
     'layer { name: "t" type: "Threshold" bottom: "a" top: "b" threshold_param { '
     'threshold: 0.7 } }'
     'layer { name: "c" type: "Clip" bottom: "x" top: "c" clip_param { min: -0.5 max: 0.3 } }'
     'layer { name: "s" type: "Swish" bottom: "c" top: "d" swish_param { beta: 1.5 } }'
     'layer { name: "e" type: "Eltwise" bottom: "b" bottom: "d" top: "y" }', "dim: 6"),
    ('layer { name: "t" type: "Tile" bottom: "x" top: "y" tile_param { axis: 1 tiles: 3 } }',
     "dim: 2 dim: 3"),
    ('layer { name: "r" type: "Reduction" bottom: "x" top: "a" reduction_param { axis: 1 } }'
     'layer { name: "s" type: "Reduction" bottom: "x" top: "b" reduction_param { axis: 2 '
     'operation: ASUM coeff: 0.5 } }'
     'layer { name: "q" type: "Reduction" bottom: "x" top: "c" reduction_param { axis: 1 '
     'operation: SUMSQ } }'
     'layer { name: "m" type: "Reduction" bottom: "x" top: "d" reduction_param { axis: 1 '
     'operation: MEAN coeff: 2 } }', "dim: 3 dim: 4"),
    ('layer { name: "m" type: "MVN" bottom: "x" top: "y" }', "dim: 3 dim: 4 dim: 5"),
    ('layer { name: "m" type: "MVN" bottom: "x" top: "y" mvn_param { across_channels: true '
     'normalize_variance: false } }', "dim: 3 dim: 4 dim: 5"),
    ('layer { name: "m" type: "ArgMax" bottom: "x" top: "y" argmax_param { axis: 1 } }',
     "dim: 5 dim: 3"),
    ('layer { name: "m" type: "ArgMax" bottom: "x" top: "y" }', "dim: 5 dim: 3"),
]


def case_id(v: str) -> str:
    return v.split('type: "')[1].split('"')[0] if 'type: "' in v else v


@pytest.mark.parametrize("body, dims", LAYER_CASES, ids=case_id)
def test_layer_computes_what_cct_computes(body, dims, tmp_path):
    net = net_of(INPUT.format(dims=dims) + body)
    assert_exact(net, tmp_path)


def test_legacy_v1_net_exports_after_cct_upgrades_it(tmp_path):
    net = net_of('name: "v1" input: "data" input_dim: 2 input_dim: 1 input_dim: 9 input_dim: 9 '
                 'layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv" '
                 'convolution_param { num_output: 2 kernel_size: 3 } } '
                 'layers { name: "relu" type: RELU bottom: "conv" top: "conv" } '
                 'layers { name: "pool" type: POOLING bottom: "conv" top: "pool" '
                 'pooling_param { pool: AVE kernel_size: 2 stride: 2 } }')
    model = assert_exact(net, tmp_path)
    assert [i.name for i in model.graph.input] == ["data"]


def test_embed_gathers_rows_by_float_index(tmp_path):
    net = net_of('layer { name: "i" type: "Input" top: "idx" input_param { shape { dim: 2 '
                 'dim: 5 } } } layer { name: "e" type: "Embed" bottom: "idx" top: "y" '
                 'embed_param { num_output: 4 input_dim: 7 } }')
    model = exported(net, tmp_path)
    for n in (1, 3):
        idx = np.random.default_rng(n).integers(0, 7, (n, 5)).astype(np.float32)
        assert run_check(net, model, n, given={"idx": idx})["y"] < TOL


def test_caffe_blob_names_are_the_tensor_names_and_in_place_layers_chain(tmp_path):
    net = net_of(INPUT.format(dims="dim: 3 dim: 4 dim: 4") +
                 'layer { name: "c" type: "Convolution" bottom: "x" top: "conv" '
                 'convolution_param { num_output: 2 kernel_size: 3 } }'
                 'layer { name: "r" type: "ReLU" bottom: "conv" top: "conv" }'
                 'layer { name: "p" type: "Pooling" bottom: "conv" top: "pool" '
                 'pooling_param { pool: MAX kernel_size: 2 } }')
    model = assert_exact(net, tmp_path)
    outputs = {n.name: list(n.output) for n in model.graph.node}
    assert outputs["c"] == ["conv/c"] and outputs["r"] == ["conv"] and outputs["p"] == ["pool"]
    assert [o.name for o in model.graph.output] == ["pool"]
    assert model.doc_string.startswith(f"Exported by cct {cct.__version__}")


@pytest.mark.parametrize("body, needle", [
    ('layer { name: "py" type: "Python" bottom: "x" bottom: "x" top: "y" python_param { '
     'module: "tests.zoo_layers.pyloss" layer: "EuclideanLossLayer" } }', "Python layer"),
    ('layer { name: "m" type: "ArgMax" bottom: "x" top: "y" argmax_param { top_k: 2 } }',
     "top_k 1"),
    ('layer { name: "r" type: "Reduction" bottom: "x" top: "y" reduction_param { axis: 0 } }',
     "fixed --batch"),
])
def test_layers_without_an_exact_equivalent_are_refused_by_name(body, needle, tmp_path):
    try:
        net = net_of(INPUT.format(dims="dim: 3 dim: 6 dim: 6") + body)
    except CCTError as e:       # a layer this machine cannot build (e.g. the Python one)
        pytest.skip(f"cannot build the net here: {e}")
    with pytest.raises(ExportError, match=needle):
        export_onnx(net, tmp_path / "m.onnx", batch="dynamic")
    assert not (tmp_path / "m.onnx").exists()


ZOO_DEPLOY = ["models/bvlc_reference_caffenet/deploy.prototxt",
              "models/bvlc_alexnet/deploy.prototxt",
              "models/bvlc_googlenet/deploy.prototxt",
              "models/finetune_flickr_style/deploy.prototxt",
              "models/bvlc_reference_rcnn_ilsvrc13/deploy.prototxt",
              "examples/mnist/lenet.prototxt",
              "examples/cifar10/cifar10_quick.prototxt",
              "examples/cifar10/cifar10_full.prototxt",
              "examples/net_surgery/bvlc_caffenet_full_conv.prototxt",
              "examples/net_surgery/conv.prototxt",
              "examples/siamese/mnist_siamese.prototxt"]


@pytest.mark.parametrize("rel", ZOO_DEPLOY)
def test_zoo_deploy_nets_at_batch_1_8_and_dynamic(rel, caffe_zoo, tmp_path):
    path = caffe_zoo / rel
    net = net_of(path.read_text())
    model = exported(net, tmp_path)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    for n in (1, 8):
        for name, diff in run_check(net, model, n).items():
            assert diff < TOL, (rel, name, n, diff)
    for n in (1, 8):
        fixed = export_onnx(net, tmp_path / f"fixed{n}.onnx", batch=n)
        assert fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value == n
        for name, diff in run_check(net, fixed, n).items():
            assert diff < TOL, (rel, name, n, diff)


def test_train_val_net_exports_its_deploy_view(caffe_fixtures, tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(caffe_fixtures)     # the Data layers' LMDB paths are relative
    net = cct.Net(str(caffe_fixtures / "lenet_train_test.prototxt"), cct.TEST,
                  weights=str(caffe_fixtures / "lenet_iter_2000.caffemodel"))
    capfd.readouterr()
    model = export_onnx(net, tmp_path / "lenet.onnx", batch="dynamic")
    assert "Deploy view: dropped accuracy, loss" in capfd.readouterr().err
    assert [i.name for i in model.graph.input] == ["data"]
    assert [o.name for o in model.graph.output] == ["ip2"]
    for name, diff in run_check(net, model, 4).items():
        assert diff < TOL, (name, diff)


def test_cli_exports_and_checks(caffe_fixtures, tmp_path):
    run = subprocess.run([sys.executable, "-m", "cct.cli", "export_onnx",
                          f"--model={caffe_fixtures / 'lenet_train_test.prototxt'}",
                          f"--weights={caffe_fixtures / 'lenet_iter_2000.caffemodel'}",
                          f"--output={tmp_path / 'lenet.onnx'}", "--batch=dynamic", "--check"],
                         capture_output=True, text=True, cwd=caffe_fixtures)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("check batch")]
    assert len(lines) == 2 and all("output ip2: largest difference" in ln for ln in lines)
    assert all(float(ln.split("difference ")[1].split()[0]) < TOL for ln in lines)
    model = onnx.load(str(tmp_path / "lenet.onnx"))
    assert "lenet_train_test.prototxt" in model.doc_string


def test_cli_bad_flags(tmp_path):
    run = subprocess.run([sys.executable, "-m", "cct.cli", "export_onnx",
                          f"--output={tmp_path / 'm.onnx'}"], capture_output=True, text=True)
    assert run.returncode == 1 and "give -model" in run.stderr and "Traceback" not in run.stderr
