#!/usr/bin/env bash
# The GPU checks (issues 28, 29 and 30) as one script for a lent GPU machine, each step under
# its own time limit, in order of what matters most, stopping before DEADLINE seconds, in two
# parts that each fit one device call (PART=1: steps 1-4 but `cct time`; PART=2: the rest;
# PART=all: both, for a machine with time to spare):
#   1. every test that has a GPU case (the CuPy rules' probes against real CuPy, the layer
#      registry harness, Caffe's numerics, solvers, snapshots, timers, out-of-memory);
#   2. cuDNN's engines against the lowering (scripts/cudnn_probe.py) and what a CUDA graph can
#      hold of an iteration (scripts/capture_probe.py);
#   3. bench_gpu.py's six nets against PyTorch on the same GPU (graph and CPU+GPU columns);
#   4. LeNet with -gpu 0 to >= 0.98 (lenet_solver, 2,000 iterations), timed; `cct time -gpu 0`;
#   5. mixed precision (issue 29, item 4): cuDNN in bf16 and fp16 against the lowering, LeNet
#      to >= 0.98 in each, bench_gpu's bf16 and fp16 rows against PyTorch's autocast;
#   6. CPU+GPU Hogbatch, the optimizer's race of places, the strategies' bench on CPU+GPU.
# With --bundle DIR (scripts/device_bundle.sh made it here; carry it): installs its wheels
# into /tmp/site, puts this tree's Python over the wheel's, and reads DIR/shared as
# CCT_SHARED. Without it, cct must already be importable. Logs go under $OUT (default
# ./gpu_check_out) and into $OUT/logs.tgz after each step (a device run returns at most 8
# files); the last lines of each step are printed.
#
#   PART=1 DEADLINE=330 bash scripts/gpu_check.sh --bundle .gpu-bundle
#   PART=2 DEADLINE=330 bash scripts/gpu_check.sh --bundle .gpu-bundle
set -u
REPO=$(pwd)
OUT=${OUT:-gpu_check_out}
DEADLINE=${DEADLINE:-420}
PART=${PART:-1}
T0=$(date +%s)
mkdir -p "$OUT/logs"
. "$REPO/scripts/check_common.sh"    # install_bundle DIR; step NAME SECONDS LINES CMD...
[ "${1:-}" = "--bundle" ] && install_bundle "$2"
export PYTHONUNBUFFERED=1
[ -d "${CCT_SHARED:-../shared}" ] && export CCT_SHARED=$(cd "${CCT_SHARED:-../shared}" && pwd)
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d)
cp -r tests examples "$work"/
cd "$work"


echo "== $(nvidia-smi -L 2>&1 | head -n 1); $(lscpu | grep 'Model name' | sed 's/  */ /g')"
python -c "import cupy, numpy; print('CuPy', cupy.__version__, 'NumPy', numpy.__version__)"

if [ "$PART" != 2 ]; then
step gpu_tests 150 25 python -m pytest -q -rs -p no:cacheprovider \
    tests/backend/test_standin.py tests/test_gpu_backend.py tests/layers/test_every_layer.py \
    tests/test_solver_on_device.py tests/test_cli_time.py tests/test_gpu_errors.py \
    tests/test_graphed.py tests/backend/test_cublas.py tests/test_reduced_precision.py \
    -k "gpu or cupy or real"
sh examples/mnist/create_mnist.sh > "$OUT/logs/create_mnist.txt" 2>&1
step lenet_gpu 60 3 bash -c 'time cct train --solver=examples/mnist/lenet_solver.prototxt -gpu 0'
grep 'Test net output #0' "$OUT/logs/lenet_gpu.txt" | tail -n 1
grep -m 2 'CUDA graph\|the GEMM' "$OUT/logs/lenet_gpu.txt"
step lenet_gpu_eager 45 3 bash -c 'time cct train --solver=examples/mnist/lenet_solver.prototxt -gpu 0 -cuda-graphs=off'
step cudnn_probe 40 25 python "$REPO/scripts/cudnn_probe.py"
step capture_probe 40 16 python "$REPO/scripts/capture_probe.py"
step bench_gpu 200 12 python "$REPO/bench/bench_gpu.py" --iters 20 --warmup 3 --graph \
    --timeout 60 ${CCT_SHARED:+--zoo "$CCT_SHARED/caffe-zoo"} --json "$OUT/logs/bench_gpu.json"
fi
if [ "$PART" != 1 ]; then
sh examples/mnist/create_mnist.sh > "$OUT/logs/create_mnist.txt" 2>&1
for p in bf16 fp16; do
    step lenet_gpu_$p 45 3 bash -c "time cct train --solver=examples/mnist/lenet_solver.prototxt -gpu 0 -precision $p"
    grep 'Test net output #0' "$OUT/logs/lenet_gpu_$p.txt" | tail -n 1
    grep -m 3 'CUDA graph\|the GEMM\|overflowed' "$OUT/logs/lenet_gpu_$p.txt"
    step cudnn_probe_$p 30 10 python "$REPO/scripts/cudnn_probe.py" --precision $p
done
step bench_gpu_half 120 16 python "$REPO/bench/bench_gpu.py" --iters 20 --warmup 3 --graph \
    --precisions bf16,fp16 --no-caffe-engine --timeout 40 \
    ${CCT_SHARED:+--zoo "$CCT_SHARED/caffe-zoo"} --json "$OUT/logs/bench_gpu_half.json"
step time_lenet 30 24 cct time -model examples/mnist/lenet_train_test.prototxt -gpu 0 \
    -iterations 20
step bench_hybrid 90 6 python "$REPO/bench/bench_gpu.py" --nets lenet,caffenet_b32,caffenet_b256 \
    --iters 10 --warmup 2 --hybrid --no-caffe-engine --timeout 40 ${CCT_SHARED:+--zoo "$CCT_SHARED/caffe-zoo"}
step hogbatch_cpu_gpu 60 4 cct train --solver=examples/mnist/lenet_solver.prototxt \
    --strategy=hogbatch --devices=cpu,gpu0 --batch-sizes=cpu:16,gpu0:256
step plan_cpu_gpu 60 3 cct plan --solver=examples/mnist/lenet_solver.prototxt --devices=cpu,gpu0
step strategies_cpu_gpu 300 10 python "$REPO/bench/bench_strategies.py" --setting devices \
    --devices=cpu,gpu0 --work lenet --cap 3000 --json "$OUT/logs/strategies_cpu_gpu.json" \
    --png "$OUT/logs/strategies_cpu_gpu.png"
fi
echo "== done at $(( $(date +%s) - T0 )) s; logs in $OUT/logs.tgz"
