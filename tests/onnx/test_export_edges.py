"""`cct export_onnx` where a user meets its edges: the README's form (no -batch) on a net with a
fixed batch, ONNX Runtime failures as one line naming the node and its layer, -opset checked
against what onnx and onnxruntime know, and average pooling whose last window passes the
padding (SqueezeNet's pool3), exact through a sum and Caffe's divisors."""
import pathlib

import numpy as np
import pytest

import cct
from cct import cli
from cct.install import install_hint
from cct.onnx_export import (MIN_OPSET, CheckError, ExportError, check_batches, export_onnx,
                             opset_range, run_check)

from .test_export import INPUT, LAYER_CASES, TOL, case_id, exported, net_of

onnx = pytest.importorskip("onnx", reason=f"the onnx package is not installed "
                                          f"({install_hint('onnx')})")
pytest.importorskip("onnxruntime", reason=f"onnxruntime is not installed "
                                          f"({install_hint('onnx')})")

REPO_MNIST = pathlib.Path(cct.__file__).resolve().parents[1] / "examples" / "mnist"


def run_cli(argv, capsys):
    """cct's CLI in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    rc = cli.main(["export_onnx"] + argv)
    out, err = capsys.readouterr()
    return rc, out, err


def check_lines(out):
    return [ln for ln in out.splitlines() if ln.startswith("check batch")]


# -- 1. the README's form on a fixed batch; ONNX Runtime failures as one line -----------------
def test_readme_form_on_bundled_lenet_with_data_layers(caffe_fixtures, tmp_path, capsys,
                                                       monkeypatch):
    # examples/mnist/lenet_train_test.prototxt reads examples/mnist/mnist_test_lmdb (batch 100)
    # relative to the working folder; Caffe's own 10k test digits stand in for it.
    lmdb = tmp_path / "examples" / "mnist" / "mnist_test_lmdb"
    lmdb.parent.mkdir(parents=True)
    lmdb.symlink_to(caffe_fixtures / "mnist10k_test_lmdb")
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli([f"--model={REPO_MNIST}/lenet_train_test.prototxt",
                            f"--weights={caffe_fixtures / 'lenet_iter_2000.caffemodel'}",
                            f"--output={tmp_path / 'm.onnx'}", "--check"], capsys)
    assert rc == 0, err[-2000:]
    lines = check_lines(out)
    assert len(lines) == 1 and lines[0].startswith("check batch 100: output ip2:"), out
    assert float(lines[0].split("difference ")[1].split()[0]) < TOL
    dim = onnx.load(str(tmp_path / "m.onnx")).graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_value == 100       # the net's own batch, as the prototxt says


def test_readme_form_on_fixed_batch_lenet_with_random_weights(tmp_path, capsys):
    # The bundled LeNet with Input layers (TEST batch 100) and weights drawn at random.
    model = f"{REPO_MNIST}/lenet_input_train_test.prototxt"
    net = net_of(open(model).read())
    net.save(str(tmp_path / "w.caffemodel"))
    rc, out, err = run_cli([f"--model={model}", f"--weights={tmp_path / 'w.caffemodel'}",
                            f"--output={tmp_path / 'm.onnx'}", "--check"], capsys)
    assert rc == 0, err[-2000:]
    lines = check_lines(out)
    assert [ln.split(":")[0] for ln in lines] == ["check batch 100"], out
    assert float(lines[0].split("difference ")[1].split()[0]) < TOL
    # -batch N fixes another batch; the check follows it.
    rc, out, err = run_cli([f"--model={model}", f"--weights={tmp_path / 'w.caffemodel'}",
                            f"--output={tmp_path / 'm.onnx'}", "--batch=3", "--check"], capsys)
    assert rc == 0 and [ln.split(":")[0] for ln in check_lines(out)] == ["check batch 3"], err


def test_check_batches_follow_the_model(tmp_path):
    net = net_of(INPUT.format(dims="dim: 3") +
                 'layer { name: "r" type: "ReLU" bottom: "x" top: "y" }')
    assert check_batches(export_onnx(net, tmp_path / "a.onnx")) == [2]
    assert check_batches(export_onnx(net, tmp_path / "b.onnx", batch=5)) == [5]
    assert check_batches(export_onnx(net, tmp_path / "c.onnx", batch="dynamic")) == [1, 8]
    fixed = export_onnx(net, tmp_path / "a.onnx")
    assert run_check(net, fixed)["y"] < TOL
    with pytest.raises(CheckError, match="batch is fixed at 2, got batch 3"):
        run_check(net, fixed, 3)


def broken_reshape(model):
    """The model with InnerProduct 'blk/f''s reshape target made impossible, so ONNX Runtime
    fails while running node 'blk/f/reshape'."""
    for init in model.graph.initializer:
        if init.name == "blk/f/shape":
            init.CopyFrom(onnx.numpy_helper.from_array(np.array([0, 7, 7], np.int64), init.name))
    return model


def test_runtime_failure_is_one_line_naming_node_and_layer(tmp_path):
    net = net_of(INPUT.format(dims="dim: 3 dim: 4 dim: 2") +
                 'layer { name: "blk/f" type: "InnerProduct" bottom: "x" top: "y" '
                 'inner_product_param { num_output: 5 axis: 2 } }')
    model = broken_reshape(exported(net, tmp_path))
    with pytest.raises(CheckError) as e:
        run_check(net, model, 2)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("export_onnx --check: ONNX Runtime failed")
    assert "node 'blk/f/reshape' (layer 'blk/f')" in msg and "batch 2" in msg


def test_cli_runtime_failure_is_one_error_line(tmp_path, capsys, monkeypatch):
    text = (INPUT.format(dims="dim: 3 dim: 4 dim: 2") +
            'layer { name: "blk/f" type: "InnerProduct" bottom: "x" top: "y" '
            'inner_product_param { num_output: 5 axis: 2 } }')
    net = net_of(text)
    (tmp_path / "net.prototxt").write_text(text)
    net.save(str(tmp_path / "w.caffemodel"))
    from cct.tools import export_onnx as tool
    real = tool.export_onnx
    monkeypatch.setattr(tool, "export_onnx", lambda *a, **k: broken_reshape(real(*a, **k)))
    rc, out, err = run_cli([f"--model={tmp_path / 'net.prototxt'}",
                            f"--weights={tmp_path / 'w.caffemodel'}",
                            f"--output={tmp_path / 'm.onnx'}", "--check"], capsys)
    assert rc == 1 and "Traceback" not in err
    errors = [ln for ln in err.splitlines() if ln.startswith("cct: error:")]
    assert len(errors) == 1 and "node 'blk/f/reshape' (layer 'blk/f')" in errors[0], err


# -- 2. -opset within what the exporter writes and onnx/onnxruntime know ----------------------
@pytest.mark.parametrize("opset", ["99", "12", "0"])
def test_opset_outside_the_range_is_one_line(opset, tmp_path, capsys):
    low, high, _ = opset_range()
    rc, out, err = run_cli([f"--model={REPO_MNIST}/lenet_input_train_test.prototxt",
                            f"--output={tmp_path / 'm.onnx'}", f"--opset={opset}"], capsys)
    assert rc == 1 and "Traceback" not in err
    assert f"cct: error: export_onnx: -opset {opset} is outside {low}..{high}" in err, err
    assert not (tmp_path / "m.onnx").exists()
    with pytest.raises(ExportError, match=f"-opset {opset} is outside"):
        export_onnx(net_of(INPUT.format(dims="dim: 3") +
                           'layer { name: "r" type: "ReLU" bottom: "x" top: "y" }'),
                    tmp_path / "m.onnx", opset=int(opset))


def test_opset_range_is_what_onnx_and_onnxruntime_know():
    import onnxruntime as ort
    low, high, by = opset_range()
    assert low == MIN_OPSET and MIN_OPSET <= high <= onnx.defs.onnx_opset_version()
    assert f"onnxruntime {ort.__version__}" in by


def opsets():
    """Past the default (MIN_OPSET, which every other test writes): where Reduce* take their
    axes as an input, and the newest."""
    high = opset_range()[1]
    return sorted({18, high} & set(range(MIN_OPSET + 1, high + 1)))


@pytest.mark.parametrize("opset", opsets())
@pytest.mark.parametrize("body, dims", LAYER_CASES, ids=case_id)
def test_every_layer_at_every_opset_step(body, dims, opset, tmp_path):
    # Reduce* took their axes as an input from opset 18; every opset in the range must write
    # nodes its runtime reads.
    net = net_of(INPUT.format(dims=dims) + body)
    model = export_onnx(net, tmp_path / "m.onnx", opset=opset, batch="dynamic")
    onnx.checker.check_model(onnx.load(str(tmp_path / "m.onnx")))
    assert model.opset_import[0].version == opset
    for name, diff in run_check(net, model, 2).items():
        assert diff < TOL, (name, opset, diff)


# -- 3. average pooling past the padding: a sum divided by Caffe's divisors ---------------------
def caffe_ave_pool(x, kh, kw, sh, sw, ph, pw, oh, ow):
    """Caffe's AVE pooling (pooling_layer.cpp) in float64: the sum over the window inside the
    bottom, divided by the window clipped to [-pad, size + pad)."""
    n, c, h, w = x.shape
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * sh - ph, j * sw - pw
            he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
            size = (he - hs) * (we - ws)
            y[:, :, i, j] = x[:, :, max(hs, 0):min(he, h), max(ws, 0):min(we, w)].sum(
                axis=(2, 3)) / size
    return y


# (height, width, pooling_param): even and odd planes, pad 0/1/2, stride 1/2/3, ceil rounding's
# extra windows, rectangular windows with a pad on one axis only.
GEOMETRIES = [
    (6, 6, "kernel_size: 3 stride: 2 pad: 1"),       # SqueezeNet's pool3 on an even plane
    (14, 14, "kernel_size: 3 stride: 2 pad: 1"),
    (7, 7, "kernel_size: 3 stride: 2 pad: 1"),       # odd: the last window ends at the pad
    (8, 8, "kernel_size: 4 stride: 3 pad: 2"),
    (9, 10, "kernel_size: 5 stride: 3 pad: 2"),
    (4, 4, "kernel_size: 3 stride: 2 pad: 2"),       # a window dropped: it would start in pad
    (5, 6, "kernel_size: 3 stride: 1 pad: 1"),
    (6, 7, "kernel_size: 2 stride: 2"),              # pad 0: ceil's extra window, bottom only
    (8, 5, "kernel_size: 3 stride: 3 pad: 1"),
    (6, 8, "kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 3 pad_h: 1 pad_w: 0"),
    (7, 6, "kernel_h: 2 kernel_w: 3 stride_h: 3 stride_w: 2 pad_h: 0 pad_w: 1"),
    # Past the end of the unpadded axis only: ONNX counting pads would count it too (this
    # exported silently wrong, by half, before the sum-and-divisor form).
    (7, 7, "kernel_h: 2 kernel_w: 3 stride_h: 3 stride_w: 2 pad_h: 0 pad_w: 1"),
    (6, 6, "kernel_size: 3 stride: 2 pad: 1 round_mode: FLOOR"),
]


@pytest.mark.parametrize("h, w, geometry", GEOMETRIES, ids=lambda v: str(v).replace(" ", ""))
@pytest.mark.parametrize("batch", ["dynamic", None])
def test_average_pooling_past_the_padding_is_exact(h, w, geometry, batch, tmp_path):
    net = net_of(INPUT.format(dims=f"dim: 3 dim: {h} dim: {w}") +
                 'layer { name: "pool3" type: "Pooling" bottom: "x" top: "y" pooling_param { '
                 f'pool: AVE {geometry} }} }}')
    model = export_onnx(net, tmp_path / "m.onnx", batch=batch)
    for n in check_batches(model):
        assert run_check(net, model, n)["y"] < 1e-6, (geometry, n)
        layer = net.layer_dict["pool3"]
        (kh, kw), (sh, sw), (ph, pw) = layer.kernel, layer.stride, layer.pad
        want = caffe_ave_pool(np.asarray(net.blobs["x"].data, np.float64), kh, kw, sh, sw,
                              ph, pw, *net.blobs["y"].data.shape[2:])
        got = np.asarray(net.blobs["y"].data)      # cct's forward, which ONNX just matched
        assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()


def test_squeezenet_pool3_writes_sum_and_divisor(tmp_path):
    net = net_of(INPUT.format(dims="dim: 2 dim: 6 dim: 6") +
                 'layer { name: "pool3" type: "Pooling" bottom: "x" top: "y" pooling_param { '
                 'pool: AVE kernel_size: 3 stride: 2 pad: 1 } }')
    model = export_onnx(net, tmp_path / "m.onnx", batch="dynamic")
    ops = [(n.op_type, n.name) for n in model.graph.node]
    assert ops == [("Conv", "pool3/window_sum"), ("Div", "pool3")]
    divisor = next(onnx.numpy_helper.to_array(i) for i in model.graph.initializer
                   if i.name == "pool3/divisor")
    # Rows and columns: windows start at -1, 1, 3, 5 and stop at 2, 4, 6, 7 (6 + pad 1).
    assert divisor.shape == (1, 1, 4, 4)
    np.testing.assert_array_equal(divisor[0, 0], np.outer([3, 3, 3, 2], [3, 3, 3, 2]))


def test_load_failure_names_node_and_layer():
    # ORT's wording where a node has no kernel at load time (its other form is tested above).
    from cct.onnx_export import _runtime_error
    net = net_of(INPUT.format(dims="dim: 2 dim: 6 dim: 6") +
                 'layer { name: "pool3" type: "Pooling" bottom: "x" top: "y" pooling_param { '
                 'pool: AVE kernel_size: 3 stride: 2 pad: 1 } }')
    e = _runtime_error(net, RuntimeError(
        "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for\n"
        "Conv(22) node with name 'pool3/window_sum'"), 1)
    assert str(e) == ("export_onnx --check: ONNX Runtime failed at node 'pool3/window_sum' "
                      "(layer 'pool3') at batch 1: Could not find an implementation for "
                      "Conv(22) node with name 'pool3/window_sum'")
