"""A matplotlib figure on the Agg canvas, without pyplot (no GUI backend chosen, no global
figure list), for the pictures cct writes: `cct plot_log` and the optimizer's `-plot`.
matplotlib is the `plot` extra; without it the error names the flag or tool that wanted it."""
from __future__ import annotations

from ..errors import CCTError
from ..install import install_hint


def agg_figure(width: float, height: float, who: str):
    """A ``width`` x ``height`` inch Figure at 100 dpi on an Agg canvas; ``who`` (a tool or a
    flag) is named when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise CCTError(f"{who} needs matplotlib, which is not installed: pip install "
                       f"matplotlib (or {install_hint('plot')})") from None
    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure
