"""The arithmetic of the CPU backend's GEMMs: float32 (Caffe's) or bf16 mixed precision.

With ``bf16`` every float32 GEMM of the CPU backend (the lowered convolutions, InnerProduct)
rounds its two operands to bf16 and accumulates in float32 (csrc/bf16.h); everything else
stays float32: blobs, weights, their history and the update, and the files written. It pays
only where the CPU multiplies bf16 natively (AMX-BF16, AVX512-BF16); elsewhere the engine
emulates it more slowly than cct's float32, so cct says so and stays in float32, unless
``$CCT_BF16=emulate`` (or ``emulate=True``) asks for the bf16 numerics anyway (tests, accuracy
checks on any machine).

Three engines: cct's own kernel on AVX512-BF16 (no library; any CPU with the instruction), and
Intel MKL's ``cblas_gemm_bf16bf16f32``, from the ``mkl`` wheel (the ``bf16`` extra)
or the library ``$CCT_BF16_LIBRARY`` names (AMX on Intel's CPUs), called two ways: ``mkl``,
column blocks spread over cct's threads, and ``mkl_threaded``, each whole GEMM on MKL's own
threads (its GNU OpenMP layer), which is how AMX reaches its speed. Where several run, the
first bf16 request times each on a convolution-sized GEMM and keeps the fastest, and says so. The
engines round differently, so the choice is a kernel plan (cct/backend/plans.py): kept in the
machine's plan cache and a snapshot's side file, fixed by rule in deterministic mode (cct's
kernel where the CPU runs it, else ``mkl``: results that do not depend on the thread count).
``$CCT_BF16_ENGINE`` (``avx512bf16``, ``mkl`` or ``mkl_threaded``) names one
instead. ``tf32`` and ``fp16`` are the GPU's tensor cores' (cct/backend/reduced.py, where the
device backends' precisions are set): asked of the CPU, it says so and stays in float32.
"""
from __future__ import annotations

import os
import time
from typing import Dict, List, Optional

import numpy as np

from ..native import _C
from . import mkl, plans, reduced
from ..errors import CCTError
from ..glog import info, warning

PRECISIONS = ("float32", "bf16")
EMULATE_ENV = "CCT_BF16"
ENGINE_ENV = "CCT_BF16_ENGINE"
ENGINES = plans.BF16_ENGINES
# The GEMM the engines race on: conv3 of CaffeNet at batch 8 (384 x 2304 by 2304 x 1352).
RACE_SHAPE = (384, 2304, 1352)
_chosen: Dict[str, object] = {}  # "speeds": the race's, once run (the engine is a plan)


def has_engine() -> bool:
    """Whether some bf16 GEMM engine can run here: cct's kernel, or MKL's wheel installed."""
    return bool(_C.bf16_kernel_supported()) or mkl.library_path() is not None


def _emulate_requested() -> bool:
    value = os.environ.get(EMULATE_ENV, "")
    if value not in ("", "emulate"):
        raise CCTError(f"${EMULATE_ENV} must be 'emulate' or unset, got '{value}'")
    return value == "emulate"


def _load_mkl() -> Optional[str]:
    """Loads MKL (cct/backend/mkl.py); None when loaded, else why not, naming the engine."""
    failure = mkl.load()
    return None if failure is None else f"the bf16 GEMM engine: {failure}"


def _runnable(named: str, kernel: bool, mkl_failure: Optional[str]) -> List[str]:
    """The engines that can run here, in ENGINES' order (all of them, or the one named)."""
    can = {"avx512bf16": kernel, "mkl": mkl_failure is None,
           "mkl_threaded": mkl_failure is None and bool(_C.mkl_threaded())}
    return [e for e in ENGINES if can[e] and named in ("", e)]


def _speeds(engines: List[str], repeats: int = 3) -> Dict[str, float]:
    """Best GFLOP/s of RACE_SHAPE's GEMM on each of ``engines`` (``"float32"``: OpenBLAS's
    sgemm), their calls taken in turn, round after round, so that a machine busy for a while
    slows them alike: run one after the other, a race during a compile once timed float32 at
    47 GFLOP/s against its 203 (bench/RESULTS.md)."""
    m, k, n = RACE_SHAPE
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    out = np.empty((m, n), np.float32)
    was = _C.bf16_gemm_enabled()
    best = {e: float("inf") for e in engines}
    try:
        for _ in range(repeats + 1):  # the first call grows the packing buffers
            for engine in engines:
                if engine != "float32":
                    _C.set_bf16_engine(engine)
                _C.set_bf16_gemm(engine != "float32")
                t0 = time.perf_counter()
                _C.gemm(a, b, out=out)
                best[engine] = min(best[engine], time.perf_counter() - t0)
    finally:
        _C.set_bf16_gemm(was)
    return {e: 2.0 * m * k * n / t / 1e9 for e, t in best.items()}


def _gflops(engine: str, repeats: int = 3) -> float:
    """Best GFLOP/s of RACE_SHAPE's GEMM on ``engine`` (``"float32"``: OpenBLAS's sgemm)."""
    return _speeds([engine], repeats)[engine]


def _shape_engines(engine: str, speeds: Dict[str, float]) -> List[str]:
    """The engines the GEMM races offer shape by shape besides ``engine`` (csrc/bf16.h): those
    faster than float32 on RACE_SHAPE's GEMM (one slower there, MKL's emulation on an AMD CPU,
    would only lengthen every race), never ``mkl``'s column blocks."""
    return [e for e in plans.BF16_SHAPE_ENGINES
            if e != engine and speeds.get(e, 0.0) > speeds.get("float32", float("inf"))]


def _choose_engine() -> Optional[str]:
    """Sets the engine: the one $CCT_BF16_ENGINE names, else the plans' one (chosen earlier
    in this process, or from a cache or a side file: the run repeats its engine), else the
    only one, else the fastest (in deterministic mode, the first of ENGINES, whose results do
    not depend on the thread count). With it, the engines the GEMM races also try shape by
    shape (_shape_engines; none where one engine runs, one is named, or in deterministic
    mode). None when set, else why none can run."""
    named = os.environ.get(ENGINE_ENV, "")
    if named and named not in ENGINES:
        raise CCTError(f"${ENGINE_ENV} must be one of {', '.join(ENGINES)} or unset, "
                       f"got '{named}'")
    kernel = bool(_C.bf16_kernel_supported())
    if named == "avx512bf16" and not kernel:
        return f"${ENGINE_ENV}=avx512bf16 but this CPU has no AVX512-BF16"
    mkl_failure = _load_mkl() if named != "avx512bf16" else "not asked for"
    runnable = _runnable(named, kernel, mkl_failure)
    if not runnable:
        if named == "mkl_threaded" and mkl_failure is None:
            return (f"${ENGINE_ENV}=mkl_threaded but MKL cannot run its own threads here: "
                    f"{mkl.threading()}")
        return mkl_failure
    engine = plans.bf16_engine()
    if engine not in runnable:
        speeds: Dict[str, float] = {}
        if len(runnable) > 1 and not plans.deterministic():
            speeds = _speeds(runnable + ["float32"])
        engine = max(runnable, key=lambda e: speeds.get(e, 0.0))  # untimed: ENGINES' order
        plans.record_bf16_engine(engine, _shape_engines(engine, speeds))
        _chosen["speeds"] = speeds
    _C.set_bf16_engine(engine)
    _C.set_bf16_shape_engines([e for e in plans.bf16_shape_engines() if e in runnable])
    return None


def engine_description() -> str:
    """The chosen engine in words, with the speeds that chose it."""
    engine = _C.bf16_engine()
    words = {"avx512bf16": "cct's AVX512-BF16 kernel",
             "mkl": f"MKL's cblas_gemm_bf16bf16f32 ({mkl.library_path()}) in column blocks on "
                    f"cct's threads",
             "mkl_threaded": f"MKL's cblas_gemm_bf16bf16f32 ({mkl.library_path()}), whole GEMMs on "
                             f"MKL's threads"}[engine]
    speeds = _chosen.get("speeds") or {}
    if speeds:
        m, k, n = RACE_SHAPE
        words += (f", measured the faster on a {m}x{k}x{n} GEMM: "
                  + ", ".join(f"{e} {g:.0f} GFLOP/s" for e, g in speeds.items()))
    others = _C.bf16_shape_engines()
    if others:
        words += f"; {' and '.join(others)} raced too, shape by shape (faster than float32)"
    return words


def why_not_bf16(emulate: bool = False) -> Optional[str]:
    """Why bf16 GEMMs cannot (or should not) run here, or None when they can: no engine, or
    (unless ``emulate``) no bf16 units in this CPU. Loads and picks the engine as a side
    effect."""
    if not (emulate or _emulate_requested()) and not _C.cpu_has_bf16_units():
        return ("this CPU has no bf16 units (AMX-BF16 or AVX512-BF16): bf16 would be emulated, "
                "slower than float32")
    return _choose_engine()


def set_precision(name: str, *, emulate: bool = False, source: str = "precision") -> str:
    """Sets the CPU backend's GEMM arithmetic to ``name`` ("float32" or "bf16") and returns the
    one in effect: "float32" after a warning saying why when bf16 cannot run here. ``source``
    names where the request came from in that message and in the error for an unknown name."""
    name = reduced.check(name, source)
    if name not in PRECISIONS:
        warning("precision.py:0", f"{source}: {name} is a GPU precision (tensor cores); the CPU "
                f"trains in float32 (its reduced precision is bf16).")
        name = "float32"
    if name == "float32":
        _C.set_bf16_gemm(False)
        return name
    reason = why_not_bf16(emulate)
    if reason is not None:
        warning("precision.py:0", f"{source}: bf16 asked for, training in float32: {reason}.")
        _C.set_bf16_gemm(False)
        return "float32"
    if not _C.bf16_gemm_enabled():
        how = "native" if _C.cpu_has_bf16_units() else "emulated (no bf16 units in this CPU)"
        info("precision.py:0", f"Precision bf16: bf16 GEMM operands, float32 accumulation, "
             f"weights and updates; engine {engine_description()}, {how}")
    _C.set_bf16_gemm(True)
    return name


def precision() -> str:
    """The CPU backend's GEMM arithmetic now: "float32" or "bf16"."""
    return "bf16" if _C.bf16_gemm_enabled() else "float32"
