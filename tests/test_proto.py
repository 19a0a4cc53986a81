"""The schema: proto/caffe.proto matches Caffe's field table, the committed generated modules
are what the pinned generator makes, and the supported protobuf runtimes load them."""
import csv
import filecmp
import os
import subprocess
import sys

import pytest
from google.protobuf import descriptor

from cct.proto import caffe_pb2

from .conftest import REPO, SHARED

GENERATOR = "1.75.1"
# The field table lost the leading dot of one default: Caffe's caffe.proto has
# `moving_average_fraction = 2 [default = .999]`, and so does proto/caffe.proto.
SPEC_ERRATA = {("BatchNormParameter", "moving_average_fraction"): "0.999"}  # grpcio-tools, bundling protoc for protobuf 6.31.1 gencode
TYPE_NAMES = {getattr(descriptor.FieldDescriptor, n): n[len("TYPE_"):].lower()
              for n in dir(descriptor.FieldDescriptor) if n.startswith("TYPE_")}


def is_repeated(field) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf >= 6.32 deprecates .label
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def spec_rows():
    path = SHARED / "spec" / "caffe_proto_fields.tsv"
    if not path.exists():
        pytest.skip(f"{path} is absent (set CCT_SHARED)")
    with open(path) as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_every_field_matches_caffes_schema():
    checked = 0
    for row in spec_rows():
        if row["kind"] != "field":
            continue
        msg = caffe_pb2.DESCRIPTOR.message_types_by_name[row["scope"]]
        field = msg.fields_by_name[row["name"]]
        assert field.number == int(row["number"]), row
        want_type = row["type"]
        if field.type in (field.TYPE_MESSAGE, field.TYPE_ENUM):
            got_type = (field.message_type or field.enum_type).name
        else:
            got_type = TYPE_NAMES[field.type]
        assert got_type == want_type, row
        assert is_repeated(field) == (row["label"] == "repeated"), row
        default = SPEC_ERRATA.get((row["scope"], row["name"]), row["default"].strip())
        if default and default != "packed=true" and not is_repeated(field):
            got = field.default_value
            if field.type == field.TYPE_ENUM:
                got = field.enum_type.values_by_number[got].name
            elif field.type == field.TYPE_STRING:
                default = default.strip('"').replace("]", "")
            elif field.type == field.TYPE_BOOL:
                default = default == "true"
            elif field.type in (field.TYPE_FLOAT, field.TYPE_DOUBLE):
                got, default = pytest.approx(float(got)), float(default)
            else:
                default = int(default)
            assert got == default, row
        checked += 1
    assert checked == 423


def test_every_enum_value_matches_caffes_schema():
    for row in spec_rows():
        if row["kind"] != "value":
            continue
        scope = row["scope"].split(".")
        if len(scope) == 2:
            enum = caffe_pb2.DESCRIPTOR.message_types_by_name[scope[0]].enum_types_by_name[scope[1]]
        else:
            enum = caffe_pb2.DESCRIPTOR.enum_types_by_name[scope[0]]
        assert enum.values_by_name[row["name"]].number == int(row["number"]), row


def test_committed_generated_modules_are_fresh(tmp_path):
    pytest.importorskip("grpc_tools", reason="the test-full extra installs grpcio-tools")
    from importlib.metadata import version
    if version("grpcio-tools") != GENERATOR:
        pytest.skip(f"grpcio-tools {version('grpcio-tools')} installed, the pinned generator "
                    f"is {GENERATOR}")
    from grpc_tools import protoc
    rc = protoc.main(["protoc", f"-I{REPO / 'proto'}", f"--python_out={tmp_path}",
                      str(REPO / "proto" / "caffe.proto"), str(REPO / "proto" / "caffe_raw.proto")])
    assert rc == 0
    raw = tmp_path / "caffe_raw_pb2.py"
    raw.write_text(raw.read_text().replace("import caffe_pb2 as caffe__pb2",
                                           "from . import caffe_pb2 as caffe__pb2"))
    for name in ("caffe_pb2.py", "caffe_raw_pb2.py"):
        assert filecmp.cmp(tmp_path / name, REPO / "cct" / "proto" / name, shallow=False), (
            f"cct/proto/{name} is stale: run scripts/regen_proto.sh")


# The oldest runtime the gencode accepts, and the newest major the package admits.
RUNTIMES = ["6.31.1", "7.36.2"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_supported_protobuf_runtime_reads_caffe_files(runtime, tmp_path, caffe_fixtures):
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--target", str(target), f"protobuf=={runtime}"],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        pytest.skip(f"cannot install protobuf=={runtime} here: {pip.stderr.strip()[-200:]}")
    probe = (
        "import warnings; warnings.simplefilter('error');"
        "import google.protobuf as gp, sys; assert gp.__version__ == sys.argv[1], gp.__version__;"
        "from cct.proto import caffe_pb2, caffe_raw_pb2;"
        "from cct.io.weights import load_weights;"
        "w = load_weights(sys.argv[2]); assert w['conv1'][0].shape == (20, 1, 5, 5);"
        "from google.protobuf import text_format;"
        "import pathlib; text = pathlib.Path(sys.argv[3]).read_text();"
        "n = text_format.Parse(text, caffe_pb2.NetParameter());"
        "conv1 = [l for l in n.layer if l.name == 'conv1'][0];"
        "assert conv1.convolution_param.num_output == 20; print('ok')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(REPO)]))
    run = subprocess.run([sys.executable, "-c", probe, runtime,
                          str(caffe_fixtures / "lenet_iter_1000.caffemodel"),
                          str(caffe_fixtures / "lenet_train_test.prototxt")],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
