"""Signals and hangs in the driver (issue 31): a terminal's SIGINT or SIGHUP, sent to the whole
process group, is the driver's to act on (Caffe's -sigint_effect / -sighup_effect), never the
death of the processes engine's groups; a group that stops answering is dropped after the
answer timeout; a killed driver's shared blocks are removed by the next one; --groups is
bounded before anything is built."""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from multiprocessing import shared_memory

import pytest
from google.protobuf import text_format

from cct.api import Solver
from cct.driver import Driver
from cct.driver.engines import AnswerTimeout
from cct.errors import CCTError
from cct.io.atomic import SHARED_MEMORY_FOLDER, SHARED_MEMORY_PREFIX, hold_shared_memory

from ..test_scheduler import data_list, solver_param  # noqa: F401  (fixture)


@contextlib.contextmanager
def deadline(seconds):
    """Fail the test instead of hanging it (SIGALRM interrupts a blocking wait)."""
    def expired(*_):
        raise TimeoutError(f"the test did not finish within {seconds} s")
    before = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def _dead_pid() -> int:
    """A pid no process has (one just reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# -- 1. a terminal's signals -----------------------------------------------------------------
@pytest.mark.parametrize("signum, flags, stops", [
    (signal.SIGINT, ["--sigint_effect=snapshot"], False),
    (signal.SIGHUP, [], False),                      # -sighup_effect defaults to snapshot
    (signal.SIGINT, [], True),                       # -sigint_effect defaults to stop
])
def test_a_terminals_signal_to_the_process_group_is_the_drivers(data_list, tmp_path,  # noqa: F811
                                                                signum, flags, stops):
    # base_lr 0.01, not the fixture's 0.05: two asynchronous group processes at momentum 0.9
    # and 0.05 can diverge within the ~50 iterations before the signal lands (real staleness,
    # a different run each time: once, "loss is infinite at iteration 52"), and this test is
    # about the signal, not the step size.
    param = solver_param(data_list, tmp_path, display=10, max_iter=300, base_lr=0.01)
    (tmp_path / "solver.prototxt").write_text(text_format.MessageToString(param))
    log_path = tmp_path / "log.txt"
    with open(log_path, "w") as log:
        run = subprocess.Popen(
            [sys.executable, "-m", "cct.cli", "train", "--solver=solver.prototxt",
             "--strategy=async", "--groups=2", "--engine=processes", *flags],
            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        give_up = time.monotonic() + 120
        while "] Iteration 20 " not in log_path.read_text():
            assert run.poll() is None and time.monotonic() < give_up, log_path.read_text()
            time.sleep(0.05)
        os.killpg(run.pid, signum)        # what a terminal does: the whole process group
        assert run.wait(timeout=120) == 0, log_path.read_text()[-3000:]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    log = log_path.read_text()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log
    assert "dropped" not in log and "every compute group failed" not in log
    snapshots = [int(i) for i in re.findall(r"Snapshotting to binary proto file "
                                            r"\S+_iter_(\d+)\.caffemodel", log)]
    if stops:      # Caffe: a snapshot of the iteration reached, then "Optimization Done."
        assert len(snapshots) == 1 and snapshots[0] < 300, log[-3000:]
    else:          # the snapshot asked for, then on to max_iter and its own snapshot
        assert len(snapshots) == 2 and snapshots[0] < 300 and snapshots[1] == 300, log[-3000:]
    assert log.rstrip().endswith("Optimization Done.")


# -- 2. a group that stops answering ---------------------------------------------------------
def _run_state(pid):
    """The process's state letter from /proc ("T": stopped), or None where there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_a_stopped_group_process_is_dropped_after_the_timeout(data_list, tmp_path,  # noqa: F811
                                                              capfd):
    param = solver_param(data_list, tmp_path, display=0, max_iter=40)
    solver = Solver(param)
    driver = Driver(solver, groups=2, engine="processes", group_timeout=2)
    victim = driver.groups[1]
    try:
        with deadline(120):
            driver.step(4)
            os.kill(victim.process.pid, signal.SIGSTOP)
            # The last update comes from group 0; group 1, still computing, is waited for
            # only up to the timeout, and dropped.
            driver.step(1)
            log = capfd.readouterr().err
            if len(driver.groups) == 2 and _run_state(victim.process.pid) not in (None, "T"):
                # Something sent SIGCONT and the group answered within its timeout: kept, as
                # it should be. The kernel does that to the stopped members of a process group
                # left orphaned (no parent outside it in the session) when a member exits, as
                # under `nohup ... &` once the starting shell is gone: the one cause I can name
                # for the run seen keeping group 1 (bench/RESULTS.md). Still stopped ("T") and
                # kept would be the driver's fault, and fails below.
                pytest.skip("the stopped group process was continued from outside the test")
            assert [g.index for g in driver.groups] == [0]
            assert re.search(rf"group 1 \(pid {victim.process.pid}, .*\) failed and is dropped:"
                             rf" NoAnswer: the process did not answer within 2 s", log), log
            driver.step(5)
            assert solver.iter == 10
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim.process.pid, signal.SIGKILL)
        driver.close()
        solver.close()


def test_the_answer_timeout_follows_the_slowest_step_above_a_floor():
    t = AnswerTimeout()
    assert t() == AnswerTimeout.FLOOR
    t.seen(AnswerTimeout.FLOOR)
    assert t() == AnswerTimeout.FACTOR * AnswerTimeout.FLOOR
    assert AnswerTimeout(3)() == 3
    with pytest.raises(CCTError, match="group timeout must be a positive number"):
        AnswerTimeout(0)


# -- 5. a killed driver's shared blocks --------------------------------------------------------
@pytest.mark.skipif(not os.path.isdir(SHARED_MEMORY_FOLDER), reason="no /dev/shm")
def test_the_next_driver_removes_a_killed_drivers_shared_blocks(data_list, tmp_path,  # noqa: F811
                                                                capfd):
    dead = shared_memory.SharedMemory(create=True, size=64,
                                      name=f"{SHARED_MEMORY_PREFIX}{_dead_pid()}_0_test")
    live = shared_memory.SharedMemory(create=True, size=64,
                                      name=f"{SHARED_MEMORY_PREFIX}{os.getppid()}_0_test")
    # A live driver in another pid namespace (a container sharing /dev/shm): its pid is not
    # one here, but it holds its block.
    other = shared_memory.SharedMemory(create=True, size=64,
                                       name=f"{SHARED_MEMORY_PREFIX}{_dead_pid()}_0_held")
    held = hold_shared_memory(other.name)
    solver = Solver(solver_param(data_list, tmp_path, display=0))
    try:
        with deadline(120):
            driver = Driver(solver, groups=1, engine="processes")
            driver.close()
        names = os.listdir(SHARED_MEMORY_FOLDER)
        assert dead.name.lstrip("/") not in names and live.name.lstrip("/") in names
        assert other.name.lstrip("/") in names
        assert f"Removed shared block '{dead.name.lstrip('/')}'" in capfd.readouterr().err
        assert not [n for n in names if n.startswith(f"{SHARED_MEMORY_PREFIX}{os.getpid()}_")]
    finally:
        solver.close()
        os.close(held)
        for block in (dead, live, other):
            block.close()
            with contextlib.suppress(FileNotFoundError):
                block.unlink()


# -- 6. --groups bounded ---------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["threads", "processes", "simulated"])
def test_a_million_groups_are_refused_before_anything_is_built(data_list, tmp_path,  # noqa: F811
                                                               engine):
    solver = Solver(solver_param(data_list, tmp_path, display=0))
    try:
        with deadline(30), pytest.raises(CCTError, match=rf"--groups=1000000 with "
                                                         rf"--engine={engine}: .*lower --groups"):
            Driver(solver, groups=1000000, engine=engine)
    finally:
        solver.close()


# -- 3. --ray-address ------------------------------------------------------------------------
@pytest.mark.parametrize("address, needle", [
    ("not an address", "--ray-address must be host:port (the head node's GCS address"),
    ("host:99999", "--ray-address must be host:port"),
    ("127.0.0.1:{closed}", "--ray-address=127.0.0.1:{closed}: cannot connect (Connection "
                           "refused); start the cluster"),
])
def test_a_bad_ray_address_is_one_line(data_list, tmp_path, address, needle):  # noqa: F811
    pytest.importorskip("ray")
    import socket
    with socket.socket() as s:      # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    param = solver_param(data_list, tmp_path, display=0)
    (tmp_path / "solver.prototxt").write_text(text_format.MessageToString(param))
    run = subprocess.run([sys.executable, "-m", "cct.cli", "train", "--solver=solver.prototxt",
                          "--strategy=async", "--engine=ray",
                          f"--ray-address={address.format(closed=closed)}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert f"cct: error: {needle.format(closed=closed)}" in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr


class _FakeRay:
    """ray.init as a cluster that fails (``error``) or never answers."""

    def __init__(self, error=None):
        self.error = error
        self.released = __import__("threading").Event()

    def init(self, **kw):
        if self.error is not None:
            raise self.error
        self.released.wait(60)


def test_a_ray_connection_that_fails_or_never_answers_is_one_error(monkeypatch):
    import socket

    from cct.driver import ray_engine
    monkeypatch.setattr(ray_engine, "_CONNECT_SECONDS", 1)
    fake = _FakeRay(ConnectionError("Could not find any running Ray instance.\nmore"))
    with pytest.raises(CCTError, match=r"--ray-address=auto: Ray could not connect \(Could not "
                                       r"find any running Ray instance\.\); start the cluster"):
        ray_engine.connect(fake, "auto")
    with socket.socket() as server, deadline(30):   # listens, and never speaks Ray
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        silent = _FakeRay()
        try:
            with pytest.raises(CCTError, match=rf"--ray-address={address}: no Ray cluster "
                                               rf"answered within 1 s"):
                ray_engine.connect(silent, address)
        finally:
            silent.released.set()


def test_a_full_dev_shm_or_no_process_left_is_one_error(data_list, tmp_path,  # noqa: F811
                                                        monkeypatch):
    import errno

    from cct.driver import processes
    solver = Solver(solver_param(data_list, tmp_path, display=0))
    try:
        def no_space(**kw):
            raise OSError(errno.ENOSPC, "No space left on device")
        with monkeypatch.context() as m:
            m.setattr(processes.shared_memory, "SharedMemory", no_space)
            with pytest.raises(CCTError, match=r"group 0: cannot make its shared block of \d+ "
                                               r"bytes: No space left on device \(.*--shm-size"):
                Driver(solver, groups=1, engine="processes")

        def no_process(*args):
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        monkeypatch.setattr(processes.ProcessGroup, "_start", no_process)
        with pytest.raises(CCTError, match=r"group 0: cannot start its process: Resource "
                                           r"temporarily unavailable \(.*lower --groups"):
            Driver(solver, groups=1, engine="processes")
        if os.path.isdir(SHARED_MEMORY_FOLDER):      # its block went with it
            assert not [n for n in os.listdir(SHARED_MEMORY_FOLDER)
                        if n.startswith(f"{SHARED_MEMORY_PREFIX}{os.getpid()}_")]
    finally:
        solver.close()
