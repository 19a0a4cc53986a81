"""Atomic, durable file writes: a file appears under its name complete or not at all.

:func:`atomic_write` writes ``<path>.tmp-<pid>`` in the same folder, flushes it to the disk,
renames it to ``path`` and flushes the folder, so that neither a crash, a full disk nor a power
cut leaves a half-written or renamed-but-empty file under ``path`` (a rename may reach the disk
before the data it names unless that data was fsynced first). A process killed mid-write leaves
its temporary file behind; :func:`remove_stale_temp_files` sweeps those whose writer is gone.
"""
from __future__ import annotations

import errno
import os
import re
from typing import Callable, Dict, List

import numpy as np

from ..errors import CCTError

TEMP_MARK = ".tmp-"   # a temporary file is named <final name>.tmp-<pid of its writer>
_TEMP_NAME = re.compile(re.escape(TEMP_MARK) + r"(\d+)$")


def temp_name(path: str) -> str:
    """The name :func:`atomic_write` writes ``path`` under until it is complete."""
    return f"{path}{TEMP_MARK}{os.getpid()}"


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Call ``write(tmp)`` to write the file under a temporary name beside ``path``, then make
    it ``path`` durably. On failure the temporary file is removed and a CCTError names
    ``path``; an exception of ``write`` other than OSError passes through (after the removal)."""
    tmp = temp_name(path)
    try:
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
        fsync_folder(os.path.dirname(path) or ".")
    except OSError as e:
        _remove(tmp)
        raise CCTError(f"cannot write '{path}': {e.strerror or e}") from None
    except BaseException:
        _remove(tmp)
        raise


def save_arrays(path: str, arrays: Dict[str, np.ndarray]) -> None:
    """Named arrays into an .npz file, atomically (the driver's files beside a snapshot)."""

    def write(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
    atomic_write(path, write)


def load_arrays(path: str, what: str) -> Dict[str, np.ndarray]:
    """The arrays of an .npz file written by :func:`save_arrays`; ValueError naming ``what``
    and the file when it cannot be read."""
    try:
        with np.load(path) as saved:
            return {k: saved[k] for k in saved.files}
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {what} '{path}': {e}") from None


def remove_stale_temp_files(folder: str, name_prefix: str) -> List[str]:
    """Remove the temporary files in ``folder`` whose names start with ``name_prefix`` and that
    no running writer will finish: those of processes that are gone, and this process's own
    (called by the one writer of these names in this process, between its writes, so one
    found here comes from an earlier process that had the same pid, as restarted containers
    often do). Returns the paths removed."""
    removed = []
    try:
        names = os.listdir(folder or ".")
    except OSError:
        return removed   # the write that follows reports an unusable folder
    for name in names:
        m = _TEMP_NAME.search(name)
        if not (m and name.startswith(name_prefix)):
            continue
        pid = int(m.group(1))
        if pid != os.getpid() and _running(pid):
            continue
        path = os.path.join(folder, name)
        if _remove(path):
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True   # another user's process
    except OverflowError:
        return False  # beyond any pid
    return True


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(folder: str) -> None:
    """Make a rename in ``folder`` durable; file systems that cannot sync a folder (EINVAL)
    keep their own guarantees."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def _remove(path: str) -> bool:
    """Remove a file if possible; a cleanup never hides the error that called for it."""
    try:
        os.remove(path)
    except OSError:
        return False
    return True
