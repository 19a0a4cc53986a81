"""`cct train` end to end, as a Caffe user runs it: a solver, a net, Caffe's LMDBs, the log
a parser reads, snapshots to resume from, and clear failures."""
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

SOLVER = """net: "lenet_train_test.prototxt"
test_iter: 2
test_interval: 20
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "inv"
gamma: 0.0001
power: 0.75
display: 10
max_iter: {max_iter}
snapshot: 20
snapshot_prefix: "lenet"
solver_mode: CPU
random_seed: 1701
"""


@pytest.fixture
def workdir(caffe_fixtures, tmp_path):
    """Caffe's LeNet and LMDBs in a scratch folder (snapshots are written beside them)."""
    for name in ("lenet_train_test.prototxt", "mnist10k_train_lmdb", "mnist10k_test_lmdb"):
        src = caffe_fixtures / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    (tmp_path / "solver.prototxt").write_text(SOLVER.format(max_iter=40))
    return tmp_path


def cct(*args, cwd, **kw):
    return subprocess.run([sys.executable, "-m", "cct.cli", *args], cwd=cwd,
                          capture_output=True, text=True, **kw)


TRAIN_LINE = re.compile(r"^I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ solver\.cpp:239\] Iteration (\d+) "
                        r"\([\d.e+-]+ iter/s, [\d.e+-]+s/10 iters\), loss = [\d.e+-]+$", re.M)


def test_train_logs_snapshots_and_resumes(workdir):
    run = cct("train", "--solver=solver.prototxt", cwd=workdir)
    assert run.returncode == 0, run.stderr[-3000:]
    log = run.stderr
    assert [int(i) for i in TRAIN_LINE.findall(log)] == [0, 10, 20, 30]
    assert re.findall(r"Iteration (\d+), Testing net \(#0\)", log) == ["0", "20", "40"]
    assert len(re.findall(r"\] +Test net output #0: accuracy = [\d.]+$", log, re.M)) == 3
    assert re.search(r"sgd_solver\.cpp:\d+\] Iteration 30, lr = 0\.00997", log)
    assert log.rstrip().endswith("Optimization Done.")
    for f in ("lenet_iter_20.caffemodel", "lenet_iter_20.solverstate",
              "lenet_iter_40.caffemodel", "lenet_iter_40.solverstate"):
        assert (workdir / f).is_file(), f
    losses = re.findall(r"Iteration (\d+) \(.*\), loss = ([\d.e+-]+)", log)

    # Resume from 20: the same data order and seed give the same losses after it.
    again = cct("train", "-solver", "solver.prototxt", "-snapshot", "lenet_iter_20.solverstate",
                cwd=workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Resuming from lenet_iter_20.solverstate" in again.stderr
    resumed = re.findall(r"Iteration (\d+) \(.*\), loss = ([\d.e+-]+)", again.stderr)
    assert [r for r in resumed if int(r[0]) > 20] == [l for l in losses if int(l[0]) > 20]


def test_finetune_from_weights_and_bad_combinations(workdir):
    assert cct("train", "-solver=solver.prototxt", cwd=workdir).returncode == 0
    (workdir / "solver.prototxt").write_text(SOLVER.format(max_iter=1))
    tune = cct("train", "--solver", "solver.prototxt", "--weights",
               "lenet_iter_40.caffemodel", cwd=workdir)
    assert tune.returncode == 0 and "Finetuning from lenet_iter_40.caffemodel" in tune.stderr
    both = cct("train", "-solver", "solver.prototxt", "-weights", "lenet_iter_40.caffemodel",
               "-snapshot", "lenet_iter_40.solverstate", cwd=workdir)
    assert both.returncode == 1 and "not both" in both.stderr
    model_as_state = cct("train", "-solver", "solver.prototxt", "-snapshot",
                         "lenet_iter_40.caffemodel", cwd=workdir)
    assert model_as_state.returncode == 1
    assert "not a solver state" in model_as_state.stderr
    for run in (both, model_as_state):
        assert "Traceback" not in run.stderr


@pytest.mark.parametrize("case,files,needle", [
    ("no solver", {}, "Need a solver definition"),
    ("missing solver file", {}, "does not exist"),
    ("solver without a net", {"s.prototxt": "base_lr: 0.1\n"}, "s.prototxt"),
    ("missing net file", {"s.prototxt": 'net: "nope.prototxt"\nbase_lr: 0.1\nlr_policy: "fixed"\n'}, "nope.prototxt"),
    ("missing lmdb", {"s.prototxt": 'net: "n.prototxt"\nbase_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 1\n',
                      "n.prototxt": 'layer { name: "d" type: "Data" top: "data" '
                      'data_param { source: "nodb" batch_size: 2 backend: LMDB } }'}, "nodb"),
])
def test_train_user_errors(tmp_path, case, files, needle):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    args = [] if case == "no solver" else ["-solver", "s.prototxt"]
    run = cct("train", *args, cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    errors = [l for l in run.stderr.splitlines() if l.startswith("cct: error:")]
    assert len(errors) == 1 and needle in errors[0]


def test_signals_snapshot_and_stop(workdir):
    """SIGINT and SIGHUP do what -sigint_effect / -sighup_effect say (Caffe's SignalHandler)."""
    (workdir / "solver.prototxt").write_text(SOLVER.format(max_iter=100000).replace(
        "snapshot: 20", "snapshot: 0"))
    proc = subprocess.Popen([sys.executable, "-m", "cct.cli", "train", "-solver",
                             "solver.prototxt", "-sigint_effect", "snapshot",
                             "-sighup_effect", "stop"], cwd=workdir,
                            stderr=subprocess.PIPE, text=True)
    log = []

    def read_until(text):
        for line in proc.stderr:
            log.append(line)
            if text in line:
                return
        raise AssertionError("".join(log)[-3000:])
    read_until("solver.cpp:239] Iteration 10 ")
    proc.send_signal(signal.SIGINT)
    read_until("Snapshotting solver state")
    read_until("solver.cpp:239] Iteration")  # training goes on after the snapshot
    proc.send_signal(signal.SIGHUP)
    log.extend(proc.stderr)
    assert proc.wait(timeout=120) == 0, "".join(log)[-3000:]
    text = "".join(log)
    assert "Optimization stopped early." in text
    snaps = sorted(int(m) for m in re.findall(r"lenet_iter_(\d+)\.solverstate$",
                                              "\n".join(os.listdir(workdir)), re.M))
    assert len(snaps) == 2 and snaps[0] < snaps[1]  # the SIGINT snapshot, then the final one


INTERRUPT_WHILE_BUILDING = """
import os, signal, sys
import cct.net
from cct import cli

build = cct.net.Net.__init__

def interrupted_build(self, *args, **kw):
    os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C while the train net is being built
    build(self, *args, **kw)

cct.net.Net.__init__ = interrupted_build
sys.exit(cli.main(["train", "-solver", "solver.prototxt"]))
"""


def test_sigint_while_the_net_is_built_stops_before_training(workdir):
    """As in Caffe, the signal handler is set before the solver is built: the interrupt waits
    for the solver's first check and stops there, cleanly, with nothing to snapshot."""
    run = subprocess.run([sys.executable, "-c", INTERRUPT_WHILE_BUILDING], cwd=workdir,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert "solver.cpp:311] Optimization stopped early." in run.stderr
    assert "solver.cpp:239] Iteration" not in run.stderr
    assert not [f for f in os.listdir(workdir) if f.startswith("lenet_iter_")]


def skeletons(log: str) -> set:
    """Each solver/CLI log line with numbers and names blanked: what a parser relies on."""
    out = set()
    for line in log.splitlines():
        m = re.match(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ ((?:solver|sgd_solver|caffe)"
                     r"\.cpp):\d+\] (.*)$", line)
        if not m:
            continue
        body = re.sub(r"-?\d+(\.\d+)?(e[+-]?\d+)?", "N", m.group(2))
        body = re.sub(r"lenet\S*", "FILE", body)
        out.add((m.group(1), body))
    return out


def test_log_lines_have_caffes_tokens(workdir, caffe_fixtures):
    """Every kind of line Caffe's lenet_train.log has from the solver and the CLI, cct's log of
    the same solver has too, token for token (numbers and file names aside)."""
    run = cct("train", "--solver=solver.prototxt", cwd=workdir)
    assert run.returncode == 0, run.stderr[-3000:]
    ours = skeletons(run.stderr)
    theirs = skeletons((caffe_fixtures / "lenet_train.log").read_text())
    # Caffe's log holds the solver parameters it was given; ours were others.
    missing = {t for t in theirs - ours if not t[1].startswith("Initializing solver")}
    assert not missing, sorted(missing)
