"""The ``cct`` command: Caffe's ``caffe`` tool with its commands and gflags-style flags.

Flags are accepted in every gflags spelling: ``-model x``, ``-model=x``, ``--model=x``,
``--model x``. A user error prints one paragraph (``cct: error: ...``) and exits with status 1;
never a traceback.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from . import glog as log
from .errors import CCTError
from .flags import Flags, ShowAndExit, version_line
from .tools import TOOLS, command as tool_command

USAGE = """usage: cct <command> <args>

commands:
  train           train or finetune a model (-solver, -weights, -snapshot, -level, -stage,
                  -sigint_effect, -sighup_effect, -gpu, -devices: e.g. cpu:1,cpu:1 or cpu,gpu0
                  to split every batch across devices, -deterministic: fixed kernel plans,
                  none timed, so runs repeat to the bit whatever the machine's load;
                  -precision=float32|bf16: bf16 GEMMs where the CPU has bf16 units;
                  -progress=auto|bar|none: a live progress line, by default on a terminal;
                  -strategy=sync|async|hogbatch|adaptive-hogbatch|sma -groups=G
                  -engine=threads|processes|simulated|ray
                  -staleness=round-robin|exponential
                  -momentum=auto|X -allow-negative-momentum -sync-fc -batch-sizes=16,256
                  -threshold=T -learners=K|auto -sma-alpha=A -sma-momentum=M
                  -sync-period=P -simulate-speeds=1,8 -engine=ray -ray-address=A|auto
                  -ps-shards=N|auto -ray-group-restarts=R -ray-data=ship|local: the
                  driver's strategies, cct/driver; -optimize -target-accuracy=A
                  -target-loss=L -budget=S -probe-share=P -retune-every=K: the optimizer
                  chooses them, cct/optimizer)
  plan            the optimizer's plan for a solver, without training (-solver, -devices,
                  -engine, -target-accuracy, -target-loss, -budget, -probe-share,
                  -bandwidth: each candidate's measured HE, probe and predicted time, the
                  choice and why, and the advisor's batch, devices and shards;
                  -cluster=nodes=N,bandwidth=X[,shards=S][,overhead=C] -staleness=...:
                  the plan for that cluster, HE from the scale-out model, SE simulated)
  test            score a model (-model, -weights, -iterations, -level, -stage, -gpu,
                  -devices: one device, e.g. gpu1 or standin)
  time            benchmark forward/backward of a model (-model, -iterations, -phase, -level,
                  -stage, -precision=float32|bf16, -gpu, -devices: one device)
  device_query    show the devices cct can run on (-gpu)

tools (Caffe's tools/ and tools/extra/; each takes Caffe's own arguments and flags):
  convert_mnist_data        IMAGES LABELS DB [--backend=lmdb]
  convert_imageset          [--gray] [--shuffle] [--resize_height=H] [--resize_width=W]
                            [--check_size] [--encoded] [--encode_type=png] ROOTFOLDER/ LISTFILE DB
  compute_image_mean        [--backend=lmdb] DB [OUT.binaryproto]
  extract_features          WEIGHTS MODEL BLOB[,BLOB..] DB[,DB..] NUM_MINI_BATCHES [lmdb]
  upgrade_net_proto_text    IN.prototxt OUT.prototxt
  upgrade_solver_proto_text IN.prototxt OUT.prototxt
  parse_log                 LOGFILE OUTPUT_DIR [--delimiter ,] [--verbose]
  plot_log                  LOGFILE OUT.png [--follow [--follow-timeout=S]]
                            (or Caffe's: CHART_TYPE OUT.png LOGFILE...)
  summarize                 NET.prototxt [--phase TRAIN|TEST|ALL] [--max-width 30]
  draw_net                  NET.prototxt OUT.png [--rankdir LR|TB|BT|RL] [--phase TRAIN|TEST|ALL]
  export_onnx               --model=deploy.prototxt [--weights=w.caffemodel] --output=m.onnx
                            [--opset 13] [--batch dynamic|N] [--check]

Flags take any gflags spelling: -model x, -model=x, --model=x, --model x.
cct <command> --help lists a command's flags and defaults; cct --version prints the version."""


def _phase(name: str):
    from .net import TEST, TRAIN
    phases = {"TRAIN": TRAIN, "TEST": TEST}
    if name not in phases:
        raise CCTError(f"-phase must be TRAIN or TEST, got '{name}'")
    return phases[name]


def _iterations(flags: Flags, what: str) -> int:
    """-iterations of ``cct test`` and ``cct time``. Caffe runs no pass for a value below 1 and
    then divides by it, printing nan or inf; cct refuses it."""
    n = flags.int("iterations")
    if n < 1:
        raise CCTError(f"{flags.command}: -iterations must be at least 1 (got {n}): it is the "
                       f"number of {what}.")
    return n


def _require(flags: Flags, name: str, why: str) -> str:
    value = flags.get(name)
    if not value:
        raise CCTError(f"{flags.command}: {why} (give -{name})")
    return value


class SignalActions:
    """Caffe's SignalHandler: SIGINT and SIGHUP become the solver actions the flags name
    ("stop", "snapshot" or "none"); the solver polls :meth:`__call__` once per iteration."""

    EFFECTS = ("stop", "snapshot", "none")

    def __init__(self, sigint_effect: str, sighup_effect: str):
        import signal

        for name, effect in (("sigint_effect", sigint_effect), ("sighup_effect", sighup_effect)):
            if effect not in self.EFFECTS:
                raise CCTError(f"train: -{name} must be one of stop, snapshot, none; got "
                               f"'{effect}'")
        self.effects = {signal.SIGINT: sigint_effect}
        if hasattr(signal, "SIGHUP"):
            self.effects[signal.SIGHUP] = sighup_effect
        self.pending: List[str] = []
        for signum in self.effects:
            signal.signal(signum, self._handle)

    def _handle(self, signum, _frame) -> None:
        self.pending.append(self.effects[signum])

    def __call__(self) -> str:
        return self.pending.pop(0) if self.pending else "none"


def _gpu_ids(gpu: str, command: str) -> Optional[List[int]]:
    """Caffe's -gpu value: ids separated by commas, or None for 'all'."""
    if gpu == "all":
        return None
    try:
        return [int(i) for i in gpu.split(",")]
    except ValueError:
        raise CCTError(f"{command}: -gpu takes GPU ids separated by commas, or 'all' (got "
                       f"{gpu!r}).") from None


def _gpu_backend(flags: Flags):
    """The GPU backend, for -gpu. The flag asks for a GPU in so many words: where the GPU
    backend cannot run it is an error saying why and how to fix it, as -gpu is fatal in
    Caffe's CPU-only build ("Cannot use GPU in CPU-only Caffe"). Only a solver's
    solver_mode: GPU, and pycaffe's set_mode_gpu(), fall back to the CPU: Caffe's own example
    solvers ask for the GPU and must still train on machines without one."""
    from .backend import gpu as gpu_backend
    ok, reason = gpu_backend.available()
    if not ok:
        raise CCTError(f"{flags.command}: -gpu {flags.get('gpu')} asks for a GPU, but {reason}. "
                       f"Leave out -gpu to run on the CPU.")
    return gpu_backend


def _net_backend(flags: Flags, where: str) -> str:
    """The backend of ``cct test``/``cct time``: the first GPU of -gpu (Caffe uses the first
    of a list there too), which must exist; the one device of -devices (cct's spelling: a GPU,
    the stand-in, the CPU); the CPU without either."""
    gpu, spec = flags.get("gpu"), flags.get("devices")
    if gpu and spec:
        raise CCTError(f"{flags.command}: give -gpu or -devices, not both.")
    if spec:
        from .devices import parse_devices
        devices = parse_devices(spec)
        if len(devices) != 1:
            raise CCTError(f"{flags.command}: -devices={spec} names {len(devices)} devices; "
                           f"{flags.command} runs one net on one device (e.g. -devices=gpu1)")
        devices[0].activate()          # a GPU made current on this thread
        log.info(where, f"Use device {devices[0].name}.")
        return devices[0].backend
    if gpu:
        device_id = (_gpu_ids(gpu, flags.command) or [0])[0]
        gpu_backend = _gpu_backend(flags)
        try:
            gpu_backend.use_device(device_id)
        except CCTError as e:  # an id the machine's GPUs do not have
            raise CCTError(f"{flags.command}: -gpu {gpu}: {e}") from None
        log.info(where, f"Use GPU with device ID {device_id}")
        return "gpu"
    log.info(where, "Use CPU.")
    return "cpu"


def _train_devices(flags: Flags, param):
    """The devices ``cct train`` runs on. Caffe's rule: -gpu overrides the solver's
    solver_mode/device_id; -devices is cct's own list (cct/devices.py). None: the CPU.
    solver_mode: GPU on a machine where the GPU backend cannot run warns and trains on the CPU;
    -gpu there, and a GPU id the machine does not have, are errors."""
    from .backend import gpu as gpu_backend
    from .devices import DeviceError, parse_devices
    from .proto import caffe_pb2

    spec, gpu = flags.get("devices"), flags.get("gpu")
    if spec and gpu:
        raise CCTError("train: give -gpu (Caffe's list of GPUs) or -devices (cct's list of "
                       "devices, e.g. cpu,gpu0), not both.")
    if spec:
        log.info("caffe.cpp:197", f"Use devices {spec}.")
        return spec
    what = f"-gpu {gpu}"
    if not gpu and param.solver_mode == caffe_pb2.SolverParameter.GPU:
        gpu = str(param.device_id)
        what = f"solver_mode: GPU (device_id {gpu})"
    if not gpu:
        log.info("caffe.cpp:197", "Use CPU.")
        return None
    ids = _gpu_ids(gpu, "train")
    if flags.get("gpu"):
        _gpu_backend(flags)
    else:
        ok, reason = gpu_backend.available()
        if not ok:
            log.warning("caffe.cpp:206", f"{what}: GPU devices asked for, but {reason}. "
                        f"Running on the CPU.")
            log.info("caffe.cpp:197", "Use CPU.")
            return None
    try:
        devices = parse_devices(",".join(f"gpu{i}" for i in ids) if ids else "gpu:all")
    except DeviceError as e:  # a GPU id the machine does not have
        raise CCTError(f"train: {what}: {e}") from None
    log.info("caffe.cpp:218", f"Using GPUs {', '.join(d.name[3:] for d in devices)}")
    return devices


def _momentum_value(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise CCTError(f"train: -momentum must be a number (or 'auto' with -strategy=async), "
                       f"got '{text}'") from None


def _learners(text: str):
    """-learners: a count or 'auto' (None: -groups)."""
    if not text or text == "auto":
        return text or None
    try:
        return int(text)
    except ValueError:
        raise CCTError(f"train: -learners must be a count or 'auto', got '{text}'") from None


def _speeds(text: str) -> Optional[List[float]]:
    """-simulate-speeds: records per virtual second of each simulated device (1,8)."""
    if not text:
        return None
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise CCTError(f"train: -simulate-speeds takes speeds separated by commas (1,8), got "
                       f"'{text}'") from None


def cmd_train(argv: List[str]) -> int:
    """Caffe's ``caffe train``: solve from a solver prototxt, optionally resuming from a
    .solverstate (-snapshot) or starting from trained weights (-weights a,b)."""
    from .driver import STRATEGIES, Driver
    from .io.prototxt import read_solver_text
    from .progress import TrainingProgress, wants_bar
    from .scheduler import gradient_source, single_gpu
    from .solver import Solver

    flags = Flags("train", argv, {"solver": "", "weights": "", "snapshot": "", "gpu": "",
                                  "devices": "", "level": "0", "stage": "", "sigint_effect": "stop",
                                  "sighup_effect": "snapshot", "strategy": "sync", "groups": "",
                                  "engine": "threads", "staleness": "round-robin",
                                  "momentum": "", "seed": "0", "batch-sizes": "",
                                  "progress": "auto", "target-accuracy": "",
                                  "target-loss": "", "budget": "", "probe-share": "0.1",
                                  "retune-every": "0",
                                  "threshold": "0.05", "learners": "", "sma-alpha": "",
                                  "sma-momentum": "0", "sync-period": "1",
                                  "simulate-speeds": "", "ray-address": "",
                                  "ps-shards": "auto", "ray-group-restarts": "3",
                                  "ray-data": "ship", "precision": ""},
                  booleans=("deterministic", "allow-negative-momentum", "sync-fc", "optimize"))
    solver_path = _require(flags, "solver", "Need a solver definition to train.")
    if flags.get("snapshot") and flags.get("weights"):
        raise CCTError("train: give a snapshot to resume training (-snapshot) or weights to "
                       "finetune (-weights), but not both.")
    param = read_solver_text(solver_path)
    param.train_state.level = flags.int("level")
    # Caffe splits the -stage flag even when empty, so its train_state holds stage "".
    param.train_state.stage.extend(flags.get("stage").split(","))
    del param.weights[:]
    if flags.get("weights"):
        param.weights.append(flags.get("weights"))
    if flags.get("precision"):
        param.precision = _precision_value(flags.get("precision"))
    devices = _train_devices(flags, param)
    if flags.bool("deterministic"):
        from .backend import plans
        plans.set_deterministic(True)
    show_progress = wants_bar(flags.get("progress"))
    actions = SignalActions(flags.get("sigint_effect"), flags.get("sighup_effect"))
    strategy = flags.get("strategy")
    if strategy not in STRATEGIES:
        raise CCTError(f"train: unknown -strategy '{strategy}'; known: {', '.join(STRATEGIES)}")
    groups = flags.int("groups") if flags.get("groups") else None  # None: one per device
    if strategy == "sync" and groups not in (None, 1):
        raise CCTError("train: -groups needs -strategy=async (sync is one group)")
    if strategy != "sma" and flags.get("learners"):
        raise CCTError("train: -learners is for -strategy=sma (use -groups for the others)")
    if strategy == "sync" and flags.get("batch-sizes"):
        raise CCTError("train: -batch-sizes gives each group its batch: use it with "
                       "-strategy=hogbatch, adaptive-hogbatch or sma")
    if strategy == "sync" and flags.get("momentum"):
        param.momentum = _momentum_value(flags.get("momentum"))
    if strategy == "sync":
        devices, backend = single_gpu(devices, "cpu")
    else:
        backend = "cpu"
    # Blob diffs can share memory where no code but the backward pass reads them: one net,
    # trained by the solver alone.
    solver = Solver(param, solver_path, action_request=actions, backend=backend,
                    share_blob_diffs=(strategy == "sync" and devices is None
                                      and not flags.bool("optimize")))
    driver = None
    progress = None
    try:
        if strategy != "sync":
            driver = Driver(solver, groups=groups, engine=flags.get("engine"),
                            devices=devices, staleness=flags.get("staleness"),
                            momentum=flags.get("momentum") or None,
                            allow_negative_momentum=flags.bool("allow-negative-momentum"),
                            seed=flags.int("seed"), sync_fc=flags.bool("sync-fc"),
                            strategy=strategy, batch_sizes=flags.get("batch-sizes") or None,
                            threshold=flags.float("threshold"),
                            learners=_learners(flags.get("learners")),
                            sma_alpha=(flags.float("sma-alpha") if flags.get("sma-alpha")
                                       else None),
                            sma_momentum=flags.float("sma-momentum"),
                            sync_period=flags.int("sync-period"),
                            simulate_speeds=_speeds(flags.get("simulate-speeds")),
                            ray_address=flags.get("ray-address") or None,
                            ps_shards=flags.get("ps-shards"),
                            ray_group_restarts=flags.int("ray-group-restarts"),
                            ray_data=flags.get("ray-data"))
        elif devices is not None:
            solver.set_gradient_source(gradient_source(solver.net, devices))
        if flags.get("snapshot"):
            solver.restore(flags.get("snapshot"))  # logs caffe.cpp's "Resuming from ..."
        if show_progress:  # the solver's callbacks run under the driver's strategies too
            progress = TrainingProgress(solver).attach()
        log.info("caffe.cpp:239", "Starting Optimization")
        if flags.bool("optimize"):
            if strategy != "sync":
                raise CCTError("train: -optimize chooses the strategy and groups itself; give "
                               "no -strategy")
            from .optimizer import Optimizer
            optimizer = Optimizer(solver, **_optimize_args(flags), engine=flags.get("engine"),
                                  devices=devices)
            try:
                optimizer.solve()
            finally:
                optimizer.close()
        else:
            (driver.solve if driver else solver.solve)()
    finally:
        if progress is not None:
            progress.close()
        solver.close()
    log.info("caffe.cpp:250", "Optimization Done.")
    return 0


def _optimize_args(flags: Flags) -> dict:
    """The optimizer's settings from -target-accuracy, -target-loss, -budget, -probe-share and
    -retune-every (cct/optimizer)."""
    def number(name):
        return flags.float(name) if flags.get(name) else None
    if flags.get("target-accuracy") and flags.get("target-loss"):
        raise CCTError(f"{flags.command}: give -target-accuracy or -target-loss, not both")
    return {"target_accuracy": number("target-accuracy"), "target_loss": number("target-loss"),
            "budget": number("budget"), "probe_share": flags.float("probe-share"),
            "retune_every": (flags.int("retune-every") or None) if "retune-every" in flags.values
            else None}


def cmd_plan(argv: List[str]) -> int:
    """``cct plan``: the optimizer's plan for a solver (every candidate with its measured HE,
    probe and predicted time, the choice and why) and the advisor's batch, devices and
    shards, without training. Writes nothing: no snapshot, and the kernel plan cache is off."""
    import os

    os.environ["CCT_PLAN_CACHE"] = "off"
    from .io.prototxt import read_solver_text
    from .optimizer import Optimizer, advise
    from .solver import Solver

    flags = Flags("plan", argv, {"solver": "", "devices": "", "engine": "threads",
                                 "target-accuracy": "", "target-loss": "", "budget": "",
                                 "probe-share": "0.1", "bandwidth": "1.25e9", "cluster": "",
                                 "staleness": "round-robin"})
    solver_path = _require(flags, "solver", "Need a solver definition to plan.")
    cluster = None
    if flags.get("cluster"):
        from .optimizer.cluster import parse_cluster
        cluster = parse_cluster(flags.get("cluster"))
    param = read_solver_text(solver_path)
    param.snapshot = 0
    param.snapshot_after_train = False
    devices = flags.get("devices") or None
    solver = Solver(param, solver_path)
    optimizer = None
    try:
        kw = {"engine": flags.get("engine"), "devices": devices}
        if cluster is not None:
            # HE from the scale-out model, SE from the simulated engine with one group a node.
            from .optimizer.cluster import ClusterModel, apply_seconds
            from .params import ParamSet
            model = ClusterModel(cluster, ParamSet.of_net(solver.net).nbytes,
                                 apply_seconds(solver))
            kw = {"engine": "simulated", "groups": cluster.groups(), "he_model": model,
                  "staleness": flags.get("staleness")}
        optimizer = Optimizer(solver, **_optimize_args(flags), **kw)
        plan = optimizer.make_plan()
        if cluster is not None:
            for line in model.lines():
                log.info("optimizer.py:0", line)
        optimizer.log_plan(plan)
        bandwidth = cluster.bandwidth if cluster is not None else flags.float("bandwidth")
        advise(solver, devices, step_seconds=plan.winner.he, bandwidth=bandwidth)
    finally:
        if optimizer is not None:
            optimizer.close()
        solver.close()
    return 0


def cmd_device_query(argv: List[str]) -> int:
    """Caffe's ``caffe device_query``: with -gpu, each GPU's name, memory, compute capability
    and measured SGEMM rate; without, the CPU cores cct may use and their measured SGEMM rate."""
    import os
    import platform

    from . import _C

    flags = Flags("device_query", argv, {"gpu": ""})
    gpu = flags.get("gpu")
    if gpu:
        from .backend import gpu as gpu_backend
        ok, reason = gpu_backend.available()
        if not ok:
            raise CCTError(f"device_query -gpu {gpu}: {reason}")
        ids = _gpu_ids(gpu, "device_query")
        for device_id in range(gpu_backend.device_count()) if ids is None else ids:
            log.info("caffe.cpp:112", f"Querying GPUs {device_id}")
            d = gpu_backend.describe(device_id)
            # Caffe's common.cpp DeviceQuery lines, then what cct measured.
            for src, label, value in (
                    ("common.cpp:168", "Device id", d["id"]),
                    ("common.cpp:170", "Name", d["name"]),
                    ("common.cpp:171", "Total global memory", d["total_memory"]),
                    ("common.cpp:169", "Compute capability", d["compute_capability"]),
                    ("common.cpp:186", "Number of multiprocessors", d["multiprocessors"]),
                    ("common.cpp:0", "Measured SGEMM", f"{d['sgemm_gflops']:.0f} GFLOP/s")):
                log.info(src, f"{label + ':':<31}{value}")
        return 0
    log.info("caffe.cpp:112", "Querying CPU")
    log.info("common.cpp:0", f"Device: CPU ({platform.processor() or platform.machine()})")
    log.info("common.cpp:0", f"Cores available: {len(os.sched_getaffinity(0))}")
    log.info("common.cpp:0", f"BLAS: {_C.blas_config()}")
    log.info("common.cpp:0", f"Measured SGEMM: {_cpu_sgemm_gflops():.0f} GFLOP/s "
             f"({_C.get_num_threads()} threads)")
    log.info("common.cpp:0", f"NumPy {np.__version__}")
    return 0


def _cpu_sgemm_gflops(n: int = 1536, repeats: int = 3) -> float:
    from . import _C
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    _C.gemm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        _C.gemm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9


def cmd_test(argv: List[str]) -> int:
    """Caffe's ``caffe test``: average each output over -iterations forward passes (TEST)."""
    from .api import Net
    from .net import TEST

    flags = Flags("test", argv, {"model": "", "weights": "", "iterations": "50", "gpu": "",
                                 "devices": "", "level": "0", "stage": ""})
    model = _require(flags, "model", "Need a model definition to score.")
    weights = _require(flags, "weights", "Need model weights to score.")
    iterations = _iterations(flags, "batches to score")
    net = Net(model, TEST, level=flags.int("level"), stages=flags.list("stage"), weights=weights,
              backend=_net_backend(flags, "caffe.cpp:290"))
    log.info("caffe.cpp:308", f"Running for {iterations} iterations.")
    scores: List[float] = []
    owners: List[int] = []
    total_loss = 0.0
    for i in range(iterations):
        total_loss += net.forward_prefilled()
        idx = 0
        for j, blob_id in enumerate(net.output_blob_indices):
            values = np.asarray(net.blobs_list[blob_id].cpu_data(), np.float32).ravel()
            name = net.blob_names[blob_id]
            for v in values:
                if i == 0:
                    scores.append(float(v))
                    owners.append(j)
                else:
                    scores[idx] += float(v)
                log.info("caffe.cpp:331", f"Batch {i}, {name} = {_g(v)}")
                idx += 1
    log.info("caffe.cpp:336", f"Loss: {_g(total_loss / iterations)}")
    for score, j in zip(scores, owners):
        blob_id = net.output_blob_indices[j]
        mean = score / iterations
        weight = net.blob_loss_weights[blob_id]
        extra = f" (* {_g(weight)} = {_g(weight * mean)} loss)" if weight else ""
        log.info("caffe.cpp:348", f"{net.blob_names[blob_id]} = {_g(mean)}{extra}")
    return 0


def _precision_value(name: str) -> int:
    """-precision's value as the solver's ``precision`` field."""
    from .backend.precision import PRECISIONS
    from .proto import caffe_pb2
    if name.lower() not in PRECISIONS:
        raise CCTError(f"-precision must be one of {', '.join(PRECISIONS)}, got '{name}'")
    return caffe_pb2.SolverParameter.Precision.Value(name.upper())


def cmd_time(argv: List[str]) -> int:
    """Caffe's ``caffe time``: per-layer forward and backward times averaged over iterations."""
    from .api import Net

    flags = Flags("time", argv, {"model": "", "iterations": "50", "phase": "TRAIN", "gpu": "",
                                 "devices": "", "level": "0", "stage": "", "weights": "",
                                 "precision": "float32"})
    model = _require(flags, "model", "Need a model definition to time.")
    iterations = _iterations(flags, "forward-backward passes to time")
    from .backend.precision import set_precision
    set_precision(flags.get("precision"), source="time: -precision")
    net = Net(model, _phase(flags.get("phase")), level=flags.int("level"),
              stages=flags.list("stage"), weights=flags.get("weights") or None,
              backend=_net_backend(flags, "caffe.cpp:352"))
    log.info("caffe.cpp:365", "Performing Forward")
    loss = net.forward_prefilled()
    log.info("caffe.cpp:370", f"Initial loss: {_g(loss)}")
    log.info("caffe.cpp:371", "Performing Backward")
    net.backward_all()
    n = len(net.layers)
    fwd = np.zeros(n)
    bwd = np.zeros(n)
    log.info("caffe.cpp:380", "*** Benchmark begins ***")
    log.info("caffe.cpp:381", f"Testing for {iterations} iterations.")
    # Caffe's Timers, from the net's backend: host clocks on the CPU, CUDA events on a GPU,
    # whose kernels are still running when their launches return.
    total_timer, forward_timer, backward_timer, iter_timer, timer = (
        net.backend.timer() for _ in range(5))
    total_fwd = total_bwd = 0.0
    total_timer.start()
    for it in range(iterations):
        iter_timer.start()
        forward_timer.start()
        for i in range(n):
            timer.start()
            net.forward_from_to(i, i)
            fwd[i] += timer.milliseconds()
        total_fwd += forward_timer.milliseconds()
        backward_timer.start()
        for i in range(n - 1, -1, -1):
            timer.start()
            net.backward_from_to(i, i)
            bwd[i] += timer.milliseconds()
        total_bwd += backward_timer.milliseconds()
        log.info("caffe.cpp:396", f"Iteration: {it + 1} forward-backward time: "
                 f"{_g(iter_timer.milliseconds())} ms.")
    total = total_timer.milliseconds()
    log.info("caffe.cpp:399", "Average time per layer: ")
    for i, name in enumerate(net.layer_names):
        log.info("caffe.cpp:402", f"{name:>10}\tforward: {_g(fwd[i] / iterations)} ms.")
        log.info("caffe.cpp:405", f"{name:>10}\tbackward: {_g(bwd[i] / iterations)} ms.")
    log.info("caffe.cpp:410", f"Average Forward pass: {_g(total_fwd / iterations)} ms.")
    log.info("caffe.cpp:412", f"Average Backward pass: {_g(total_bwd / iterations)} ms.")
    log.info("caffe.cpp:414", f"Average Forward-Backward: {_g(total / iterations)} ms.")
    log.info("caffe.cpp:416", f"Total Time: {_g(total)} ms.")
    log.info("caffe.cpp:417", "*** Benchmark ends ***")
    return 0


COMMANDS: Dict[str, Callable[[List[str]], int]] = {
    "train": cmd_train, "test": cmd_test, "time": cmd_time, "device_query": cmd_device_query,
    "plan": cmd_plan}
COMMANDS.update({name: tool_command(name) for name in TOOLS})


def _g(x) -> str:
    return "%g" % float(x)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] == "help" or (
            argv[0].startswith("-") and argv[0].lstrip("-") in ("h", "help", "helpshort",
                                                                 "helpfull")):
        print(USAGE)
        return 0 if argv else 1
    if argv[0] in ("-version", "--version"):
        print(version_line())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"cct: error: unknown command '{command}'.\n{USAGE}", file=sys.stderr)
        return 1
    try:
        return COMMANDS[command](rest)
    except ShowAndExit as shown:
        print(shown.text)
        return 0
    except CCTError as e:
        print(f"cct: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cct: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
