"""Atomic writes (cct/io/atomic.py): fsynced before the rename and the folder after it, no
temporary file left on failure, and leftovers of killed writers swept."""
import errno
import os
import stat
import subprocess
import sys

import pytest

from cct.errors import CCTError
from cct.io.atomic import atomic_write, remove_stale_temp_files, temp_name


def write_bytes(data):
    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
    return write


def test_file_is_synced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src, dst):
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = tmp_path / "a.caffemodel"
    atomic_write(str(path), write_bytes(b"weights"))
    assert events == ["fsync file", "rename", "fsync folder"]
    assert path.read_bytes() == b"weights" and os.listdir(tmp_path) == ["a.caffemodel"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "a.solverstate"
    path.write_bytes(b"old")

    def full_disk(tmp):
        with open(tmp, "wb") as f:
            f.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CCTError, match=f"cannot write '{path}': No space left on device"):
        atomic_write(str(path), full_disk)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["a.solverstate"]


def test_a_failed_fsync_fails_the_write_before_the_rename(tmp_path, monkeypatch):
    path = tmp_path / "a.caffemodel"
    path.write_bytes(b"old")

    def io_error(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", io_error)
    with pytest.raises(CCTError, match="cannot write .*a.caffemodel': Input/output error"):
        atomic_write(str(path), write_bytes(b"new"))
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["a.caffemodel"]


def test_other_exceptions_pass_through_after_the_cleanup(tmp_path):
    def bad_format(tmp):
        open(tmp, "wb").close()
        raise ValueError("unknown format 'xyz'")

    with pytest.raises(ValueError, match="xyz"):
        atomic_write(str(tmp_path / "plot.xyz"), bad_format)
    assert os.listdir(tmp_path) == []


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temp_files_are_removed_and_live_writers_kept(tmp_path):
    dead, alive = dead_pid(), os.getppid()
    names = {
        f"snap_iter_20.caffemodel.tmp-{dead}": False,            # a killed writer's
        f"snap_iter_20.solverstate.cct.json.tmp-{dead}": False,
        os.path.basename(temp_name("snap_iter_40.solverstate")): False,  # ours: stale
        f"snap_iter_40.caffemodel.tmp-{alive}": True,             # being written
        f"other_iter_20.caffemodel.tmp-{dead}": True,             # another prefix
        "snap_iter_20.caffemodel": True,                          # not a temporary file
        f"snap_iter_20.caffemodel.tmp-{dead}.bak": True,
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    removed = remove_stale_temp_files(str(tmp_path), "snap_iter_")
    assert sorted(os.path.basename(p) for p in removed) == sorted(
        n for n, kept in names.items() if not kept)
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, kept in names.items() if kept)
    assert remove_stale_temp_files(str(tmp_path / "missing"), "snap_iter_") == []
