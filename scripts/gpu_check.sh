#!/usr/bin/env bash
# The GPU checks (issues 28, 29 and 30) as one script for a lent GPU machine (no network there):
#   1. every test that has a GPU case (the CuPy rules' probes against real CuPy, the layer
#      registry harness, Caffe's numerics, solvers, snapshots, timers, out-of-memory);
#   2. LeNet with -gpu 0 to >= 0.98 (Caffe's lenet_solver, 10,000 bundled digits);
#   3. CPU+GPU Hogbatch (one group per device, CPU batches of 16, GPU batches of 256) to
#      >= 0.975;
#   4. cuDNN's engines against the lowering (scripts/cudnn_probe.py), the optimizer's race of
#      places and the strategies' bench on CPU+GPU, and bench_gpu.py's six nets against
#      PyTorch (with the CUDA-graph and CPU+GPU columns).
# Run from the repository root with cct and its wheels installed where PYTHONPATH points
# (see the device README: build the wheels here, carry them, pip install --target there).
# Each step's output goes under $OUT (default ./gpu_check_out); the last lines sum up.
set -u
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
work=$(mktemp -d)
cp -r tests examples "$work"/
[ -d "${CCT_SHARED:-../shared}" ] && export CCT_SHARED=$(cd "${CCT_SHARED:-../shared}" && pwd)
cd "$work"
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
python -c "import cupy; print('CuPy', cupy.__version__, 'CUDA', cupy.cuda.runtime.runtimeGetVersion())" \
    >> "$OUT/gpu.txt" 2>&1

python -m pytest -q -rs -p no:cacheprovider \
    tests/backend/test_standin.py tests/test_gpu_backend.py tests/layers/test_every_layer.py \
    tests/test_solver_on_device.py tests/test_cli_time.py tests/test_gpu_errors.py \
    -k "gpu or cupy or real" > "$OUT/gpu_tests.txt" 2>&1
echo "tests: $(tail -n 1 "$OUT/gpu_tests.txt")"

# cuDNN's engines against the lowering path, geometry by geometry (issue 29, item 1)
python "$OLDPWD/scripts/cudnn_probe.py" > "$OUT/cudnn_probe.txt" 2>&1
echo "cudnn probe: exit $?; $(grep -c ' ok$' "$OUT/cudnn_probe.txt") operations agree"
# what a CUDA graph can hold of an iteration, op by op, and cuDNN's matmul against cuBLAS
python "$OLDPWD/scripts/capture_probe.py" > "$OUT/capture_probe.txt" 2>&1
echo "capture probe: exit $?"; cat "$OUT/capture_probe.txt"

sh examples/mnist/create_mnist.sh > "$OUT/create_mnist.txt" 2>&1
cct train --solver=examples/mnist/lenet_solver.prototxt -gpu 0 > "$OUT/lenet_gpu.log" 2>&1
echo "lenet -gpu 0: exit $?; $(grep 'Test net output #0' "$OUT/lenet_gpu.log" | tail -n 1)"

cct train --solver=examples/mnist/lenet_solver.prototxt --strategy=hogbatch \
    --devices=cpu,gpu0 --batch-sizes=cpu:16,gpu0:256 > "$OUT/hogbatch_cpu_gpu.log" 2>&1
echo "hogbatch cpu+gpu0: exit $?; $(grep 'Test net output #0' "$OUT/hogbatch_cpu_gpu.log" | tail -n 1)"
grep -E "One compute group per device|Updates by group" "$OUT/hogbatch_cpu_gpu.log" | tail -n 2

# Issue 30's items 3 and 4 (built and checked on CPU cores and the stand-in; what a GPU
# measures): the optimizer's race of one group's places on CPU+GPU, then the strategies to
# LeNet's 98% on the CPU and the GPU against the GPU alone (bench_strategies' devices setting).
cct plan --solver=examples/mnist/lenet_solver.prototxt --devices=cpu,gpu0 \
    > "$OUT/plan_cpu_gpu.log" 2>&1
echo "plan cpu+gpu0: exit $?; $(grep -o 'one group, by place.*' "$OUT/plan_cpu_gpu.log" | tail -n 1)"
if [ -f "$OLDPWD/bench/bench_strategies.py" ]; then
    python "$OLDPWD/bench/bench_strategies.py" --setting devices --devices=cpu,gpu0 \
        --work lenet --cap 3000 --json "$OUT/strategies_cpu_gpu.json" \
        --png "$OUT/strategies_cpu_gpu.png" > "$OUT/strategies_cpu_gpu.txt" 2>&1
    echo "bench_strategies cpu+gpu0: exit $?"
    tail -n 10 "$OUT/strategies_cpu_gpu.txt"
fi

# Issue 29's table: the six nets against PyTorch on the same GPU, with the CUDA-graph column
if [ -f "$OLDPWD/bench/bench_gpu.py" ]; then
    python "$OLDPWD/bench/bench_gpu.py" --iters 20 --warmup 3 --graph --hybrid \
        --json "$OUT/bench_gpu.json" > "$OUT/bench_gpu.txt" 2>&1
    echo "bench_gpu: exit $?"
    grep -v '^#   ' "$OUT/bench_gpu.txt" | tail -n 9
fi
