"""``cct parse_log [--delimiter ,] [--verbose] LOGFILE OUTPUT_DIR``: Caffe's
tools/extra/parse_log.py.

Writes ``OUTPUT_DIR/<basename of LOGFILE>.train`` and ``.test``: CSV tables (Excel dialect,
``\\r\\n`` line ends) with the columns ``NumIters, Seconds, LearningRate`` followed by one column
per net output, named as in the log (``loss``, ``accuracy`` ...). The rows are the ones Caffe's
script produces from the same log:

- parsing starts after the ``Solving ...`` line, whose time is second 0 (Caffe's
  extract_seconds.py); a row is the outputs printed for one iteration (``Train net output #k``
  / ``Test net output #k`` lines), timed by the first of its lines;
- ``LearningRate`` is the last ``lr = ...`` seen before the row, so the first row's is NaN and,
  as in Caffe, replaced by the second row's;
- numbers are written as Python floats (``NumIters`` ``100.0``).

glog prefixes without a year (``I1122 04:17:58.385668``) take the log file's creation year, as
Caffe does; prefixes with one (``I20201122 ...``, glog >= 0.6 by default) use it. Two things
Caffe's script gets wrong are done right here: a log whose table has a single row keeps it,
and a log running past New Year counts the seconds across it.
"""
from __future__ import annotations

import csv
import datetime
import os
import re
from typing import Dict, Iterable, List, Optional, Tuple

from ..errors import CCTError
from ..flags import Flags

TOOL = "parse_log"

_ITERATION = re.compile(r"Iteration (\d+)")
_TRAIN_OUTPUT = re.compile(r"Train net output #(\d+): (\S+) = ([\.\deE+-]+)")
_TEST_OUTPUT = re.compile(r"Test net output #(\d+): (\S+) = ([\.\deE+-]+)")
_LEARNING_RATE = re.compile(r"lr = ([-+]?[0-9]*\.?[0-9]+([eE]?[-+]?[0-9]+)?)")
_PREFIX = re.compile(r"^[IWEF](\d{4}|\d{8}) (\d\d):(\d\d):(\d\d)\.(\d+)\s")

Row = Dict[str, float]


class _Clock:
    """Turns glog prefixes into datetimes; a month smaller than the last one starts a new
    year (a year-less prefix has none of its own)."""

    def __init__(self, year: int):
        self.year = year
        self.last_month = 0

    def __call__(self, line: str) -> Optional[datetime.datetime]:
        m = _PREFIX.match(line.lstrip())
        if not m:
            return None
        date, hour, minute, second, frac = m.groups()
        if len(date) == 8:
            year, month, day = int(date[:4]), int(date[4:6]), int(date[6:])
        else:
            month, day = int(date[:2]), int(date[2:])
            if month < self.last_month:
                self.year += 1
            year = self.year
        self.last_month = month
        try:
            return datetime.datetime(year, month, day, int(hour), int(minute), int(second),
                                     int(frac[:6].ljust(6, "0")))
        except ValueError:
            return None


def log_created_year(path: str) -> int:
    """Caffe's get_log_created_year: the year of the file's ctime."""
    return datetime.datetime.fromtimestamp(os.path.getctime(path)).year


def parse_lines(lines: Iterable[str], year: int) -> Tuple[List[Row], List[Row]]:
    """(train rows, test rows) of a Caffe training log given as lines."""
    clock = _Clock(year)
    lines = iter(lines)
    start = None
    for line in lines:
        if "Solving" in line:
            start = clock(line)
            break
    if start is None:
        raise CCTError(f"{TOOL}: the log has no 'Solving ...' line (the solver's start, from "
                       f"which Caffe counts the seconds); is it the log of a `train` run?")
    iteration = -1.0
    learning_rate = float("nan")
    seconds = 0.0
    train: List[Row] = []
    test: List[Row] = []
    train_row: Optional[Row] = None
    test_row: Optional[Row] = None
    for line in lines:
        m = _ITERATION.search(line)
        if m:
            iteration = float(m.group(1))
        if iteration == -1:
            continue
        when = clock(line)
        if when is not None:
            seconds = (when - start).total_seconds()
        m = _LEARNING_RATE.search(line)
        if m:
            learning_rate = float(m.group(1))
        train_row = _add_output(_TRAIN_OUTPUT, train_row, train, line, iteration, seconds,
                                learning_rate)
        test_row = _add_output(_TEST_OUTPUT, test_row, test, line, iteration, seconds,
                               learning_rate)
    for rows, row in ((train, train_row), (test, test_row)):
        if row is not None and not rows:
            rows.append(row)
        _fix_initial_nan_learning_rate(rows)
    return train, test


def _add_output(regex, row: Optional[Row], rows: List[Row], line: str, iteration: float,
                seconds: float, learning_rate: float) -> Optional[Row]:
    """Caffe's parse_line_for_net_output: an output line adds a column to the current row (a
    new iteration starts a new row); a row with as many columns as the first is complete."""
    m = regex.search(line)
    if m:
        if row is None or row["NumIters"] != iteration:
            if row is not None:
                rows.append(row)
            row = {"NumIters": iteration, "Seconds": seconds, "LearningRate": learning_rate}
        row[m.group(2)] = float(m.group(3))
    if row is not None and rows and len(row) == len(rows[0]):
        rows.append(row)
        row = None
    return row


def _fix_initial_nan_learning_rate(rows: List[Row]) -> None:
    """The first row has no learning rate yet (Caffe prints it after the first step); Caffe's
    script gives it the second row's."""
    if len(rows) > 1:
        rows[0]["LearningRate"] = rows[1]["LearningRate"]


def parse_log(path: str) -> Tuple[List[Row], List[Row]]:
    """(train rows, test rows) of the log file ``path``."""
    if not os.path.isfile(path):
        raise CCTError(f"{TOOL}: log file '{path}' does not exist"
                       if not os.path.exists(path) else
                       f"{TOOL}: log file '{path}' is a directory, expected a file")
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_lines(f, log_created_year(path))


def write_csv(path: str, rows: List[Row], delimiter: str = ",") -> bool:
    """Caffe's write_csv: nothing is written for an empty table. Columns are the first row's;
    a later row lacking one leaves it empty."""
    if not rows:
        return False
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), dialect=csv.excel,
                                delimiter=delimiter, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return True


def save_csv_files(log_path: str, output_dir: str, train: List[Row], test: List[Row],
                   delimiter: str = ",", verbose: bool = False) -> List[str]:
    """Write ``<output_dir>/<log basename>.train`` and ``.test``; returns the paths written."""
    if not os.path.isdir(output_dir):
        raise CCTError(f"{TOOL}: output directory '{output_dir}' does not exist")
    written = []
    base = os.path.basename(log_path)
    for suffix, rows in (("train", train), ("test", test)):
        out = os.path.join(output_dir, f"{base}.{suffix}")
        if write_csv(out, rows, delimiter):
            written.append(out)
            if verbose:
                print(f"Wrote {out}")
        elif verbose:
            print(f"Not writing {out}; no lines to write")
    return written


def main(argv: List[str]) -> int:
    flags = Flags(TOOL, argv, {"delimiter": ","}, booleans=("verbose",),
                  positional=("logfile_path", "output_dir"))
    delimiter = flags.get("delimiter")
    if len(delimiter) != 1:
        raise CCTError(f"{TOOL}: --delimiter must be one character, got '{delimiter}'")
    log_path, output_dir = flags.positional
    train, test = parse_log(log_path)
    save_csv_files(log_path, output_dir, train, test, delimiter, flags.bool("verbose"))
    return 0
