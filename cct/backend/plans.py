"""Kernel plans, chosen once and kept, so that a run repeats to the bit.

The C++ kernels time their candidate plans the first time a shape comes and keep the fastest
(csrc/conv.cpp: batch partitions x lowered, pointwise, direct or Winograd layouts x
cache-sized chunks per convolution kernel; csrc/gemm.cpp: the operand order of the
weight-gradient GEMMs). The plans round differently, so a choice that changes from one
process to the next (a busy machine times them differently) changes the weights. Three things
keep the choice fixed:

* **the machine's plan cache**, one JSON file per machine fingerprint (CPU model, cores, BLAS
  build, cct version, the set of candidate plans) in ``$CCT_PLAN_CACHE`` (a folder; ``off``
  disables it), else ``$XDG_CACHE_HOME/cct``, else ``~/.cache/cct``. A solver loads it before
  it builds its nets (:func:`use_machine_cache`) and writes it back, merged, whenever new
  shapes were timed (:func:`persist`): a rerun on the same machine runs the first run's plans;
* **the snapshot side file** holds :func:`table` and a resume :func:`install`\\ s it, so a
  resumed run runs the plans of the run it continues, whatever the cache holds;
* **deterministic mode** (:func:`set_deterministic`, ``cct train --deterministic``): nothing
  is timed, every shape gets the plan of a fixed rule (one partition per thread; Winograd
  F(2x2) on 3x3 and 5x5 stride-1 float32 layers of 16 or more channels in and out, the direct
  layout on thin stride-1 float32 layers where the CPU has it, else lowered; the direct GEMM
  order) and the cache is neither read nor written, so the plans do not depend on the load,
  the cache or concurrent runs. It is slower where the rule's plan is not the fastest
  (bench/RESULTS.md).

A table is ``{"conv": [[kernel, geometry(16), itemsize, threads, modes, partitions, layout,
cache_chunks], ...], "gemm": [[trans_a, trans_b, m, n, k, itemsize, threads, accumulate,
transposed], ...], "bf16": engine}``: the C++ tables' keys and choices as they are (layout 0
lowered, 1 pointwise, 2 direct, 3 Winograd F(2x2, 3x3) or F(2x2, 5x5), 4 Winograd F(4x4,
3x3), 5-7 their phase forms, 8 the direct layout's AVX-512 tile, 9 its phase form, 10 oneDNN's
convolution where oneDNN is offered, cct/backend/onednn.py); a GEMM's accumulate: whether it
adds into C (raced apart from overwriting it), its choice true/false for its operand order, 2
or 3 for the same orders run in float32 under bf16, 4 for the skinny float32 engine, 5 for
MKL's sgemm where MKL is installed, cct/backend/mkl.py, 6 for the skinny engine's 16-lane tile
on AVX-512 CPUs, the same bits as 4, 10 for the thin float32 engine on AVX-512 CPUs; under bf16
also 8 and 9, the direct order on MKL's whole-GEMM threads and on cct's kernel, 11 and 12,
cct's kernel in the skinny and the thin forms, the same bits as 9, and 13, oneDNN's matmul
where oneDNN is offered, cct/backend/onednn.py), and the bf16
GEMM engine once one was chosen (cct/backend/precision.py times them: the engines round
differently too), with ``"bf16_shapes"``, the engines the races also try shape by
shape (those faster than float32 there). Where MKL is offered or bf16 is on, a table also holds
``"gemm_batch": [[trans_a, trans_b, m, n, k, count, itemsize, threads, accumulate, choice],
...]``: the strided batched GEMMs' (Winograd's products, the pointwise layout's), itemsize 2
for a batch that may multiply in bf16 (under bf16), else 4; 0 for the BLAS's float32 batched
call, 5 for MKL's, 7 for the items one by one in bf16 (itemsize 2 only), 8 and 9 for the same
on MKL's whole-GEMM threads and on cct's kernel, 13 for the whole batch in one call of oneDNN's
matmul.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from typing import Optional

from ..native import _C, __version__
from ..errors import CCTError
from ..glog import info, warning
from ..io.atomic import atomic_write
from . import mkl, onednn

FORMAT = 1
# The candidate plans the kernels measure; a cache written before a new one existed would
# never try it, so the number is part of the fingerprint. 2: the direct convolution layout;
# 3: Winograd; 4: the bf16 GEMM engines; 5: Winograd for 5x5 layers and F(4x4, 3x3); 6: the
# key's modes renumbered to hold Caffe's engine (an older table's modes would mean others);
# 7: the phase layouts for strided layers and the direct layout's AVX-512 tile (the modes'
# radix grew with the layouts); 8: MKL's bf16 GEMMs whole on its own threads (mkl_threaded);
# 9: the skinny float32 GEMM engine (GEMM choice 4); 10: that engine adds beta C after the
# products, not before (its bits changed: a cache of 9 would replay other numbers); 11: MKL's
# sgemm (GEMM choice 5, where MKL is offered: the fingerprint holds its version then), and the
# lowered convolution's forward and backward-data GEMMs raced like its weight gradient's; 12:
# the skinny engine's 16-lane tile on AVX-512 CPUs (GEMM choice 6); 13: MKL's batched sgemm
# raced for the strided batched GEMMs (the "gemm_batch" table); 14: under bf16, the batched
# GEMMs (Winograd F(2x2, 3x3)'s products, the pointwise layout's) race bf16 items against
# float32 (batched choice 7; the batched rows gain the element size); 15: under bf16, the
# engines faster than float32 besides the chosen one race shape by shape (GEMM and batched
# choices 8 and 9; the table's "bf16_shapes"); 16: oneDNN's convolution layout (layout 10,
# where oneDNN is offered: the fingerprint holds its version then; the modes' radix grew); 17:
# the skinny engine takes op(B) = B too (a fully connected layer's backward data: a cache of 16
# never raced it there); 18: the thin float32 GEMM engine (GEMM choice 10: a fully connected
# layer's weight gradient at a small batch); 19: under bf16, cct's kernel in the skinny form
# (GEMM choice 11: a fully connected layer's forward at a small batch); 20: under bf16, cct's
# kernel in the thin form (GEMM choice 12: a fully connected layer's weight gradient at a small
# batch, a lowered convolution's backward data with few filters); 21: under bf16 where oneDNN is
# offered, its matmul (GEMM and batched choice 13: Winograd's products, the pointwise layout's,
# the lowered GEMMs); 22: the thin engine on CPUs without AVX-512F too (its 8-lane tile: a cache
# of 21 never raced it there).
KERNEL_PLANS = 22
BF16_ENGINES = ("avx512bf16", "mkl", "mkl_threaded")
MKL_CHOICE = 5  # a GEMM row's choice of MKL's sgemm
BF16_ITEMS_CHOICE = 7  # a batched GEMM row's choice of its items one by one in bf16
# Under bf16, a row's choice of one engine for its shape (the direct order; a batch's items one
# by one), whatever engine the process chose: csrc/gemm.cpp.
BF16_ENGINE_CHOICES = {8: "mkl_threaded", 9: "avx512bf16"}
BF16_SHAPE_ENGINES = tuple(BF16_ENGINE_CHOICES.values())
SKINNY_CHOICES = (4, 6)  # the skinny engine's: vectors of 8 lanes, of 16 (the same bits)
THIN_CHOICE = 10  # the thin engine's (csrc/gemm_thin.h)
BF16_SKINNY_CHOICE = 11  # under bf16, cct's kernel in the skinny form (csrc/bf16.h)
BF16_THIN_CHOICE = 12  # under bf16, cct's kernel in the thin form (csrc/bf16.h)
# Under bf16, cct's kernel in one form (the bits of choice 9), whatever engine was chosen.
BF16_FORM_CHOICES = (BF16_SKINNY_CHOICE, BF16_THIN_CHOICE)
# Under bf16, oneDNN's matmul (csrc/onednn.h), a GEMM's or a whole batch's, where oneDNN is
# offered (cct/backend/onednn.py); its own bits.
ONEDNN_CHOICE = 13
# conv.cpp's layouts by number (a convolution row's layout), as the kernels name them.
CONV_LAYOUT_NAMES = tuple(_C.conv_layout_names())
_CONV_FIELDS = 8
_GEMM_FIELDS = 9
_GEMM_FIELDS_BEFORE_ACCUMULATE = 8  # tables written before adding and overwriting were apart
_GEMM_BATCH_FIELDS = 10
_GEMM_BATCH_FIELDS_BEFORE_SIZE = 9  # tables written before batches raced bf16 (all float32)
# Leading fields of a row that are its key (the rest is the choice): kernel, geometry,
# itemsize, threads, modes; trans_a, trans_b, m, n, k, itemsize, threads, accumulate; trans_a,
# trans_b, m, n, k, count, itemsize, threads, accumulate.
_KEY_FIELDS = {"conv": 5, "gemm": 8, "gemm_batch": 9}
_TABLES = (("conv", _CONV_FIELDS), ("gemm", _GEMM_FIELDS), ("gemm_batch", _GEMM_BATCH_FIELDS))

_state = {"loaded": False, "path": None, "saved_count": None, "bf16": None, "bf16_saved": None,
          "bf16_shapes": []}


# Plan tables kept by a device's own libraries (the GPU's cuDNN engines, cct/backend/cudnn.py):
# name -> (rows(), install(rows)), written and installed with the CPU's.
_device_tables: dict = {}


def register_device_table(name: str, rows, install_rows) -> None:
    """Keep ``name``'s plans with this module's table: ``rows()`` gives them as JSON rows,
    ``install_rows(rows)`` takes them back (raising ValueError, saying why, for bad rows)."""
    _device_tables[name] = (rows, install_rows)


def table() -> dict:
    """The plans of this process: every convolution plan and GEMM order chosen so far, and
    each device library's (cuDNN's engines, by geometry)."""
    conv = [[k, list(geom), size, threads, modes, parts, layout, bool(chunks)]
            for k, geom, size, threads, modes, parts, layout, chunks in _C.conv_plan_table()]
    # choice: true/false (the operand order transposed or not); under bf16 also 2 and 3, the
    # same orders in float32; 4 the skinny float32 engine (csrc/gemm_skinny.h; op(B) either
    # way), 5 MKL's sgemm, 6 the skinny engine's 16-lane tile, 10 the thin float32 engine
    # (csrc/gemm_thin.h)
    gemm = [[bool(ta), bool(tb), m, n, k, size, threads, bool(acc), bool(ch) if ch < 2 else ch]
            for ta, tb, m, n, k, size, threads, acc, ch in _C.gemm_choices()]
    tab = {"conv": conv, "gemm": gemm}
    batched = [[bool(ta), bool(tb), m, n, k, count, size, threads, bool(acc), choice]
               for ta, tb, m, n, k, count, size, threads, acc, choice
               in _C.gemm_batch_choices()]
    if batched:   # raced only where MKL is offered or bf16 is on
        tab["gemm_batch"] = batched
    if _state["bf16"] is not None:
        tab["bf16"] = _state["bf16"]
        if _state["bf16_shapes"]:
            tab["bf16_shapes"] = list(_state["bf16_shapes"])
    for name, (rows, _) in _device_tables.items():
        got = rows()
        if got:
            tab[name] = got
    return tab


def bf16_engine() -> Optional[str]:
    """The bf16 GEMM engine this process's plans hold (a cache, a side file, or timed), or
    None before one was chosen."""
    return _state["bf16"]


def bf16_shape_engines() -> list:
    """The engines this process's plans race shape by shape besides the bf16 engine."""
    return list(_state["bf16_shapes"])


def record_bf16_engine(name: str, shape_engines=()) -> None:
    """Keeps ``name`` as the bf16 engine plan, with the engines raced shape by shape besides it
    (written with the machine's cache)."""
    _state["bf16"] = name
    _state["bf16_shapes"] = list(shape_engines)


def _bf16_shapes(tab) -> list:
    shapes = tab.get("bf16_shapes", [])
    if not (isinstance(shapes, list) and all(e in BF16_SHAPE_ENGINES for e in shapes)):
        raise ValueError(f"'bf16_shapes' is not a list of engines from "
                         f"{', '.join(BF16_SHAPE_ENGINES)}: {shapes!r:.80}")
    if shapes and tab.get("bf16") is None:
        raise ValueError("'bf16_shapes' without the 'bf16' engine it races beside")
    return shapes


def _rows(tab, key: str, width: int) -> list:
    rows = tab.get(key, [])
    if not isinstance(rows, list):
        raise ValueError(f"'{key}' is not a list")
    if key == "gemm":
        rows = _gemm_rows_now(rows)
    if key == "gemm_batch":
        rows = _gemm_batch_rows_now(rows)
    for row in rows:
        if not isinstance(row, list) or len(row) != width:
            raise ValueError(f"a '{key}' entry is not a list of {width} values: {row!r:.80}")
    return rows


def _gemm_rows_now(rows: list) -> list:
    """GEMM rows in today's form: a row of a table written before adding into C and
    overwriting it were timed apart held one choice for both, and a run resumed from it
    keeps that choice for both."""
    now = []
    for row in rows:
        if isinstance(row, list) and len(row) == _GEMM_FIELDS_BEFORE_ACCUMULATE:
            now += [row[:7] + [False, row[7]], row[:7] + [True, row[7]]]
        else:
            now.append(row)
    return now


def _gemm_batch_rows_now(rows: list) -> list:
    """Batched rows in today's form: a row of a table written before the batches raced bf16
    items (KERNEL_PLANS 13) was a float32 call's, element size 4, and a run resumed from it
    keeps its choice."""
    return [row[:6] + [4] + row[6:]
            if isinstance(row, list) and len(row) == _GEMM_BATCH_FIELDS_BEFORE_SIZE else row
            for row in rows]


def conv_modes(modes: int) -> dict:
    """A convolution row's modes (conv.cpp's plan_modes, one mixed-radix number) spelled out:
    the forced layout mode (0: measured among all), the partition mode, whether measured (not
    the rule's), whether under bf16 GEMMs, whether Caffe's engine."""
    radix = len(CONV_LAYOUT_NAMES) + 1
    rest = modes // radix
    return {"layout_mode": modes % radix, "partition_mode": rest % 3,
            "measured": (rest // 3) % 2 == 0, "bf16": (rest // 6) % 2 == 1,
            "caffe_engine": (rest // 12) % 2 == 1}


def _conv_row(row) -> tuple:
    kernel, geom, size, threads, modes, parts, layout, chunks = row
    if not (isinstance(geom, list) and len(geom) == 16):
        raise ValueError(f"a convolution plan's geometry is not 16 numbers: {geom!r:.80}")
    ints = [kernel, size, threads, modes, parts, layout] + geom
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
        raise ValueError(f"a convolution plan holds a value that is not an integer: {row!r:.80}")
    if not isinstance(chunks, bool):
        raise ValueError(f"a convolution plan's cache_chunks is not true/false: {row!r:.80}")
    return kernel, geom, size, threads, modes, parts, layout, chunks


def _gemm_row(row) -> tuple:
    ta, tb, m, n, k, size, threads, accumulate, choice = row
    if not all(isinstance(v, bool) for v in (ta, tb, accumulate)):
        raise ValueError(f"a GEMM order's flags are not true/false: {row!r:.80}")
    if not (isinstance(choice, bool) or choice in (2, 3, MKL_CHOICE, *SKINNY_CHOICES,
                                                   *BF16_ENGINE_CHOICES, THIN_CHOICE,
                                                   *BF16_FORM_CHOICES, ONEDNN_CHOICE)
            and isinstance(choice, int)):
        raise ValueError(f"a GEMM order's choice is not true/false, 2, 3, 4, 5, 6, 8, 9, 10, 11, "
                         f"12 or 13: {row!r:.80}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (m, n, k, size, threads)):
        raise ValueError(f"a GEMM order holds a size that is not an integer: {row!r:.80}")
    if (choice in BF16_ENGINE_CHOICES or choice in BF16_FORM_CHOICES
            or choice == ONEDNN_CHOICE) and size != 2:
        raise ValueError(f"a GEMM order's choice {choice} (bf16 on one engine) needs itemsize 2: "
                         f"{row!r:.80}")
    return ta, tb, m, n, k, size, threads, accumulate, int(choice)


def _gemm_batch_row(row) -> tuple:
    ta, tb, m, n, k, count, size, threads, accumulate, choice = row
    if not all(isinstance(v, bool) for v in (ta, tb, accumulate)):
        raise ValueError(f"a batched GEMM's flags are not true/false: {row!r:.80}")
    if not all(isinstance(v, int) and not isinstance(v, bool)
               for v in (m, n, k, count, size, threads)):
        raise ValueError(f"a batched GEMM holds a size that is not an integer: {row!r:.80}")
    if size not in (2, 4):
        raise ValueError(f"a batched GEMM's itemsize is not 2 (bf16) or 4: {row!r:.80}")
    if isinstance(choice, bool) or choice not in (0, MKL_CHOICE) + (
            (BF16_ITEMS_CHOICE, *BF16_ENGINE_CHOICES, ONEDNN_CHOICE) if size == 2 else ()):
        raise ValueError(f"a batched GEMM's choice is not 0, {MKL_CHOICE} or (itemsize 2) "
                         f"{BF16_ITEMS_CHOICE}, 8, 9 or {ONEDNN_CHOICE}: {row!r:.80}")
    return ta, tb, m, n, k, count, size, threads, accumulate, choice


# What a plan runs instead where its library or instruction set is missing (csrc/gemm.cpp),
# for the warning that says so.
_FALLBACKS = {MKL_CHOICE: ("GEMM plan(s) run MKL's sgemm", "OpenBLAS's direct order"),
              THIN_CHOICE: ("GEMM plan(s) run the thin engine", "OpenBLAS's direct order"),
              BF16_SKINNY_CHOICE: ("bf16 GEMM plan(s) run cct's kernel in the skinny form",
                                   "on the chosen bf16 engine"),
              BF16_THIN_CHOICE: ("bf16 GEMM plan(s) run cct's kernel in the thin form",
                                 "on the chosen bf16 engine"),
              ONEDNN_CHOICE: ("bf16 GEMM plan(s) run oneDNN's matmul",
                              "on the chosen bf16 engine"),
              **{choice: (f"bf16 GEMM plan(s) run on {engine}", "on the chosen bf16 engine")
                 for choice, engine in BF16_ENGINE_CHOICES.items()}}


def _why_not_here(choice) -> Optional[str]:
    """Why a plan of ``choice`` cannot run here, or None. MKL's plans load it wherever it
    loads."""
    if choice == THIN_CHOICE:
        return None if _C.gemm_thin_available() else "this CPU has no AVX2 and FMA"
    if choice == ONEDNN_CHOICE:  # offered (by use_machine_cache) to bf16's races, or not
        return None if _C.onednn_offered(True) else (onednn.why_not_offered()
                                                     or "oneDNN is offered to float32 only")
    engine = BF16_ENGINE_CHOICES.get(choice)
    if engine == "avx512bf16" or choice in BF16_FORM_CHOICES:
        return None if _C.bf16_kernel_supported() else "this CPU has no AVX512-BF16"
    why = mkl.load()
    if why is None and engine == "mkl_threaded" and not _C.mkl_threaded():
        why = f"MKL cannot run its own threads here: {mkl.threading()}"
    return why


def _warn_plans_that_cannot_run(rows) -> None:
    """Says how many plans name an engine that cannot run here, and what they run instead,
    whose numbers differ in the last bits."""
    for choice, (what, instead) in _FALLBACKS.items():
        count = sum(row[-1] == choice for row in rows)
        why = _why_not_here(choice) if count else None
        if why is not None:
            warning("plans.py:0", f"{count} {what}, which cannot run here ({why}): they run "
                    f"{instead}, whose numbers differ in the last bits")


def _warn_onednn_plans(rows) -> None:
    """Says how many convolution plans name oneDNN's layout where its races do not offer it:
    they run lowered."""
    count = sum(row[6] == onednn.LAYOUT for row in rows)
    why = onednn.why_not_offered() if count else None
    if why is not None:
        warning("plans.py:0", f"{count} convolution plan(s) run oneDNN, which is not offered "
                f"here ({why}): they run the lowered GEMM, whose numbers differ in the last "
                f"bits")


def install(tab) -> int:
    """Install a table's plans (replacing those of the same shapes); returns how many. Raises
    ValueError, saying what is wrong, for anything that is not such a table; then nothing
    is installed."""
    if not isinstance(tab, dict):
        raise ValueError("the plan table is not a JSON object")
    conv = [_conv_row(r) for r in _rows(tab, "conv", _CONV_FIELDS)]
    gemm = [_gemm_row(r) for r in _rows(tab, "gemm", _GEMM_FIELDS)]
    batched = [_gemm_batch_row(r) for r in _rows(tab, "gemm_batch", _GEMM_BATCH_FIELDS)]
    bf16 = tab.get("bf16")
    if bf16 is not None and bf16 not in BF16_ENGINES:
        raise ValueError(f"the bf16 engine {bf16!r:.40} is none of {', '.join(BF16_ENGINES)}")
    shapes = _bf16_shapes(tab)
    try:
        _C.load_conv_plans(conv)
        _C.load_gemm_choices(gemm)
        _C.load_gemm_batch_choices(batched)
        if bf16 is not None and _C.bf16_gemm_enabled():
            _C.set_bf16_engine(bf16)
            _C.set_bf16_shape_engines(shapes)  # each raced only where it runs (csrc/bf16.h)
    except (TypeError, ValueError, OverflowError, RuntimeError) as e:
        raise ValueError(f"a plan does not fit the kernels' tables: {e}") from None
    if bf16 is not None:
        _state["bf16"] = bf16
        _state["bf16_shapes"] = list(shapes)
    _warn_plans_that_cannot_run(gemm + batched)
    _warn_onednn_plans(conv)
    count = len(conv) + len(gemm) + len(batched) + (bf16 is not None)
    for name, (_, install_rows) in _device_tables.items():
        rows = tab.get(name)
        if rows is not None:   # a table from a run without this device's library has none
            if not isinstance(rows, list):
                raise ValueError(f"the {name} plans are not a list")
            count += install_rows(rows)
    return count


def fingerprint() -> dict:
    """What a cached plan depends on: the CPU, its cores, the BLAS build, cct's kernels and
    the plans they choose among."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    facts = {"cpu": model, "cores": _C.available_cores(), "blas": _C.blas_config(),
             "cct": __version__, "kernel_plans": KERNEL_PLANS, "mkl": mkl.sgemm_fingerprint()}
    # Only where it is offered: the caches of machines without oneDNN keep their names.
    if onednn.fingerprint() is not None:
        facts["onednn"] = onednn.fingerprint()
    return facts


def user_cache_folder() -> str:
    """cct's folder in the user's cache: ``$XDG_CACHE_HOME/cct``, else ``~/.cache/cct``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cct")


def cache_path() -> Optional[str]:
    """The machine's plan cache file, or None when ``CCT_PLAN_CACHE=off``."""
    folder = os.environ.get("CCT_PLAN_CACHE")
    if folder is not None and folder.strip().lower() in ("off", "0", "none", ""):
        return None
    if not folder:
        folder = user_cache_folder()
    digest = hashlib.sha1(json.dumps(fingerprint(), sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(folder, f"plans-{digest}.json")


def _read_cache(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        warning("plans.py:0", f"ignoring the kernel plan cache '{path}': {e}")
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        warning("plans.py:0", f"ignoring the kernel plan cache '{path}': not a format-{FORMAT} "
                f"plan table")
        return None
    return data


def set_deterministic(on: bool = True) -> None:
    """Fixed plans by rule, no timing and no machine cache (see the module's docstring)."""
    _C.set_plan_measurement(not on)


def deterministic() -> bool:
    return not _C.plan_measurement()


def offer_libraries() -> None:
    """The installed libraries' kernels join the races: MKL's sgemm the GEMMs'
    (cct/backend/mkl.py), oneDNN's convolutions the convolutions' (cct/backend/onednn.py).
    Once per process, as each says."""
    mkl.offer_sgemm()
    onednn.offer()


def use_machine_cache() -> None:
    """Load the machine's plan cache into the kernels' tables, once per process (nothing in
    deterministic mode or with the cache off). A damaged cache is ignored with a warning."""
    if _state["loaded"] or deterministic():
        return
    _state["loaded"] = True
    offer_libraries()  # before the fingerprint, which holds the candidates
    path = cache_path()
    _state["path"] = path
    if path is None:
        return
    data = _read_cache(path)
    if data is not None:
        try:
            n = install(data)
        except ValueError as e:
            warning("plans.py:0", f"ignoring the kernel plan cache '{path}': {e}")
        else:
            info("plans.py:0", f"Kernel plans: {n} loaded from {path}")
    _state["saved_count"] = _C.plan_count()
    _state["bf16_saved"] = _state["bf16"]


def persist() -> None:
    """Write the machine's plan cache when this process has timed new shapes since it was read
    or written: the file's plans and this process's, the file's winning where both timed a
    shape (another run wrote it first; its runs and the next ones then agree). A cache that
    cannot be written costs a warning, never the run."""
    path = _state["path"]
    if path is None or deterministic() or (_C.plan_count() == _state["saved_count"]
                                           and _state["bf16"] == _state["bf16_saved"]):
        return
    _state["saved_count"] = _C.plan_count()
    _state["bf16_saved"] = _state["bf16"]
    ours = table()
    theirs = _read_cache(path) or {}
    merged = {"format": FORMAT, "fingerprint": fingerprint()}
    source = theirs if theirs.get("bf16") in BF16_ENGINES else ours
    if source.get("bf16") is not None:
        merged["bf16"] = source["bf16"]
        try:
            shapes = _bf16_shapes(source)
        except ValueError:
            shapes = []
        if shapes:
            merged["bf16_shapes"] = shapes
    for key, width in _TABLES:
        rows = {}
        for source in (ours, theirs):
            try:
                source_rows = _rows(source, key, width)
            except ValueError:
                continue
            for row in source_rows:
                rows[json.dumps(row[:_KEY_FIELDS[key]])] = row
        if rows or key != "gemm_batch":
            merged[key] = list(rows.values())
    text = json.dumps(merged)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, lambda tmp: _write_text(tmp, text))
    except (OSError, CCTError) as e:
        warning("plans.py:0", f"cannot write the kernel plan cache '{path}': {e}")


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
