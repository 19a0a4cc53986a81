"""glog-style logging, so that Caffe's log parsers read cct's logs.

Caffe prints ``I1122 04:17:58.385668 27700 net.cpp:86] Creating Layer conv1``: severity letter,
month and day, time with microseconds, thread id, ``source:line]``. cct writes the same prefix
and, where a line corresponds to one of Caffe's, the same source location, because tools like
``extract_seconds.py`` split on these tokens.
"""
import contextlib
import logging
import sys
import threading
import time
from typing import Callable, ContextManager, Optional

_LEVEL_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W",
                 logging.ERROR: "E", logging.CRITICAL: "F"}


class GlogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        t = record.created
        lt = time.localtime(t)
        usec = int((t - int(t)) * 1e6)
        where = getattr(record, "caffe_src", None) or f"{record.module}.py:{record.lineno}"
        prefix = "%s%02d%02d %02d:%02d:%02d.%06d %5d %s] " % (
            _LEVEL_LETTER.get(record.levelno, "I"), lt.tm_mon, lt.tm_mday, lt.tm_hour,
            lt.tm_min, lt.tm_sec, usec, threading.get_native_id() % 100000, where)
        return prefix + record.getMessage()


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (glog logs to stderr), so redirections
    made after import are honoured. While a live display holds the terminal's last line
    (:func:`set_live_display`), each log line is written inside its ``around_line()``."""

    around_line: Optional[Callable[[], ContextManager]] = None

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass

    def emit(self, record: logging.LogRecord) -> None:
        around = self.around_line
        if around is None:
            super().emit(record)
            return
        with around():
            super().emit(record)


logger = logging.getLogger("cct")
if not logger.handlers:
    _handler = _StderrHandler()
    _handler.setFormatter(GlogFormatter())
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def set_live_display(around_line: Optional[Callable[[], ContextManager]]) -> None:
    """A live display on stderr (cct/progress.py's bar) or None: ``around_line()`` takes the
    display off the terminal's last line for one log line and puts it back after, so log lines
    and the display never share a line. The log's bytes are unchanged."""
    for handler in logger.handlers:
        if isinstance(handler, _StderrHandler):
            handler.around_line = around_line


def info(src: str, msg: str) -> None:
    """Log ``msg`` at INFO as if from Caffe's ``src`` (e.g. ``"net.cpp:86"``)."""
    logger.info(msg, extra={"caffe_src": src})


def warning(src: str, msg: str) -> None:
    logger.warning(msg, extra={"caffe_src": src})


def error(src: str, msg: str) -> None:
    logger.error(msg, extra={"caffe_src": src})


@contextlib.contextmanager
def quiet():
    """INFO lines off for a while (a net replica's construction repeats the net's log)."""
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def held():
    """INFO lines held back instead of written, for a while: yields the list that collects
    them (:class:`logging.LogRecord` s). The optimizer holds a probe's lines and writes only
    the kept probe's, with :func:`release`."""
    records: list = []
    handlers = logger.handlers[:]

    class _Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:       # warnings are not held back
                for handler in handlers:
                    handler.handle(record)
            else:
                records.append(record)

    logger.handlers[:] = [_Hold()]
    try:
        yield records
    finally:
        logger.handlers[:] = handlers


def release(records) -> None:
    """Write held lines (:func:`held`), stamped now: a log's times only go forward (Caffe's
    parse_log.py takes seconds from them)."""
    now = time.time()
    for record in records:
        record.created = now
        logger.handle(record)


def set_quiet(quiet: bool = True) -> None:
    """Silence INFO lines (pycaffe users often build many nets; Caffe's GLOG_minloglevel=1)."""
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
