"""cct's own cuBLAS handle (cct/backend/cublas.py): how it lays row-major operands, transposed
views and stacks out for column-major cuBLAS, checked without a GPU against a cuBLAS of
NumPy's (cublasSgemm_v2's contract, read and written through the pointers it is given); on a
GPU, the real one against CuPy's matmul."""
import ctypes

import numpy as np
import pytest

from cct.backend import cublas, gpu
from cct.backend.reduced import COMPUTE_TYPE, round_operand

GPU_OK, GPU_REASON = gpu.available()


class _Memory:
    data = None

    def __init__(self, ptr):
        self.ptr = ptr


class Dev(np.ndarray):
    """A NumPy array posing as a device array: ``.data.ptr`` is its address."""

    @property
    def data(self):
        return _Memory(self.ctypes.data)

    def fill(self, value):
        self[...] = value


def dev(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(Dev)


class FakeCupy:
    """What CublasGemm asks of CuPy: arrays, and the current stream and device."""

    class cuda:
        class runtime:
            @staticmethod
            def getDevice():
                return 0

        class _Stream:
            ptr = 0

        @staticmethod
        def get_current_stream():
            return FakeCupy.cuda._Stream()

    @staticmethod
    def empty(shape, dtype):
        return np.empty(shape, dtype).view(Dev)

    @staticmethod
    def ascontiguousarray(a):
        return dev(a)

    @staticmethod
    def matmul(a, b, out=None):
        raise AssertionError("fell back to CuPy's matmul")


def _matrix(ptr, rows, cols, ld):
    """A column-major rows x cols matrix at ``ptr`` with leading dimension ``ld``."""
    size = (cols - 1) * ld + rows
    flat = np.ctypeslib.as_array((ctypes.c_float * size).from_address(ptr))
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (4, 4 * ld))


class FakeLib:
    """cublasSgemm_v2's contract in NumPy: C = alpha op(A) op(B) + beta C, column-major."""

    def __init__(self):
        self.calls = 0
        self.computes = []

    def cublasSgemm_v2(self, handle, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        self.calls += 1
        a = _matrix(A.value, k, m, lda).T if ta else _matrix(A.value, m, k, lda)
        b = _matrix(B.value, n, k, ldb).T if tb else _matrix(B.value, k, n, ldb)
        c = _matrix(C.value, m, n, ldc)
        # alpha and beta: host pointers (byref), as cuBLAS's default pointer mode reads them
        c[...] = alpha._obj.value * (a @ b) + (beta._obj.value * c if beta._obj.value else 0)
        return 0


    def cublasGemmEx(self, handle, ta, tb, m, n, k, alpha, A, a_type, lda, B, b_type, ldb,
                     beta, C, c_type, ldc, compute, algo):
        """cublasGemmEx's contract for float32 matrices: the compute type's tensor cores
        round A and B down (reduced.round_operand), the sums and C stay float32."""
        assert (a_type, b_type, c_type, algo) == (cublas.CUDA_R_32F,) * 3 + (
            cublas.CUBLAS_GEMM_DEFAULT,)
        precision = {v: k for k, v in COMPUTE_TYPE.items()}[compute]
        self.computes.append(precision)
        a = _matrix(A.value, k, m, lda).T if ta else _matrix(A.value, m, k, lda)
        b = _matrix(B.value, n, k, ldb).T if tb else _matrix(B.value, k, n, ldb)
        c = _matrix(C.value, m, n, ldc)
        c[...] = alpha._obj.value * (round_operand(np.ascontiguousarray(a), precision)
                                     @ round_operand(np.ascontiguousarray(b), precision))
        self.calls += 1
        return 0


@pytest.fixture
def fake():
    g = cublas.CublasGemm(FakeCupy)
    g._lib = FakeLib()
    g._handles[0] = (ctypes.c_void_p(1), None, [0])
    return g


def _cases():
    rs = np.random.RandomState(0)
    a, b = rs.randn(5, 7), rs.randn(7, 3)
    yield "plain", dev(a), dev(b)
    yield "a transposed", dev(a.T).T, dev(b)                  # x.T of InnerProduct
    yield "b transposed", dev(a), dev(b.T).T                  # weight.T
    yield "both", dev(a.T).T, dev(b.T).T
    yield "a strided", dev(rs.randn(5, 14))[:, ::2], dev(b)   # neither layout: a copy
    g, c = rs.randn(2, 4, 6), rs.randn(2, 6, 5)
    yield "stack", dev(g), dev(c)                             # the grouped convolution's
    yield "stack, a transposed", dev(g.transpose(0, 2, 1)).transpose(0, 2, 1), dev(c)
    yield "one column", dev(rs.randn(1, 9)), dev(rs.randn(9, 1))   # Caffe's dot


@pytest.mark.parametrize("name,a,b", list(_cases()), ids=[c[0] for c in _cases()])
def test_the_layout_gives_the_product(fake, name, a, b):
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    got = fake.matmul(a, b)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    out = dev(np.zeros(want.shape))
    assert fake.matmul(a, b, out=out) is out
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp16"])
def test_a_reduced_precision_goes_through_gemm_ex_with_its_compute_type(fake, precision):
    rs = np.random.RandomState(2)
    a, b = rs.randn(6, 40), rs.randn(3, 40).T          # b transposed: weight.T
    fake.precision = precision
    got = fake.matmul(dev(a), dev(b.T).T)
    want = (round_operand(np.float32(a), precision).astype(np.float64)
            @ round_operand(np.ascontiguousarray(b, np.float32), precision))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert fake._lib.computes == [precision]
    fake.precision = "float32"
    fake.matmul(dev(a), dev(b))
    assert fake._lib.computes == [precision]           # float32: cublasSgemm, as before


def test_what_it_does_not_take_goes_to_cupy(fake):
    with pytest.raises(AssertionError, match="CuPy's matmul"):
        fake.matmul(dev(np.ones((2, 2))).astype(np.float64).view(Dev), dev(np.ones((2, 2))))
    with pytest.raises(AssertionError, match="CuPy's matmul"):
        fake.matmul(dev(np.ones((2, 3, 4))), dev(np.ones((4, 5))))   # a broadcast


@pytest.mark.skipif(not GPU_OK, reason=f"no usable GPU: {GPU_REASON}")
def test_the_real_handle_agrees_with_cupy():
    import cupy
    g = cublas.gemm(cupy)
    rs = np.random.RandomState(1)
    for a, b in ((rs.randn(64, 500), rs.randn(500, 10)), (rs.randn(500, 64).T, rs.randn(10, 500).T),
                 (rs.randn(2, 48, 75), rs.randn(2, 75, 300))):
        da, db = cupy.asarray(a, cupy.float32), cupy.asarray(b, cupy.float32)
        want = cupy.matmul(da, db)
        got = g.matmul(da, db)
        assert float(abs(got - want).max()) <= 1e-4 * float(abs(want).max())


@pytest.mark.skipif(not GPU_OK, reason=f"no usable GPU: {GPU_REASON}")
@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp16"])
def test_the_real_handle_in_a_reduced_precision(precision):
    """cuBLAS's tensor cores in each compute type: near the rounded operands' float64
    product, and not float32's exact one (the operands were rounded)."""
    import cupy
    g = cublas.CublasGemm(cupy)
    g.precision = precision
    rs = np.random.RandomState(3)
    a, b = rs.randn(256, 512).astype(np.float32), rs.randn(512, 128).astype(np.float32)
    got = cupy.asnumpy(g.matmul(cupy.asarray(a), cupy.asarray(b)))
    # FAST_16F lets cuBLAS take TF32 instead of half (cublas_api.h): either rounding
    roundings = [precision] + (["tf32"] if precision == "fp16" else [])
    wants = [round_operand(a, r).astype(np.float64) @ round_operand(b, r).astype(np.float64)
             for r in roundings]
    want = wants[0]
    assert min(np.abs(got - w).max() for w in wants) <= 1e-4 * np.abs(want).max()
    assert np.abs(got - a.astype(np.float64) @ b).max() > 1e-6 * np.abs(want).max()
