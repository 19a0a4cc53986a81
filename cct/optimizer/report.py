"""The optimizer's report: what each candidate's probe showed and what it predicts, as table rows
for the log (:func:`table`, what ``Plan.table`` returns) and as a picture of the probes'
loss curves (:func:`plot`, ``-plot=PATH`` of ``cct plan`` and ``cct train -optimize``).

The table's evidence columns, after the measured HE and the probe's length and smoothed loss:

* ``slope c±se``: the probe's fitted exponent c of L ~ t^-c (-d log L / d log t, positive when
  the loss falls) and its standard error (:mod:`.curve`); ``falling`` when c - 2 se > 0,
  ``flat?`` when not (such a probe is no evidence either way), ``diverged`` for a probe that
  did.
* ``pred iters [range]``: the predicted iterations to the reference loss after the probe's
  end, and the iterations at exponents c + 2 se and c - 2 se (inf: never, or a flat curve not
  ruled out). The range is the spread of a ranking device over the probe's noise, not a
  promise of a time (see :mod:`.curve`).
"""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, List, Optional

import numpy as np

from ..errors import CCTError
from ..io.figure import agg_figure
from .curve import SE_MULTIPLE, smooth

if TYPE_CHECKING:
    from .plan import Candidate, Plan

FLAG = "-plot"


def num_text(x, fmt: str) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, fmt)


def _short(x: float) -> str:
    """An iteration count in at most 5 characters: 510, 1.9e3, inf."""
    if not math.isfinite(x):
        return "inf"
    if x < 999.5:
        return f"{x:.0f}"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def slope(c: "Candidate") -> str:
    """``c±se`` of the candidate's probe, and whether it is evidence of a falling loss."""
    f = c.fit
    if f is None or not math.isfinite(f.c):
        return "-"
    verdict = "diverged" if f.diverged else "falling" if f.falling else "flat?"
    return f"{f.c:.3g}±{num_text(f.c_se, '.2g')} {verdict}"


def prediction(c: "Candidate", reference: Optional[float]) -> str:
    """The predicted iterations with their range at c ± 2 se, e.g. ``820 [510-1.9e3]``."""
    if c.iters is None:
        return "-"
    shown = num_text(c.iters, ".4g")
    if c.fit is None or reference is None or c.fit.diverged:
        return shown
    lo, hi = c.fit.iterations_interval(reference)
    if c.iters == 0.0 or (lo == hi == c.iters):
        return shown
    return f"{shown} [{_short(lo)}-{_short(hi)}]"


def table(plan: "Plan") -> List[str]:
    """A header, one row per candidate and a legend: ``Plan.table``'s columns (HE, probe,
    prediction and status, in that order) with the evidence (see the module doc)."""
    head = (f"{'#':>3} {'strategy':<9} {'groups':>6} {'batch':>5} {'lr':>9} {'momentum':>8} "
            f"{'HE s/iter':>10} {'probe it':>8} {'probe loss':>10} {'slope c±se':>20} "
            f"{'pred iters [range]':>22} {'pred s':>9}  status")
    rows = [head]
    for i, c in enumerate(plan.candidates):
        rows.append(f"{i:>3} {c.strategy:<9} {c.groups:>6} {c.batch:>5} {c.lr:>9.4g} "
                    f"{c.momentum:>8.4g} {num_text(c.he, '.4g'):>10} {c.probed or '-':>8} "
                    f"{num_text(c.fit.last if c.fit else None, '.4g'):>10} {slope(c):>20} "
                    f"{prediction(c, plan.reference_loss):>22} "
                    f"{num_text(c.seconds, '.3g'):>9}  {c.status}"
                    + (f"; predicted {c.basis}" if c.basis else ""))
    rows.append(f"    (slope: c of L ~ t^-c on the probe ± its standard error, falling when "
                f"c - {SE_MULTIPLE:g} se > 0; [range]: the iterations at c ± {SE_MULTIPLE:g} "
                f"se, a ranking device's spread, not a promise)")
    return rows


def places_line(plan: "Plan", chosen: str) -> str:
    """One group's places, each with its HE and, with the iterations the best one-group
    candidate is predicted to need (the same wherever it runs), its predicted seconds to the
    reference; and the place chosen."""
    sync = [c for c in plan.candidates if c.strategy == "sync" and c.iters is not None
            and math.isfinite(c.iters)]
    iters = min((c.iters for c in sync), default=None)
    parts = []
    for name, he in plan.places:
        text = f"{name} {num_text(he, '.3g')} s/iter"
        if iters is not None and he is not None and math.isfinite(he):
            text += f" ({num_text(he * iters, '.3g')} s)"
        parts.append(text)
    tail = (f" to the reference at the {num_text(iters, '.4g')} iterations predicted for one "
            f"group" if iters is not None else "")
    return (f"one group, by place (the same updates wherever they run, so the fastest trains "
            f"them): {'; '.join(parts)}{tail}; chose {chosen}")


# -- the picture -------------------------------------------------------------------------------
def _figure(width: float, height: float):
    return agg_figure(width, height, FLAG)


def check_plot_path(path: str, command: str = "") -> str:
    """``path`` when :func:`plot` can write it: its folder exists, it names no folder, and
    matplotlib is installed and writes its format (from the extension, PNG without one);
    else a CCTError naming the flag and the path. Checked before any probe or training."""
    where = f"{command}: " if command else ""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CCTError(f"{where}{FLAG}={path}: the folder '{folder}' does not exist; create it "
                       f"or give a path in an existing folder")
    if os.path.isdir(path):
        raise CCTError(f"{where}{FLAG}={path} is a folder; give a file name, e.g. "
                       f"{os.path.join(path, 'probes.png')}")
    figure = _figure(1, 1)
    ext = os.path.splitext(path)[1][1:].lower() or "png"
    known = figure.canvas.get_supported_filetypes()
    if ext not in known:
        raise CCTError(f"{where}{FLAG}={path}: matplotlib cannot write .{ext} files; give a "
                       f".png name (or one of .{', .'.join(sorted(known))})")
    return path


def plot(plan: "Plan", path: str, title: Optional[str] = None) -> None:
    """The probes' loss curves against the run's iterations, written atomically to ``path``:
    per probed candidate the raw losses (faint), their smoothed curve (solid) and the fitted
    power law over the probe's span (dashed), labelled by its configuration; the winner drawn
    thicker and named; the reference loss as a horizontal line; the loss axis logarithmic."""
    from ..io.atomic import atomic_write

    check_plot_path(path)
    figure = _figure(12, 6.5)
    from matplotlib.ticker import LogFormatter      # matplotlib is there: _figure said so
    ax = figure.add_subplot(1, 1, 1)
    colors = _colors()
    drawn = 0
    for i, c in enumerate(plan.candidates):
        if not c.losses or c.fit is None:
            continue
        color = colors[drawn % len(colors)]
        drawn += 1
        win = c is plan.winner
        losses = np.asarray(c.losses, dtype=np.float64)
        start = c.fit.t_last - losses.size
        t = start + 1 + np.arange(losses.size)
        smoothed = smooth(losses)       # as the fit smooths them
        ax.plot(t, _positive(losses), color=color, alpha=0.2, linewidth=0.7)
        label = f"#{i} {c.describe()}" + (" (winner)" if win else "")
        ax.plot(t, _positive(smoothed), color=color, linewidth=2.6 if win else 1.3,
                label=label, zorder=3 if win else 2)
        f = c.fit
        if not f.diverged and math.isfinite(f.a) and f.a > 0 and math.isfinite(f.c):
            ax.plot(t, f.a * t.astype(np.float64) ** (-f.c), color=color, linestyle="--",
                    linewidth=1.6 if win else 1.0, zorder=3 if win else 2)
    if plan.reference_loss is not None and math.isfinite(plan.reference_loss) \
            and plan.reference_loss > 0:
        ax.axhline(plan.reference_loss, color="black", linestyle=":", linewidth=1.2,
                   label=f"reference loss {plan.reference_loss:.4g}")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))    # 2, 3: not 2x10^0
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    ax.set_xlabel("iteration")
    ax.set_ylabel("training loss (log scale)")
    ax.set_title(title or f"Optimizer probes: {drawn} of {len(plan.candidates)} candidates "
                 f"probed (raw faint, smoothed solid, fitted power law dashed)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if drawn or plan.reference_loss is not None:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ext = os.path.splitext(path)[1][1:].lower() or "png"

    def write(tmp: str) -> None:
        figure.savefig(tmp, format=ext, bbox_inches="tight")
    try:
        atomic_write(path, write)
    except ValueError as e:
        raise CCTError(f"{FLAG}: cannot write '{path}': {e}") from None


def _positive(x: np.ndarray) -> np.ndarray:
    """``x`` with what a log axis cannot show (non-finite, not positive) left out."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(x) & (x > 0), x, np.nan)


def _colors() -> list:
    """Twenty distinct colours, the dark of each of tab20's pairs first."""
    from matplotlib import colormaps
    pairs = list(colormaps["tab20"].colors)
    return pairs[0::2] + pairs[1::2]
