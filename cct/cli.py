"""The ``cct`` command: Caffe's ``caffe`` tool with its commands and gflags-style flags.

Flags are accepted in every gflags spelling: ``-model x``, ``-model=x``, ``--model=x``,
``--model x``. A user error prints one paragraph (``cct: error: ...``) and exits with status 1;
never a traceback.
"""
from __future__ import annotations

import math
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from . import glog as log
from .errors import CCTError, close_matches
from .flags import Flags, ShowAndExit, version_line
from .tools import TOOLS, command as tool_command
from .usage import USAGE


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


#: Flags of the driver's strategies (every strategy but sync, the solver's own solve()): SMA's,
#: the Ray engine's, all of them; and the optimizer's.
_SMA_FLAGS = ("learners", "sma-alpha", "sma-momentum", "sync-period")
_RAY_FLAGS = ("ray-address", "ps-shards", "ray-group-restarts", "ray-data")
_DRIVER_FLAGS = ("engine", "groups", "batch-sizes", "staleness", "seed", "simulate-speeds",
                 "threshold", "sync-fc", "group-timeout") + _SMA_FLAGS + _RAY_FLAGS
_OPTIMIZER_FLAGS = ("target-accuracy", "target-loss", "budget", "probe-share", "retune-every",
                    "plot")
#: What each flag that only some settings use is for: the second half of the error when it is
#: given where it does nothing.
_PURPOSE = {
    "strategy": "-optimize chooses the strategy and groups itself",
    "engine": "-engine runs the groups of the driver's strategies",
    "groups": "-groups needs -strategy=async, hogbatch, adaptive-hogbatch or sma",
    "batch-sizes": "-batch-sizes gives each group its batch",
    "staleness": "-staleness orders the updates of the simulated engine's groups",
    "seed": "-seed seeds the simulated engine's -staleness=exponential",
    "simulate-speeds": "-simulate-speeds sets the simulated engine's device speeds",
    "threshold": "-threshold is adaptive-hogbatch's tolerated imbalance of the updates",
    "sync-fc": "-sync-fc is for the parameter store's strategies: async, hogbatch, "
               "adaptive-hogbatch",
    "allow-negative-momentum": "-allow-negative-momentum lets -momentum go below 0",
    "group-timeout": "-group-timeout bounds the wait for a group process or actor (a thread "
                     "cannot be stopped)",
    "momentum": "-momentum sets the solver's or the parameter store's momentum; sma's learners "
                "use the solver's and the central model -sma-momentum",
    **{name: f"-{name} is for -strategy=sma" for name in _SMA_FLAGS},
    **{name: f"-{name} is for -engine=ray" for name in _RAY_FLAGS},
    **{name: f"-{name} is a setting of -optimize" for name in _OPTIMIZER_FLAGS},
}


def _refuse_unused(flags: Flags, names, context: str, give: str = "",
                   purpose: Optional[Dict[str, str]] = None) -> None:
    """The one rule for flags the chosen settings do not use: a flag given on the command line
    that does nothing ``context`` (e.g. "with -strategy=sync") is an error naming both, never
    silently ignored. ``give``: the setting that would use it; ``purpose``: what the flags
    are for, where :data:`_PURPOSE` does not say it for this command."""
    for name in names:
        if name in flags.given:
            fix = f"give {give} or leave -{name} out" if give else f"leave -{name} out"
            why = (purpose or {}).get(name) or _PURPOSE[name]
            raise CCTError(f"{flags.command}: -{name}={flags.get(name)} does nothing {context}: "
                           f"{why}; {fix}")


def _check_train_flags_apply(flags: Flags, strategy: str, optimize: bool) -> None:
    """Refuse every train flag the strategy, engine or -optimize does not use (see
    :func:`_refuse_unused`)."""
    engine, staleness = flags.get("engine"), flags.get("staleness")
    if "allow-negative-momentum" in flags.given and "momentum" not in flags.given:
        _refuse_unused(flags, ("allow-negative-momentum",), "without -momentum",
                       "-momentum=auto")
    if optimize:
        # The optimizer runs its own strategies on -engine, from the solver's momentum (or
        # -momentum's); none of the driver's other settings reaches it.
        context = "with -optimize (it chooses strategy, groups, lr and momentum)"
        _refuse_unused(flags, ("strategy",), context)
        _refuse_unused(flags, [n for n in _DRIVER_FLAGS if n != "engine"], context)
        return
    _refuse_unused(flags, _OPTIMIZER_FLAGS, "without -optimize", "-optimize")
    if strategy == "sync":
        _refuse_unused(flags, _DRIVER_FLAGS, "with -strategy=sync (one update stream, no "
                       "groups)", "-strategy=async (or hogbatch, adaptive-hogbatch, sma)")
        return
    here = f"with -strategy={strategy}"
    if strategy == "sma":
        _refuse_unused(flags, ("momentum", "allow-negative-momentum", "sync-fc", "threshold"),
                       here)
        if "learners" in flags.given:
            _refuse_unused(flags, ("groups",), "with -learners (the learner count)")
    else:
        _refuse_unused(flags, _SMA_FLAGS, here, "-strategy=sma")
        if strategy != "adaptive-hogbatch":
            _refuse_unused(flags, ("threshold",), here, "-strategy=adaptive-hogbatch")
    if engine != "simulated":
        _refuse_unused(flags, ("staleness", "seed", "simulate-speeds"),
                       f"with -engine={engine}", "-engine=simulated")
    elif "simulate-speeds" in flags.given:
        _refuse_unused(flags, ("staleness", "seed"), "with -simulate-speeds (the speeds order "
                       "the groups)")
    elif staleness != "exponential":
        _refuse_unused(flags, ("seed",), f"with -staleness={staleness}",
                       "-staleness=exponential")
    if engine != "ray":
        _refuse_unused(flags, _RAY_FLAGS, f"with -engine={engine}", "-engine=ray")
    if engine not in ("processes", "ray"):
        _refuse_unused(flags, ("group-timeout",), f"with -engine={engine}",
                       "-engine=processes (or ray)")


def _momentum(flags: Flags, strategy: str) -> Optional[str]:
    """-momentum: a finite number, at least 0 unless -allow-negative-momentum (a negative or
    non-finite momentum otherwise ends in a NaN loss blamed on base_lr), or 'auto' with the
    parameter store's strategies; None when not given."""
    text = flags.get("momentum")
    if not text or (text == "auto" and strategy != "sync"):
        return text or None
    try:
        value = float(text)
    except ValueError:
        if strategy == "sync":
            raise CCTError(f"train: -momentum must be a number (or 'auto' with "
                           f"-strategy=async), got '{text}'") from None
        return text         # the driver's error names it: 'auto' or a number
    allow = flags.bool("allow-negative-momentum")
    if not math.isfinite(value) or (value < 0 and not allow):
        floor = "" if allow else " of at least 0 (below: add -allow-negative-momentum)"
        raise CCTError(f"train: -momentum must be a finite number{floor}, got '{text}'")
    return text


def _learners(flags: Flags):
    """-learners: a count or 'auto' (None: -groups)."""
    text = flags.get("learners")
    if not text or text == "auto":
        return text or None
    try:
        int(text)
    except ValueError:
        raise CCTError(f"train: -learners must be a count or 'auto', got '{text}'") from None
    return flags.int("learners", "[1, inf)", "the number of SMA learners")


def _ps_shards(flags: Flags) -> str:
    """-ps-shards: a count of at least 1, or auto."""
    text = flags.get("ps-shards")
    if text != "auto" and not (text.isdigit() and int(text) >= 1):
        raise CCTError(f"train: -ps-shards must be a count of at least 1 or 'auto', got "
                       f"'{text}'")
    return text


def _speeds(flags: Flags) -> Optional[List[float]]:
    """-simulate-speeds: records per virtual second of each simulated device (1,8)."""
    text = flags.get("simulate-speeds")
    if not text:
        return None
    try:
        speeds = [float(v) for v in text.split(",")]
    except ValueError:
        raise CCTError(f"train: -simulate-speeds takes speeds separated by commas (1,8), got "
                       f"'{text}'") from None
    if not all(math.isfinite(v) and v > 0 for v in speeds):
        raise CCTError(f"train: -simulate-speeds must be positive finite speeds (records per "
                       f"virtual second, e.g. 1,8), got '{text}'")
    return speeds


def _driver_config(flags: Flags, strategy: str, groups: Optional[int]):
    """The driver's settings (a DriverConfig) from the command line, each flag checked where
    it is parsed (the driver checks them again for Python callers, without the flag's
    spelling)."""
    from .driver import DriverConfig
    return DriverConfig(
        groups=groups, engine=flags.get("engine"), staleness=flags.get("staleness"),
        momentum=_momentum(flags, strategy),
        allow_negative_momentum=flags.bool("allow-negative-momentum"),
        seed=flags.int("seed", "[0, inf)", "NumPy's generators take no negative seed"),
        sync_fc=flags.bool("sync-fc"), strategy=strategy,
        batch_sizes=flags.get("batch-sizes") or None,
        threshold=flags.float("threshold", "(0, 1)", "the tolerated gap between a group's "
                              "share of the updates and 1/groups"),
        learners=_learners(flags),
        sma_alpha=(flags.float("sma-alpha", "[0, 1]", "the share of its gap to the central "
                               "model a learner closes") if flags.get("sma-alpha") else None),
        sma_momentum=flags.float("sma-momentum", "[0, 1)", "the central model's momentum"),
        sync_period=flags.int("sync-period", "[1, inf)", "local steps between "
                              "synchronisations"),
        simulate_speeds=_speeds(flags), ray_address=flags.get("ray-address") or None,
        ps_shards=_ps_shards(flags),
        ray_group_restarts=flags.int("ray-group-restarts", "[0, inf)", "Ray's -1, restart "
                                     "forever, is not taken: a group that keeps dying is "
                                     "dropped after these"),
        ray_data=_ray_data(flags),
        group_timeout=(flags.float("group-timeout", "(0, inf)", "seconds a group may take to "
                                   "answer") if flags.get("group-timeout") else None))


def _ray_data(flags: Flags) -> str:
    """-ray-data: ship or local, checked before Ray is imported (a machine without Ray would
    answer a misspelt value with the missing Ray)."""
    text = flags.get("ray-data")
    if text not in ("ship", "local"):
        raise CCTError(f"train: -ray-data must be ship (the driver reads and ships batches) or "
                       f"local (each group reads its part of the LMDB), got '{text}'."
                       + close_matches(text, ("ship", "local")))
    return text


class RunSummary:
    """The end of a training run in two lines after the solver's own "Optimization Done.":
    iterations and wall time (in the display line's form, which log tools already read and
    pass over), each test output's last and best score, and the snapshots written. Tests and
    snapshots are seen through the solver's on_start callback (each comes between two
    iterations' callbacks) and once more at the end."""

    #: outputs listed per test net; a vector output's values beyond them are counted
    SHOWN = 6

    def __init__(self, solver):
        self.solver = solver
        self.began = time.perf_counter()
        self.first_iter = solver.iter
        self._seen_scores: Dict[int, object] = dict(solver.test_scores)
        self._last_state = solver.last_snapshot      # a resumed state is not written here
        # (test net, output position) -> [name, last, best, lower is better]
        self.scores: Dict[tuple, list] = {}
        self.snapshots: List[str] = []
        solver.add_callback(self.look, lambda: None)

    def look(self) -> None:
        s = self.solver
        for net_id, scores in s.test_scores.items():
            if self._seen_scores.get(net_id) is scores:   # each test stores a new list
                continue
            self._seen_scores[net_id] = scores
            net = s.test_nets[net_id]
            for k, (name, value) in enumerate(scores):
                row = self.scores.get((net_id, k))
                if row is None:
                    # A loss (an output with a loss weight) is best lowest, any other output
                    # (accuracy) highest.
                    lower = bool(net.blob_loss_weights[net.blob_names.index(name)])
                    self.scores[(net_id, k)] = [name, value, value, lower]
                else:
                    row[1] = value
                    row[2] = min(row[2], value) if row[3] else max(row[2], value)
        if s.last_snapshot and s.last_snapshot != self._last_state:
            self._last_state = s.last_snapshot
            self.snapshots.append(s.last_snapshot)

    def log(self) -> None:
        self.look()
        s = self.solver
        n = s.iter - self.first_iter
        seconds = time.perf_counter() - self.began
        line = (f"Trained {n} iterations ({_g(n / seconds if seconds > 0 else 0)} iter/s, "
                f"{_g(seconds)}s/{n} iters)")
        for net_id in sorted({k[0] for k in self.scores}):
            rows = [self.scores[k] for k in sorted(self.scores) if k[0] == net_id]
            parts = [f"{name} {_g(last)} (best {_g(best)})"
                     for name, last, best, _ in rows[:self.SHOWN]]
            more = f", {len(rows) - self.SHOWN} more" if len(rows) > self.SHOWN else ""
            line += f"; test net #{net_id}: " + ", ".join(parts) + more
        log.info("caffe.cpp:249", line)
        if self.snapshots:
            state = self.snapshots[-1]
            log.info("caffe.cpp:249", f"Snapshots written: {len(self.snapshots)}, the last "
                     f"{_model_of(state)} and {state}")
        else:
            log.info("caffe.cpp:249", "Snapshots written: none")


def _model_of(state: str) -> str:
    """The model file a snapshot wrote beside its solver state (Solver.snapshot's names)."""
    for ext, model in ((".solverstate.h5", ".caffemodel.h5"), (".solverstate", ".caffemodel")):
        if state.endswith(ext):
            return state[:-len(ext)] + model
    return state


def cmd_train(argv: List[str]) -> int:
    """Caffe's ``caffe train``: solve from a solver prototxt, optionally resuming from a
    .solverstate (-snapshot) or starting from trained weights (-weights a,b)."""
    from .context import RunContext
    from .driver import STRATEGIES
    from .progress import wants_bar
    from .solver import Solver

    flags = _train_flags(argv)
    solver_path = _require(flags, "solver", "Need a solver definition to train.")
    if flags.get("snapshot") and flags.get("weights"):
        raise CCTError("train: give a snapshot to resume training (-snapshot) or weights to "
                       "finetune (-weights), but not both.")
    strategy = flags.get("strategy")
    if strategy not in STRATEGIES:
        raise CCTError(f"train: unknown -strategy '{strategy}'; known: {', '.join(STRATEGIES)}."
                       + close_matches(strategy, STRATEGIES))
    optimize = flags.bool("optimize")
    # Every flag checked before a net is built: which apply, then their values.
    _check_train_flags_apply(flags, strategy, optimize)
    level = flags.int("level", "[-2147483648, 2147483647]", "NetState's level is an int32")
    groups = flags.int("groups") if flags.get("groups") else None  # None: one per device
    config = (_driver_config(flags, strategy, groups) if strategy != "sync" and not optimize
              else None)
    optimize_args = _optimize_args(flags) if optimize else None
    param = _train_param(flags, solver_path, level, _momentum(flags, strategy), strategy)
    devices, backend = _train_place(flags, param, strategy, optimize)
    show_progress = wants_bar(flags.get("progress"))
    actions = SignalActions(flags.get("sigint_effect"), flags.get("sighup_effect"))
    # What the run sets for the process (the seed, deterministic plans, the precision), once.
    context = RunContext.of_solver(param, solver_path, backend,
                                   deterministic=flags.bool("deterministic") or None)
    graphs = flags.get("cuda-graphs")
    if graphs not in ("on", "off"):
        raise CCTError(f"-cuda-graphs must be on or off, got '{graphs}'")
    context = context.replace(cuda_graphs=graphs)
    context.apply()
    # Blob diffs can share memory where no code but the backward pass reads them: one net,
    # trained by the solver alone.
    solver = Solver(param, solver_path, action_request=actions, backend=backend,
                    context=context,
                    share_blob_diffs=(strategy == "sync" and devices is None and not optimize))
    try:
        _train(flags, solver, config, devices, optimize_args, show_progress)
    finally:
        solver.close()
    log.info("caffe.cpp:250", "Optimization Done.")
    return 0


def _train_flags(argv: List[str]) -> Flags:
    return Flags("train", argv, {"solver": "", "weights": "", "snapshot": "", "gpu": "",
                                 "devices": "", "level": "0", "stage": "",
                                 "sigint_effect": "stop", "sighup_effect": "snapshot",
                                 "strategy": "sync", "groups": "", "engine": "threads",
                                 "staleness": "round-robin", "momentum": "", "seed": "0",
                                 "batch-sizes": "", "progress": "auto", "target-accuracy": "",
                                 "target-loss": "", "budget": "", "probe-share": "0.1",
                                 "retune-every": "0", "plot": "", "threshold": "0.05",
                                 "learners": "", "sma-alpha": "", "sma-momentum": 0.0,
                                 "sync-period": "1", "simulate-speeds": "", "ray-address": "",
                                 "ps-shards": "auto", "ray-group-restarts": "3",
                                 "group-timeout": "", "ray-data": "ship", "precision": "",
                                 "cuda-graphs": "on"},
                 booleans=("deterministic", "allow-negative-momentum", "sync-fc", "optimize"))


def _train_param(flags: Flags, solver_path: str, level: int, momentum: Optional[str],
                 strategy: str):
    """The solver file with what the flags change: the NetState's level and stages, the
    -weights to start from, -precision, and -momentum for the solver alone (a driver's
    momentum is its own)."""
    from .io.prototxt import read_solver_text
    param = read_solver_text(solver_path)
    param.train_state.level = level
    # Caffe splits the -stage flag even when empty, so its train_state holds stage "".
    param.train_state.stage.extend(flags.get("stage").split(","))
    del param.weights[:]
    if flags.get("weights"):
        param.weights.append(flags.get("weights"))
    if flags.get("precision"):
        param.precision = _precision_value(flags.get("precision"))
    if strategy == "sync" and momentum is not None:
        param.momentum = float(momentum)
    return param


def _train_place(flags: Flags, param, strategy: str, optimize: bool):
    """(devices, backend): the devices the run trains on and where the solver's nets live."""
    from .scheduler import master_backend, master_place
    devices = _train_devices(flags, param)
    if strategy == "sync" and not optimize:
        return master_place(devices, "cpu")
    if optimize or (devices is not None and flags.get("engine") != "ray"):
        # The solver's nets (the optimizer's one-group place of its own; a driver's parameter
        # store) live on a device with memory of its own when one is among the devices: the
        # GPU group reaches the store without a copy (CPU+GPU Hogbatch), the CPU groups' pulls
        # and pushes cross the bus. The groups and places are built from the spelling. Ray's
        # store is its shards, in host memory.
        return devices, master_backend(devices, "cpu")
    return devices, "cpu"


def _train(flags: Flags, solver, config, devices, optimize_args: Optional[dict],
           show_progress: bool) -> None:
    """The run on a built solver: the driver (its momentum measured first when asked) or the
    devices' gradient source, the resume, the progress bar, the solve or the optimizer's,
    and the summary."""
    from .driver import Driver
    from .progress import TrainingProgress
    from .scheduler import gradient_source
    optimize = optimize_args is not None
    if solver.loss_scale is not None and (config is not None or devices is not None
                                          or optimize):
        raise CCTError("-precision fp16 trains with a loss scale on one device (-gpu N, or "
                       "-devices with one GPU); a split batch, a driver's groups and the "
                       "optimizer take -precision bf16 (float32's range, no scale needed)")
    driver = progress = None
    try:
        measured = config is not None and config.momentum == "auto"
        if measured:
            # The probes run drivers of their own on the solver, from where the run starts:
            # a resumed one first (the driver, built after them, pulls afresh).
            if flags.get("snapshot"):
                solver.restore(flags.get("snapshot"))
            config = _measured_momentum(solver, config.replace(devices=devices))
        if config is not None:
            driver = Driver(solver, config.replace(devices=devices))
        elif devices is not None and not optimize:
            solver.set_gradient_source(gradient_source(solver.net, devices))
        if flags.get("snapshot") and not measured:
            solver.restore(flags.get("snapshot"))  # logs caffe.cpp's "Resuming from ..."
        if show_progress:  # the solver's callbacks run under the driver's strategies too
            progress = TrainingProgress(solver).attach()
        summary = RunSummary(solver)
        log.info("caffe.cpp:239", "Starting Optimization")
        if optimize:
            from .optimizer import Optimizer
            optimizer = Optimizer(solver, **optimize_args, engine=flags.get("engine"),
                                  devices=devices)
            try:
                optimizer.solve()
            finally:
                optimizer.close()
        else:
            (driver.solve if driver else solver.solve)()
        summary.log()
    finally:
        if progress is not None:
            progress.close()


def _measured_momentum(solver, config):
    """-momentum=auto with the parameter store's strategies: short probes at the run's group
    count choose the explicit momentum (cct/optimizer/momentum.py, logged); they are thrown
    away and the driver trains with the choice. The probes' drivers take the run's DriverConfig
    (its -seed, -sync-fc ...) and the data layers' batch."""
    from .optimizer.momentum import choose_momentum
    groups = config.groups
    if groups is None:          # the driver's rule: one group per device
        devices = config.device_list()
        groups = len(devices) if devices else 1
    choice = choose_momentum(solver, groups=groups, engine=config.engine,
                             devices=config.devices, staleness=config.staleness,
                             allow_negative=config.allow_negative_momentum,
                             driver_config=config)
    return config.replace(momentum=repr(choice.momentum),
                          allow_negative_momentum=config.allow_negative_momentum
                          or choice.momentum < 0)


def _optimize_args(flags: Flags) -> dict:
    """The optimizer's settings from -target-accuracy, -target-loss, -budget, -probe-share,
    -retune-every and -plot (cct/optimizer), each checked where it is parsed."""
    if flags.get("target-accuracy") and flags.get("target-loss"):
        raise CCTError(f"{flags.command}: give -target-accuracy or -target-loss, not both")
    checks = {"target-accuracy": ("(0, 1]", "the first test net's accuracy to stop at"),
              "target-loss": ("(0, inf)", "the smoothed training loss to stop at"),
              "budget": ("(0, inf)", "the seconds the run may take")}
    args = {name.replace("-", "_"): flags.float(name, *checks[name]) if flags.get(name)
            else None for name in checks}
    args["probe_share"] = flags.float("probe-share", "(0, 1)",
                                      "the share of the run's time its probes may take")
    if "retune-every" in flags.values:
        # 0 (the default): the optimizer's interval, an epoch or a tenth of max_iter.
        args["retune_every"] = flags.int("retune-every", "[0, inf)",
                                         "iterations between re-tunes") or None
    if flags.values.get("plot"):
        # Refused here, before a net is built, not after the probes.
        from .optimizer.report import check_plot_path
        args["plot"] = check_plot_path(flags.get("plot"), flags.command)
    return args


def cmd_plan(argv: List[str]) -> int:
    """``cct plan``: the optimizer's plan for a solver (every candidate with its measured HE,
    probe and predicted time, the choice and why) and the advisor's batch, devices and
    shards, without training. Writes nothing but -plot's picture: no snapshot, and the kernel
    plan cache is off."""
    import os

    os.environ["CCT_PLAN_CACHE"] = "off"
    from .io.prototxt import read_solver_text
    from .optimizer import Optimizer, advise
    from .scheduler import master_backend
    from .solver import Solver

    flags = Flags("plan", argv, {"solver": "", "devices": "", "engine": "threads",
                                 "target-accuracy": "", "target-loss": "", "budget": "",
                                 "probe-share": "0.1", "bandwidth": "1.25e9", "cluster": "",
                                 "staleness": "round-robin", "plot": ""})
    solver_path = _require(flags, "solver", "Need a solver definition to plan.")
    cluster = None
    if flags.get("cluster"):
        # A cluster's plan runs the simulated engine on the cluster's own link.
        _refuse_unused(flags, ("engine", "bandwidth"), "with -cluster",
                       purpose={"engine": "-cluster plans on the simulated engine, a group a "
                                          "node",
                                "bandwidth": "-cluster=...,bandwidth=X gives the links' "
                                             "bandwidth"})
        from .optimizer.cluster import parse_cluster
        cluster = parse_cluster(flags.get("cluster"))
    else:
        _refuse_unused(flags, ("staleness",), "without -cluster", "-cluster",
                       purpose={"staleness": "-staleness orders the simulated groups of a "
                                             "-cluster plan"})
    bandwidth = (cluster.bandwidth if cluster is not None else
                 flags.float("bandwidth", "(0, inf)", "the link's bytes per second"))
    optimize_args = _optimize_args(flags)
    param = read_solver_text(solver_path)
    param.snapshot = 0
    param.snapshot_after_train = False
    devices = flags.get("devices") or None
    # The solver's nets where `cct train --optimize` puts them (a GPU among the devices holds
    # them); the optimizer builds its places and groups from the spelling.
    solver = Solver(param, solver_path, backend=master_backend(devices, "cpu"))
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
        optimizer = Optimizer(solver, **optimize_args, **kw)
        plan = optimizer.make_plan()
        if cluster is not None:
            for line in model.lines():
                log.info("optimizer.py:0", line)
        optimizer.log_plan(plan)
        if optimizer.plot:
            from .optimizer.report import plot as plot_probes
            plot_probes(plan, optimizer.plot)
            log.info("optimizer.py:0", f"Optimizer: the probes' loss curves are in "
                     f"{optimizer.plot}")
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

    from .native import _C

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
                    ("common.cpp:0", "Measured SGEMM", f"{d['sgemm_gflops']:.0f} GFLOP/s"),
                    ("common.cpp:0", "Measured tensor-core GEMMs",
                     ", ".join(f"{p} {g:.0f}" for p, g in d["gemm_gflops"].items()
                               if p != "float32") + " GFLOP/s (-precision)")):
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
    from .native import _C
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
    output_ids = net.output_ids()
    for i in range(iterations):
        total_loss += net.forward_prefilled()
        idx = 0
        for j, blob_id in enumerate(output_ids):
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
        blob_id = output_ids[j]
        mean = score / iterations
        weight = net.blob_loss_weights[blob_id]
        extra = f" (* {_g(weight)} = {_g(weight * mean)} loss)" if weight else ""
        log.info("caffe.cpp:348", f"{net.blob_names[blob_id]} = {_g(mean)}{extra}")
    return 0


def _precision_value(name: str) -> int:
    """-precision's value as the solver's ``precision`` field."""
    from .backend.reduced import PRECISIONS
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
    backend = _net_backend(flags, "caffe.cpp:352")
    from .context import set_precision
    set_precision(flags.get("precision"), backend, source="time: -precision")
    net = Net(model, _phase(flags.get("phase")), level=flags.int("level"),
              stages=flags.list("stage"), weights=flags.get("weights") or None,
              backend=backend)
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
        # One line: the closest commands, not the whole usage (cct --help prints it).
        print(f"cct: error: unknown command '{command}'.{close_matches(command, COMMANDS)} "
              f"(cct --help lists the commands)", file=sys.stderr)
        return 1
    # caffe.cpp sets FLAGS_alsologtostderr: the tools put the whole log on stderr, whatever
    # GLOG_log_dir asks for besides (GLOG_minloglevel still applies).
    log.init_log(alsologtostderr=True)
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
