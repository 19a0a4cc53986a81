"""Every flag's value checked where it is parsed, one rule for flags the chosen strategy or engine
does not use, "did you mean" for unknown flags and commands, -help's type column, and the
summary `cct train` logs at the end of a run (issue 31)."""
import re
import subprocess
import sys

import pytest

from cct import cli
from cct.driver.balance import parse_batch_sizes
from cct.driver.staleness import schedule
from cct.errors import CCTError
from cct.flags import Flags

# A net of three layers and no database: a run takes a fraction of a second.
NET = """name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 }
    data_filler { type: "gaussian" } data_filler { type: "constant" value: 0.5 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "cls" type: "DummyData" top: "cls" include { phase: TEST }
  dummy_data_param { shape { dim: 4 } data_filler { type: "constant" value: 1 } } }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "cls" top: "acc"
  include { phase: TEST } }
"""
SOLVER = """net: "net.prototxt"
base_lr: 0.01
momentum: 0.9
lr_policy: "fixed"
max_iter: 4
display: 2
test_iter: 1
test_interval: 2
snapshot: 2
snapshot_prefix: "tiny"
solver_mode: CPU
random_seed: 1
"""


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(SOLVER)
    return tmp_path


def cct(*args, cwd):
    return subprocess.run([sys.executable, "-m", "cct.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def one_error(err: str) -> str:
    """The run's only line on stderr, a cct error; no traceback."""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cct: error: "), err[-2000:]
    return lines[0]


# Refused before any file is read: the solver named need not exist.
@pytest.mark.parametrize("flags, needle", [
    (["--optimize", "--target-accuracy=2"], "-target-accuracy must be in (0, 1], got '2'"),
    (["--optimize", "--target-accuracy=-1"], "-target-accuracy must be in (0, 1], got '-1'"),
    (["--optimize", "--target-accuracy=nan"], "-target-accuracy must be a finite number"),
    (["--optimize", "--target-loss=-1"], "-target-loss must be positive, got '-1'"),
    (["--optimize", "--target-loss=0"], "-target-loss must be positive, got '0'"),
    (["--optimize", "--target-loss=inf"], "-target-loss must be a finite number"),
    (["--optimize", "--budget=0"], "-budget must be positive, got '0'"),
    (["--optimize", "--budget=-10"], "-budget must be positive, got '-10'"),
    (["--optimize", "--retune-every=-5"], "-retune-every must be at least 0, got '-5'"),
    (["--optimize", "--probe-share=1"], "-probe-share must be in (0, 1), got '1'"),
    (["--optimize", "--probe-share=nan"], "-probe-share must be a finite number"),
    (["--strategy=async", "--engine=ray", "--ray-group-restarts=-1"],
     "-ray-group-restarts must be at least 0, got '-1'"),
    (["--strategy=async", "--engine=ray", "--ray-data=lcoal"],
     "-ray-data must be ship (the driver reads and ships batches) or local (each group reads "
     "its part of the LMDB), got 'lcoal'. Did you mean 'local'?"),
    (["--strategy=async", "--engine=ray", "--ps-shards=0"],
     "-ps-shards must be a count of at least 1 or 'auto', got '0'"),
    (["--strategy=adaptive-hogbatch", "--threshold=0"], "-threshold must be in (0, 1), got '0'"),
    (["--strategy=adaptive-hogbatch", "--threshold=nan"], "-threshold must be a finite number"),
    (["--strategy=sma", "--sync-period=0"], "-sync-period must be at least 1, got '0'"),
    (["--strategy=sma", "--sma-alpha=1.5"], "-sma-alpha must be in [0, 1], got '1.5'"),
    (["--strategy=sma", "--sma-momentum=-1"], "-sma-momentum must be in [0, 1), got '-1'"),
    (["--strategy=sma", "--sma-momentum=1"], "-sma-momentum must be in [0, 1), got '1'"),
    (["--strategy=sma", "--learners=0"], "-learners must be at least 1, got '0'"),
    (["--strategy=async", "--engine=simulated", "--staleness=exponential", "--seed=-1"],
     "-seed must be at least 0, got '-1' (NumPy's generators take no negative seed)"),
    (["--strategy=async", "--engine=simulated", "--simulate-speeds=1,nan"],
     "-simulate-speeds must be positive finite speeds"),
    (["--strategy=async", "--engine=simulated", "--simulate-speeds=1,-2"],
     "-simulate-speeds must be positive finite speeds"),
    (["--momentum=-1"], "-momentum must be a finite number of at least 0 (below: add "
                        "-allow-negative-momentum), got '-1'"),
    (["--momentum=nan"], "-momentum must be a finite number of at least 0"),
    (["--strategy=async", "--momentum=inf"], "-momentum must be a finite number"),
    (["--momentum=inf", "--allow-negative-momentum"], "-momentum must be a finite number, got"),
    (["--level=99999999999999999999"], "-level must be in [-2147483648, 2147483647]"),
])
def test_bad_values_name_their_flag(capsys, flags, needle):
    assert cli.main(["train", "-solver=nowhere.prototxt", *flags]) == 1
    err = one_error(capsys.readouterr().err)
    assert err.startswith("cct: error: train: ") and needle in err, err


@pytest.mark.parametrize("flags, needle", [
    (["--engine=ray"], "-engine=ray does nothing with -strategy=sync (one update stream, no "
                       "groups): -engine runs the groups of the driver's strategies; give "
                       "-strategy=async (or hogbatch, adaptive-hogbatch, sma) or leave -engine "
                       "out"),
    (["--engine=threads"], "-engine=threads does nothing with -strategy=sync"),
    (["--groups=4"], "-groups=4 does nothing with -strategy=sync"),
    (["--batch-sizes=8"], "-batch-sizes=8 does nothing with -strategy=sync"),
    (["--sync-period=2"], "-sync-period=2 does nothing with -strategy=sync"),
    (["--strategy=async", "--staleness=exponential"],
     "-staleness=exponential does nothing with -engine=threads"),
    (["--strategy=async", "--engine=simulated", "--seed=3"],
     "-seed=3 does nothing with -staleness=round-robin"),
    (["--strategy=async", "--engine=simulated", "--simulate-speeds=1,2", "--staleness=exponential"],
     "-staleness=exponential does nothing with -simulate-speeds"),
    (["--strategy=async", "--engine=simulated", "--ray-address=auto"],
     "-ray-address=auto does nothing with -engine=simulated"),
    (["--strategy=async", "--learners=2"], "-learners=2 does nothing with -strategy=async: "
                                           "-learners is for -strategy=sma"),
    (["--strategy=hogbatch", "--threshold=0.1"], "-threshold=0.1 does nothing with "
                                                 "-strategy=hogbatch"),
    (["--strategy=sma", "--sync-fc"], "-sync-fc=true does nothing with -strategy=sma"),
    (["--strategy=sma", "--momentum=0.5"], "-momentum=0.5 does nothing with -strategy=sma"),
    (["--strategy=sma", "--learners=2", "--groups=3"], "-groups=3 does nothing with -learners"),
    (["--strategy=async", "--allow-negative-momentum"],
     "-allow-negative-momentum=true does nothing without -momentum"),
    (["--target-loss=0.1"], "-target-loss=0.1 does nothing without -optimize"),
    (["--optimize", "--strategy=async"], "-strategy=async does nothing with -optimize"),
    (["--optimize", "--seed=3"], "-seed=3 does nothing with -optimize"),
    (["--strategy=asnyc"], "unknown -strategy 'asnyc'; known: sync, async, hogbatch, "
                           "adaptive-hogbatch, sma. Did you mean 'async', 'sync'?"),
])
def test_a_flag_the_settings_do_not_use_is_an_error_naming_both(capsys, flags, needle):
    assert cli.main(["train", "-solver=nowhere.prototxt", *flags]) == 1
    err = one_error(capsys.readouterr().err)
    assert needle in err, err


@pytest.mark.parametrize("flags, needle", [
    (["-bandwidth=-1"], "plan: -bandwidth must be positive, got '-1'"),
    (["-bandwidth=nan"], "plan: -bandwidth must be a finite number"),
    (["-staleness=exponential"], "-staleness=exponential does nothing without -cluster"),
    (["-cluster=nodes=2,bandwidth=1e9", "-bandwidth=1e9"], "-bandwidth=1e9 does nothing with "
                                                           "-cluster"),
    (["-probe-share=0"], "plan: -probe-share must be in (0, 1), got '0'"),
])
def test_plan_flags(capsys, flags, needle):
    assert cli.main(["plan", "-solver=nowhere.prototxt", *flags]) == 1
    assert needle in one_error(capsys.readouterr().err)


def test_momentum_values_accepted():
    def momentum(*argv, strategy="sync"):
        flags = Flags("train", list(argv), {"momentum": ""},
                      booleans=("allow-negative-momentum",))
        return cli._momentum(flags, strategy)
    assert momentum("-momentum=0.5") == "0.5"
    assert momentum("-momentum=-0.1", "-allow-negative-momentum") == "-0.1"
    assert momentum("-momentum=auto", strategy="async") == "auto"
    assert momentum() is None


def test_huge_batch_sizes_name_the_flag(tiny):
    run = cct("train", "--solver=solver.prototxt", "--strategy=hogbatch", "--groups=2",
              "--engine=simulated", "--batch-sizes=99999999999999999999,16", cwd=tiny)
    assert run.returncode == 1
    err = [l for l in run.stderr.splitlines() if "Traceback" in l or "error" in l]
    assert err == [err[0]] and "--batch-sizes=99999999999999999999,16: a batch above " \
        "2147483647 (INT_MAX)" in err[0], run.stderr[-2000:]


def test_batch_sizes_and_seed_from_python():
    with pytest.raises(CCTError, match="a batch above 2147483647"):
        parse_batch_sizes("16,2147483648", [[], []])
    assert parse_batch_sizes("16,2147483647", [[], []]) == [16, 2147483647]
    with pytest.raises(CCTError, match=r"seed \(--seed\) must be an integer of at least 0"):
        schedule("exponential", 2, seed=-1)


@pytest.mark.parametrize("setting, needle", [
    ({"target_accuracy": 2.0}, "--target-accuracy must be in (0, 1]"),
    ({"target_accuracy": float("nan")}, "--target-accuracy must be in (0, 1]"),
    ({"target_loss": -1.0}, "--target-loss must be a positive finite loss"),
    ({"target_loss": float("inf")}, "--target-loss must be a positive finite loss"),
    ({"budget": 0.0}, "--budget must be a positive finite number of seconds"),
    ({"retune_every": -5}, "--retune-every must be at least 0 iterations"),
])
def test_the_optimizer_refuses_the_same_values_from_python(setting, needle):
    from cct.optimizer import Optimizer
    # Checked before the solver is looked at.
    with pytest.raises(CCTError) as e:
        Optimizer(None, **setting)
    assert needle in str(e.value)


def test_unknown_flag_suggests_and_stays_on_one_line(capsys):
    assert cli.main(["train", "--stratgy=async"]) == 1
    err = one_error(capsys.readouterr().err)
    assert err == ("cct: error: train: unknown flag -stratgy. Did you mean '-strategy', "
                   "'-stage'? (cct train --help lists its flags)")


def test_unknown_command_suggests_and_stays_on_one_line():
    run = cct("trian", cwd=".")
    assert run.returncode == 1
    assert one_error(run.stderr) == ("cct: error: unknown command 'trian'. Did you mean "
                                     "'train'? (cct --help lists the commands)")


def test_help_types_follow_the_defaults(capsys):
    assert cli.main(["train", "--help"]) == 0
    out = re.sub(r"\s+", " ", capsys.readouterr().out)
    for name, default in (("sma-momentum", "0"), ("threshold", "0.05"),
                          ("probe-share", "0.1")):
        assert re.search(rf"--{name} \(.*?\) type: double default: {default} ", out), name
    assert "--seed (" in out and re.search(r"--seed \(.*?\) type: int32 default: 0 ", out)


def test_sync_run_ends_with_a_summary_parse_log_passes_over(tiny):
    from cct.tools.parse_log import parse_log

    run = cct("train", "--solver=solver.prototxt", cwd=tiny)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stderr.rstrip().splitlines()
    tail = [l.split("] ", 1)[1] for l in lines[-4:]]
    assert tail[0] == "Optimization Done." and "solver.cpp:332]" in lines[-4]
    m = re.fullmatch(r"Trained 4 iterations \([\d.e+-]+ iter/s, [\d.e+-]+s/4 iters\); "
                     r"test net #0: acc ([\d.e+-]+) \(best ([\d.e+-]+)\), "
                     r"loss ([\d.e+-]+) \(best ([\d.e+-]+)\)", tail[1])
    assert m, tail[1]
    # Each output's last score, and its best: an accuracy's highest, a loss's lowest.
    accs = [float(v) for v in re.findall(r"Test net output #0: acc = ([\d.e+-]+)", run.stderr)]
    losses = [float(v) for v in re.findall(r"Test net output #1: loss = ([\d.e+-]+)",
                                           run.stderr)]
    assert len(accs) == len(losses) == 3
    assert [float(v) for v in m.groups()] == pytest.approx(
        [accs[-1], max(accs), losses[-1], min(losses)], rel=1e-5)
    assert tail[2] == ("Snapshots written: 2, the last tiny_iter_4.caffemodel and "
                       "tiny_iter_4.solverstate")
    assert tail[3] == "Optimization Done." and "caffe.cpp:250]" in lines[-1]
    assert all("caffe.cpp:249]" in l for l in lines[-3:-1])
    # Caffe's log tools read the same tables with and without the summary.
    (tiny / "with.log").write_text(run.stderr)
    (tiny / "without.log").write_text("\n".join(l for l in lines if "caffe.cpp:249]" not in l)
                                      + "\n")
    assert parse_log(str(tiny / "with.log")) == parse_log(str(tiny / "without.log"))


def test_a_resumed_driven_run_counts_its_own_iterations_and_snapshots(tiny):
    assert cct("train", "--solver=solver.prototxt", cwd=tiny).returncode == 0
    run = cct("train", "--solver=solver.prototxt", "--snapshot=tiny_iter_2.solverstate",
              "--strategy=async", "--groups=2", "--engine=simulated", cwd=tiny)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"caffe\.cpp:249\] Trained 2 iterations \(", run.stderr)
    assert ("caffe.cpp:249] Snapshots written: 1, the last tiny_iter_4.caffemodel and "
            "tiny_iter_4.solverstate") in run.stderr


def test_group_timeout_is_checked_and_only_for_the_engines_that_use_it(tmp_path, capsys):
    """-group-timeout bounds the wait for a group process or actor: a positive number of
    seconds, refused with the threads engine (a thread cannot be stopped)."""
    from cct import cli
    (tmp_path / "s.prototxt").write_text('net: "n.prototxt" base_lr: 0.1 lr_policy: "fixed"')
    for extra, words in ((["-strategy=async", "-engine=processes", "-group-timeout=-3"],
                          "-group-timeout"),
                         (["-strategy=async", "-group-timeout=30"],
                          "-group-timeout=30 does nothing with -engine=threads")):
        assert cli.main(["train", f"-solver={tmp_path / 's.prototxt'}", *extra]) == 1
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
