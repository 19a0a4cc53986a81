"""oneDNN's convolutions and matmul, loaded at run time: a layout of the convolution races
(csrc/onednn.h, conv.cpp's layout 10, "onednn") and, under bf16, an engine of the GEMM races
(csrc/gemm.cpp's choice 13: the lowered GEMMs, and Winograd's and the pointwise layout's
batched products in one call each).

cct links no oneDNN. Where Intel's wheel is installed (the ``onednn`` extra: onednn-cpu-gomp,
oneDNN 3 on GNU OpenMP) or ``$CCT_ONEDNN_LIBRARY`` names a libdnnl.so.3 of that build, the
first run that reads the machine's plan cache (:func:`cct.backend.plans.use_machine_cache`)
loads it and offers its convolutions to the races beside cct's own layouts, each kernel on
each geometry timed once and kept only where it wins. On an Intel Xeon with AMX its bf16
convolutions run on AMX's tiles over the whole batch (PyTorch's bf16 engine there); on AMD's
Zen 4 they tie cct's bf16 layouts and its float32 ones run 1.4-1.7x slower than cct's; its
bf16 matmul ran CaffeNet b32's Winograd products 1.25x faster than cct's kernel there in sum,
and tied or lost on the large GEMMs; its training steps tie (bench/RESULTS.md). Hence
``$CCT_ONEDNN``:

* ``bf16`` (the default): offered to the races of ``--precision=bf16`` only;
* ``all``: its convolutions to float32's races too (its matmul races under bf16 only);
* ``off``: never.

oneDNN rounds differently from cct's layouts, so whether it is offered, and its version, are
part of the plan cache's fingerprint; deterministic mode races nothing and never runs it.
"""
from __future__ import annotations

import importlib.metadata
import os
from typing import Dict, Optional, Tuple

from ..native import _C
from ..errors import CCTError
from ..glog import warning
from ..install import install_hint
from .mkl import gnu_openmp_failure

LIBRARY_ENV = "CCT_ONEDNN_LIBRARY"
OFFER_ENV = "CCT_ONEDNN"
DISTRIBUTION = "onednn-cpu-gomp"
LAYOUT = _C.conv_layout_names().index("onednn")  # conv.cpp's kOnednn: a plan row's layout
_OFFERS = {"bf16": (False, True), "all": (True, True), "off": (False, False)}
_state: Dict[str, object] = {}  # "offered": (float32, bf16) once offer() ran; "why": if not


def library_path() -> Optional[str]:
    """oneDNN's library: ``$CCT_ONEDNN_LIBRARY``, else the one in the installed wheel, else
    None."""
    if os.environ.get(LIBRARY_ENV):
        return os.environ[LIBRARY_ENV]
    try:
        files = importlib.metadata.files(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "libdnnl.so.3":
            return str(f.locate().resolve())
    return None


def load() -> Optional[str]:
    """Loads oneDNN; None when loaded, else why not."""
    if _C.onednn_loaded():
        return None
    path = library_path()
    if path is None:
        return (f"no oneDNN: {install_hint('onednn')} (Intel's onednn-cpu-gomp), or set "
                f"${LIBRARY_ENV} to its libdnnl.so.3")
    # oneDNN's threads are GNU OpenMP's: started spinning by default, they would keep the
    # cores from cct's after each call. Unlike MKL it has no single-thread mode to fall back on.
    failure = gnu_openmp_failure("oneDNN")
    if failure is None:
        failure = _C.load_onednn(path) or None
        if failure is not None:
            failure = f"oneDNN '{path}' did not load: {failure}"
    return failure


def wanted() -> Tuple[bool, bool]:
    """Which precisions' races ``$CCT_ONEDNN`` offers oneDNN to: (float32, bf16)."""
    value = os.environ.get(OFFER_ENV, "").strip().lower() or "bf16"
    if value not in _OFFERS:
        raise CCTError(f"${OFFER_ENV} must be 'bf16', 'all' or 'off', got '{value}'")
    return _OFFERS[value]


def offer() -> None:
    """oneDNN's layout joins the convolution races ``$CCT_ONEDNN`` names where oneDNN is
    installed and loads; a no-op where it is not installed. Once per process: a later call
    changes nothing, so that the candidates, and the cache they are kept in, stay put."""
    if "offered" in _state:
        return
    float32, bf16 = wanted()
    offered = (False, False)
    if not (float32 or bf16):
        _state["why"] = f"${OFFER_ENV}=off"
    elif library_path() is None:
        _state["why"] = "oneDNN is not installed"
    else:
        failure = load()
        if failure is not None:
            _state["why"] = failure
            warning("onednn.py:0", f"{failure}: the convolutions race cct's layouts only")
        else:
            offered = (float32, bf16)
    _state["offered"] = offered
    _C.set_onednn_offered(*offered)


def why_not_offered() -> Optional[str]:
    """Why oneDNN's layout is in no race here, or None where it is in some."""
    if any(_state.get("offered", (False, False))):
        return None
    return _state.get("why", "oneDNN was not offered")  # type: ignore[return-value]


def fingerprint() -> Optional[str]:
    """oneDNN's version and the precisions it is offered to, where it is offered (plans made
    with it hold its choices), else None."""
    float32, bf16 = _state.get("offered", (False, False))  # type: ignore[misc]
    if not (float32 or bf16):
        return None
    return f"{_C.onednn_version()}; " + ("float32 and bf16" if float32 else "bf16")
