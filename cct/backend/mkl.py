"""Intel MKL, loaded at run time: the bf16 GEMM engines' library (cct/backend/precision.py)
and a candidate in the float32 GEMM races (csrc/gemm.cpp, GEMM choice 5).

cct links OpenBLAS and does not need MKL. Where MKL's wheel is installed (the ``mkl`` or
``bf16`` extra) or ``$CCT_BF16_LIBRARY`` names a libmkl_rt, the first run that reads the
machine's plan cache (:func:`cct.backend.plans.use_machine_cache`) loads it and offers its
``cblas_sgemm`` to the races that pick each raced GEMM's operand order (the fully connected
layers' GEMMs, the convolutions' weight gradients): on Intel's CPUs its AVX-512 kernels are the
small-GEMM engine OpenBLAS lacks there; on AMD's the races seldom pick it. ``$CCT_MKL_SGEMM=off``
keeps it out. MKL rounds differently from OpenBLAS, so whether it was offered, and its
version, are part of the plan cache's fingerprint; deterministic mode races nothing and never
runs it.
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import os
from pathlib import Path
from typing import Dict, Optional

from ..native import _C
from ..errors import CCTError
from ..glog import warning
from ..install import install_hint

LIBRARY_ENV = "CCT_BF16_LIBRARY"  # named for its first use; it names MKL for both
SGEMM_ENV = "CCT_MKL_SGEMM"
_state: Dict[str, object] = {}  # "threading": why MKL runs without its own threads, if it does


def library_path() -> Optional[str]:
    """MKL's runtime library: ``$CCT_BF16_LIBRARY``, else the one in the installed ``mkl``
    wheel, else None."""
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


def beside(path: str, library: str) -> bool:
    """Whether MKL's ``library`` (e.g. "libmkl_sequential") sits beside the libmkl_rt at
    ``path``, where MKL looks for the layers it loads at its first call."""
    return any(Path(path).resolve().parent.glob(f"{library}.so*"))


def threading_failure(path: str) -> Optional[str]:
    """Why MKL cannot run its own threads here, or None: it needs its GNU threading layer
    beside the library and libgomp, which MKL would otherwise end the process for lacking at
    its first call."""
    if not beside(path, "libmkl_gnu_thread"):
        return f"no libmkl_gnu_thread beside {path}"
    return gnu_openmp_failure("MKL")


def gnu_openmp_failure(library: str) -> Optional[str]:
    """Why ``library``'s GNU OpenMP threads would keep the cores from cct's, or None (then
    libgomp is loaded, told to spin briefly): MKL's threads here, and oneDNN's
    (cct/backend/onednn.py)."""
    # GNU OpenMP's threads spin 300,000 times after a call before they sleep (its default),
    # taking the cores from cct's threads in the kernel that comes next; it reads the setting
    # once, when it loads. A value the user set stands. A libgomp another library loaded
    # first (PyTorch ships one) has read it already, and MKL's threads would be its threads:
    # with PyTorch imported first, LeNet's iteration ran 1.5-1.9x slower with MKL's sgemm in
    # the races than without (bench/RESULTS.md), so MKL then runs on the caller's thread.
    spin_set = any(v in os.environ for v in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"))
    loaded = _loaded_libgomp()
    if loaded is not None and not spin_set:
        return (f"GNU OpenMP was loaded before {library} ({loaded}) with its default "
                f"spin-wait, whose threads would keep the cores from cct's after each "
                f"{library} call; set GOMP_SPINCOUNT=10000 in the environment before Python "
                f"starts to give {library} its threads")
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    try:
        ctypes.CDLL("libgomp.so.1")
    except OSError as e:
        return f"GNU OpenMP (libgomp.so.1) does not load: {e}"
    return None


def _loaded_libgomp() -> Optional[str]:
    """The libgomp this process has loaded already (its path where /proc says it), or None."""
    try:
        ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return None
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "/libgomp" in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return "libgomp.so.1"


def threading() -> Optional[str]:
    """Why the loaded MKL runs without its own threads, or None."""
    return _state.get("threading")  # type: ignore[return-value]


def load() -> Optional[str]:
    """Loads MKL, with its threading layer where it can run; None when loaded, else why not."""
    if _C.mkl_loaded():
        return None
    path = library_path()
    if path is None:
        return (f"no MKL: {install_hint('bf16')} (Intel MKL), or set ${LIBRARY_ENV} to a "
                f"libmkl_rt")
    failure = threading_failure(path)
    if failure is not None:
        # On the caller's thread MKL runs its sequential layer, a library of its own, whose
        # absence MKL would end the process for at its first call (scripts/cpu_bundle.sh
        # leaves it out).
        if not beside(path, "libmkl_sequential"):
            return (f"MKL '{path}' cannot run here: not on its own threads ({failure}), nor "
                    f"on the caller's thread (no libmkl_sequential beside it)")
        _state["threading"] = failure
    failure = _C.load_mkl(path, threaded=failure is None)
    return f"MKL '{path}' did not load: {failure}" if failure else None


def _sgemm_wanted() -> bool:
    value = os.environ.get(SGEMM_ENV, "").strip().lower()
    if value not in ("", "on", "off"):
        raise CCTError(f"${SGEMM_ENV} must be 'on', 'off' or unset, got '{value}'")
    return value != "off"


def offer_sgemm() -> None:
    """MKL's sgemm joins the float32 GEMM races where MKL is installed and loads (unless
    ``$CCT_MKL_SGEMM=off``); a no-op where it is not installed. Once per process: a later
    call changes nothing, so that the candidates, and the cache they are kept in, stay put."""
    if "offered" in _state:
        return
    offered = False
    if _sgemm_wanted() and library_path() is not None:
        failure = load()
        if failure is not None:
            warning("mkl.py:0", f"{failure}: the float32 GEMMs race OpenBLAS's orders only")
        elif threading() is not None and _C.blas_num_threads() > 1:
            # gemm.cpp races a one-thread MKL only where cct runs one thread.
            warning("mkl.py:0", f"MKL runs without its own threads: {threading()}; the "
                                f"float32 GEMMs on {_C.blas_num_threads()} threads race "
                                f"without it")
        offered = failure is None
    _state["offered"] = offered
    _C.set_mkl_sgemm_offered(offered)


def sgemm_fingerprint() -> Optional[str]:
    """MKL's version where its sgemm is offered to the races (plans made with it hold its
    choices), else None."""
    return _C.mkl_version() if _C.mkl_sgemm_offered() else None
