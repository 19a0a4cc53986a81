#!/usr/bin/env bash
# Regenerate cct/proto/*_pb2.py from proto/*.proto with the pinned generator (protoc from
# grpcio-tools 1.75.1, i.e. protobuf 6.31.1 gencode). tests/test_proto.py fails when the
# committed modules differ from what this produces.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "grpcio-tools==1.75.1"
python -m grpc_tools.protoc -Iproto --python_out=cct/proto proto/caffe.proto proto/caffe_raw.proto
# protoc writes `import caffe_pb2`; inside the package it must be relative.
sed -i 's/^import caffe_pb2 as caffe__pb2$/from . import caffe_pb2 as caffe__pb2/' cct/proto/caffe_raw_pb2.py
