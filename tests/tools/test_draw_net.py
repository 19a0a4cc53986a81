"""draw_net: a PNG of the net's layers and blobs (Graphviz via pydot, or cct's own drawing)."""
import shutil

import numpy as np
import pytest
from PIL import Image

from cct import cli
from cct.errors import CCTError
from cct.io.prototxt import read_net_text
from cct.proto import caffe_pb2
from cct import draw as draw_net   # the drawing the tool calls (cct/draw.py)


def lenet(caffe_fixtures):
    return read_net_text(str(caffe_fixtures / "lenet_train_test.prototxt"))


def test_phase_filter_and_labels(caffe_fixtures):
    net = lenet(caffe_fixtures)
    names = lambda phase: [l.name for l in draw_net.phase_layers(net, phase)]  # noqa: E731
    assert names(caffe_pb2.TRAIN) == ["mnist", "conv1", "pool1", "conv2", "pool2", "ip1",
                                      "relu1", "ip2", "loss"]
    assert names(caffe_pb2.TEST) == ["mnist", "conv1", "pool1", "conv2", "pool2", "ip1",
                                     "relu1", "ip2", "accuracy", "loss"]
    assert len(names(None)) == 11
    conv1 = net.layer[2]
    assert draw_net.layer_label(conv1, "LR", False) == [
        "conv1", "(Convolution)", "kernel size: 5", "stride: 1", "pad: 0"]
    assert draw_net.layer_label(net.layer[3], "TB", False) == [
        "pool1 (Pooling MAX) kernel size: 2 stride: 2 pad: 0"]
    assert draw_net.layer_label(conv1, "LR", True)[-2:] == ["lr mult: 1, 2",
                                                            "decay mult: 1, 1"]
    assert draw_net.edge_label(conv1) == "20" and draw_net.edge_label(net.layer[0]) == \
        "Batch 64"


def test_in_place_layer_gets_a_new_blob_node(caffe_fixtures):
    layers = draw_net.phase_layers(lenet(caffe_fixtures), caffe_pb2.TRAIN)
    nodes, edges = draw_net.build_graph(layers, "LR", False)
    ip1 = [k for k in nodes if k.startswith("blob:ip1:")]
    assert ip1 == ["blob:ip1:0", "blob:ip1:1"]
    relu = "layer:6"
    assert ("blob:ip1:0", relu, "") in edges and (relu, "blob:ip1:1", "") in edges
    ranks = draw_net._layout(nodes, edges)
    assert nodes["blob:ip1:1"].rank == nodes["blob:ip1:0"].rank + 2
    assert sum(len(r) for r in ranks) == len(nodes)


@pytest.mark.parametrize("rankdir", ["LR", "TB", "BT", "RL"])
def test_pillow_png(caffe_fixtures, tmp_path, rankdir):
    out = tmp_path / "net.png"
    used = draw_net.draw_net_to_file(lenet(caffe_fixtures), str(out), rankdir,
                                     caffe_pb2.TRAIN, engine="pillow")
    assert used == "pillow"
    with Image.open(out) as image:
        assert image.format == "PNG"
        pixels = np.asarray(image.convert("RGB")).reshape(-1, 3)
        wide = image.size[0] > image.size[1]
    assert wide == (rankdir in ("LR", "RL"))
    colours = {tuple(p) for p in np.unique(pixels, axis=0)}
    for hex_colour in ("#FF5050", "#FF9900", "#CC33FF", "#6495ED", "#90EE90", "#E0E0E0"):
        rgb = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
        assert rgb in colours, hex_colour


def test_cli_any_engine(caffe_fixtures, tmp_path, capsys):
    out = tmp_path / "net.png"
    assert cli.main(["draw_net", str(caffe_fixtures / "lenet_train_test.prototxt"), str(out),
                     "--rankdir", "TB", "--phase", "TEST"]) == 0
    assert f"Drawing net to {out}" in capsys.readouterr().out
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > 100 and image.size[1] > 100


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_graphviz_png(caffe_fixtures, tmp_path):
    pytest.importorskip("pydot")
    out = tmp_path / "net.png"
    assert draw_net.draw_net_to_file(lenet(caffe_fixtures), str(out), "LR", None,
                                     engine="graphviz") == "graphviz"
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > image.size[1]


def test_errors(caffe_fixtures, tmp_path, capsys):
    net_file = str(caffe_fixtures / "lenet_train_test.prototxt")
    for argv, message in [([net_file, str(tmp_path / "x.png"), "--rankdir", "XY"], "rankdir"),
                          ([net_file, str(tmp_path / "x.png"), "--phase", "VAL"], "phase"),
                          ([str(tmp_path / "none"), str(tmp_path / "x.png")], "does not exist"),
                          ([net_file], "expected 2 argument(s)")]:
        assert cli.main(["draw_net"] + argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("cct: error:") and message in err
    with pytest.raises(CCTError, match="not .svg"):
        draw_net.draw_net_to_file(lenet(caffe_fixtures), str(tmp_path / "x.svg"),
                                  engine="pillow")
    assert not list(tmp_path.iterdir())
