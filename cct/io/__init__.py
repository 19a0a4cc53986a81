"""Reading and writing Caffe's files (:mod:`.prototxt`, :mod:`.weights`, :mod:`.upgrade`); also
pycaffe's ``caffe.io`` helpers (:mod:`.pycaffe_io`), re-exported here so ``cct.io.<name>`` works
as ``caffe.io.<name>`` does."""
from .pycaffe_io import *  # noqa: F401,F403
from .pycaffe_io import __all__  # noqa: F401
