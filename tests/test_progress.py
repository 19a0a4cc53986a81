"""`cct train --progress`: a live line on a terminal (a pseudo-terminal here), never in a log
redirected to a file, and the log's lines the same either way."""
import fcntl
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios

import pytest

from cct.tools.parse_log import parse_log

pytest.importorskip("tqdm")

SOLVER = """net: "lenet_train_test.prototxt"
test_iter: 2
test_interval: 10
base_lr: 0.01
momentum: 0.9
lr_policy: "fixed"
display: 5
max_iter: 20
snapshot: 0
snapshot_prefix: "lenet"
solver_mode: CPU
random_seed: 1701
"""

PREFIX = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ (\S+:\d+)\] ")
BAR = re.compile(r"Iteration: +\d+%\|.*\| (\d+)/20 \[.*it/s, (\d+) img/s, loss [\d.e+-]+, "
                 r"accuracy [\d.]+ @\d+\]")


@pytest.fixture
def workdir(caffe_fixtures, tmp_path):
    for name in ("lenet_train_test.prototxt", "mnist10k_train_lmdb", "mnist10k_test_lmdb"):
        src = caffe_fixtures / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    (tmp_path / "solver.prototxt").write_text(SOLVER)
    return tmp_path


def train_on_terminal(cwd, *flags, columns=0):
    """`cct train --deterministic` (so that two runs log the same values) with stdin, stdout and stderr on a pseudo-terminal of ``columns`` columns
    (0: one that reports no size, as a bare pty does); returns (status, what it showed)."""
    master, slave = pty.openpty()
    if columns:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "cct.cli", "train", "--solver=solver.prototxt",
                             "--deterministic", *flags], cwd=cwd, stdin=slave, stdout=slave,
                            stderr=slave)
    os.close(slave)
    shown = b""
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:     # EIO: the child closed the terminal
            break
        if not data:
            break
        shown += data
    os.close(master)
    return proc.wait(timeout=300), shown.decode()


def train_to_file(cwd, *flags, name="train.log"):
    log = cwd / name
    with open(log, "w") as f:
        status = subprocess.run([sys.executable, "-m", "cct.cli", "train",
                                 "--solver=solver.prototxt", "--deterministic", *flags], cwd=cwd,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=f, timeout=300).returncode
    assert status == 0, log.read_text()[-3000:]
    return log


def normalized(lines):
    """Log lines without what changes from run to run: the glog prefix's time and thread,
    and the display's timing. A line without a prefix continues a multi-line message (the
    solver's and nets' parameters)."""
    out = []
    for line in lines:
        m = PREFIX.match(line)
        text = m.group(1) + "] " + line[m.end():] if m else line
        out.append(re.sub(r"\([\d.e+-]+ iter/s, [\d.e+-]+s/", "(T iter/s, Ts/", text))
    return out


def log_lines_seen(shown):
    """The log lines a terminal shows: each line written after the bar was cleared off it is
    the text after the last carriage return."""
    lines = []
    for piece in shown.split("\r\n"):
        last = piece.split("\r")[-1]
        if last.strip() and not BAR.search(last):
            lines.append(last)
    return lines


@pytest.mark.parametrize("strategy,columns", [("sync", 0), ("async", 120)])
def test_bar_on_a_terminal(workdir, strategy, columns):
    flags = ["--strategy=async", "--groups=2"] if strategy == "async" else []
    status, shown = train_on_terminal(workdir, *flags, columns=columns)
    assert status == 0, shown[-3000:]
    bars = BAR.findall(shown)
    assert bars and bars[-1][0] == "20", shown[-2000:]
    assert int(bars[-1][1]) > 0
    assert "Iteration: 100%" in shown
    # Every log line came out whole, on a line of its own, in the order of a redirected run.
    seen = normalized(log_lines_seen(shown))
    logged = normalized(train_to_file(workdir, *flags, "--progress=none").read_text()
                        .splitlines())
    if strategy == "sync":
        assert seen == logged
    else:   # the groups' interleaving differs between runs; the lines are whole all the same
        assert seen[-1] == logged[-1] == "caffe.cpp:250] Optimization Done."
        assert len(seen) == len(logged)


def test_redirected_log_is_caffes(workdir):
    """auto (the default) draws nothing into a file: the log is --progress=none's, byte for
    byte but for the times, and parse_log reads the same tables from it."""
    auto = train_to_file(workdir, name="auto.log")
    none = train_to_file(workdir, "--progress=none", name="none.log")
    text = auto.read_text()
    assert "\r" not in text and "Iteration:" not in text and "img/s" not in text
    assert normalized(text.splitlines()) == normalized(none.read_text().splitlines())
    (train_a, test_a), (train_n, test_n) = parse_log(str(auto)), parse_log(str(none))
    assert len(train_a) == 4 and len(test_a) == 3
    for rows_a, rows_n in ((train_a, train_n), (test_a, test_n)):
        strip = [[{k: v for k, v in r.items() if k != "Seconds"} for r in rows]
                 for rows in (rows_a, rows_n)]
        assert strip[0] == strip[1]


def test_bad_progress_value(workdir):
    run = subprocess.run([sys.executable, "-m", "cct.cli", "train", "--solver=solver.prototxt",
                          "--progress=sometimes"], cwd=workdir, capture_output=True, text=True)
    assert run.returncode == 1
    assert "-progress must be auto, bar or none; got 'sometimes'" in run.stderr
    assert "Traceback" not in run.stderr


class _Solver:
    """What the bar reads of a solver, run by hand: tests at the start of an iteration, then
    the callbacks, as Solver.begin_iteration does."""

    def __init__(self, max_iter=30, test_interval=10, test_initialization=True):
        import types
        self.param = types.SimpleNamespace(max_iter=max_iter, iter_size=1)
        self.net = types.SimpleNamespace(layers=[])
        self.iter, self.smoothed_loss, self.test_scores = 0, 2.3, {}
        self.test_interval, self.test_initialization = test_interval, test_initialization
        self.callbacks = []

    def add_callback(self, on_start, on_gradients_ready):
        self.callbacks.append((on_start, on_gradients_ready))

    def test(self):
        # a new list per test, as Solver.test makes
        self.test_scores[0] = [("loss", 1.5), ("accuracy", 0.11 + self.iter / 100)]

    def run(self, iters, postfix):
        """``iters`` iterations; the bar's scores at each."""
        shown = {}
        for _ in range(iters):
            if self.iter % self.test_interval == 0 and (self.iter or self.test_initialization):
                self.test()
            for on_start, on_gradients_ready in self.callbacks:
                on_start()
                on_gradients_ready()
            shown[self.iter] = postfix()
            self.iter += 1
        return shown


def _bar(solver):
    import io

    from cct.progress import TrainingProgress
    return TrainingProgress(solver, stream=io.StringIO()).attach()


def test_the_bar_says_which_iterations_test_its_accuracy_is():
    """Iteration 0's test (the initial weights) is not shown as the current accuracy until the
    next test: every score carries its test's iteration."""
    solver = _Solver()
    progress = _bar(solver)
    try:
        shown = solver.run(25, progress._postfix)
        solver.test()               # the solve's last test, after the loop
    finally:
        progress.close()
    assert shown[0] == shown[9] == "loss 2.3, accuracy 0.11 @0"
    assert shown[10] == shown[19] == "loss 2.3, accuracy 0.21 @10"
    assert shown[24] == "loss 2.3, accuracy 0.31 @20"
    assert progress._postfix() == "loss 2.3, accuracy 0.36 @25"


def test_no_score_before_the_first_test():
    solver = _Solver(test_initialization=False)
    progress = _bar(solver)
    try:
        shown = solver.run(12, progress._postfix)
    finally:
        progress.close()
    assert shown[0] == shown[9] == "loss 2.3"
    assert shown[10] == "loss 2.3, accuracy 0.21 @10"
