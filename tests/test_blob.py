"""Blob: diffs allocated when first used, on the CPU and on a device backend (numpy)."""
import tracemalloc

import numpy as np

from cct.backend import npdevice
from cct.blob import Blob


def test_diff_is_allocated_zeroed_when_first_used():
    tracemalloc.start()
    try:
        b = Blob((256, 1024))
        allocated = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert allocated < 1.5 * b.data.nbytes     # the data only
    b.reshape(1024, 256)                       # same count, diff still unallocated
    assert b.diff.shape == (1024, 256) and b.diff.dtype == np.float32
    assert not b.diff.any() and not b.cpu_diff().any()
    b.diff[0, 0] = 5                           # pycaffe's blob.diff is the array itself
    assert b.diff[0, 0] == 5 and b.cpu_diff()[0, 0] == 5


def test_share_diff_before_first_use():
    a, flat = Blob((2, 6)), Blob((12,))
    flat.share_diff(a)
    flat.diff[...] = np.arange(12)
    np.testing.assert_array_equal(a.diff, np.arange(12).reshape(2, 6))


def test_device_blob_diff_on_first_use():
    a = Blob((2, 3), np.float32, npdevice.xp)
    shared = Blob((6,), np.float32, npdevice.xp)
    shared.share_diff(a)
    view = a.host_view()
    assert view.diff.shape == (2, 3) and not view.diff.any()
    view.diff[...] = 2                         # a host write reaches device code
    assert (shared.diff == 2).all()
    shared.diff[...] = 3                       # a device write reaches host code
    assert (view.diff == 3).all() and (a.cpu_diff() == 3).all()
    b = Blob((4,), np.float32, npdevice.xp)
    b.host_view().diff = 7                     # assigning every element before first use
    assert (b.diff == 7).all()
