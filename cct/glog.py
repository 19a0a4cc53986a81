"""glog-style logging, so that Caffe's log parsers read cct's logs.

Caffe prints ``I1122 04:17:58.385668 27700 net.cpp:86] Creating Layer conv1``: severity letter,
month and day, time with microseconds, thread id, ``source:line]``. cct writes the same prefix
and, where a line corresponds to one of Caffe's, the same source location, because tools like
``extract_seconds.py`` split on these tokens.

Where the lines go follows glog's environment variables, read when this module is imported and
again by :func:`init_log` (pycaffe's ``caffe.init_log``):

* ``GLOG_minloglevel``: 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL; lines below it are not written
  anywhere (2 is what Caffe users set to silence pycaffe).
* ``GLOG_logtostderr``: 1, every line to stderr and no files; 0, log files (below) and only
  lines at or above ``GLOG_stderrthreshold`` (default 2, ERROR) to stderr.
* ``GLOG_alsologtostderr``: 1, every line to stderr as well as to the files.
* ``GLOG_log_dir``: the files' directory (else ``$TMPDIR`` or /tmp). Each severity has its file
  ``<program>.<hostname>.<user>.log.<SEVERITY>.<yyyymmdd>-<hhmmss>.<pid>``, holding its lines and
  those above (the INFO file is the whole log), made at its first line, with the symlink
  ``<program>.<SEVERITY>`` beside it.

One default differs from glog's: with neither ``GLOG_logtostderr`` nor ``GLOG_log_dir`` set, cct
logs to stderr, as if ``GLOG_logtostderr=1``. pycaffe with glog writes its INFO lines to files in
/tmp, but cct's users (the CLI's, as with Caffe's tools, and scripts written against cct) expect
to see the log; setting either variable gives glog's behaviour.
"""
import contextlib
import getpass
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, IO, List, Optional, Tuple

_LEVEL_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W",
                 logging.ERROR: "E", logging.CRITICAL: "F"}
# glog's severities, in order: GLOG_minloglevel and GLOG_stderrthreshold index this.
SEVERITIES = ("INFO", "WARNING", "ERROR", "FATAL")
_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
_TRUE, _FALSE = ("1", "t", "true", "y", "yes"), ("0", "f", "false", "n", "no")


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


def _severity(levelno: int) -> int:
    """glog's severity index (0 INFO ... 3 FATAL) of a logging level."""
    return sum(levelno >= level for level in _LEVELS[1:])


def _level(severity: int) -> int:
    """The logging level of glog's severity index; past FATAL, a level nothing reaches."""
    return _LEVELS[severity] if severity < len(_LEVELS) else logging.CRITICAL + 10


@dataclass
class Settings:
    """glog's flags, from the environment (see the module doc)."""
    minloglevel: int = 0
    logtostderr: bool = True
    alsologtostderr: bool = False
    stderrthreshold: int = 2
    log_dir: str = ""
    program: str = "python"

    @classmethod
    def from_environment(cls) -> Tuple["Settings", List[str]]:
        """The settings the GLOG_* variables give, and a note for each value not understood
        (glog with gflags exits on one; a log setting should not stop a run, so cct says so
        and goes on with glog's default)."""
        env = os.environ
        s, notes = cls(), []

        def severity(name: str, default: int) -> int:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return max(0, int(raw))
            except ValueError:
                notes.append(f"{name}='{raw}' is not a severity; using {default} "
                             f"({SEVERITIES[default]}). Set it to 0 (INFO), 1 (WARNING), "
                             f"2 (ERROR) or 3 (FATAL)")
                return default

        def flag(name: str) -> Optional[bool]:
            raw = env.get(name, "").strip()
            if not raw:
                return None
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            notes.append(f"{name}='{raw}' is neither 1 nor 0; ignored. Set it to 1 or 0")
            return None

        s.minloglevel = severity("GLOG_minloglevel", 0)
        s.stderrthreshold = severity("GLOG_stderrthreshold", 2)
        s.alsologtostderr = bool(flag("GLOG_alsologtostderr"))
        s.log_dir = env.get("GLOG_log_dir", "").strip()
        to_stderr = flag("GLOG_logtostderr")
        # cct's one difference from glog (module doc): stderr unless a variable asks for files.
        s.logtostderr = (not s.log_dir) if to_stderr is None else to_stderr
        s.program = _program_name()
        return s, notes


def _program_name() -> str:
    """glog's program name, argv[0]'s base name (``cct``, ``train.py``); the package's for
    ``python -m package``, and ``python`` for ``python -c`` and the interactive interpreter."""
    path = sys.argv[0] if sys.argv and sys.argv[0] else ""
    name = os.path.basename(path)
    if name == "__main__.py":
        name = os.path.basename(os.path.dirname(path))
    return name if name and name not in ("-c", "-m", "-") else "python"


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


class _LogFiles(logging.Handler):
    """glog's log files: a line goes to its severity's file and to each lower one's, each file
    made at its first line (module doc). A file that cannot be made is said once on stderr and
    its lines go to stderr instead: the log is not lost."""

    def __init__(self, settings: Settings):
        super().__init__()
        self.settings = settings
        self.directory = settings.log_dir or tempfile.gettempdir()
        self.files: Dict[int, IO[str]] = {}
        self.failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed:
            return
        line = self.format(record) + "\n"
        try:
            for severity in range(min(_severity(record.levelno), len(SEVERITIES) - 1), -1, -1):
                f = self.files.get(severity) or self._open(severity, record.created)
                f.write(line)
                f.flush()
        except OSError as e:
            self.failed = True
            where = (f"GLOG_log_dir '{self.settings.log_dir}'" if self.settings.log_dir
                     else f"the temporary directory '{self.directory}'")
            sys.stderr.write(
                f"cct: warning: cannot write the log file in {where} ({e.strerror or e}); the "
                f"log goes to stderr. Point GLOG_log_dir at a writable directory, or set "
                f"GLOG_logtostderr=1\n")
            # From now on the stderr handler (before this one) writes every line; this one
            # it passed over.
            if record.levelno < _stderr.level:
                sys.stderr.write(line)
            _stderr.setLevel(logging.NOTSET)

    def _open(self, severity: int, created: float) -> IO[str]:
        s = self.settings
        name = SEVERITIES[severity]
        lt = time.localtime(created)
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "invalid-user"       # glog's name for a user it cannot find
        base = "%s.%s.%s.log.%s.%04d%02d%02d-%02d%02d%02d.%d" % (
            s.program, socket.gethostname(), user, name, lt.tm_year, lt.tm_mon, lt.tm_mday,
            lt.tm_hour, lt.tm_min, lt.tm_sec, os.getpid())
        path = os.path.join(self.directory, base)
        f = open(path, "a", encoding="utf-8")
        f.write("Log file created at: %04d/%02d/%02d %02d:%02d:%02d\nRunning on machine: %s\n"
                "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg\n"
                % (lt.tm_year, lt.tm_mon, lt.tm_mday, lt.tm_hour, lt.tm_min, lt.tm_sec,
                   socket.gethostname()))
        self.files[severity] = f
        link = os.path.join(self.directory, f"{s.program}.{name}")
        # The link is a convenience (``tail -f /tmp/python.INFO``): failing to make it (a
        # file system without symlinks) loses nothing.
        with contextlib.suppress(OSError):
            if os.path.islink(link):
                os.unlink(link)
            os.symlink(base, link)
        return f

    def close(self) -> None:
        for f in self.files.values():
            with contextlib.suppress(OSError):
                f.close()
        self.files = {}
        super().close()


logger = logging.getLogger("cct")
logger.propagate = False
_stderr = _StderrHandler()
_stderr.setFormatter(GlogFormatter())
_settings = Settings()
_files: Optional[_LogFiles] = None


def init_log(level: Optional[int] = None, logtostderr: Optional[bool] = None, *,
             alsologtostderr: bool = False) -> Settings:
    """Set the log up from the GLOG_* variables (module doc), read now; pycaffe's
    ``caffe.init_log(level, stderr)``: ``level``, when given, is the minloglevel (0 INFO, 1
    WARNING, 2 ERROR, 3 FATAL) and ``logtostderr`` glog's flag, both over the environment's;
    ``alsologtostderr`` is what Caffe's tools set (``caffe.cpp``: the whole log on stderr as
    well as in any files the variables ask for). Returns the settings in effect."""
    global _settings, _files
    settings, notes = Settings.from_environment()
    if level is not None:
        settings.minloglevel = max(0, int(level))
    if logtostderr is not None:
        settings.logtostderr = bool(logtostderr)
    settings.alsologtostderr = settings.alsologtostderr or alsologtostderr
    handlers: List[logging.Handler] = [_stderr]
    if settings.logtostderr or settings.alsologtostderr:
        _stderr.setLevel(logging.NOTSET)
    else:
        _stderr.setLevel(_level(settings.stderrthreshold))
    files = None if settings.logtostderr else _LogFiles(settings)
    if _files is not None and files is not None and not _files.failed and \
            (_files.directory, _files.settings.program) == (files.directory, settings.program):
        files = _files          # glog keeps its files open: the same log goes on in them
        files.settings = settings
    elif _files is not None:
        _files.close()
    _files = files
    if files is not None:
        files.setFormatter(GlogFormatter())
        handlers.append(files)
    logger.handlers[:] = handlers
    logger.setLevel(_level(settings.minloglevel))
    _settings = settings
    for note in notes:
        warning("logging.cc:0", note)
    return settings


init_log()


def set_live_display(around_line: Optional[Callable[[], ContextManager]]) -> None:
    """A live display on stderr (cct/progress.py's bar) or None: ``around_line()`` takes the
    display off the terminal's last line for one log line and puts it back after, so log lines
    and the display never share a line. The log's bytes are unchanged."""
    _stderr.around_line = around_line


def info(src: str, msg: str) -> None:
    """Log ``msg`` at INFO as if from Caffe's ``src`` (e.g. ``"net.cpp:86"``)."""
    logger.info(msg, extra={"caffe_src": src})


def warning(src: str, msg: str) -> None:
    logger.warning(msg, extra={"caffe_src": src})


def error(src: str, msg: str) -> None:
    logger.error(msg, extra={"caffe_src": src})


@contextlib.contextmanager
def quiet():
    """INFO lines off for a while (a net replica's construction repeats the net's log); a
    GLOG_minloglevel above WARNING stays."""
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
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
    """Silence INFO lines (pycaffe users often build many nets; Caffe's GLOG_minloglevel=1),
    or bring them back; the GLOG_* variables are read again (:func:`init_log`), and a
    GLOG_minloglevel above WARNING stays."""
    level = Settings.from_environment()[0].minloglevel
    init_log(max(level, 1) if quiet else level)
