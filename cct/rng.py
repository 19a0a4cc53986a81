"""The process-wide random generator (Caffe's ``Caffe::rng_stream``), seeded by random_seed."""
import numpy as np

_rng = np.random.default_rng()


def get_rng() -> np.random.Generator:
    return _rng


def set_random_seed(seed: int) -> None:
    """Caffe's ``Caffe::set_random_seed``: fillers, Dropout and data shuffling draw from here."""
    global _rng
    _rng = np.random.default_rng(int(seed) & 0xFFFFFFFFFFFFFFFF)
