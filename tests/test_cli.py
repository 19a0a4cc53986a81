"""The ``cct`` command itself: interrupts and argument checks common to its commands."""
import signal
import subprocess
import sys

import pytest

from cct import cli

INTERRUPT_WHILE_LOADING = """
import os, signal, sys

class Interrupt:
    '''Ctrl-C arrives while the cct package is being imported.'''
    def find_spec(self, name, path=None, target=None):
        if name == "cct.net":
            os.kill(os.getpid(), signal.SIGINT)

# A user's shell delivers Ctrl-C: whatever this test's parent did with SIGINT (ignored or
# blocked by a library in the test process) is not what a user's cct sees.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
sys.meta_path.insert(0, Interrupt())
import runpy
sys.argv = ["cct", "train", "-solver", "solver.prototxt"]
runpy.run_module("cct.cli", run_name="__main__")
"""


def test_ctrl_c_while_loading_prints_one_line_and_dies_by_sigint(tmp_path):
    run = subprocess.run([sys.executable, "-c", INTERRUPT_WHILE_LOADING], cwd=tmp_path,
                         capture_output=True, text=True)
    assert run.stderr == "cct: interrupted\n"
    assert run.returncode == -signal.SIGINT   # the shell's 130, as for Caffe


@pytest.mark.parametrize("command", ["test", "time"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_non_positive_iterations_are_refused(tmp_path, capsys, command, value):
    model = tmp_path / "net.prototxt"
    model.write_text('layer { name: "in" type: "Input" top: "data" '
                     'input_param { shape { dim: 1 dim: 2 } } }')
    argv = [command, "-model", str(model), "-iterations", value, "-weights", "w.caffemodel"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cct: error: {command}: -iterations must be at least 1 (got {value})")
    assert "Running for" not in err and "Benchmark" not in err
