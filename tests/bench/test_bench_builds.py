"""bench/bench_builds.py: two installed builds, each process importing its own (a process that
found cct somewhere else would time the wrong build), and the refusals of a bad --build."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import cct

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "bench_builds.py"


def run(*args, env_shared=None):
    env = dict(os.environ)
    if env_shared:
        env["CCT_SHARED"] = str(env_shared)
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.mark.parametrize("fresh", [False, True])
def test_each_build_runs_from_its_own_folder(tmp_path, fresh):
    # two copies of the installed cct (its compiled _C with it), and the bundled LeNet as the
    # zoo's, so that no ../shared is needed
    for name in ("a", "b"):
        shutil.copytree(pathlib.Path(cct.__file__).parent, tmp_path / name / "cct",
                        ignore=shutil.ignore_patterns("__pycache__"))
    zoo = tmp_path / "shared" / "caffe-zoo" / "examples" / "mnist"
    zoo.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "mnist" / "lenet_train_test.prototxt", zoo)
    out = run("--build", f"a={tmp_path / 'a'}", "--build", f"b={tmp_path / 'b'}",
              "--nets", "lenet", "--rounds", "2", "--warmup", "1", "--iters", "2",
              *(["--fresh-plans"] if fresh else []), env_shared=tmp_path / "shared")
    assert out.returncode == 0, out.stderr
    rows = [r for r in out.stdout.splitlines() if "training step" in r]
    assert [r.split()[:2] for r in rows] == [["lenet", "a"], ["lenet", "b"]]
    assert "1.000x of a;" in rows[0]
    # the shared cache: every timed process starts from the plans an untimed one wrote; with
    # fresh plans none does
    assert all(r.endswith(f"{0 if fresh else 2} of 2 from cached plans") for r in rows), rows
    # with fresh plans, each process's median too (two rounds: two a build)
    each = [r.split(":")[1].split() for r in out.stdout.splitlines() if "each process" in r]
    assert [len(e) for e in each] == ([2, 2] if fresh else [])


def test_env_sets_a_build_apart(tmp_path):
    """One folder as two builds, told apart by --env; a bad --env is refused."""
    site = pathlib.Path(cct.__file__).parent.parent
    out = run("--build", f"a={site}", "--build", f"b={site}", "--env", "c:X=1")
    assert out.returncode != 0
    assert "--env 'c:X=1': expected NAME:VAR=VALUE, NAME one of a, b" in out.stderr


def test_a_folder_without_cct_is_refused(tmp_path):
    out = run("--build", f"a={tmp_path}", "--build", f"b={tmp_path}")
    assert out.returncode != 0
    assert f"--build 'a={tmp_path}': expected NAME=DIR with DIR/cct in it" in out.stderr


def test_one_build_is_refused():
    out = run("--build", f"a={pathlib.Path(cct.__file__).parent.parent}")
    assert out.returncode != 0 and "give two or more --build NAME=DIR" in out.stderr
