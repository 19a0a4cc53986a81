"""cct: a Caffe-compatible CNN training engine. ``import cct as caffe`` runs pycaffe code.

The names here follow pycaffe: ``Net``, ``TRAIN``/``TEST``, ``set_mode_cpu``, ``layers``/``params``
(NetSpec), ``io``, ``proto.caffe_pb2``, ``Classifier``/``Detector``; ``import cct.draw`` and
``import cct.coord_map`` as in pycaffe. docs/PYCAFFE.md lists every name and its status.
"""
import sys as _sys

# Ctrl-C while this package loads (a third of a second or more, before the ``cct`` command can
# catch anything) ends the program with one line instead of a traceback; Python then exits as
# killed by SIGINT, as Caffe does before its signal handler is set. Python's own hook is back
# once the package has loaded.
_excepthook = _sys.excepthook


def _interrupted_while_loading(kind, value, traceback) -> None:
    if issubclass(kind, KeyboardInterrupt):
        print("cct: interrupted", file=_sys.stderr)
    else:
        _excepthook(kind, value, traceback)


_sys.excepthook = _interrupted_while_loading


# The first import of cct._C (cct/native.py, which sets OpenBLAS's environment first). After
# `pip install .`, `python` in the checkout's root finds the source tree first, which has no
# compiled _C (it was built into site-packages), and Python's own words for that blame a
# circular import.
try:
    from .native import __version__  # noqa: F401
    from .api import (TEST, TRAIN, Net, get_solver_mode, layer_type_list,  # noqa: F401
                      set_device, set_mode_cpu, set_mode_gpu, set_precision, set_random_seed,
                      init_log, log)
except ImportError:
    from .install import has_extension, missing_extension_message
    if not has_extension():
        raise ImportError(missing_extension_message()) from None
    raise
from .api import (Solver, SGDSolver, NesterovSolver, AdaGradSolver,  # noqa: F401
                  RMSPropSolver, AdaDeltaSolver, AdamSolver, get_solver)
from .errors import CCTError  # noqa: F401
from .onnx_export import export_onnx  # noqa: F401  (imports onnx only when called)
from .layers.python_layer import PythonLayer as Layer  # noqa: F401  (pycaffe's caffe.Layer)
from .caffe_alias import install_as_caffe  # noqa: F401
from .pycaffe import (NCCL, Timer, has_nccl, multiprocess, set_multiprocess,  # noqa: F401
                      set_solver_count, set_solver_rank, solver_count, solver_rank)
from .classifier import Classifier  # noqa: F401
from .detector import Detector  # noqa: F401
from .proto.caffe_pb2 import LayerParameter, NetParameter, SolverParameter  # noqa: F401
from .proto import caffe_pb2  # noqa: F401
from . import proto  # noqa: F401
# After the imports above: this rebinds ``cct.layers`` from the layer package to pycaffe's
# NetSpec pseudo-module, which still forwards the package's own names (see net_spec.Layers).
from .net_spec import NetSpec, layers, params, to_proto  # noqa: F401

_sys.excepthook = _excepthook
del _excepthook, _interrupted_while_loading

