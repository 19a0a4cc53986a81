#!/usr/bin/env bash
# The Intel/AMX CPU measurements (issues 34 and 33) as one script for the lent device
# machine's host CPU, on two of its cores (`taskset -c 0,1`, as issue 34's tables were
# taken), each step under its own time limit, in order of what matters most, stopping before
# DEADLINE seconds:
#   0. the CPU kernels' tests (tests/backend: the code only an AVX-512 or AMX CPU runs, held to
#      the bits the tests promise);
#   1. the bf16 engine race (cct's AVX512-BF16 kernel, MKL in column blocks, MKL's own
#      threads) on a fresh plan cache, with the CPU's flags; then onednn_ab: the small nets'
#      bf16 iteration with oneDNN's convolutions in the races against without (and
#      onednn_f32_ab: the same for float32, CCT_ONEDNN=all against the default);
#   2. bench_train --precision bf16 on LeNet, CIFAR10-quick and CaffeNet b32 against PyTorch
#      (issue 34's first table, the three nets with a 1.5x target; ROUNDS rounds, 3 unless
#      set, each arm's processes alternated), then bench_skinny_gemm,
#      bench_update_rules (CaffeNet's update and clear) and bench_thin_gemm (every raced GEMM
#      with MKL's sgemm among the candidates, each strided batch of Winograd's and the
#      pointwise layout's GEMMs in OpenBLAS and in MKL, and the iteration with MKL in the races
#      against without);
#   3. bench_conv_layouts on LeNet, CIFAR10-quick and CaffeNet b32 (each convolution's kernels
#      under every layout), then bench_layers on those (the iteration layer by layer, issue
#      34's second table): where the Xeon's convolutions lose to the Zen 4's (item 1), and
#      backward_fusions (GoogLeNet's Concats, and the ReLUs run inside Concat's and MAX
#      Pooling's backward); then
#      bench_layers_bf16 (CaffeNet b32 and GoogLeNet b32 layer by layer in float32 and in bf16:
#      where bf16's time goes), conv_layouts_bf16 (each convolution's kernels under every
#      bf16 layout, oneDNN's with the implementation it picked: AMX's or not), bf16_engines
#      (each bf16 engine forced on the small nets) and bf16_batched (Winograd's products in
#      bf16 on each engine against float32); then bf16_accuracy (LeNet and CIFAR10-quick in
#      bf16 against float32 at 2,000 iterations: issue 34's accuracy target on this CPU);
#   4. issue 33's LeNet to 98% by its own protocol (bench_cli_time_to_accuracy.py, 3 seeds),
#      then CIFAR10-quick to loss 0.3 with settings already good and with Caffe's, one round;
#   5. bench_train --precision bf16 on CaffeNet b256, AlexNet b32 and GoogLeNet b32
#      (BIG_ROUNDS rounds, 1 unless set);
#   6. with a baseline build in the bundle (cpu_bundle.sh's BASELINE=REV): bench_builds, the
#      training step of LeNet and CIFAR10-quick under this build and the baseline's, in
#      alternating processes (what a change to the compiled kernels gains on this host).
# With --bundle DIR (scripts/cpu_bundle.sh made it here; carry it): installs its wheels into
# /tmp/site, unpacks MKL into /tmp/mkl (CCT_BF16_LIBRARY) and oneDNN into /tmp/dnnl
# (CCT_ONEDNN_LIBRARY), puts this tree's Python over the
# wheel's and reads DIR/shared as CCT_SHARED. Logs go under $OUT (default ./cpu_check_out)
# and into $OUT/logs.tgz after each step; the last lines of each step are printed.
#
#   DEADLINE=540 bash scripts/cpu_check.sh --bundle .cpu-bundle
#   STEPS=bench_train_bf16_big,bench_layers DEADLINE=540 bash scripts/cpu_check.sh --bundle ...
# (STEPS: only the steps named; the big nets' step took about 10 minutes on a Zen 4's 2 cores,
# past a first run's deadline.)
#
# STREAMS=N on a host with more cores than two (the device's has 16): the steps run in up to N
# streams at once (four; seven or eight where there are that many pairs of physical cores, the
# big nets then one to a stream, and with eight the first table's rounds alone in the first,
# the kernels' tests and bf16_accuracy in the eighth), each pinned to two CPUs of its own cores
# (the first stream to 0,1, as issue 34's tables were taken), so that one device run takes all
# of them. The streams share the host (on the device's, a VM's, its SGEMM peak read
# 142-258 GFLOP/s in one such run), which a figure from this mode must say. Each stream's log
# lines start with its letter; every stream's logs go into $OUT/logs.tgz. What a lent device
# took in 785 s of its 900 (the thirty-fifth session, with six streams: bench_layers_bf16 came
# after): a first run with every step in streams, then the first table and the baseline alone,
# on a quiet host:
#   STREAMS=7 DEADLINE=500 OUT=$OUT bash scripts/cpu_check.sh --bundle .cpu-bundle   (570 s)
#   STEPS=bench_train_bf16,baseline_ab DEADLINE=255 OUT=$OUT bash scripts/cpu_check.sh ...
# With oneDNN in the bundle, the quiet second run is better spent on what the streams time
# worst and oneDNN's answer rests on: STEPS=bench_train_bf16,onednn_ab,conv_layouts_bf16.
# The forty-fifth session's (718 s): STREAMS=7 DEADLINE=500 (396 s), then
# STEPS=bench_train_bf16,bench_train_bf16_googlenet_b32 DEADLINE=390 alone (322 s). Its pairs
# of processes gave bf16 / float32 ratios 0.91-2.15 on the same net: hence the rounds. The
# next: STREAMS=8 DEADLINE=500 (stream A's first table in 3 rounds, alone in its stream: one
# round took 148 s there, and every round's processes race their plans afresh), then alone
# BIG_ROUNDS=2 STEPS=bench_train_bf16_googlenet_b32 with DEADLINE what the device has left
# less a minute (its one round alone took 178 s, races included).
set -u
REPO=$(pwd)
OUT=${OUT:-cpu_check_out}
DEADLINE=${DEADLINE:-540}
PIN=${PIN:-taskset -c 0,1}
T0=$(date +%s)
mkdir -p "$OUT/logs"
. "$REPO/scripts/check_common.sh"    # install_bundle DIR; step NAME SECONDS LINES CMD...
if [ "${1:-}" = "--bundle" ]; then
    install_bundle "$2"
    mkdir -p /tmp/mkl && tar -C /tmp/mkl -xJf "$BUNDLE/mkl.tar.xz"
    export CCT_BF16_LIBRARY=/tmp/mkl/libmkl_rt.so.3 \
        LD_LIBRARY_PATH=/tmp/mkl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    if [ -f "$BUNDLE/onednn.tar.xz" ]; then
        mkdir -p /tmp/dnnl && tar -C /tmp/dnnl -xJf "$BUNDLE/onednn.tar.xz"
        export CCT_ONEDNN_LIBRARY=/tmp/dnnl/libdnnl.so.3
    fi
    if [ -d "$BUNDLE/baseline" ]; then    # this install with the baseline's compiled _C
        rm -rf /tmp/site_baseline && cp -r /tmp/site /tmp/site_baseline
        rm -f /tmp/site_baseline/cct/_C*.so && cp "$BUNDLE"/baseline/_C*.so /tmp/site_baseline/cct/
        export CCT_BASELINE_SITE=/tmp/site_baseline
        echo "== baseline build: $(cat "$BUNDLE/baseline/REV")"
    fi
fi
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=$(mktemp -d)     # plans timed afresh, as a user's
[ -d "${CCT_SHARED:-../shared}" ] && export CCT_SHARED=$(cd "${CCT_SHARED:-../shared}" && pwd)
OUT=$(cd "$OUT" && pwd)
# A machine may set OpenBLAS's core type (for older OpenBLAS builds that fail on its CPU).
# Every benchmark would then run that core's kernels: a Zen 5 set to Haswell read half its
# SGEMM peak (bench/RESULTS.md, fiftieth session). The benchmarks run without them, as the
# machine's notes advise; the kernels' tests keep them (KEEP_BLAS_ENV, passed to streams).
KEEP_BLAS_ENV=${KEEP_BLAS_ENV:-}
for v in OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; do
    if [ -n "${!v:-}" ]; then
        echo "== $v=${!v} was set: unset for the benchmarks, kept for the kernels' tests"
        KEEP_BLAS_ENV="$KEEP_BLAS_ENV $v=${!v}"
        unset "$v"
    fi
done
export KEEP_BLAS_ENV

if [ -n "${STREAMS:-}" ]; then
    # Pairs of CPUs, each pair on two physical cores no other pair (nor the first, 0,1) uses.
    PAIRS=$(python3 - <<'PY'
import os
def core(c):
    t = f"/sys/devices/system/cpu/cpu{c}/topology/"
    return tuple(open(t + f).read().strip() for f in ("physical_package_id", "core_id"))
used, pairs, cur = {core(0), core(1)}, ["0,1"], []
for c in sorted(os.sched_getaffinity(0)):
    if core(c) not in used:
        used.add(core(c)); cur.append(str(c))
        if len(cur) == 2:
            pairs.append(",".join(cur)); cur = []
print(" ".join(pairs))
PY
)
    lscpu -e > "$OUT/logs/lscpu.txt" 2>&1
    echo "== streams on CPU pairs: $PAIRS"
    read -r -a PAIR <<< "$PAIRS"; NAMES=(A B C D E F G H)
    if [ "${#PAIR[@]}" -ge 7 ]; then     # the big nets one to a stream: each takes minutes
        GROUPS_OF=("kernel_tests,engine_race,bench_train_bf16"
                   "bench_train_bf16_googlenet_b32,bf16_engines"
                   "bench_train_bf16_caffenet_b256" "bench_train_bf16_alexnet_b32,bf16_batched"
                   "conv_layouts_bf16,conv_layouts,bench_layers,backward_fusions"
                   "skinny_gemm,update_rules,thin_gemm,baseline_ab"
                   "bench_layers_bf16,onednn_ab,bf16_accuracy,onednn_f32_ab")
        if [ "${#PAIR[@]}" -ge 8 ] && [ "$STREAMS" -ge 8 ]; then  # the first table's rounds alone
            GROUPS_OF[0]=bench_train_bf16
            GROUPS_OF[6]=bench_layers_bf16,onednn_ab,onednn_f32_ab
            GROUPS_OF+=("kernel_tests,engine_race,bf16_accuracy")
        fi
    else
        GROUPS_OF=("kernel_tests,engine_race,bench_train_bf16,onednn_ab,bf16_batched"
                   "bench_train_bf16_big"
                   "conv_layouts_bf16,conv_layouts,bench_layers,bench_layers_bf16,backward_fusions"
                   "skinny_gemm,update_rules,thin_gemm,baseline_ab,bf16_engines,bf16_accuracy"\
",onednn_f32_ab")
    fi
    rm -rf /tmp/cpu_streams; n=0
    for g in "${!GROUPS_OF[@]}"; do
        [ "$g" -ge "$STREAMS" ] && break
        cpus=${PAIR[$g]:-0,1}       # too few cores: the stream shares the first pair's
        name=${NAMES[$g]}
        mkdir -p "/tmp/cpu_streams/$name/logs"
        ( OUT=/tmp/cpu_streams/$name STREAMS= PIN="taskset -c $cpus" STEPS=${GROUPS_OF[$g]} \
            DEADLINE=$(( DEADLINE - ($(date +%s) - T0) )) bash "$0" 2>&1 \
            | sed -u "s/^/[$name $cpus] /" ) &
        n=$((n + 1))
    done
    tar_logs() {
        tar czf "$OUT/.logs.tgz" -C /tmp cpu_streams -C "$OUT" logs &&
            mv "$OUT/.logs.tgz" "$OUT/logs.tgz"
    }
    while [ "$(jobs -r | wc -l)" -gt 0 ]; do   # the logs so far, in case the run is cut off
        sleep 15; tar_logs
    done
    wait; tar_logs
    echo "== $n streams done at $(( $(date +%s) - T0 )) s; logs in $OUT/logs.tgz"
    exit 0
fi


echo "== $(lscpu | grep 'Model name' | sed 's/  */ /g'); flags: $(grep -o -w \
    'amx_bf16\|amx_tile\|avx512_bf16\|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
# -P: not the tree's own cct/ (no compiled _C) ahead of the installed one
python3 -P -c "import numpy, cct; print('NumPy', numpy.__version__, 'cct', cct.__file__)"
cd "$REPO"
# MKL ends the process when a kernel library it dispatches to is missing (AMD CPUs take
# libmkl_def, AVX10 ones libmkl_avx10, and a host without libgomp libmkl_sequential, none of
# them in the bundle): probe one bf16 GEMM per MKL
# engine and a float32 race with MKL's sgemm first, and without MKL measure cct's own
# AVX512-BF16 kernel, saying so. (Whether MKL's sgemm keeps its bits at other operand
# alignments, strict CNR mode not being set, is test_gemm_mkl's, in the kernel_tests step.)
if [ -n "${CCT_BF16_LIBRARY:-}" ] && ! $PIN python3 -P -c "
import numpy as np
from cct.backend import mkl, precision
from cct.native import _C
why = mkl.load()
if why:
    raise SystemExit(why)
for e in ('mkl', 'mkl_threaded') if _C.mkl_threaded() else ('mkl',):
    print(e, round(precision._gflops(e, 0)), 'GFLOP/s')
mkl.offer_sgemm()  # the float32 races time MKL's sgemm too
a, b = np.ones((64, 256), np.float32), np.ones((128, 256), np.float32)
assert (_C.gemm(a, b, False, True, measured=True) == 256).all()
print('float32 races with MKL:', _C.gemm_choices())" > "$OUT/logs/mkl_probe.txt" 2>&1; then
    echo "== MKL does not run here; cct's own bf16 kernel only:"; tail -n 3 "$OUT/logs/mkl_probe.txt"
    unset CCT_BF16_LIBRARY
else
    echo "== MKL probe:"; tail -n 3 "$OUT/logs/mkl_probe.txt" 2>/dev/null
fi
# oneDNN: its version and the implementation its bf16 convolution takes on CaffeNet's conv3
# and its bf16 matmul on CaffeNet's conv4 Winograd products (on AMX, brg:avx512_core_amx);
# where it does not load, the races run without it, saying so.
if [ -n "${CCT_ONEDNN_LIBRARY:-}" ] && ! $PIN python3 -P -c "
from cct.backend import onednn
from cct.native import _C
why = onednn.load()
if why:
    raise SystemExit(why)
print('oneDNN', _C.onednn_version())
for bf16 in (False, True):
    print('bf16' if bf16 else 'float32', [_C.onednn_conv_impl(k, (32, 256, 13, 13), 384,
          (3, 3), (1, 1), (1, 1), (1, 1), 1, bf16) for k in range(3)])
print('bf16 matmul, conv4 F(2x2) products', _C.onednn_matmul_impl(False, False, 384, 1568, 384,
      16))" \
        > "$OUT/logs/onednn_probe.txt" 2>&1; then
    echo "== oneDNN does not run here:"; tail -n 3 "$OUT/logs/onednn_probe.txt"
    unset CCT_ONEDNN_LIBRARY
else
    echo "== oneDNN probe:"; tail -n 3 "$OUT/logs/onednn_probe.txt" 2>/dev/null
fi
# The kernels' tests, from a copy of tests/ beside no cct/ source (the wheel's _C is the one
# tested): the direct convolution's 16-lane tiles, the skinny engine's 16-lane tile, the thin
# engine's tile and the AVX-512 vector clones (Winograd, pooling, LRN) give the bits the tests
# promise; cct's AVX512-BF16 kernel, its chains against VDPBF16PS as Intel's SDM defines it
# (test_bf16_kernel.py: the hardware's bits, which the emulated build's tests stand for); MKL's
# sgemm plans across operand alignments (strict CNR is not set).
TESTS_COPY=$(mktemp -d) && cp -r tests pyproject.toml "$TESTS_COPY/"
step kernel_tests 90 8 bash -c "cd $TESTS_COPY && env $KEEP_BLAS_ENV $PIN python3 -m pytest -q \
    -p no:cacheprovider \
    tests/backend/test_cpu_kernels.py tests/backend/test_gemm_skinny.py \
    tests/backend/test_gemm_thin.py tests/backend/test_gemm_mkl.py tests/backend/test_bf16.py \
    tests/backend/test_bf16_kernel.py tests/backend/test_bf16_skinny.py \
    tests/backend/test_bf16_thin.py tests/backend/test_plans.py tests/backend/test_conv_onednn.py \
    tests/backend/test_onednn_matmul.py"
step engine_race 60 6 $PIN python3 -P -c "
from cct.backend import precision
print('bf16:', precision.set_precision('bf16', source='cpu_check'))
print(precision.engine_description())"
# (its last lines: where each net's bf16 GEMM shapes went, the engines raced shape by shape)
# ROUNDS (3) rounds of every arm, alternated: on the device's host one pair of processes gave
# CaffeNet b32's bf16 / float32 anywhere in 0.91-2.15 (the forty-fifth session), so each ratio
# is the median of the rounds' own, each round's printed under its net's row
step bench_train_bf16 $(( 170 * ${ROUNDS:-3} )) 24 $PIN python3 bench/bench_train.py \
    --nets lenet,cifar10_quick,caffenet_b32 --iters 5 --precision bf16 --rounds ${ROUNDS:-3}
# oneDNN's convolutions and matmul in the bf16 races (the default) against without them,
# alternated
step onednn_ab 200 8 bash -c "for r in 1 2; do for e in bf16 off; do echo CCT_ONEDNN=\$e:; \
    CCT_ONEDNN=\$e $PIN python3 bench/bench_train.py --nets lenet,cifar10_quick,caffenet_b32 \
    --iters 5 --precision bf16 --no-torch | grep -E '^(lenet|cifar|caffenet)' | sort -u; done; done"
# oneDNN's float32 convolutions in float32's races (CCT_ONEDNN=all) against without (the
# default), alternated: the Zen 4's kept them on one kernel of CIFAR10-quick's nine and none of
# CaffeNet's, but PyTorch's float32 runs on them on this Xeon, where CIFAR10-quick and LeNet
# stay under 1.5x PyTorch
step onednn_f32_ab 200 8 bash -c "for r in 1 2; do for e in all bf16; do echo CCT_ONEDNN=\$e:; \
    CCT_ONEDNN=\$e $PIN python3 bench/bench_train.py --nets lenet,cifar10_quick,caffenet_b32 \
    --iters 5 --no-torch | grep -E '^(lenet|cifar|caffenet)' | sort -u; done; done"
# the skinny float32 GEMM engine against OpenBLAS's orders on the FC forward and backward-data
# shapes (its 8- and 16-lane tiles), and CaffeNet b32 with and without its plans: 70 s on a Zen 4
step skinny_gemm 120 14 $PIN python3 bench/bench_skinny_gemm.py --nets caffenet_b32 --rounds 6
# CaffeNet's SGD update with the next iteration's clear against the update leaving the diffs
# zero (the solver's step loop), on this host's memory (every rule's update first: 30 s here)
step update_rules 90 6 $PIN python3 bench/bench_update_rules.py --nets caffenet --threads 2
# every raced GEMM of two nets in the plan cct chose (MKL's sgemm among the candidates)
# against MKL's, each strided batch (Winograd's products) in OpenBLAS and in MKL, then each
# iteration with MKL in the races and without: what MKL's AVX-512 kernels take from
# OpenBLAS's SkylakeX ones on the thin and small shapes here
step thin_gemm 180 12 $PIN python3 bench/bench_thin_gemm.py --nets cifar10_quick,caffenet_b32 \
    --rounds 3
# each convolution under each layout (lowered, direct's 8- and 16-lane tiles, Winograd 2x2 and
# 4x4, a strided layer's phase forms), forward and both backward kernels: 45 s on a Zen 4.
# LeNet's too: never taken on this Xeon, where its 1.5x target is missed alone.
step conv_layouts 120 30 $PIN python3 bench/bench_conv_layouts.py \
    --nets lenet,cifar10_quick,caffenet_b32 --repeats 3
# the same under bf16, with oneDNN's column and its implementations (AMX's?)
step conv_layouts_bf16 150 40 $PIN python3 bench/bench_conv_layouts.py \
    --nets cifar10_quick,caffenet_b32 --repeats 3 --precision bf16
# (LeNet too: the net with the thinnest margin on this Xeon, 1.52x PyTorch in the quiet run)
step bench_layers 150 50 $PIN python3 bench/bench_layers.py \
    --nets lenet,cifar10_quick,caffenet_b32 --iters 5
# GoogLeNet's Concats on cct's threads against NumPy's slices, and GoogLeNet's and CaffeNet's
# Concat and MAX Pooling backward with the in-place ReLUs on their bottoms inside against the
# ReLUs' own passes (memory-bound float32 layers that bf16 leaves as they are)
step backward_fusions 200 50 $PIN python3 bench/bench_backward_fusions.py --rounds 11
# where bf16's time goes on this CPU (its targets are 2x float32): each layer of CaffeNet b32
# and GoogLeNet b32 in both precisions, in one step so that the two tables are side by side
step bench_layers_bf16 300 20 bash -c "for p in float32 bf16; do $PIN python3 \
    bench/bench_layers.py --nets caffenet_b32,googlenet_b32 --layers --iters 3 \
    --precision \$p; done"
# each bf16 engine forced on the small nets (the race's choice, MKL on its own threads, made
# CIFAR10-quick's bf16 0.81-0.87x its float32 on this Xeon): whether an engine that wins its
# race in isolation loses inside the iteration (its threads' wake-ups between cct's loops)
step bf16_engines 150 12 bash -c "for e in mkl_threaded mkl avx512bf16; do echo \$e:; \
    CCT_BF16_ENGINE=\$e $PIN python3 bench/bench_train.py --nets lenet,cifar10_quick \
    --iters 5 --precision bf16 --no-torch | grep -E '^(lenet|cifar)' | sort -u; done"
# Winograd's products in bf16 on each engine against float32 (CaffeNet b32's 22 shapes): bf16
# can double a net that runs Winograd in float32 only where these run over twice as fast
step bf16_batched 150 30 $PIN python3 bench/bench_bf16_batched.py --nets caffenet_b32 \
    --rounds 3
# issue 34's accuracy target: LeNet and CIFAR10-quick in bf16 within 0.3 point of float32 at
# 2,000 iterations, on this CPU's engines (the Zen 4's AVX512-BF16 met it; AMX's MKL and oneDNN
# round and order differently)
step bf16_accuracy 400 10 $PIN python3 bench/bench_bf16_accuracy.py --work lenet,cifar10_quick
step time_to_98 150 12 $PIN python3 bench/bench_cli_time_to_accuracy.py --seeds 1701-1703 \
    --json "$OUT/logs/time_to_98.json"
# issue 33's 0.9x floor (CIFAR10-quick at lr 0.009, settings already good) and its 1.3x
# (Caffe's settings), one round each: the synthetic CIFAR data is written on first use
step time_to_loss_cifar 120 8 $PIN python3 bench/bench_time_to_accuracy.py --work cifar10_quick \
    --arms caffe,optimize --runs 1 \
    --solver-args '{"base_lr": 0.009}' --json "$OUT/logs/cifar_good.json" --png "$OUT/logs/cifar_good.png"
step time_to_loss_cifar_caffe 120 8 $PIN python3 bench/bench_time_to_accuracy.py \
    --work cifar10_quick --arms caffe,optimize --runs 1 \
    --json "$OUT/logs/cifar_caffe.json" --png "$OUT/logs/cifar_caffe.png"
step bench_train_bf16_big 600 18 $PIN python3 bench/bench_train.py \
    --nets caffenet_b256,alexnet_b32,googlenet_b32 --iters 3 --warmup 1 --precision bf16 \
    --rounds ${BIG_ROUNDS:-1}
for net in caffenet_b256 alexnet_b32 googlenet_b32; do   # one net a step: only when named
    case ",${STEPS:-}," in
        *",bench_train_bf16_$net,"*) step bench_train_bf16_$net 600 18 $PIN python3 \
            bench/bench_train.py --nets $net --iters 3 --warmup 1 --precision bf16 \
            --rounds ${BIG_ROUNDS:-1} ;;
    esac
done
# what the compiled kernels of this build gain on this host over the baseline build's
[ -n "${CCT_BASELINE_SITE:-}" ] && step baseline_ab 150 6 $PIN python3 bench/bench_builds.py \
    --build this=/tmp/site --build baseline="$CCT_BASELINE_SITE" --nets lenet,cifar10_quick \
    --rounds 5 --iters 20
echo "== done at $(( $(date +%s) - T0 )) s; logs in $OUT/logs.tgz"
