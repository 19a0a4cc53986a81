"""The kernels' argument conventions in cct.backend.shapes, which the CPU kernels and the array
kernels share: the out= targets on NumPy and on an array module without ``writeable`` flags
(CuPy's), and each family naming itself when it refuses a dtype."""
import types

import numpy as np
import pytest

from cct.backend import array_kernels, cpu, shapes
from cct.backend.array_kernels import ArrayKernels


def test_both_kernel_families_use_the_one_copy_of_the_helpers():
    for name in ("_dtype", "_pair", "_target", "_result", "_disjoint", "_accumulating"):
        assert getattr(cpu, name) is getattr(array_kernels, name), name
    assert cpu._target is shapes.target


def test_a_refused_dtype_names_the_family_that_refused_it():
    x = np.zeros((2, 3), np.int32)
    with pytest.raises(TypeError, match="^cpu kernels take float32 or float64 arrays, not int32"):
        cpu.relu_forward(x, 0.0)
    with pytest.raises(TypeError, match="^array kernels take float32 or float64 arrays, not int32"):
        ArrayKernels(np).relu_forward(x, 0.0)


def test_out_is_written_directly_when_it_can_be():
    out = np.zeros((2, 3), np.float32)
    assert shapes.target(np, out, (6,), out.dtype) == (out, None)
    # CuPy's flags have c_contiguous but no writeable
    cupy_like = types.SimpleNamespace(dtype=out.dtype,
                                      flags=types.SimpleNamespace(c_contiguous=True))
    assert shapes.target(np, cupy_like, (6,), out.dtype) == (cupy_like, None)


@pytest.mark.parametrize("make", [
    lambda a: np.asfortranarray(a),
    lambda a: a.astype(np.float64),
    lambda a: np.lib.stride_tricks.as_strided(a, writeable=False)])
def test_out_the_kernel_cannot_write_gets_a_temporary(make):
    out = make(np.arange(6, dtype=np.float32).reshape(2, 3))
    buf, dest = shapes.target(np, out, (2, 3), np.dtype(np.float32))
    assert dest is out and buf is not out and buf.flags.c_contiguous
    # accumulating kernels add into the temporary, so it starts as out's values
    kept, dest = shapes.target(np, out, (2, 3), np.dtype(np.float32), keep=True)
    assert dest is out and kept.dtype == np.float32 and (kept == out).all()
    if out.flags.writeable:
        assert shapes.result(kept + 1, dest) is out and (out == np.arange(1, 7).reshape(2, 3)).all()
