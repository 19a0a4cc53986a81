"""The random generators: the process-wide one (Caffe's ``Caffe::rng_stream``), seeded by
random_seed, and a net's own where a net has one.

Caffe keeps one generator per thread (``thread_specific_ptr<Caffe>``): each solver thread of
its multi-GPU training draws its own Dropout masks. cct's nets draw from the process-wide
generator unless built with one of their own (``Net(..., rng=generator)``: a driver's compute
groups, cct/driver), which then serves that net's fillers and Dropout on whatever thread runs
it, so that concurrent groups draw reproducibly. :func:`using` is how: a generator for the
calling thread for a while, in place of the process-wide one.
"""
import contextlib
import threading
from typing import Iterator, Optional

import numpy as np

_rng = np.random.default_rng()
_local = threading.local()


def get_rng() -> np.random.Generator:
    """The calling thread's generator: the one :func:`using` set, else the process-wide one."""
    return getattr(_local, "rng", None) or _rng


def set_random_seed(seed: int) -> None:
    """Caffe's ``Caffe::set_random_seed``: fillers, Dropout and data shuffling draw from here."""
    global _rng
    _rng = np.random.default_rng(int(seed) & 0xFFFFFFFFFFFFFFFF)


@contextlib.contextmanager
def using(generator: Optional[np.random.Generator]) -> Iterator[None]:
    """Draws on this thread come from ``generator`` inside the block (None: no change)."""
    if generator is None:
        yield
        return
    saved = getattr(_local, "rng", None)
    _local.rng = generator
    try:
        yield
    finally:
        _local.rng = saved
