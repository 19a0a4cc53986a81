"""Runs repeat to the bit: the same `cct train` twice gives byte-identical caffemodels (the
machine's plan cache), a resumed run ends where the uninterrupted one did even when this
machine's cache would choose other kernel plans (the snapshot's side file), a run killed with
SIGKILL resumes to the same bytes and leaves no temp file, and --deterministic needs no cache."""
import json
import os
import signal
import subprocess
import sys

import pytest

from .test_cli_train import cct, workdir  # noqa: F401  (workdir is a fixture)

FINAL = "lenet_iter_40.caffemodel"


def train(folder, cache, *args):
    env = dict(os.environ, CCT_PLAN_CACHE=str(cache))
    run = cct("train", "--solver=solver.prototxt", *args, cwd=folder, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stderr


def final_bytes(folder) -> bytes:
    return (folder / FINAL).read_bytes()


def flip_plans(cache) -> None:
    """Every cached plan the other way: the other partitioning, the other GEMM order."""
    (path,) = cache.glob("plans-*.json")
    data = json.loads(path.read_text())
    for row in data["conv"]:
        row[5] = 3 - row[5] if row[5] in (1, 2) else row[5]
    for row in data["gemm"]:
        row[7] = not row[7]
    path.write_text(json.dumps(data))


@pytest.fixture
def runs(workdir, tmp_path_factory):  # noqa: F811
    """The uninterrupted run, its bytes and its plan cache."""
    cache = tmp_path_factory.mktemp("cache")
    log = train(workdir, cache)
    return workdir, cache, final_bytes(workdir), log


def fresh_copy(workdir, tmp_path_factory):  # noqa: F811
    """The same solver, net and LMDBs in a new folder, without the snapshots."""
    other = tmp_path_factory.mktemp("again")
    for item in workdir.iterdir():
        if item.name.startswith("lenet_iter_"):
            continue
        os.symlink(item, other / item.name)
    return other


def test_rerun_on_the_same_machine_is_byte_identical(runs, tmp_path_factory):
    workdir, cache, first, log = runs
    assert "Kernel plans:" not in log        # the first run timed them
    for _ in range(2):
        again = fresh_copy(workdir, tmp_path_factory)
        assert "Kernel plans:" in train(again, cache)
        assert final_bytes(again) == first


def test_resume_runs_the_interrupted_runs_plans(runs, tmp_path_factory):
    workdir, cache, first, _ = runs
    flip_plans(cache)
    other = fresh_copy(workdir, tmp_path_factory)
    train(other, cache)
    assert final_bytes(other) != first       # the plans do change the weights...
    resumed = fresh_copy(workdir, tmp_path_factory)
    for name in ("lenet_iter_20.caffemodel", "lenet_iter_20.solverstate",
                 "lenet_iter_20.solverstate.cct.json"):
        (resumed / name).write_bytes((workdir / name).read_bytes())
    train(resumed, cache, "--snapshot=lenet_iter_20.solverstate")
    assert final_bytes(resumed) == first     # ...and the side file's plans are what ran


def test_killed_run_resumes_to_the_same_bytes_without_leftovers(runs, tmp_path_factory):
    workdir, cache, first, _ = runs
    folder = fresh_copy(workdir, tmp_path_factory)
    env = dict(os.environ, CCT_PLAN_CACHE=str(cache))
    proc = subprocess.Popen([sys.executable, "-m", "cct.cli", "train", "-solver",
                             "solver.prototxt"], cwd=folder, env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "Iteration 30" in line:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert not (folder / FINAL).exists()
    train(folder, cache, "--snapshot=lenet_iter_20.solverstate")
    assert final_bytes(folder) == first
    assert [p.name for p in folder.iterdir() if ".tmp-" in p.name] == []


def test_deterministic_runs_need_no_cache(workdir, tmp_path_factory):  # noqa: F811
    train(workdir, "off", "--deterministic")
    first = final_bytes(workdir)
    again = fresh_copy(workdir, tmp_path_factory)
    train(again, "off", "--deterministic")
    assert final_bytes(again) == first
