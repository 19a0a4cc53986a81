"""Atomic, durable file writes: a file appears under its name complete or not at all.

:func:`atomic_write` writes ``<path>.tmp-<pid>`` in the same folder, flushes it to the disk,
renames it to ``path`` and flushes the folder, so that neither a crash, a full disk nor a power
cut leaves a half-written or renamed-but-empty file under ``path`` (a rename may reach the disk
before the data it names unless that data was fsynced first). A process killed mid-write leaves
its temporary file behind; :func:`remove_stale_temp_files` sweeps those whose writer is gone.
The processes engine's shared-memory blocks, left in /dev/shm by a driver killed with SIGKILL,
are swept the same way by :func:`remove_stale_shared_memory`.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
from typing import Callable, Dict, List, Optional

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


SHARED_MEMORY_PREFIX = "cct_"   # a block is named cct_<pid of the driver that made it>_...
_SHARED_MEMORY_NAME = re.compile(re.escape(SHARED_MEMORY_PREFIX) + r"(\d+)_")
SHARED_MEMORY_FOLDER = "/dev/shm"   # where Linux keeps POSIX shared memory, by name


def hold_shared_memory(name: str, folder: str = SHARED_MEMORY_FOLDER) -> Optional[int]:
    """A shared lock on block ``name`` for as long as the returned descriptor is open (the
    kernel drops it with the process, however it ends): the block is in use. The pid in its
    name alone is not enough where drivers in other pid namespaces share /dev/shm (containers
    with a shared IPC namespace): there a live driver's pid may not exist. None where the
    system keeps no such folder."""
    try:
        fd = os.open(os.path.join(folder, name.lstrip("/")), os.O_RDONLY)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def remove_stale_shared_memory(folder: str = SHARED_MEMORY_FOLDER) -> List[str]:
    """Unlink the shared-memory blocks whose driver is gone (killed before it could unlink
    them: SIGKILL, the OOM killer): named by a pid that is not running, and held by no one
    (:func:`hold_shared_memory`). A running driver's blocks, this process's included, stay.
    Returns the names removed (none where the system keeps no such folder)."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = _SHARED_MEMORY_NAME.match(name)
        if not m:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or _running(pid):
            continue
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue            # gone meanwhile, or not ours to read
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue            # held: a live driver's, in another pid namespace
        try:
            if _remove(path):
                removed.append(name)
        finally:
            os.close(fd)
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
