"""Run an unchanged pycaffe script with cct as its ``caffe``::

    python -m cct.as_caffe script.py [args ...]

The script runs as ``__main__`` (with ``sys.argv`` = ``[script.py, args ...]`` and its folder
first on ``sys.path``, as ``python script.py`` would) after ``import caffe`` has been made to give
cct (:func:`cct.install_as_caffe`), even where a real Caffe is installed.
"""
import os
import runpy
import sys

from .caffe_alias import install_as_caffe


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m cct.as_caffe script.py [args ...]", file=sys.stderr)
        return 0 if argv else 2
    script = argv[0]
    if not os.path.isfile(script):
        print(f"cct.as_caffe: no such script: {script}", file=sys.stderr)
        return 2
    install_as_caffe()
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
