"""A run's context: the settings a training run holds for the whole process, in one value made
once by whoever starts the run and handed down.

Caffe keeps them in its ``Caffe::Get()`` singleton (the random generator ``random_seed``
seeds, the mode and device); cct's are the process-wide random generator (cct/rng.py), the
kernels' plan tables and their deterministic switch (cct/backend/plans.py), the GEMM
precision (cct/backend/precision.py) and the backend the solver's nets live on. The plan
tables and the precision live in the compiled extension, one per process: a context does not
make them per-run, it makes one place that sets them (:meth:`RunContext.apply`) and one value
that travels: ``cct train`` builds it from the solver file and the flags and gives it to the
solver; a driver's group processes and Ray actors receive the driver's
(:meth:`RunContext.current`) and apply it where they run, so their kernels plan and round as
the driver's do (a spawned process starts with none of the parent's settings).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from . import rng
from . import backend as backends
from .backend import plans, precision as precisions, reduced
from .glog import info
from .proto import caffe_pb2


@dataclass(frozen=True)
class RunContext:
    """``seed``: Caffe's random_seed (None: the generator is left as it is); ``precision``:
    "float32", "bf16", "tf32" or "fp16" (None: as it is; the CPU's GEMMs take float32 and
    bf16, a device backend's all four, cct/backend/reduced.py); ``deterministic``: plans
    fixed by rule, no timing (None: as it is); ``backend``: where the solver's nets live
    ("cpu", "gpu"...);
    ``source``: what the settings came from, for messages (the solver file);
    ``cuda_graphs``: "on" (the default) replays a device net's iteration as a CUDA graph where
    it can (cct/graphed.py), "off" runs it eagerly."""

    seed: Optional[int] = None
    precision: Optional[str] = None
    deterministic: Optional[bool] = None
    backend: str = "cpu"
    source: str = "<solver>"
    cuda_graphs: str = "on"

    @classmethod
    def of_solver(cls, param: caffe_pb2.SolverParameter, source: str = "<solver>",
                  backend: str = "cpu", deterministic: Optional[bool] = None) -> "RunContext":
        """What a SolverParameter says: its random_seed when set (>= 0) and its precision
        when given (``cct train -precision`` writes the flag's value there)."""
        name = None
        if param.HasField("precision"):
            name = caffe_pb2.SolverParameter.Precision.Name(param.precision).lower()
        seed = param.random_seed if param.random_seed >= 0 else None
        return cls(seed, name, deterministic, backend, source)

    @classmethod
    def current(cls, backend: str = "cpu") -> "RunContext":
        """This process's settings now (no seed: a group draws from its own generator), to
        hand to a group that runs in another process."""
        arithmetic = (precisions.precision() if backend == "cpu"
                      else backends.get(backend).precision())
        return cls(None, arithmetic, plans.deterministic(), backend, "<the driver's>")

    def replace(self, **changes) -> "RunContext":
        return dataclasses.replace(self, **changes)

    def apply(self) -> None:
        """Set what this context says for the process, in this order: the deterministic
        switch (it decides whether the machine's plan cache is read), the seed, the machine's
        plan cache, the precision (after the cache, which may hold the bf16 engine's
        choice): the CPU's GEMMs', or on a device backend the device's (a hybrid split's CPU
        replicas then multiply in float32)."""
        if self.deterministic is not None:
            plans.set_deterministic(self.deterministic)
        if self.seed is not None:
            rng.set_random_seed(self.seed)
        plans.use_machine_cache()
        if self.precision is None:
            return
        set_precision(self.precision, self.backend, f"{self.source}: precision")


def set_precision(name: str, backend: str = "cpu", source: str = "precision") -> str:
    """The arithmetic of ``backend``'s GEMMs and convolutions (the CPU's, cct/backend/
    precision.py; a device's, cct/backend/reduced.py); returns the one in effect."""
    if backend == "cpu":
        return precisions.set_precision(name, source=source)
    name = backends.get(backend).set_precision(name, source=source)
    if name != "float32":
        info("solver.cpp:0", f"Precision {name} on the {backend} backend: "
             f"{reduced.DESCRIPTION[name]}")
    return name
