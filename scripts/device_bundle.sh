#!/usr/bin/env bash
# Prepares what a lent GPU machine needs to run scripts/gpu_check.sh (it has no network, no
# lmdb, no cudnn frontend, and does not see ../shared): run here, from the repository root,
# with a Python 3.12 that can build the wheel (the device's Python), then carry the folder:
#
#   scripts/device_bundle.sh [python3.12]      # makes .gpu-bundle/ (git-ignored), ~55 MB
#   device run, carry [".gpu-bundle"]:  bash scripts/gpu_check.sh --bundle .gpu-bundle
#
# .gpu-bundle/whl: cct's wheel for cp312 (its C++ kernels built here), lmdb, protobuf 6.31.1 (the
# generated caffe_pb2's runtime) and nvidia-cudnn-frontend; .gpu-bundle/shared: the Caffe numerics
# fixtures and the model zoo the GPU tests and benches read.
set -euo pipefail
PY=${1:-$HOME/.pyenv/versions/3.12.1/bin/python}
SHARED=${CCT_SHARED:-../shared}
rm -rf .gpu-bundle && mkdir -p .gpu-bundle/whl .gpu-bundle/shared/fixtures/caffe
"$PY" -m pip wheel -q --no-deps . -w .gpu-bundle/whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu-bundle/whl \
    lmdb "protobuf==6.31.1" nvidia-cudnn-frontend
cp -r "$SHARED/fixtures/caffe/numerics" "$SHARED/fixtures/caffe/README.md" \
    .gpu-bundle/shared/fixtures/caffe/
cp -r "$SHARED/caffe-zoo" .gpu-bundle/shared/
chmod -R u+w .gpu-bundle
du -sh .gpu-bundle
