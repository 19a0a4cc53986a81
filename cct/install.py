"""What to run to install what cct is missing: one wording for every message naming an extra.

cct's distribution (the name pip knows) is ``cct-caffe``; the import name stays ``cct``, as the
``opencv-python`` distribution gives ``cv2``. ``cct`` on PyPI is an unrelated project (the CREDO
Control Tool): ``pip install 'cct[onnx]'`` would install that project rather than add ONNX to
this one. setup.py reads ``DIST`` from this file without importing the package, so this module
imports nothing beyond the standard library.
"""
import pathlib
from typing import Optional

DIST = "cct-caffe"

_PACKAGE = pathlib.Path(__file__).resolve().parent
# The folder holding the package: a source checkout when setup.py and the C++ sources sit
# beside it, site-packages when cct was installed as a wheel.
_ROOT = _PACKAGE.parent


def source_checkout() -> Optional[pathlib.Path]:
    """The checkout this cct is imported from (an editable install, or the tree on sys.path),
    or None for an installed copy."""
    if (_ROOT / "setup.py").is_file() and (_ROOT / "csrc").is_dir():
        return _ROOT
    return None


def install_hint(extra: str) -> str:
    """The pip command that adds the packages of ``extra`` (an extras_require key of setup.py)
    to the cct that is running.

    From a source checkout: ``pip install -e '.[onnx]'``, with the checkout's full path in place
    of ``.`` unless it is the current folder, so the command works wherever it is pasted. ``-e``
    because the running cct is the checkout itself: a plain install would put a second copy in
    site-packages, which the checkout still shadows when run from its root. Otherwise
    ``pip install 'cct-caffe[onnx]'``: pip keeps the installed cct-caffe (it satisfies the
    requirement) and installs only the extra's packages, from any folder.
    """
    root = source_checkout()
    if root is None:
        return f"pip install '{DIST}[{extra}]'"
    where = "." if pathlib.Path.cwd().resolve() == root else str(root)
    return f"pip install -e '{where}[{extra}]'"


def has_extension() -> bool:
    """Whether the package folder holds a compiled ``_C`` this Python could load."""
    from importlib.machinery import EXTENSION_SUFFIXES
    return any((_PACKAGE / f"_C{suffix}").is_file() for suffix in EXTENSION_SUFFIXES)


def missing_extension_message() -> str:
    """Why ``cct._C`` cannot be imported when the package folder holds no compiled ``_C``. The
    usual cause: ``pip install .``, then ``python`` in the checkout's root, where the source tree
    (no extension: it was built into site-packages) shadows the installed cct."""
    here = pathlib.Path.cwd().resolve() == _ROOT
    return (f"cct's compiled extension cct._C is not in {_PACKAGE}: you are importing the "
            f"source tree at {_ROOT}{' (the current folder)' if here else ''} rather than the "
            f"installed cct; run from another folder, or build in place with "
            f"pip install -e {'.' if here else _ROOT}")
