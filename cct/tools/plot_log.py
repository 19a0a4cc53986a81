"""``cct plot_log LOGFILE OUT.png``: a picture of a training log, after Caffe's
tools/extra/plot_training_log.py.example.

The default picture has three rows (loss, accuracy, learning rate) and two columns (against
iterations and against seconds since the solver started): train and test loss, every test
output whose name holds ``acc``, and the learning rate, as ``cct parse_log`` reads them from
the log. Caffe's own form is accepted too: ``cct plot_log CHART_TYPE OUT.png LOG [LOG...]``
draws one chart of several logs, CHART_TYPE being

    0 Test accuracy vs. Iters     1 Test accuracy vs. Seconds
    2 Test loss vs. Iters         3 Test loss vs. Seconds
    4 Train learning rate vs. Iters   5 Train learning rate vs. Seconds
    6 Train loss vs. Iters        7 Train loss vs. Seconds

``cct plot_log --follow LOGFILE OUT.png`` watches a log that training is writing
(``cct train ... 2> LOGFILE``): it reads the log every ``--poll`` seconds and, when it has grown,
draws the picture again, replacing OUT.png atomically (an image viewer never sees half a file).
It stops when the log says ``Optimization Done.`` (after the last drawing), on Ctrl-C, or after
``--follow-timeout`` seconds in which the log did not grow (0, the default: never).

Needs matplotlib (``pip install matplotlib``, or the ``plot`` extra of cct). The figure is
drawn without pyplot, so it changes no global matplotlib state.
"""
from __future__ import annotations

import math
import os
import sys
import time
from typing import Callable, List, Optional, Tuple

from ..errors import CCTError
from ..flags import Flags
from ..io.figure import agg_figure
from .parse_log import Row, log_created_year, parse_lines, parse_log

TOOL = "plot_log"
CHART_TYPES = {
    0: ("Test accuracy", "Iters"), 1: ("Test accuracy", "Seconds"),
    2: ("Test loss", "Iters"), 3: ("Test loss", "Seconds"),
    4: ("Train learning rate", "Iters"), 5: ("Train learning rate", "Seconds"),
    6: ("Train loss", "Iters"), 7: ("Train loss", "Seconds"),
}
_X_COLUMN = {"Iters": "NumIters", "Seconds": "Seconds"}


def _figure(width: float, height: float):
    return agg_figure(width, height, TOOL)


def _columns(rows: List[Row], want) -> List[str]:
    return [c for c in (rows[0] if rows else ())
            if c not in ("NumIters", "Seconds", "LearningRate") and want(c)]


def _series(rows: List[Row], x: str, y: str) -> Tuple[List[float], List[float]]:
    pts = [(r[x], r[y]) for r in rows if y in r and not math.isnan(r[y])]
    return [p[0] for p in pts], [p[1] for p in pts]


def _is_loss(name: str) -> bool:
    return "loss" in name.lower()


def _is_accuracy(name: str) -> bool:
    return "acc" in name.lower()


def _save(figure, path: str) -> None:
    from ..io.atomic import atomic_write

    ext = os.path.splitext(path)[1][1:].lower() or "png"

    def write(tmp: str) -> None:
        figure.savefig(tmp, format=ext)
    try:
        atomic_write(path, write)
    except ValueError as e:
        raise CCTError(f"{TOOL}: cannot write '{path}': {e}") from None


def plot_summary(log_path: str, out: str) -> None:
    """Loss, accuracy and learning rate of one log against iterations and seconds."""
    train, test = parse_log(log_path)
    _plot_tables(log_path, train, test, out)


def _plot_tables(log_path: str, train: List[Row], test: List[Row], out: str) -> None:
    if not train and not test:
        raise CCTError(f"{TOOL}: '{log_path}' holds no 'Train net output' or 'Test net output' "
                       f"lines to plot")
    panels = [
        ("loss", [("train", train, c) for c in _columns(train, _is_loss)]
         + [("test", test, c) for c in _columns(test, _is_loss)]),
        ("accuracy", [("train", train, c) for c in _columns(train, _is_accuracy)]
         + [("test", test, c) for c in _columns(test, _is_accuracy)]),
        ("learning rate", [("train", train, "LearningRate")] if train else []),
    ]
    panels = [p for p in panels if p[1]]
    figure = _figure(12, 3.4 * len(panels))
    figure.suptitle(os.path.basename(log_path))
    for i, (title, series) in enumerate(panels):
        for j, x_name in enumerate(("Iters", "Seconds")):
            ax = figure.add_subplot(len(panels), 2, 2 * i + j + 1)
            for phase, rows, column in series:
                xs, ys = _series(rows, _X_COLUMN[x_name], column)
                label = f"{phase} {column}" if column != "LearningRate" else "learning rate"
                ax.plot(xs, ys, marker="o" if phase == "test" else None, markersize=3,
                        label=label)
            ax.set_title(f"{title} vs. {x_name}")
            ax.set_xlabel(x_name)
            ax.set_ylabel(title)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    figure.tight_layout()
    _save(figure, out)


def plot_chart(chart_type: int, out: str, logs: List[str]) -> None:
    """Caffe's plot_training_log.py: one chart of ``chart_type`` for each log."""
    y_name, x_name = CHART_TYPES[chart_type]
    figure = _figure(8, 6)
    ax = figure.add_subplot(1, 1, 1)
    for log in logs:
        train, test = parse_log(log)
        rows = test if y_name.startswith("Test") else train
        if y_name.endswith("learning rate"):
            columns: List[Optional[str]] = ["LearningRate"]
        elif y_name.endswith("accuracy"):
            columns = _columns(rows, _is_accuracy)
        else:
            columns = _columns(rows, _is_loss)
        if not rows or not columns:
            raise CCTError(f"{TOOL}: '{log}' has no {y_name.lower()} to plot")
        for column in columns:
            xs, ys = _series(rows, _X_COLUMN[x_name], column)
            label = os.path.basename(log) + ("" if len(columns) == 1 else f" {column}")
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=0.75, label=label)
    ax.legend(loc="upper right" if "loss" in y_name else "lower right", fontsize=8)
    ax.set_title(f"{y_name} vs. {x_name}")
    ax.set_xlabel(x_name)
    ax.set_ylabel(y_name)
    ax.grid(True, alpha=0.3)
    _save(figure, out)


#: the line Caffe's (and cct's) ``train`` ends its log with
DONE = "Optimization Done."


def follow(log_path: str, out: str, poll: float = 2.0, timeout: float = 0.0,
           clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep) -> str:
    """Redraw ``out`` from ``log_path`` each time the log grows, until it holds
    :data:`DONE` ("done"), or ``timeout`` seconds (> 0) pass without growth ("timeout"), or
    Ctrl-C ("interrupted"). Returns why it stopped. Only whole lines are read: a line being
    written is left for the next poll."""
    size = -1
    last_growth = clock()
    try:
        while True:
            try:
                now_size = os.path.getsize(log_path)
            except OSError:
                now_size = -1   # not written yet: training may still be starting
            if now_size != size:
                size = now_size
                last_growth = clock()
                if size >= 0 and _redraw(log_path, out):
                    return "done"
            elif timeout > 0 and clock() - last_growth >= timeout:
                return "timeout"
            sleep(poll)
    except KeyboardInterrupt:
        return "interrupted"


def _redraw(log_path: str, out: str) -> bool:
    """Draw what the log holds so far (nothing before its first output line); True when the
    log is complete."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()
    done = any(DONE in line for line in lines)
    try:
        train, test = parse_lines(lines, log_created_year(log_path))
    except CCTError:
        if done:
            raise
        return False     # no 'Solving' line yet
    if train or test or done:
        _plot_tables(log_path, train, test, out)
    return done


def main(argv: List[str]) -> int:
    flags = Flags(TOOL, argv, {"follow-timeout": "0", "poll": "2"}, booleans=("follow",))
    args = flags.positional
    if flags.bool("follow"):
        if len(args) != 2:
            raise CCTError(f"{TOOL}: usage: cct {TOOL} --follow LOGFILE OUT.png")
        poll, timeout = flags.float("poll"), flags.float("follow-timeout")
        if poll <= 0 or timeout < 0:
            raise CCTError(f"{TOOL}: --poll must be above 0 and --follow-timeout at least 0 "
                           f"(got {poll:g} and {timeout:g})")
        why = follow(args[0], args[1], poll, timeout)
        if why == "timeout":
            print(f"{TOOL}: '{args[0]}' did not grow for {timeout:g} s; stopped following",
                  file=sys.stderr)
        return 0
    if len(args) >= 3 and args[0].isdigit():
        chart_type = int(args[0])
        if chart_type not in CHART_TYPES:
            raise CCTError(f"{TOOL}: chart type must be 0..7, got {chart_type}:\n" + "\n".join(
                f"  {k}: {y} vs. {x}" for k, (y, x) in CHART_TYPES.items()))
        plot_chart(chart_type, args[1], args[2:])
        return 0
    if len(args) != 2:
        raise CCTError(f"{TOOL}: usage: cct {TOOL} LOGFILE OUT.png, or Caffe's form "
                       f"cct {TOOL} CHART_TYPE[0-7] OUT.png LOGFILE [LOGFILE...]")
    plot_summary(args[0], args[1])
    return 0
