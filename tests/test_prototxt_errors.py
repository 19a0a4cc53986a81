"""Bad input files end in one CCTError naming the file (and the line, for text), never in a
protobuf traceback."""
import pytest

import cct.api
from cct.errors import CCTError, ProtoError
from cct.io.prototxt import read_net, read_net_binary, read_net_text, read_solver_text
from cct.io.weights import load_weights
from cct.net import TEST
from cct.proto import caffe_pb2

RELU_NET = 'name: "n"\nlayer {\n  name: "relu"\n  type: "ReLU"\n  bottom: "x"\n  top: "x"\n}\n'


def write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


@pytest.mark.parametrize("text, line, col, words", [
    # Syntax: a brace never closed, reported where the file ends.
    ('name: "n"\nlayer {\n  name: "relu"\n', 3, 9, ['Expected "}"']),
    ('name: "n"\nlayer {\n  name: "relu" }\n}\n', 4, 1, ["Expected identifier"]),
    ('name: "n"\nlayer {\n  name: "relu\n}\n', 3, 9, ["missing ending quote"]),
    # Unknown field names, with a suggestion.
    ('name: "n"\nlayer {\n  name: "c"\n  botom: "x"\n}\n', 4, 3,
     ['"caffe.LayerParameter" has no field named "botom"', "Did you mean 'bottom'"]),
    ('nmae: "n"\n', 1, 1, ['no field named "nmae"', "'name'"]),
    # Unknown enum values, current and V1 format.
    ('layer {\n  name: "p"\n  type: "Pooling"\n  pooling_param {\n    pool: MAXIMUM\n  }\n}\n',
     5, 11, ['has no value named MAXIMUM', "'MAX'"]),
    ('layers {\n  name: "c"\n  type: CONVOLUTON\n}\n', 3, 9,
     ['"caffe.V1LayerParameter.LayerType" has no value named CONVOLUTON', "'CONVOLUTION'"]),
    # A bad value and an unquoted type string.
    ('layer {\n  name: "c"\n  convolution_param { num_output: 2.5 }\n}\n', 3, 35,
     ["Couldn't parse integer: 2.5"]),
    ('layer {\n  name: "r"\n  type: ReLU\n}\n', 3, 9,
     ["Expected string", 'double quotes, e.g. type: "ReLU"']),
    # Caffe's text parser refuses a non-repeated field given twice.
    ('name: "a"\nname: "b"\n', 2, 7, ['multiple "name" fields']),
])
def test_bad_net_prototxt_names_file_line_and_column(tmp_path, text, line, col, words):
    path = write(tmp_path, "bad.prototxt", text)
    for read in (read_net_text, read_net):
        with pytest.raises(ProtoError) as e:
            read(path)
        msg = str(e.value)
        assert msg.startswith(f"{path}:{line}:{col}: cannot parse NetParameter: "), msg
        for w in words:
            assert w in msg, msg
        if line <= len(text.splitlines()):
            assert f"line {line}: {text.splitlines()[line - 1].strip()}" in msg
    with pytest.raises(ProtoError, match=rf"^{path}:{line}:{col}: "):
        cct.api.Net(path, TEST)


def test_bad_solver_prototxt(tmp_path):
    path = write(tmp_path, "solver.prototxt", 'base_lr: 0.01\nlr_polcy: "step"\n')
    with pytest.raises(ProtoError, match=rf"^{path}:2:1: cannot parse SolverParameter: .*"
                                         r"no field named \"lr_polcy\". Did you mean 'lr_policy'"):
        read_solver_text(path)
    path = write(tmp_path, "solver2.prototxt", 'solver_mode: TPU\n')
    with pytest.raises(ProtoError, match=r"solver2\.prototxt:1:14: .*no value named TPU.*"):
        read_solver_text(path)
    path = write(tmp_path, "solver3.prototxt", 'solver_type: ADAMW\n')
    with pytest.raises(ProtoError, match=r"solver3\.prototxt:1:14: .*Did you mean 'ADAM'"):
        read_solver_text(path)


@pytest.mark.parametrize("read", [read_net_text, read_net_binary, read_net, read_solver_text,
                                  load_weights])
def test_missing_file(tmp_path, read):
    path = str(tmp_path / "nope.prototxt")
    with pytest.raises(CCTError, match=rf"'{path}' does not exist"):
        read(path)


@pytest.mark.parametrize("read", [read_net_text, read_solver_text])
def test_directory_given(tmp_path, read):
    with pytest.raises(ProtoError, match=rf"'{tmp_path}' is a directory"):
        read(str(tmp_path))


def test_missing_net_file_through_api(tmp_path):
    path = str(tmp_path / "nope.prototxt")
    with pytest.raises(CCTError, match=rf"'{path}' does not exist"):
        cct.api.Net(path, TEST)


def test_binary_file_given_as_prototxt(tmp_path, caffe_fixtures):
    path = str(caffe_fixtures / "lenet_iter_1000.caffemodel")
    for read in (read_net_text, read_solver_text):
        with pytest.raises(ProtoError, match=rf"'{path}' is a binary file, not a text prototxt"):
            read(path)
    # Binary but valid UTF-8 (field tags and lengths below 0x20) is caught too.
    small = caffe_pb2.NetParameter(name="n")
    small.layer.add(name="relu", type="ReLU")
    path = write(tmp_path, "small.caffemodel", small.SerializeToString())
    with pytest.raises(ProtoError, match="is a binary file"):
        read_net_text(path)
    assert read_net(path) == small


def test_truncated_caffemodel(tmp_path, caffe_fixtures):
    data = (caffe_fixtures / "lenet_iter_1000.caffemodel").read_bytes()
    for n in (9, len(data) // 2, len(data) - 3):
        path = write(tmp_path, f"cut{n}.caffemodel", data[:n])
        with pytest.raises(ProtoError, match=rf"'{path}' is not a valid binary NetParameter: it "
                                             r"is truncated or not a protobuf file"):
            read_net_binary(path)
        with pytest.raises(CCTError, match=rf"'{path}'"):
            load_weights(path)


def test_caffemodel_cut_between_fields_has_no_layers(tmp_path, caffe_fixtures):
    # The first 7 bytes are the complete field name: "LeNet", a valid NetParameter (Caffe cannot
    # tell this cut either); the weights reader reports that no layer is left.
    data = (caffe_fixtures / "lenet_iter_1000.caffemodel").read_bytes()
    path = write(tmp_path, "cut.caffemodel", data[:7])
    assert read_net_binary(path) == caffe_pb2.NetParameter(name="LeNet")
    with pytest.raises(CCTError, match=rf"'{path}' holds no layers"):
        load_weights(path)


def test_non_protobuf_caffemodel(tmp_path):
    path = write(tmp_path, "image.caffemodel", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    with pytest.raises(ProtoError, match=rf"'{path}' is not a valid binary NetParameter"):
        read_net_binary(path)
    with pytest.raises(CCTError, match=rf"'{path}'"):
        load_weights(path)


def test_prototxt_given_as_caffemodel(tmp_path):
    path = write(tmp_path, "lenet.prototxt", RELU_NET)
    with pytest.raises(ProtoError, match=r"looks like a text file \(a prototxt given where a "
                                         r"binary file was expected\?\)"):
        read_net_binary(path)
    with pytest.raises(CCTError, match=rf"'{path}'"):
        load_weights(path)


def test_empty_caffemodel_has_no_layers(tmp_path):
    path = write(tmp_path, "empty.caffemodel", b"")
    with pytest.raises(CCTError, match=rf"'{path}' holds no layers"):
        load_weights(path)


def test_good_files_still_read(tmp_path, caffe_fixtures):
    net = read_net_text(write(tmp_path, "ok.prototxt", RELU_NET))
    assert [lp.name for lp in net.layer] == ["relu"]
    weights = read_net_binary(str(caffe_fixtures / "lenet_iter_1000.caffemodel"))
    assert [lp.name for lp in weights.layer][:3] == ["mnist", "conv1", "pool1"]


def test_non_utf8_comments_are_read_like_caffe(tmp_path):
    # Caffe's parser takes any bytes; a Latin-1 comment must not make the file "binary".
    path = write(tmp_path, "latin1.prototxt", "# r\xe9seau de caf\xe9\n".encode("latin-1")
                 + RELU_NET.encode())
    assert [lp.name for lp in read_net_text(path).layer] == ["relu"]
    assert [lp.name for lp in read_net(path).layer] == ["relu"]


def test_a_control_byte_in_a_comment_is_still_text(tmp_path):
    """Before: taken for a binary file, and reported as "weights file ... not a valid binary
    NetParameter"."""
    path = write(tmp_path, "ctrl.prototxt", b"# made by a tool \x01 that wrote a control byte\n"
                 + RELU_NET.encode())
    for read in (read_net_text, read_net):
        assert [lp.name for lp in read(path).layer] == ["relu"]
    solver = write(tmp_path, "ctrl_solver.prototxt", b"# \x07\nbase_lr: 0.01\n")
    assert read_solver_text(solver).base_lr == pytest.approx(0.01)


def test_a_prototxt_with_a_stray_control_byte_reports_the_text_error(tmp_path):
    path = write(tmp_path, "ctrl.prototxt", RELU_NET.replace('"ReLU"', '\x02"ReLU"'))
    for read in (read_net_text, read_net):
        with pytest.raises(ProtoError, match=rf"^{path}:4:9: cannot parse NetParameter: "):
            read(path)
