"""`cct train --strategy=async`: one group gives plain training's log, loss for loss; several
groups log their staleness; bad driver flags are one clear line."""
import os
import re

import pytest

from ..test_cli_train import cct, workdir  # noqa: F401  (workdir is a fixture)

LOSS = re.compile(r"\] (Iteration \d+), loss = ([\d.e+-]+)|\] (Iteration \d+) \(.*\), "
                  r"loss = ([\d.e+-]+)|\] +(Test net output #\d: \S+ = [\d.e+-]+)")


def losses(log: str):
    return [tuple(x for x in m if x) for m in LOSS.findall(log)]


def test_one_async_group_logs_plain_trainings_losses(workdir, tmp_path_factory):  # noqa: F811
    # One plan cache for the runs: kernel plans timed apart would round apart.
    env = dict(os.environ, CCT_PLAN_CACHE=str(tmp_path_factory.mktemp("plans")))
    plain = cct("train", "--solver=solver.prototxt", cwd=workdir, env=env)
    assert plain.returncode == 0, plain.stderr[-2000:]
    for engine in ("threads", "processes"):
        run = cct("train", "--solver=solver.prototxt", "--strategy=async", "--groups=1",
                  f"--engine={engine}", cwd=workdir, env=env)
        assert run.returncode == 0, run.stderr[-2000:]
        assert losses(run.stderr) == losses(plain.stderr) and len(losses(plain.stderr)) > 8
        assert (workdir / "lenet_iter_40.caffemodel").read_bytes()


def test_two_groups_log_staleness_and_momentum(workdir):  # noqa: F811
    run = cct("train", "--solver=solver.prototxt", "--strategy=async", "--groups=2",
              "--engine=simulated", "--momentum=auto", cwd=workdir)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = re.findall(r"Staleness mean ([\d.]+) max (\d+) over (\d+) updates; momentum "
                       r"explicit ([\d.]+) \(implicit ~([\d.]+)\)", run.stderr)
    assert [(m, k, n) for m, k, n, _, _ in lines] == [
        ("0", "0", "1"), ("1", "1", "10"), ("1", "1", "10"), ("1", "1", "10")]
    # -momentum=auto's probes choose the explicit momentum (tests/optimizer/
    # test_momentum_auto.py) and are thrown away; the driver trains with the choice.
    chose = re.search(r"Momentum auto: chose ([\d.]+): ", run.stderr)
    assert chose and {float(e) for _, _, _, e, _ in lines} == {float(chose.group(1))}
    # At iteration 30: 31 updates, the first with staleness 0, then 1 each: E[tau] = 30/31.
    mean = 30 / 31
    assert float(lines[-1][4]) == pytest.approx(mean / (1 + mean), abs=1e-4)


@pytest.mark.parametrize("flags, needle", [
    (["--strategy=bogus"], "unknown -strategy 'bogus'; known: sync, async"),
    (["--groups=2"], "-groups needs -strategy=async"),
    (["--strategy=async", "--engine=warp"], "unknown engine 'warp'"),
    (["--strategy=async", "--momentum=fast"], "--momentum must be 'auto' or a number"),
    (["--momentum=auto"], "-momentum must be a number (or 'auto' with -strategy=async)"),
    (["--strategy=async", "--groups=0"], "--groups must be at least 1"),
    (["--strategy=async", "--engine=simulated", "--staleness=zipf"], "unknown staleness model"),
    (["--strategy=async", "--groups=3", "--devices=cpu:1,cpu:1"], "needs at least 3 devices"),
])
def test_bad_driver_flags(workdir, flags, needle):  # noqa: F811
    run = cct("train", "--solver=solver.prototxt", *flags, cwd=workdir)
    assert run.returncode == 1
    assert needle in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("flags, needle", [
    (["--strategy=hogbatch", "--groups=2", "--batch-sizes=8"], "gives 1 batch size(s) for 2"),
    (["--strategy=hogbatch", "--groups=2", "--batch-sizes=gpu3:8"], "no group runs on 'gpu3'"),
    (["--strategy=async", "--learners=2"], "-learners is for -strategy=sma"),
    (["--strategy=sma", "--learners=many"], "-learners must be a count or 'auto'"),
    (["--batch-sizes=8"], "-batch-sizes gives each group its batch"),
    (["--strategy=hogbatch", "--groups=2", "--engine=simulated", "--simulate-speeds=1,x"],
     "-simulate-speeds takes speeds separated by commas"),
])
def test_bad_strategy_flags(workdir, flags, needle):  # noqa: F811
    run = cct("train", "--solver=solver.prototxt", *flags, cwd=workdir)
    assert run.returncode == 1
    assert needle in run.stderr and "Traceback" not in run.stderr


def test_hogbatch_and_sma_from_the_command_line(workdir):  # noqa: F811
    run = cct("train", "--solver=solver.prototxt", "--strategy=adaptive-hogbatch", "--groups=2",
              "--engine=simulated", "--simulate-speeds=1,4", "--batch-sizes=16,64",
              cwd=workdir)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Batches: group 0 16, group 1 64" in run.stderr
    assert re.search(r"group 1 \([^)]*\): batch \d+, \d+ updates \([\d.]+%\), [\d.e+-]+ updates/s",
                     run.stderr)
    assert "Updates by group: group 0" in run.stderr
    run = cct("train", "--solver=solver.prototxt", "--strategy=sma", "--learners=2",
              "--engine=simulated", "--sync-period=2", "--sma-alpha=0.4", cwd=workdir)
    assert run.returncode == 0, run.stderr[-2000:]
    assert ("SMA: 2 learner(s), alpha 0.4, central momentum 0, synchronising every 2 round(s)"
            in run.stderr)
    assert (workdir / "lenet_iter_40.solverstate.cct.sma.npz").exists()
