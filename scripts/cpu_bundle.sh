#!/usr/bin/env bash
# Prepares what the lent device machine's host CPU (an Intel Xeon with AMX) needs to run
# scripts/cpu_check.sh: run here, from the repository root, with a Python 3.12 that can build
# the wheel (the device's Python), then carry the folder:
#
#   scripts/cpu_bundle.sh [python3.12]     # makes .cpu-bundle/ (git-ignored), ~58 MB
#   BASELINE=REV scripts/cpu_bundle.sh     # and REV's compiled _C (1.1 MB): cpu_check.sh's
#                                          # baseline_ab step times this build against it
#   device run, carry [".cpu-bundle"]:  bash scripts/cpu_check.sh --bundle .cpu-bundle
#
# .cpu-bundle/whl: cct's wheel for cp312, lmdb, protobuf 6.31.1 and pytest (the kernel tests'
# step); .cpu-bundle/mkl.tar.xz:
# the MKL libraries the bf16 engines load (libmkl_rt, the LP64 interface, core, gnu_thread and
# the AVX-512 kernels, which hold AMX's; 227 MB, 39 MB in xz -9: the whole `mkl` wheel would
# not fit the 64 MiB a device call carries with the tree, and the device has no network). Not
# libmkl_sequential: cct runs MKL on its GNU threading layer wherever libgomp loads (the device
# has it), one thread for the column-block engine, and where MKL does not run, cpu_check.sh's
# probe says so and measures without it;
# .cpu-bundle/onednn.tar.xz: oneDNN's libdnnl.so.3 from the installed onednn-cpu-gomp wheel
# (the `onednn` extra; 55 MB, 7 MB in xz), for the convolutions' oneDNN layout;
# .cpu-bundle/shared:
# the model zoo's prototxts (bench_train, bench_layers).
set -euo pipefail
PY=${1:-$HOME/.pyenv/versions/3.12.1/bin/python}
SHARED=${CCT_SHARED:-../shared}
rm -rf .cpu-bundle && mkdir -p .cpu-bundle/whl .cpu-bundle/shared
"$PY" -m pip wheel -q --no-deps . -w .cpu-bundle/whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .cpu-bundle/whl lmdb "protobuf==6.31.1"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    -d .cpu-bundle/whl pytest
MKL=$(python3 -c "
import importlib.metadata as md, pathlib
f = [f for f in md.files('mkl') if f.name.startswith('libmkl_rt.so')][0]
print(pathlib.Path(f.locate()).resolve().parent)")
tar -C "$MKL" -cf - libmkl_rt.so.3 libmkl_core.so.3 libmkl_gnu_thread.so.3 \
    libmkl_intel_lp64.so.3 libmkl_avx512.so.3 | xz -T0 -9 > .cpu-bundle/mkl.tar.xz
DNNL=$(python3 -c "
import importlib.metadata as md, pathlib
f = [f for f in md.files('onednn-cpu-gomp') if f.name == 'libdnnl.so.3'][0]
print(pathlib.Path(f.locate()).parent)")
tar -C "$DNNL" -chf - libdnnl.so.3 | xz -T0 -6 > .cpu-bundle/onednn.tar.xz
cp -r "$SHARED/caffe-zoo" .cpu-bundle/shared/
if [ -n "${BASELINE:-}" ]; then     # a wheel of REV's tree, of which only _C travels
    TREE=$(mktemp -d) && git worktree add -q --detach "$TREE" "$BASELINE"
    "$PY" -m pip wheel -q --no-deps "$TREE" -w "$TREE/whl"
    mkdir -p .cpu-bundle/baseline && git rev-parse --short "$BASELINE" > .cpu-bundle/baseline/REV
    python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
[z.extract(n, sys.argv[2]) for n in z.namelist() if n.startswith('cct/_C')]" \
        "$TREE"/whl/*.whl "$TREE/c" && cp "$TREE"/c/cct/_C*.so .cpu-bundle/baseline/
    git worktree remove --force "$TREE"
fi
chmod -R u+w .cpu-bundle
# The tree and the bundle travel together, 64 MiB at most: say what they come to.
du -sh .cpu-bundle
echo "with the tracked tree: $(( ($(du -sb .cpu-bundle | cut -f1) + \
    $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)) >> 20 )) MiB of the 64 a call carries"
