"""The compiled extension (``cct._C``) and the package's version, for every floor: the lowest
module of cct, importing nothing of it but ``_C``. The kernels, the plan cache, the devices and
the tools take ``_C`` and ``__version__`` from here, not from the package (whose ``__init__``
imports the pycaffe surface, from the top floor); cct/__init__.py imports this module first.
"""
import os

__version__ = "0.1.0"   # cct.backend.plans keys its cache by it; setup.py says the same

# OpenBLAS's idle threads spin for 2^28 cycles (about 0.1 s) after each threaded call before they
# sleep; meanwhile they take the cores from cct's own threads, which run the next kernel (a
# partitioned convolution, pooling, ReLU) right after. Spinning 2^4 cycles instead made the
# bench's nets train 1.3x (CaffeNet b32) to 1.8x (CIFAR10-quick) faster on 2 cores
# (bench/RESULTS.md). OpenBLAS reads the variable when its library loads, at the import of _C
# just below: the first one, since cct/__init__.py imports this module before anything else.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from . import _C  # noqa: E402,F401  (after the environment above)
