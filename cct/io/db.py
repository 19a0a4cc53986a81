"""Caffe's key-value databases: LMDB (py-lmdb). A cursor walks the keys in order and wraps
around at the end, as Caffe's DataReader does."""
from __future__ import annotations

import os

from ..errors import CCTError


class LMDBCursor:
    """Sequential reader of an LMDB written by Caffe (or by cct's converters)."""

    def __init__(self, path: str):
        import lmdb

        if not os.path.exists(path):
            raise CCTError(f"LMDB '{path}' does not exist")
        if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "data.mdb")):
            raise CCTError(f"'{path}' is not an LMDB (expected a folder holding data.mdb)")
        try:
            self.env = lmdb.open(path, readonly=True, lock=False, readahead=False,
                                 max_readers=126, subdir=True)
        except lmdb.Error as e:
            raise CCTError(f"cannot open LMDB '{path}': {e}") from None
        self.path = path
        self.txn = self.env.begin(buffers=False)
        self.cursor = self.txn.cursor()
        if not self.cursor.first():
            raise CCTError(f"LMDB '{path}' holds no records")

    def __len__(self) -> int:
        return self.env.stat()["entries"]

    def value(self) -> bytes:
        return self.cursor.value()

    def key(self) -> bytes:
        return self.cursor.key()

    def next(self) -> None:
        """Advance; after the last record, start again from the first (Caffe: "Restarting
        data prefetching from start.")."""
        if not self.cursor.next():
            self.cursor.first()

    def close(self) -> None:
        self.env.close()


def open_db(path: str, backend: int) -> LMDBCursor:
    from ..proto import caffe_pb2
    if backend == caffe_pb2.DataParameter.LMDB:
        return LMDBCursor(path)
    raise CCTError(f"database backend LEVELDB is not supported yet (source '{path}'); "
                   f"convert it to LMDB or set `backend: LMDB`")
