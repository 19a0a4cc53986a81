"""summarize: Caffe's tools/extra/summarize.py table, with the shapes and param counts of the
net cct builds."""
import re

from cct import cli
from cct.tools.summarize import format_table, printed_len

SMALL = """name: "small"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 4 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        param { name: "w" lr_mult: 2 decay_mult: 0 } param { lr_mult: 1 }
        convolution_param { num_output: 8 kernel_size: 3 stride: 2 pad: 1 group: 2 } }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
        pooling_param { pool: MAX kernel_h: 2 kernel_w: 1 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 3 } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


def test_lenet_shapes_and_params(caffe_fixtures, monkeypatch, capsys):
    monkeypatch.chdir(caffe_fixtures)        # the data layers' sources are relative paths
    assert cli.main(["summarize", "lenet_train_test.prototxt"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["layer", "type", "params", "bottoms", "tops", "args", "top",
                                "shapes", "param", "values"]
    by_name = {line.split()[0]: line for line in lines[1:-1]}
    assert list(by_name) == ["mnist", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2",
                             "loss"]                        # TRAIN: no accuracy layer
    # Param values against the layer shapes: weights plus biases.
    expected = {"conv1": 20 * 1 * 5 * 5 + 20, "conv2": 50 * 20 * 5 * 5 + 50,
                "ip1": 500 * 50 * 4 * 4 + 500, "ip2": 10 * 500 + 10}
    for name, count in expected.items():
        assert by_name[name].split()[-1] == str(count), by_name[name]
    assert re.search(r"data\s+-> conv1\s+5 20\s+64x20x24x24\s+520$", by_name["conv1"])
    assert re.search(r"conv1\s+-> pool1\s+2/2\s+64x20x12x12$", by_name["pool1"])
    assert "(, x2)" in by_name["ip1"]                       # bias lr_mult 2, as Caffe shows it
    assert re.search(r"-> data, label\s+64x1x28x28, 64$", by_name["mnist"])
    assert re.search(r"ip2, label -> 1 \* loss\s+scalar$", by_name["loss"])
    assert lines[-1].startswith(f"Total: {sum(expected.values())} param values "
                                f"({sum(expected.values())} learnable) in 9 layers; ")


def test_args_params_and_a_net_without_data(tmp_path, capsys):
    (tmp_path / "small.prototxt").write_text(SMALL)
    assert cli.main(["summarize", str(tmp_path / "small.prototxt"), "--phase=TEST"]) == 0
    out = capsys.readouterr().out
    conv = next(l for l in out.splitlines() if l.startswith("conv "))
    assert re.search(r"Convolution\s+\(w x2 Dx0, \)\s+data\s+-> conv\s+3/2\+1 8/2\s+2x8x4x4\s+"
                     r"152$", conv)                  # 8 * (4/2) * 3 * 3 + 8 values
    pool = next(l for l in out.splitlines() if l.startswith("pool "))
    assert re.search(r"2x1/2\s+2x8x2x3$", pool)    # Caffe rounds the pooled size up
    ip = next(l for l in out.splitlines() if l.startswith("ip "))
    assert re.search(r"-> ip\s+3\s+2x3\s+147$", ip)   # 3 * 48 + 3


def test_unbuildable_net_gets_the_prototxt_columns(caffe_fixtures, tmp_path, monkeypatch,
                                                    capsys):
    monkeypatch.chdir(tmp_path)                     # no LMDB here
    assert cli.main(["summarize", str(caffe_fixtures / "lenet_train_test.prototxt"),
                     "--phase", "TEST"]) == 0
    out, err = capsys.readouterr()
    assert "cannot be built, so the table has no shapes" in err and "mnist10k_test_lmdb" in err
    lines = out.splitlines()
    assert lines[0].split() == ["layer", "type", "params", "bottoms", "tops", "args"]
    assert [l.split()[0] for l in lines[1:]] == ["mnist", "conv1", "pool1", "conv2", "pool2",
                                                 "ip1", "relu1", "ip2", "accuracy", "loss"]
    assert not lines[-1].startswith("Total")


def test_phase_all_lists_every_layer_with_colors(caffe_fixtures, capsys):
    """Caffe's own listing: every layer of the file, blob colors, outputs bold and
    underlined, and a bottom nothing produced on red."""
    assert cli.main(["summarize", str(caffe_fixtures / "lenet_train_test.prototxt"),
                     "--phase=ALL", "--color=always"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [l.split()[0] for l in lines[1:]]
    assert names.count("mnist") == 2 and "accuracy" in names
    assert "\033[92mdata\033[0m" in lines[1]
    assert "\033[1;4maccuracy\033[0m" in next(l for l in lines if l.startswith("accuracy"))
    assert "\033[1;4m" not in next(l for l in lines if l.startswith("conv1"))


def test_disconnected_bottom_is_red(tmp_path, capsys):
    (tmp_path / "n.prototxt").write_text(
        'layer { name: "r" type: "ReLU" bottom: "nowhere" top: "out" }\n')
    assert cli.main(["summarize", str(tmp_path / "n.prototxt"), "--phase=ALL",
                     "--color=always"]) == 0
    assert "\033[41mnowhere\033[0m" in capsys.readouterr().out


def test_format_table_overflow_keeps_later_columns_aligned():
    rows = [["a", "bb", "c"], ["a-very-long-cell", "x", "y"], ["b", "c", "d"]]
    lines = format_table(rows, max_width=4)
    assert lines == ["a   bb c", "a-very-long-cell x y", "b   c  d"]
    assert printed_len("\033[92mdata\033[0m") == 4


def test_flag_errors(caffe_fixtures, capsys):
    net = str(caffe_fixtures / "lenet_train_test.prototxt")
    for flag, needle in (("--phase=BOTH", "--phase must be TRAIN, TEST or ALL"),
                         ("--max-width=0", "--max-width must be at least 1"),
                         ("--color=sometimes", "--color must be auto, always or never")):
        assert cli.main(["summarize", net, flag]) == 1
        assert needle in capsys.readouterr().err
    assert cli.main(["summarize"]) == 1
    assert "expected 1 argument(s) (filename)" in capsys.readouterr().err
