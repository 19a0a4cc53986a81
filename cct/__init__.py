"""cct: a Caffe-compatible CNN training engine. ``import cct as caffe`` runs pycaffe code.

The names here follow pycaffe: ``Net``, ``TRAIN``/``TEST``, ``set_mode_cpu``, ``layers``/``params``
(NetSpec), ``io``, ``proto.caffe_pb2``.
"""
from .api import (TEST, TRAIN, Net, get_solver_mode, layer_type_list,  # noqa: F401
                  set_device, set_mode_cpu, set_mode_gpu, set_random_seed, init_log, log)
from .api import (Solver, SGDSolver, NesterovSolver, AdaGradSolver,  # noqa: F401
                  RMSPropSolver, AdaDeltaSolver, AdamSolver, get_solver)
from .errors import CCTError  # noqa: F401
from .layers.python_layer import PythonLayer as Layer  # noqa: F401  (pycaffe's caffe.Layer)
from .proto import caffe_pb2  # noqa: F401
from . import proto  # noqa: F401
# After the imports above: this rebinds ``cct.layers`` from the layer package to pycaffe's
# NetSpec pseudo-module, which still forwards the package's own names (see net_spec.Layers).
from .net_spec import NetSpec, layers, params, to_proto  # noqa: F401

__version__ = "0.1.0"
