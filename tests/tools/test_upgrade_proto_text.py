"""upgrade_net_proto_text / upgrade_solver_proto_text: Caffe's upgrades, written as text."""
from google.protobuf import text_format

from cct import cli
from cct.io.prototxt import read_net_text
from cct.proto import caffe_pb2

V1_NET = """name: "old"
input: "data"
input_dim: 1 input_dim: 1 input_dim: 8 input_dim: 8
layers {
  name: "conv" type: CONVOLUTION bottom: "data" top: "conv"
  blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
  convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "gaussian" std: 0.01 } }
}
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
"""


def test_v1_net_upgraded(tmp_path, capsys):
    src, out = tmp_path / "v1.prototxt", tmp_path / "new.prototxt"
    src.write_text(V1_NET)
    assert cli.main(["upgrade_net_proto_text", str(src), str(out)]) == 0
    assert "Wrote upgraded NetParameter text proto to" in capsys.readouterr().err
    text = out.read_text()
    net = text_format.Parse(text, caffe_pb2.NetParameter())
    assert net == read_net_text(str(src))
    assert [(l.name, l.type) for l in net.layer] == [("input", "Input"),
                                                    ("conv", "Convolution"), ("relu", "ReLU")]
    assert not net.layers and not net.input
    # numbers as protobuf's C++ TextFormat prints them
    assert "    lr_mult: 1\n    decay_mult: 1\n" in text and "lr_mult: 2\n" in text
    assert "std: 0.01\n" in text and ".0\n" not in text


def test_current_net_written_back(tmp_path, capsys):
    src, out = tmp_path / "new.prototxt", tmp_path / "same.prototxt"
    src.write_text('name: "n" layer { name: "d" type: "Input" top: "d" '
                   'input_param { shape { dim: 2 } } }')
    assert cli.main(["upgrade_net_proto_text", str(src), str(out)]) == 0
    assert "] File already in latest proto format: " in capsys.readouterr().err
    assert text_format.Parse(out.read_text(), caffe_pb2.NetParameter()) == \
        text_format.Parse(src.read_text(), caffe_pb2.NetParameter())


def test_solver_type_upgraded(tmp_path, capsys):
    src, out = tmp_path / "solver.prototxt", tmp_path / "new.prototxt"
    src.write_text('net: "x.prototxt"\nbase_lr: 0.01\nsolver_type: ADAM\nmomentum: 0.9\n')
    assert cli.main(["upgrade_solver_proto_text", str(src), str(out)]) == 0
    assert "Wrote upgraded SolverParameter text proto" in capsys.readouterr().err
    solver = text_format.Parse(out.read_text(), caffe_pb2.SolverParameter())
    assert solver.type == "Adam" and not solver.HasField("solver_type")
    assert not solver.HasField("snapshot_prefix")  # the tool does not default it
    assert out.read_text() == ('base_lr: 0.01\nmomentum: 0.9\nnet: "x.prototxt"\n'
                               'type: "Adam"\n')


def test_errors(tmp_path, capsys):
    bad = tmp_path / "bad.prototxt"
    bad.write_text('name: "n"\nlayer { nme: "x" }\n')
    both = tmp_path / "both.prototxt"
    both.write_text('solver_type: SGD\ntype: "SGD"\n')
    for argv, message in [
            (["upgrade_net_proto_text", str(tmp_path / "none"), "o"], "does not exist"),
            (["upgrade_net_proto_text", str(bad), str(tmp_path / "o")], "bad.prototxt:2"),
            (["upgrade_solver_proto_text", str(both), str(tmp_path / "o")], "both"),
            (["upgrade_net_proto_text", str(bad)], "expected 2 argument(s)")]:
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert "cct: error:" in err and message in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()
