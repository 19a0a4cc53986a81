"""Blob: Caffe's N-d array pair (data, diff), plain arrays that users may read and write.

On the CPU a blob's arrays are NumPy arrays that layers and pycaffe code share. On a device
backend (the GPU; the ``numpy`` backend standing in for one) a blob is a :class:`DeviceBlob`:
layers see device arrays, pycaffe code sees NumPy copies through :meth:`Blob.host_view`, and
each array is a :class:`SyncedMemory` that copies between the two lazily, as Caffe's does:
host code reading or writing after device code wrote copies device -> host first; device code
touching the array after host code asked for it copies host -> device first.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .backend import device_of_xp
from .errors import LayerError

INT_MAX = 2 ** 31 - 1


class BlobShapeError(LayerError):
    """A shape Caffe's Blob::Reshape refuses; the layer that asked for it adds its name."""


def checked_shape(shape: Sequence[int]) -> tuple:
    """``shape`` as a tuple of ints, refused as Caffe's Blob::Reshape refuses it: a negative
    dimension, or more than INT_MAX values (Caffe counts them in an int)."""
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise BlobShapeError(f"blob shape {shape} has a negative dimension")
    count = math.prod(shape)
    if count > INT_MAX or (count == 0 and any(s > INT_MAX for s in shape)):
        raise BlobShapeError(f"blob shape {shape} holds {count} values, more than Caffe's "
                             f"limit of INT_MAX = {INT_MAX} (blob size exceeds INT_MAX)")
    return shape


class Blob:
    """Holds ``data`` and ``diff`` of one shape, on the array module ``xp`` of a backend.

    As in Caffe, reshaping to the same element count keeps the values; a different count
    allocates fresh zeroed memory. ``Blob(shape, dtype, xp)`` makes a :class:`DeviceBlob`
    when ``xp`` is a device's array module.

    The diff is allocated, zeroed, when something first asks for it (as Caffe's SyncedMemory
    allocates on first use): a net that only runs forward, or the params of a net being built,
    then cost their data alone.
    """

    __slots__ = ("_data", "_diff", "xp", "dtype")

    def __new__(cls, shape: Sequence[int] = (), dtype=np.float32, xp=np):
        if cls is Blob and device_of_xp(xp) is not None:
            cls = DeviceBlob
        return object.__new__(cls)

    def __init__(self, shape: Sequence[int] = (), dtype=np.float32, xp=np):
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self._alloc(checked_shape(shape))

    def _alloc(self, shape: tuple) -> None:
        self._data = self.xp.zeros(shape, self.dtype)
        self._diff = None

    def _diff_array(self):
        """The diff array, allocated (zeros of the blob's shape) on first use."""
        if self._diff is None:
            self._alloc_diff()
        return self._diff

    def _alloc_diff(self) -> None:
        self._diff = self.xp.zeros(self.shape, self.dtype)

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
        if shape == self.shape:
            return
        if math.prod(checked_shape(shape)) == self.count:
            self._data = self._data.reshape(shape)
            if self._diff is not None:
                self._diff = self._diff.reshape(shape)
        else:
            self._alloc(shape)

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
        return self._diff_array()

    @diff.setter
    def diff(self, value) -> None:
        self._diff_array()[...] = value

    def cpu_data(self) -> np.ndarray:
        """The data as a read-only NumPy array (Caffe's ``cpu_data()``): for code that saves
        or prints values, whichever device the blob is on."""
        return _read_only(self._data)

    def cpu_diff(self) -> np.ndarray:
        return _read_only(self._diff_array())

    def host_view(self) -> "Blob":
        """The blob as pycaffe code sees it, ``data``/``diff`` NumPy arrays: the blob itself
        on the CPU, a :class:`HostBlob` on a device."""
        return self

    def share_data(self, other: "Blob") -> None:
        """Make this blob use ``other``'s data array (Caffe's ShareData, used by Flatten etc.)."""
        self._data = other._data.reshape(self.shape)

    def share_diff(self, other: "Blob") -> None:
        self._diff = other._diff_array().reshape(self.shape)

    def diff_in(self, memory) -> None:
        """Make this blob's diff the first ``count`` elements of ``memory`` (an array of this
        blob's module and dtype), in its shape: cct/blob_memory.py's shared buffers."""
        self._diff = memory[:self.count].reshape(self.shape)

    def array_ids(self) -> tuple:
        """The identities of the arrays that hold the data and the diff now (the diff's None
        when none was made): a CUDA graph reads and writes those very arrays, so a blob that
        takes others (a reshape, a share, a restored net's) must not be replayed
        (cct/graphed.py)."""
        return id(self._data), id(self._diff)

    def __repr__(self) -> str:
        return f"Blob(shape={self.shape}, dtype={self.dtype})"

    def shape_string(self) -> str:
        """Caffe's ``shape_string()``: ``"64 20 24 24 (737280)"``."""
        return " ".join(str(s) for s in self.shape) + (" " if self.shape else "") + f"({self.count})"


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


# ------------------------------------------------------------------------------------------------
# Device blobs
# ------------------------------------------------------------------------------------------------
AT_DEVICE, AT_HOST, SYNCED = "device", "host", "synced"


class SyncedMemory:
    """Caffe's SyncedMemory for one device array: the host copy, made when host code first
    asks, and ``head``, the side whose values are current (AT_DEVICE, AT_HOST, or SYNCED when
    both are). Blobs that share memory (in-place layers, ShareData, shared params) share this
    object, so a write on either side is seen through every one of them."""

    __slots__ = ("device", "host", "head", "backend")

    def __init__(self, device, backend):
        self.device = device
        self.host = None
        self.head = AT_DEVICE
        self.backend = backend  # the device backend that moves the array (cct.backend)

    def device_side(self) -> None:
        """Before device code touches the array (it may write it: Caffe's mutable_gpu_data)."""
        if self.head is AT_HOST:
            self.backend.to_device(self.host, out=self.device)
        self.head = AT_DEVICE

    def _host(self) -> np.ndarray:
        if self.host is None:
            self.host = np.empty(self.device.shape, np.dtype(self.device.dtype))
        return self.host

    def host_side(self, mutable: bool) -> np.ndarray:
        """The current values on the host; ``mutable``: the caller may write them (Caffe's
        mutable_cpu_data, what pycaffe's ``.data`` is), else only reads (cpu_data)."""
        if self.head is AT_DEVICE:
            self.backend.to_host(self.device, out=self._host())
            self.head = SYNCED
        if mutable:
            self.head = AT_HOST
        return self.host

    def host_write(self, shape, value) -> None:
        """Host code sets every element: no copy from the device first."""
        self._host().reshape(shape)[...] = value
        self.head = AT_HOST


class DeviceBlob(Blob):
    """A blob whose arrays live on a device. ``data``/``diff`` are the device arrays (what
    layers use), made current first if pycaffe code asked for the host copies since;
    :meth:`host_view` is what pycaffe code gets."""

    __slots__ = ("_data_mem", "_diff_mem", "_host_view")

    def __init__(self, shape: Sequence[int] = (), dtype=np.float32, xp=np):
        self._host_view = None
        super().__init__(shape, dtype, xp)

    def _alloc(self, shape: tuple) -> None:
        super()._alloc(shape)
        self._data_mem = SyncedMemory(self._data, device_of_xp(self.xp))
        self._diff_mem = None

    def _alloc_diff(self) -> None:
        super()._alloc_diff()
        self._diff_mem = SyncedMemory(self._diff, device_of_xp(self.xp))

    def _diff_synced(self) -> SyncedMemory:
        self._diff_array()
        return self._diff_mem

    def _get_data(self):
        if self._data_mem.head is not AT_DEVICE:
            self._data_mem.device_side()
        return self._data

    def _set_data(self, value) -> None:
        self._get_data()[...] = self.xp.asarray(value, dtype=self.dtype)

    def _get_diff(self):
        mem = self._diff_synced()
        if mem.head is not AT_DEVICE:
            mem.device_side()
        return self._diff

    def _set_diff(self, value) -> None:
        self._get_diff()[...] = self.xp.asarray(value, dtype=self.dtype)

    data = property(_get_data, _set_data)
    diff = property(_get_diff, _set_diff)

    def cpu_data(self) -> np.ndarray:
        return _read_only(self._data_mem.host_side(mutable=False).reshape(self.shape))

    def cpu_diff(self) -> np.ndarray:
        return _read_only(self._diff_synced().host_side(mutable=False).reshape(self.shape))

    def host_view(self) -> "HostBlob":
        if self._host_view is None:
            self._host_view = HostBlob(self)
        return self._host_view

    def share_data(self, other: "Blob") -> None:
        super().share_data(other)
        self._data_mem = other._data_mem

    def share_diff(self, other: "Blob") -> None:
        super().share_diff(other)
        self._diff_mem = other._diff_synced()

    def diff_in(self, memory) -> None:
        super().diff_in(memory)
        # Its own head: only the backward pass, on the device, touches a shared buffer.
        self._diff_mem = SyncedMemory(self._diff, device_of_xp(self.xp))

    def __repr__(self) -> str:
        return f"DeviceBlob(shape={self.shape}, dtype={self.dtype}, xp={self.xp.__name__})"


class HostBlob:
    """pycaffe's view of a DeviceBlob: ``data`` and ``diff`` are NumPy arrays (host copies
    that users may read and write in place, as with pycaffe's ``blob.data``); everything else
    (shape, reshape, count ...) is the blob's. Device code sees host writes the next time it
    touches the blob (e.g. in ``Net.forward``); host code sees device writes the next time it
    reads ``data`` or ``diff``, and a NumPy array held from before is refreshed in place then,
    as in pycaffe."""

    __slots__ = ("_blob",)

    def __init__(self, blob: DeviceBlob):
        self._blob = blob

    @property
    def data(self) -> np.ndarray:
        return self._blob._data_mem.host_side(mutable=True).reshape(self._blob.shape)

    @data.setter
    def data(self, value) -> None:
        self._blob._data_mem.host_write(self._blob.shape, value)

    @property
    def diff(self) -> np.ndarray:
        return self._blob._diff_synced().host_side(mutable=True).reshape(self._blob.shape)

    @diff.setter
    def diff(self, value) -> None:
        self._blob._diff_synced().host_write(self._blob.shape, value)

    @property
    def blob(self) -> DeviceBlob:
        """The device blob behind this view."""
        return self._blob

    def host_view(self) -> "HostBlob":
        return self

    def __getattr__(self, attr):
        return getattr(self._blob, attr)

    def __repr__(self) -> str:
        return f"HostBlob(shape={self._blob.shape}, dtype={self._blob.dtype})"
