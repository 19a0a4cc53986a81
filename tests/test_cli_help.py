"""gflags' reporting flags: every command and tool answers -help/-helpshort with its flags and
defaults, and ``cct --version`` answers as ``caffe --version`` does; all exit with status 0."""
import subprocess
import sys

import pytest

import cct
from cct import cli
from cct.tools import TOOLS


def _cct(*argv):
    return subprocess.run([sys.executable, "-m", "cct.cli", *argv], capture_output=True,
                          text=True, timeout=120)


def _one_flag(command):
    """A flag the command takes, as its -help listing must show it."""
    flags = {"train": "solver", "test": "model", "time": "iterations", "device_query": "gpu",
             "export_onnx": "opset", "draw_net": "rankdir", "parse_log": "delimiter",
             "convert_imageset": "resize_width", "extract_features": "backend",
             "convert_mnist_data": "backend", "compute_image_mean": "backend"}
    return flags.get(command)


# Each spelling goes to some commands, so every command runs once and every spelling is seen.
SPELLINGS = ["--help", "-help", "--helpshort", "-helpshort", "--helpfull"]


@pytest.mark.parametrize("command", sorted(set(cli.COMMANDS) | set(TOOLS)))
def test_every_command_answers_help(command):
    spelling = SPELLINGS[sorted(set(cli.COMMANDS) | set(TOOLS)).index(command) % len(SPELLINGS)]
    run = _cct(command, spelling)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr + run.stdout
    assert f"cct {command}" in run.stdout
    flag = _one_flag(command)
    if flag:
        assert f"--{flag} (" in run.stdout and "default:" in run.stdout


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_help_wins_over_other_flags_and_their_errors(capsys, spelling):
    assert cli.main(["convert_mnist_data", "--bogus", "x", spelling]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cct convert_mnist_data")
    assert '--backend (' in out and 'default: "lmdb"' in out


def test_help_lists_defaults_and_types(capsys):
    assert cli.main(["convert_imageset", "-help"]) == 0
    out = capsys.readouterr().out
    assert "type: bool default: false" in out
    assert "type: int32 default: 0" in out
    assert "ROOTFOLDER/ LISTFILE DB" in out   # the tool's usage line


def test_help_false_is_accepted_and_ignored(capsys):
    assert cli.main(["train", "--help=false"]) == 1   # no -solver: train's own error
    assert "Need a solver" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["help"], ["-helpshort"]])
def test_cct_help_prints_the_global_usage(capsys, argv):
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.startswith("usage: cct <command>")


def test_version():
    run = _cct("--version")
    assert run.returncode == 0
    first = run.stdout.splitlines()[0]
    assert first == f"cct version {cct.__version__} (Caffe 1.0.0 compatible)"


@pytest.mark.parametrize("argv", [["-version"], ["train", "-version"]])
def test_version_spellings(capsys, argv):
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.startswith("cct version ")


def test_unknown_flag_is_still_an_error(capsys):
    assert cli.main(["train", "--helpme"]) == 1
    assert "unknown flag -helpme" in capsys.readouterr().err
