"""glog's held lines (the optimizer's kept probes): INFO lines wait, warnings do not, and
released lines come out in order with the time of their release; glog's environment variables
(GLOG_minloglevel, GLOG_logtostderr, GLOG_alsologtostderr, GLOG_stderrthreshold, GLOG_log_dir)
and pycaffe's init_log."""
import logging
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest

from cct import glog


def test_held_lines_wait_and_come_out_stamped_at_release(capfd):
    capfd.readouterr()
    with glog.held() as lines:
        glog.info("solver.cpp:239", "Iteration 0, loss = 2.3")
        glog.warning("solver.cpp:1", "a warning is not held")
        glog.info("solver.cpp:239", "Iteration 1, loss = 2.2")
    during = capfd.readouterr().err
    assert "a warning is not held" in during and "Iteration" not in during
    assert len(lines) == 2
    glog.info("optimizer.py:0", "after the probe")
    time.sleep(0.01)
    glog.release(lines)
    out = capfd.readouterr().err.splitlines()
    assert [line.split("] ", 1)[1] for line in out] == [
        "after the probe", "Iteration 0, loss = 2.3", "Iteration 1, loss = 2.2"]
    stamps = [re.match(r"I\d{4} (\S+)", line).group(1) for line in out]
    assert stamps == sorted(stamps) and stamps[0] < stamps[1]


# -- glog's environment variables ------------------------------------------------------------
NET = """name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 4 } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
"""
FILE = re.compile(r"^(?P<program>.+)\.(?P<host>[^.]+(?:\.[^.]+)*)\.(?P<user>[^.]+)\.log\."
                  r"(?P<severity>INFO|WARNING|ERROR|FATAL)\.\d{8}-\d{6}\.(?P<pid>\d+)$")


@pytest.fixture
def glog_env(monkeypatch):
    """No GLOG_* variable but those a test sets; the log set up again from the real
    environment afterwards (stderr, INFO), for the tests that follow."""
    for name in list(os.environ):
        if name.startswith("GLOG_"):
            monkeypatch.delenv(name)
    yield monkeypatch
    monkeypatch.undo()
    glog.init_log()


def _log_three():
    glog.info("net.cpp:86", "an info line")
    glog.warning("net.cpp:87", "a warning line")
    glog.error("net.cpp:88", "an error line")


def _messages(text):
    """The messages of a text's glog lines (not of a log file's header)."""
    return [line.split("] ", 1)[1] for line in text.splitlines()
            if re.match(r"[IWEF]\d{4} ", line)]


def _log_files(directory):
    """severity -> (file name, its log lines' messages), and the symlinks' targets."""
    files, links = {}, {}
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.islink(path):
            links[name] = os.readlink(path)
        else:
            m = FILE.match(name)
            assert m, name
            assert int(m["pid"]) == os.getpid() and m["program"] == glog._settings.program
            with open(path) as f:
                text = f.read()
            assert text.startswith("Log file created at: ")
            files[m["severity"]] = (name, _messages(text))
    return files, links


def test_a_net_build_at_minloglevel_2_writes_nothing(tmp_path):
    """What Caffe users set to silence pycaffe: a Net builds without one line."""
    (tmp_path / "net.prototxt").write_text(NET)
    code = "import cct; cct.Net('net.prototxt', cct.TEST)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLOG_")}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, env={**env, "GLOG_minloglevel": "2"}, timeout=120)
    assert run.returncode == 0 and run.stderr == "", run.stderr[-2000:]
    loud = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=120)
    assert "Creating Layer ip" in loud.stderr                   # today's default: stderr


@pytest.mark.parametrize("level,shown", [("0", 3), ("1", 2), ("2", 1), ("3", 0)])
def test_minloglevel_drops_the_lines_below_it(glog_env, capfd, level, shown):
    glog_env.setenv("GLOG_minloglevel", level)
    glog.init_log()
    capfd.readouterr()
    _log_three()
    assert _messages(capfd.readouterr().err) == [
        "an info line", "a warning line", "an error line"][3 - shown:]


def test_quiet_keeps_a_higher_minloglevel(glog_env, capfd):
    glog_env.setenv("GLOG_minloglevel", "2")
    glog.init_log()
    with glog.quiet():
        _log_three()
    glog.set_quiet(False)               # back to the environment's level, not to INFO
    _log_three()
    assert _messages(capfd.readouterr().err) == ["an error line"] * 2


def test_log_dir_gets_glogs_files_and_stderr_the_errors(glog_env, capfd, tmp_path):
    glog_env.setenv("GLOG_log_dir", str(tmp_path))
    settings = glog.init_log()
    assert not settings.logtostderr and settings.stderrthreshold == 2
    capfd.readouterr()
    _log_three()
    assert _messages(capfd.readouterr().err) == ["an error line"]
    files, links = _log_files(tmp_path)
    assert files["INFO"][1] == ["an info line", "a warning line", "an error line"]
    assert files["WARNING"][1] == ["a warning line", "an error line"]
    assert files["ERROR"][1] == ["an error line"]
    assert "FATAL" not in files                 # made at its first line only
    program = glog._settings.program
    assert links == {f"{program}.{s}": files[s][0] for s in ("INFO", "WARNING", "ERROR")}
    glog.set_quiet(True)                        # init_log again: the same files go on
    glog.set_quiet(False)
    glog.info("net.cpp:89", "one more")
    again, _ = _log_files(tmp_path)
    assert again["INFO"] == (files["INFO"][0], files["INFO"][1] + ["one more"])


def test_stderrthreshold_and_alsologtostderr(glog_env, capfd, tmp_path):
    glog_env.setenv("GLOG_log_dir", str(tmp_path / "a"))
    glog_env.setenv("GLOG_stderrthreshold", "1")
    os.mkdir(tmp_path / "a")
    glog.init_log()
    capfd.readouterr()
    _log_three()
    assert _messages(capfd.readouterr().err) == ["a warning line", "an error line"]
    # Caffe's tools: the whole log on stderr as well as in the files
    glog_env.setenv("GLOG_log_dir", str(tmp_path / "b"))
    os.mkdir(tmp_path / "b")
    glog.init_log(alsologtostderr=True)
    _log_three()
    assert len(_messages(capfd.readouterr().err)) == 3
    assert len(_log_files(tmp_path / "b")[0]["INFO"][1]) == 3


def test_logtostderr_1_writes_no_file(glog_env, capfd, tmp_path):
    glog_env.setenv("GLOG_log_dir", str(tmp_path))
    glog_env.setenv("GLOG_logtostderr", "1")
    glog.init_log()
    capfd.readouterr()
    _log_three()
    assert len(_messages(capfd.readouterr().err)) == 3
    assert os.listdir(tmp_path) == []


def test_logtostderr_0_writes_files_in_the_temporary_directory(glog_env, capfd, tmp_path):
    glog_env.setenv("GLOG_logtostderr", "0")
    glog_env.setenv("TMPDIR", str(tmp_path))
    glog_env.setattr(tempfile, "tempdir", None)     # gettempdir() reads TMPDIR again
    glog.init_log()
    capfd.readouterr()
    glog.info("net.cpp:86", "an info line")
    assert capfd.readouterr().err == ""
    assert _log_files(tmp_path)[0]["INFO"][1] == ["an info line"]


def test_pycaffe_init_log_overrides_the_environment(glog_env, capfd, tmp_path):
    """caffe.init_log(level, stderr): the level and glog's logtostderr over the variables."""
    glog_env.setenv("GLOG_minloglevel", "2")
    glog.init_log(0)
    _log_three()
    glog_env.setenv("GLOG_log_dir", str(tmp_path))
    glog.init_log(1, True)
    _log_three()
    assert len(_messages(capfd.readouterr().err)) == 3 + 2
    assert os.listdir(tmp_path) == []


def test_a_value_not_understood_is_said_and_the_default_used(glog_env, capfd):
    glog_env.setenv("GLOG_minloglevel", "quiet")
    glog_env.setenv("GLOG_logtostderr", "maybe")
    settings = glog.init_log()
    assert settings.minloglevel == 0 and settings.logtostderr
    err = capfd.readouterr().err
    assert "GLOG_minloglevel='quiet' is not a severity; using 0 (INFO). Set it to 0 (INFO)" in err
    assert "GLOG_logtostderr='maybe' is neither 1 nor 0; ignored" in err
    assert all(line.startswith("W") for line in err.splitlines())


def test_a_log_dir_that_cannot_be_written_sends_the_log_to_stderr(glog_env, capfd, tmp_path):
    missing = tmp_path / "missing"
    glog_env.setenv("GLOG_log_dir", str(missing))
    glog.init_log()
    capfd.readouterr()
    _log_three()
    err = capfd.readouterr().err.splitlines()
    assert err[0] == (f"cct: warning: cannot write the log file in GLOG_log_dir '{missing}' "
                      "(No such file or directory); the log goes to stderr. Point GLOG_log_dir "
                      "at a writable directory, or set GLOG_logtostderr=1")
    assert _messages("\n".join(err[1:])) == ["an info line", "a warning line", "an error line"]
    assert logging.getLogger("cct").handlers[0].level == logging.NOTSET


def test_the_cli_keeps_the_whole_log_on_stderr_with_a_log_dir(tmp_path):
    """caffe.cpp sets FLAGS_alsologtostderr: `caffe train` with GLOG_log_dir still prints its
    whole log, and writes the files too."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, GLOG_log_dir=str(tmp_path))
    run = subprocess.run([sys.executable, "-m", "cct.cli", "device_query"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Querying CPU" in run.stderr
    assert any(p.name.startswith("cct") or ".log.INFO." in p.name for p in tmp_path.iterdir())
