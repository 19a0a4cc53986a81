"""Caffe's tools as ``cct`` subcommands: one module per tool, each with ``main(argv) -> int``.

| command | Caffe's tool |
| --- | --- |
| convert_mnist_data | examples/mnist/convert_mnist_data.cpp |
| convert_imageset | tools/convert_imageset.cpp |
| compute_image_mean | tools/compute_image_mean.cpp |
| extract_features | tools/extract_features.cpp |
| upgrade_net_proto_text, upgrade_solver_proto_text | tools/upgrade_*_proto_text.cpp |
| parse_log, plot_log | tools/extra/parse_log.py, tools/extra/plot_training_log.py.example |
| summarize | tools/extra/summarize.py |
| draw_net | python/draw_net.py |

The databases the tools write hold the same keys and Datum bytes as Caffe's. A database is
written under a temporary name beside its final one and renamed when complete, so a failed run
leaves no half-written database behind.
"""
from __future__ import annotations

import importlib
import os
import shutil
from typing import Callable, Dict, List, Optional

from ..errors import CCTError
from ..glog import logger
from ..io.atomic import TEMP_MARK, fsync_folder

#: command -> the module of cct.tools that implements it
TOOLS: Dict[str, str] = {
    "convert_mnist_data": "convert_mnist_data",
    "convert_imageset": "convert_imageset",
    "compute_image_mean": "compute_image_mean",
    "extract_features": "extract_features",
    "upgrade_net_proto_text": "upgrade_proto_text",
    "upgrade_solver_proto_text": "upgrade_proto_text",
    "parse_log": "parse_log",
    "plot_log": "plot_log",
    "summarize": "summarize",
    "draw_net": "draw_net",
    "export_onnx": "export_onnx",
}


def command(name: str) -> Callable[[List[str]], int]:
    """The ``main`` of tool ``name`` (``main_<name>`` where a module holds two tools), imported
    when first called, so plotting libraries load only for the tools that need them."""
    module_name = TOOLS[name]

    def run(argv: List[str]) -> int:
        module = importlib.import_module(f"{__name__}.{module_name}")
        entry = getattr(module, f"main_{name}", None) or module.main
        return entry(argv)

    run.__name__ = f"cmd_{name}"
    return run


# -- logging: Caffe's LOG(ERROR) lines ---------------------------------------------------------

def log_error(src: str, msg: str) -> None:
    """glog's ``E`` line as if from Caffe's ``src`` (Caffe's tools log progress at ERROR)."""
    logger.error(msg, extra={"caffe_src": src})


# -- arguments ----------------------------------------------------------------------------------

def format_int(n: int, width: int) -> str:
    """Caffe's ``caffe::format_int``: ``n`` zero-padded to ``width`` digits."""
    return "%0*d" % (width, n)


def check_backend(tool: str, backend: str) -> None:
    """Caffe's ``db::GetDB``: ``lmdb`` is supported; ``leveldb`` is not in cct."""
    if backend.lower() == "lmdb":
        return
    if backend.lower() == "leveldb":
        raise CCTError(f"{tool}: the LevelDB backend is not supported by cct; write an LMDB "
                       f"(--backend=lmdb)")
    raise CCTError(f"{tool}: unknown database backend '{backend}' (Caffe's backends are lmdb "
                   f"and leveldb; cct writes lmdb)")


def need_file(tool: str, path: str, what: str) -> str:
    if not os.path.exists(path):
        raise CCTError(f"{tool}: {what} '{path}' does not exist")
    if os.path.isdir(path):
        raise CCTError(f"{tool}: {what} '{path}' is a directory, expected a file")
    return path


# -- writing an LMDB ----------------------------------------------------------------------------

class LMDBWriter:
    """A new LMDB at ``path``, written as Caffe's ``db::LMDB`` in ``NEW`` mode: the folder must
    not exist yet, records go in with :meth:`put` and become durable with :meth:`commit`
    (Caffe's tools commit every 1000 records). The map grows by doubling when full, as Caffe's
    ``LMDBTransaction::Commit`` does. The database is built in a temporary folder beside
    ``path`` and renamed on :meth:`close`; :meth:`abort` (or leaving a ``with`` block by an
    exception) removes it.
    """

    _INITIAL_MAP = 64 << 20

    def __init__(self, tool: str, path: str):
        import lmdb

        self.tool = tool
        self.path = path.rstrip("/") or path
        if os.path.lexists(self.path):
            raise CCTError(f"{tool}: database '{path}' already exists; remove it or choose "
                           f"another name (Caffe refuses to overwrite a database too)")
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise CCTError(f"{tool}: cannot create database '{path}': folder '{parent}' does "
                           f"not exist")
        self.tmp = os.path.join(parent,
                                f".{os.path.basename(self.path)}{TEMP_MARK}{os.getpid()}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        try:
            os.mkdir(self.tmp, 0o744)
            self.env = lmdb.open(self.tmp, map_size=self._INITIAL_MAP, subdir=True,
                                 meminit=False, max_dbs=0)
        except (OSError, lmdb.Error) as e:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise CCTError(f"{tool}: cannot create database '{path}': {e}") from None
        self.map_size = self._INITIAL_MAP
        self.pending: List[tuple] = []

    def put(self, key: bytes, value: bytes) -> None:
        self.pending.append((key, value))

    def commit(self) -> None:
        import lmdb

        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for key, value in self.pending:
                        txn.put(key, value)
                break
            except lmdb.MapFullError:
                self.map_size *= 2
                self.env.set_mapsize(self.map_size)
        self.pending = []

    def close(self) -> None:
        if self.pending:
            self.commit()
        self.env.close()
        try:
            os.rename(self.tmp, self.path)
            # LMDB synced the data at each commit; this makes the new name durable too.
            fsync_folder(os.path.dirname(os.path.abspath(self.path)))
        except OSError as e:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise CCTError(f"{self.tool}: cannot create database '{self.path}': "
                           f"{e.strerror or e}") from None

    def abort(self) -> None:
        self.env.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "LMDBWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def open_lmdb_writer(tool: str, path: str, backend: str = "lmdb",
                     log_src: Optional[str] = "db_lmdb.cpp:35") -> LMDBWriter:
    """Check the backend, create the database and log Caffe's ``Opened lmdb`` line."""
    from ..glog import info

    check_backend(tool, backend)
    writer = LMDBWriter(tool, path)
    if log_src:
        info(log_src, f"Opened lmdb {path}")
    return writer
