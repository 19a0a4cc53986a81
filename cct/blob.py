"""Blob: Caffe's N-d array pair (data, diff), plain arrays that users may read and write."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import LayerError


class Blob:
    """Holds ``data`` and ``diff`` of one shape, on the array module ``xp`` of a backend.

    As in Caffe, reshaping to the same element count keeps the values; a different count
    allocates fresh zeroed memory.
    """

    __slots__ = ("_data", "_diff", "xp", "dtype")

    def __init__(self, shape: Sequence[int] = (), dtype=np.float32, xp=np):
        self.xp = xp
        self.dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        self._data = xp.zeros(shape, self.dtype)
        self._diff = xp.zeros(shape, self.dtype)

    # shape ---------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return tuple(self._data.shape)

    @property
    def count(self) -> int:
        return int(self._data.size)

    def count_range(self, start: int, end: int | None = None) -> int:
        """Product of the axes in [start, end), Caffe's ``Blob::count(start, end)``."""
        dims = self.shape[start:end]
        return int(np.prod(dims, dtype=np.int64)) if dims else 1

    @property
    def num_axes(self) -> int:
        return len(self._data.shape)

    def canonical_axis(self, axis: int) -> int:
        n = self.num_axes
        if not -n <= axis < max(n, 1):
            raise LayerError(f"axis {axis} is out of range for a blob of shape {self.shape}")
        return axis + n if axis < 0 else axis

    def _legacy(self, i: int) -> int:
        s = self.shape
        return s[i] if i < len(s) else 1

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    def reshape(self, *shape) -> None:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise LayerError(f"blob shape {shape} has a negative dimension")
        if shape == self.shape:
            return
        if int(np.prod(shape, dtype=np.int64)) == self.count:
            self._data = self._data.reshape(shape)
            self._diff = self._diff.reshape(shape)
        else:
            self._data = self.xp.zeros(shape, self.dtype)
            self._diff = self.xp.zeros(shape, self.dtype)

    def reshape_like(self, other: "Blob") -> None:
        self.reshape(other.shape)

    # data / diff -----------------------------------------------------------------------------
    @property
    def data(self):
        return self._data

    @data.setter
    def data(self, value) -> None:
        self._data[...] = value

    @property
    def diff(self):
        return self._diff

    @diff.setter
    def diff(self, value) -> None:
        self._diff[...] = value

    def share_data(self, other: "Blob") -> None:
        """Make this blob use ``other``'s data array (Caffe's ShareData, used by Flatten etc.)."""
        self._data = other._data.reshape(self.shape)

    def share_diff(self, other: "Blob") -> None:
        self._diff = other._diff.reshape(self.shape)

    def __repr__(self) -> str:
        return f"Blob(shape={self.shape}, dtype={self.dtype})"

    def shape_string(self) -> str:
        """Caffe's ``shape_string()``: ``"64 20 24 24 (737280)"``."""
        return " ".join(str(s) for s in self.shape) + (" " if self.shape else "") + f"({self.count})"
