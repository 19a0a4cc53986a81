"""Errors a user can cause, reported as one clear paragraph instead of a traceback.

Every user mistake (a bad prototxt, a missing file, a shape that does not fit) raises a
subclass of :class:`CCTError`; the CLI prints its message and exits non-zero, the Python API
lets it propagate so scripts can catch it.
"""


class CCTError(Exception):
    """Base class of every error cct reports to a user."""


class ProtoError(CCTError):
    """A prototxt or binary protobuf file could not be read (syntax, unknown field, truncated)."""


class NetError(CCTError):
    """The net graph is inconsistent: missing bottom, a top produced twice, bad include/exclude."""


class LayerError(CCTError):
    """A layer's parameters or blob shapes do not fit; the message names the layer."""


class WeightsError(CCTError):
    """A weights file is unreadable or its blobs do not fit the net."""


class SourceLost(CCTError):
    """A gradient source can compute no more (every device it had failed): the solver writes a
    snapshot of the last update before it stops."""


#: Exceptions that are mistakes in code (cct's own, or a Python layer's), never a device that
#: failed: a GPU out of memory or lost comes as CuPy's MemoryError or RuntimeError subclasses, a
#: killed group process as EOFError or OSError. A scheduler or driver that dropped a device or
#: group for one of these and trained on would pass a bug off as a lost device.
PROGRAMMING_ERRORS = (TypeError, ValueError, AttributeError, NameError, LookupError,
                      AssertionError, NotImplementedError, ArithmeticError)


def is_bug(e: BaseException) -> bool:
    """Whether ``e`` is a programming error rather than a device's failure (a CCTError, the
    user's, is neither: it stops the run with its own message)."""
    return isinstance(e, PROGRAMMING_ERRORS) and not isinstance(e, CCTError)


def bug_report(who: str, e: BaseException) -> str:
    """The line a scheduler or driver logs before it stops on a programming error in ``who``
    (a device, a group) instead of dropping it."""
    return (f"{who} raised {type(e).__name__}: {e}. This is a bug (in cct or a Python layer), "
            f"not a lost device: stopping the run")


def close_matches(word: str, choices, n: int = 3) -> str:
    """Phrase like "did you mean 'ReLU', 'PReLU'?" for an unknown name, or ''."""
    import difflib

    by_lower = {c.lower(): c for c in choices}
    found = difflib.get_close_matches(word.lower(), list(by_lower), n=n, cutoff=0.5)
    if not found:
        return ""
    return " Did you mean " + ", ".join(repr(by_lower[f]) for f in found) + "?"
