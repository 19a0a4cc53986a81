"""Caffe's key-value databases (``util/db_lmdb.cpp``, ``util/db_leveldb.cpp``) for reading.

A cursor walks the keys in byte order, as Caffe's ``db::Cursor`` does: ``seek_to_first``,
``next``, ``valid``, ``key``, ``value``, plus ``seek`` to a key (used to resume exactly). LMDB
comes from py-lmdb; LevelDB from plyvel, an optional extra (the ``leveldb`` extra).
"""
from __future__ import annotations

import os
import threading

from ..errors import CCTError
from ..glog import info
from ..install import install_hint
from ..proto import caffe_pb2


def _looks_like_lmdb(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "data.mdb"))


def _looks_like_leveldb(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "CURRENT"))


# LMDB (py-lmdb) and LevelDB refuse to open one database twice in a process, which a train and
# a test net on the same database need: cursors share one read-only handle per folder, each
# with its own read transaction or iterator.
_handles: dict = {}
_handles_lock = threading.Lock()


def _acquire(path: str, opener):
    """(handle, key): the shared handle of the folder, and the key that releases it."""
    key = os.path.realpath(path)  # one folder is either an LMDB or a LevelDB
    with _handles_lock:
        if key not in _handles:
            _handles[key] = [opener(path), 0]
        _handles[key][1] += 1
        return _handles[key][0], key


def _release(key: str) -> None:
    with _handles_lock:
        entry = _handles[key]
        entry[1] -= 1
        if entry[1] == 0:
            entry[0].close()
            del _handles[key]


def _open_lmdb(path: str):
    import lmdb
    try:
        return lmdb.open(path, readonly=True, lock=False, readahead=False, max_readers=126,
                         subdir=True)
    except lmdb.Error as e:
        raise CCTError(f"cannot open LMDB '{path}': {e}") from None


def _open_leveldb(path: str):
    import plyvel
    try:
        return plyvel.DB(path, create_if_missing=False)
    except plyvel.Error as e:
        raise CCTError(f"cannot open LevelDB '{path}': {e}") from None


class LMDBCursor:
    """Read-only cursor over an LMDB folder (``data.mdb``) written by Caffe or by cct."""

    def __init__(self, path: str):
        if not os.path.exists(path):
            raise CCTError(f"LMDB '{path}' does not exist")
        if not os.path.isdir(path) or not _looks_like_lmdb(path):
            hint = (" It looks like a LevelDB: set `backend: LEVELDB` in data_param."
                    if os.path.isdir(path) and _looks_like_leveldb(path) else "")
            raise CCTError(f"'{path}' is not an LMDB (expected a folder holding data.mdb).{hint}")
        import lmdb
        self.path = path
        self._lmdb_error = lmdb.Error
        self.env, self._handle_key = _acquire(path, _open_lmdb)
        self.txn = self.env.begin(buffers=False)
        self.cursor = self.txn.cursor()
        try:
            self.valid = self._read(self.cursor.first)
        except CCTError:
            self.close()
            raise
        if not self.valid:
            self.close()
            raise CCTError(f"LMDB '{path}' holds no records")
        info("db_lmdb.cpp:35", f"Opened lmdb {path}")

    def _read(self, call, *args):
        """``call`` into py-lmdb; its errors (a damaged page: MDB_CORRUPTED,
        MDB_PAGE_NOTFOUND) name the database."""
        try:
            return call(*args)
        except self._lmdb_error as e:
            raise CCTError(f"LMDB '{self.path}' cannot be read, its data.mdb is damaged: "
                           f"{e}") from None

    def __len__(self) -> int:
        return self._read(self.env.stat)["entries"]

    def seek_to_first(self) -> None:
        self.valid = self._read(self.cursor.first)

    def seek(self, key: bytes) -> bool:
        """Position at ``key``; False (and the cursor at the first record) if it is absent."""
        if self._read(self.cursor.set_key, key):
            self.valid = True
            return True
        self.seek_to_first()
        return False

    def next(self) -> None:
        self.valid = self._read(self.cursor.next)

    def key(self) -> bytes:
        return self._read(self.cursor.key)

    def value(self) -> bytes:
        return self._read(self.cursor.value)

    def close(self) -> None:
        if self.env is not None:
            self.txn.abort()
            _release(self._handle_key)
            self.env = None


class LevelDBCursor:
    """Read-only cursor over a LevelDB folder (Caffe's default backend), through plyvel."""

    def __init__(self, path: str):
        try:
            import plyvel  # noqa: F401  (imported here to report its absence early)
        except ImportError:
            raise CCTError(f"'{path}' is a LevelDB source, and reading LevelDB needs the plyvel "
                           f"package: {install_hint('leveldb')} (or convert the database to LMDB "
                           f"and set `backend: LMDB`)") from None
        if not os.path.exists(path):
            raise CCTError(f"LevelDB '{path}' does not exist")
        if os.path.isdir(path) and _looks_like_lmdb(path):
            raise CCTError(f"'{path}' is an LMDB, but data_param.backend is LEVELDB (Caffe's "
                           f"default); set `backend: LMDB`")
        self.path = path
        self.db, self._handle_key = _acquire(path, _open_leveldb)
        self._iter = self.db.iterator()
        self.seek_to_first()
        if not self.valid:
            self.close()
            raise CCTError(f"LevelDB '{path}' holds no records")
        info("db_leveldb.cpp:18", f"Opened leveldb {path}")

    def seek_to_first(self) -> None:
        self._iter.seek_to_start()
        self.next()

    def seek(self, key: bytes) -> bool:
        self._iter.seek(key)
        self.next()
        if self.valid and self._key == key:
            return True
        self.seek_to_first()
        return False

    def next(self) -> None:
        try:
            self._key, self._value = next(self._iter)
            self.valid = True
        except StopIteration:
            self.valid = False

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def close(self) -> None:
        if self.db is not None:
            self._iter.close()
            _release(self._handle_key)
            self.db = None


def open_db(path: str, backend: int):
    """Open ``path`` with the cursor for ``data_param.backend`` (``DataParameter.DB``)."""
    path = os.fspath(path)
    if backend == caffe_pb2.DataParameter.LMDB:
        return LMDBCursor(path)
    if backend == caffe_pb2.DataParameter.LEVELDB:
        return LevelDBCursor(path)
    raise CCTError(f"unknown database backend {backend} for source '{path}'")
