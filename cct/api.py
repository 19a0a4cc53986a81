"""The pycaffe-compatible entry points: ``caffe.Net(...)`` in both of its signatures, modes,
and the solver classes (``caffe.SGDSolver(file)`` ... ``caffe.get_solver(file)``)."""
from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from . import glog as _log
from .backend import resolve
from .errors import CCTError
from .io.prototxt import read_net, read_solver_text
from .io.upgrade import upgrade_net
from .layers import layer_type_list  # noqa: F401  (re-exported)
from .net import TEST, TRAIN
from .net import Net as _CoreNet
from .proto import caffe_pb2
from .rng import set_random_seed  # noqa: F401
from .scheduler import gradient_source, master_place
from .solver import Solver as _CoreSolver

_mode = "cpu"
_device = 0
_backend = "cpu"


def set_mode_cpu() -> None:
    global _mode, _backend
    _mode, _backend = "cpu", "cpu"


def set_mode_gpu() -> None:
    """pycaffe's set_mode_gpu: nets and solvers made afterwards run on the GPU backend on
    the device of :func:`set_device`; without a usable GPU cct says why once and runs them on
    the CPU, so pycaffe scripts that ask for the GPU still run."""
    global _mode, _backend
    _mode = "gpu"
    _backend = resolve("gpu", _device)


def set_device(device_id: int) -> None:
    """pycaffe's set_device: the GPU that GPU mode uses (now, if already in GPU mode)."""
    global _device, _backend
    _device = int(device_id)
    if _mode == "gpu":
        _backend = resolve("gpu", _device)


def set_precision(name: str) -> str:
    """cct's own: the GEMM (and, on a GPU, convolution) arithmetic of the backend that nets
    made now use, for everything run from now on. On the CPU "float32" or "bf16" (bf16
    operands, float32 accumulation, weights and updates; cct/backend/precision.py), "float32"
    in effect where the CPU has no bf16 units (after a warning saying so); in GPU mode also
    "tf32" and "fp16" (tensor cores; cct/backend/reduced.py; a solver made in fp16 scales its
    loss). Returns the precision in effect."""
    from .context import set_precision as _set
    return _set(name, _backend, source="set_precision")


def get_solver_mode() -> str:
    """"gpu" when nets made now run on a GPU, else "cpu"."""
    return "gpu" if _backend == "gpu" else "cpu"


def current_backend() -> str:
    """The backend name that nets and solvers made now use (cct.backend.get)."""
    return _backend


def init_log(level: Optional[int] = None, stderr: Optional[bool] = None) -> None:
    """pycaffe's init_log(), init_log(level), init_log(level, stderr): the GLOG_* variables
    read again; ``level`` (0 INFO .. 3 FATAL) and ``stderr`` (glog's logtostderr) over them."""
    _log.init_log(level, stderr)


def log(message: str) -> None:
    _log.info("_caffe.cpp:0", message)


class Net(_CoreNet):
    """pycaffe's ``caffe.Net``.

    ``Net(network_file, phase, level=0, stages=None, weights=None)`` or the old form
    ``Net(network_file, weights_file, phase)``. ``network_file`` is a prototxt path (or a
    NetParameter message). ``backend`` (cct's own): "cpu", "gpu" or "numpy"; by default the
    one set_mode_cpu/set_mode_gpu chose.
    """

    def __init__(self, network_file, *args, level: int = 0,
                 stages: Optional[Sequence[str]] = None, weights: Optional[str] = None,
                 phase: Optional[int] = None, dtype=np.float32, backend: Optional[str] = None):
        args = list(args)
        if args and isinstance(args[0], str):  # Net(model, weights, phase)
            if weights is not None:
                raise CCTError("Net(): weights given twice (positionally and as weights=)")
            weights = args.pop(0)
        if args:
            if phase is not None:
                raise CCTError("Net(): phase given twice")
            phase = args.pop(0)
        if args:
            raise CCTError("Net() takes (network_file, phase) or (network_file, weights, phase);"
                           f" got {len(args)} extra positional argument(s)")
        if phase not in (TRAIN, TEST):
            raise CCTError(f"Net(): phase must be caffe.TRAIN or caffe.TEST, got {phase!r}")
        if isinstance(network_file, (str, bytes)) or hasattr(network_file, "__fspath__"):
            source = os.fsdecode(network_file)
            param = read_net(source)
        else:
            source = "<NetParameter>"
            param = upgrade_net(network_file)
        super().__init__(param, phase=phase, level=level, stages=list(stages or []),
                         backend=backend or _backend, dtype=dtype, source=source)
        if weights is not None:
            self.copy_from(weights)


# -- solvers (pycaffe's caffe.SGDSolver(file) ... caffe.get_solver(file)) -------------------------

class Solver(_CoreSolver):
    """pycaffe's solver classes: constructed from a solver prototxt path (or a
    SolverParameter). ``.net``, ``.test_nets``, ``.iter``, ``.param``, ``.step(n)``,
    ``.solve(resume_file=None)``, ``.snapshot()``, ``.restore(path)``, ``.apply_update()``."""

    TYPE: Optional[str] = None   # None: the file's own ``type``

    def __init__(self, solver_file, devices=None, **kw):
        if isinstance(solver_file, caffe_pb2.SolverParameter):
            param, source = solver_file, kw.pop("source", "<SolverParameter>")
        else:
            source = os.fsdecode(solver_file)
            param = read_solver_text(source)
        kw.setdefault("solver_type", self.TYPE)
        devices, kw["backend"] = master_place(devices, kw.get("backend", _backend))
        super().__init__(param, source, **kw)
        if devices is not None:
            self.use_devices(devices)

    def share_weights(self, net) -> None:
        """pycaffe's Solver.share_weights: ``net`` uses this solver's trained params (by
        layer name) from now on."""
        net.share_trained_layers_with(self.net)

    @property
    def lr(self) -> float:
        """pycaffe's SGDSolver.lr: the learning rate of the current iteration."""
        return float(self.schedule(self.iter, self.current_step)[0])

    def use_devices(self, devices) -> None:
        """Train on these devices from the next iteration on: a spelling such as
        ``"cpu:1,cpu:1"`` or ``"cpu,gpu0"`` (cct/devices.py) or a list of Devices. Several
        devices share every batch through the hybrid scheduler (cct/scheduler.py)."""
        self.set_gradient_source(gradient_source(self.net, devices))


class SGDSolver(Solver):
    TYPE = "SGD"


class NesterovSolver(Solver):
    TYPE = "Nesterov"


class AdaGradSolver(Solver):
    TYPE = "AdaGrad"


class RMSPropSolver(Solver):
    TYPE = "RMSProp"


class AdaDeltaSolver(Solver):
    TYPE = "AdaDelta"


class AdamSolver(Solver):
    TYPE = "Adam"


_SOLVER_CLASSES = {c.TYPE: c for c in (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver,
                                       AdaDeltaSolver, AdamSolver)}


def get_solver(solver_file, **kw) -> Solver:
    """pycaffe's ``caffe.get_solver(file)``: the solver class the file's ``type`` names."""
    source = os.fsdecode(solver_file)
    param = read_solver_text(source)
    cls = _SOLVER_CLASSES.get(param.type, Solver)
    return cls(param, source=source, **kw)
