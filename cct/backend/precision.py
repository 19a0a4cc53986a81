"""The arithmetic of the CPU backend's GEMMs: float32 (Caffe's) or bf16 mixed precision.

With ``bf16`` every float32 GEMM of the CPU backend (the lowered convolutions, InnerProduct)
rounds its two operands to bf16 and accumulates in float32 (csrc/bf16.h); everything else
stays float32: blobs, weights, their history and the update, and the files written. It pays
only where the CPU multiplies bf16 natively (AMX-BF16, AVX512-BF16); elsewhere the engine
emulates it more slowly than cct's float32, so cct says so and stays in float32, unless
``$CCT_BF16=emulate`` (or ``emulate=True``) asks for the bf16 numerics anyway (tests, accuracy
checks on any machine).

The engine is Intel MKL's ``cblas_gemm_bf16bf16f32``, from the ``mkl`` wheel (``pip install
"cct[bf16]"``) or the library ``$CCT_BF16_LIBRARY`` names. The GPU backends run float32.
"""
from __future__ import annotations

import importlib.metadata
import os
from typing import Optional

from .. import _C
from ..errors import CCTError
from ..glog import info, warning

PRECISIONS = ("float32", "bf16")
LIBRARY_ENV = "CCT_BF16_LIBRARY"
EMULATE_ENV = "CCT_BF16"


def engine_path() -> Optional[str]:
    """The bf16 GEMM engine's library: ``$CCT_BF16_LIBRARY``, else MKL's runtime library from
    the installed ``mkl`` wheel, else None."""
    if os.environ.get(LIBRARY_ENV):
        return os.environ[LIBRARY_ENV]
    try:
        files = importlib.metadata.files("mkl") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name.startswith("libmkl_rt.so"):
            return str(f.locate().resolve())
    return None


def _emulate_requested() -> bool:
    value = os.environ.get(EMULATE_ENV, "")
    if value not in ("", "emulate"):
        raise CCTError(f"${EMULATE_ENV} must be 'emulate' or unset, got '{value}'")
    return value == "emulate"


def why_not_bf16(emulate: bool = False) -> Optional[str]:
    """Why bf16 GEMMs cannot (or should not) run here, or None when they can: no engine, or
    (unless ``emulate``) no bf16 units in this CPU. Loads the engine as a side effect."""
    if not (emulate or _emulate_requested()) and not _C.cpu_has_bf16_units():
        return ("this CPU has no bf16 units (AMX-BF16 or AVX512-BF16): bf16 would be emulated, "
                "slower than float32")
    if _C.bf16_engine_loaded():
        return None
    path = engine_path()
    if path is None:
        return (f"no bf16 GEMM engine: pip install 'cct[bf16]' (Intel MKL), or set "
                f"${LIBRARY_ENV} to a libmkl_rt")
    failure = _C.load_bf16_engine(path)
    return f"the bf16 GEMM engine '{path}' did not load: {failure}" if failure else None


def set_precision(name: str, *, emulate: bool = False, source: str = "precision") -> str:
    """Sets the CPU backend's GEMM arithmetic to ``name`` ("float32" or "bf16") and returns the
    one in effect: "float32" after a warning saying why when bf16 cannot run here. ``source``
    names where the request came from in that message and in the error for an unknown name."""
    name = str(name).lower()
    if name not in PRECISIONS:
        raise CCTError(f"{source}: unknown precision '{name}'; known: {', '.join(PRECISIONS)}")
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
             f"weights and updates; engine {engine_path()}, {how}")
    _C.set_bf16_gemm(True)
    return name


def precision() -> str:
    """The CPU backend's GEMM arithmetic now: "float32" or "bf16"."""
    return "bf16" if _C.bf16_gemm_enabled() else "float32"
