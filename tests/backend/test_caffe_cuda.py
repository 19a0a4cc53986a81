"""cct/backend/caffe_cuda.py without a GPU: Caffe's pooling kernels are taken for a geometry
only after their first call there agreed with the array kernels; one that disagrees or fails
is dropped for that geometry with a warning, and every call returns the array kernels'
values. Here the "fast" kernels are the array kernels themselves (agreeing), or broken ones;
on a GPU the real ones are checked the same way by their first calls (tests/test_gpu_backend.py
runs nets through them)."""
import numpy as np
import pytest

from cct.backend import caffe_cuda, shapes
from cct.backend.array_kernels import ArrayKernels


class Fast:
    """PoolingKernels' methods computed by the array kernels, or broken on demand."""

    def __init__(self, broken=None):
        self.ref = ArrayKernels(np)
        self.broken = broken
        self.calls = []

    def _done(self, name, result):
        self.calls.append(name)
        if self.broken == "raise":
            raise RuntimeError("nvrtc: error")
        if self.broken == "values":
            return tuple(np.zeros_like(r) for r in result) if isinstance(result, tuple) \
                else np.zeros_like(result)
        return result

    def max_forward(self, x, kernel, stride, pad, pooled, out, mask):
        return self._done("max_forward", self.ref.max_pool_forward(x, kernel, stride, pad, pooled))

    def max_backward(self, dy, mask, x_shape, kernel, stride, pad, out):
        self.ref._pool_geometries[x_shape[2:] + dy.shape[2:]] = frozenset(
            {(kernel, stride, pad)})
        return self._done("max_backward", self.ref.max_pool_backward(dy, mask, x_shape))

    def ave_forward(self, x, kernel, stride, pad, pooled, out):
        return self._done("ave_forward", self.ref.ave_pool_forward(x, kernel, stride, pad, pooled))

    def ave_backward(self, dy, x_shape, kernel, stride, pad, pooled, out):
        return self._done("ave_backward",
                          self.ref.ave_pool_backward(dy, x_shape, kernel, stride, pad, pooled))


def _pool_all(k, x, dy_seed=1):
    geom = ((3, 3), (2, 2), (1, 1))
    pooled = (4, 4)
    y, mask = k.max_pool_forward(x, *geom, pooled)
    dy = np.random.default_rng(dy_seed).standard_normal(y.shape).astype(x.dtype)
    dx = k.max_pool_backward(dy, mask, x.shape)
    a = k.ave_pool_forward(x, *geom, pooled)
    da = k.ave_pool_backward(dy, x.shape, *geom, pooled)
    return y, mask, dx, a, da


@pytest.mark.parametrize("broken", [None, "values", "raise"])
def test_a_kernel_is_taken_only_where_it_gave_the_array_kernels_values(broken, capfd):
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 7)).astype(np.float32)
    want = _pool_all(ArrayKernels(np), x)
    k, fast = ArrayKernels(np), Fast(broken)
    caffe_cuda.wrap_pooling(k, fast, shapes.pair)
    for _ in range(2):   # the first call checks, the second runs what the check decided
        got = _pool_all(k, x)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    verdicts = [v for c in k.first_use_checks.values() for v in c.verdicts.values()]
    assert len(verdicts) == 4 and all(v is (broken is None) for v in verdicts)
    if broken is None:     # checked once, then taken: two calls of each
        assert sorted(fast.calls) == sorted(["max_forward", "max_backward", "ave_forward",
                                             "ave_backward"] * 2)
    else:                  # tried once, then never again
        assert len(fast.calls) == 4
        assert capfd.readouterr().err.count("runs in the array kernels") == 4


def test_a_kernel_writes_where_out_says_and_checks_against_fresh_arrays():
    """The check compares two results, not the caller's out= buffer with itself."""
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 7)).astype(np.float32)
    k = ArrayKernels(np)
    caffe_cuda.wrap_pooling(k, Fast("values"), shapes.pair)
    out = np.full((2, 3, 4, 4), 5.0, np.float32)
    got = k.ave_pool_forward(x, (3, 3), (2, 2), (1, 1), (4, 4), out=out)
    assert got is out
    np.testing.assert_array_equal(out, ArrayKernels(np).ave_pool_forward(
        x, (3, 3), (2, 2), (1, 1), (4, 4)))


def test_a_dtype_without_a_kernel_stays_in_the_array_kernels():
    x = np.random.default_rng(0).standard_normal((1, 1, 5, 5)).astype(np.float16)
    k, fast = ArrayKernels(np), Fast()
    caffe_cuda.wrap_pooling(k, fast, shapes.pair)
    try:
        k.ave_pool_forward(x, (2, 2), (2, 2), (0, 0), (3, 3))
    except Exception:   # the array kernels refuse float16 themselves: not our concern here
        pass
    assert fast.calls == []


def test_the_cuda_source_names_each_kernel_it_is_launched_by():
    for name in ("max_pool_forward", "max_pool_backward", "ave_pool_forward",
                 "ave_pool_backward", "softmax_loss_forward", "lrn_across_forward",
                 "lrn_across_backward"):
        assert f'__global__ void {name}(' in caffe_cuda._SOURCE


class FastLoss:
    """LossKernels' softmax_loss_forward by the array kernels, or off by a little."""

    def __init__(self, off=0.0):
        self.ref, self.off, self.calls = ArrayKernels(np), off, 0

    def softmax_loss_forward(self, x, label, ignore_label, prob, deferred):
        self.calls += 1
        p, loss, count, bad = self.ref.softmax_loss_forward(x, label, ignore_label,
                                                            deferred=deferred)
        return p + self.off, loss, count, bad


@pytest.mark.parametrize("deferred", [False, True])
@pytest.mark.parametrize("off", [0.0, 1e-3])
def test_the_loss_kernel_is_checked_like_the_pooling_ones(deferred, off, capfd):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5, 3)).astype(np.float32)
    label = rng.integers(0, 5, (4, 3)).astype(np.float32)
    want = ArrayKernels(np).softmax_loss_forward(x, label, None, deferred=deferred)
    k, fast = ArrayKernels(np), FastLoss(off)
    caffe_cuda.wrap_loss(k, fast)
    for _ in range(2):
        got = k.softmax_loss_forward(x, label, None, deferred=deferred)
        np.testing.assert_array_equal(got[0], want[0])
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert fast.calls == (2 if off == 0 else 1)
    assert ("runs in the array kernels" in capfd.readouterr().err) == (off != 0)


class FastReLU:
    """CaffeKernels' ReLU by the array kernels (writing into out, in place too), or broken."""

    def __init__(self, broken=False):
        self.ref, self.broken, self.calls = ArrayKernels(np), broken, 0

    def relu_forward(self, x, slope, out):
        self.calls += 1
        y = self.ref.relu_forward(x, slope, out=out)
        if self.broken:
            y[...] = 0
        return y

    def relu_backward(self, src, dy, slope, out):
        self.calls += 1
        return self.ref.relu_backward(src, dy, slope, out=out)


@pytest.mark.parametrize("broken", [False, True])
def test_relu_in_place_keeps_its_input_for_the_check(broken):
    """Caffe's ReLU runs in place: the check runs both kernels into fresh arrays, so the
    reference still reads the input, and the result lands in the caller's array."""
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    want = ArrayKernels(np).relu_forward(x, 0.1)
    k, fast = ArrayKernels(np), FastReLU(broken)
    caffe_cuda.wrap_relu(k, fast)
    y = x.copy()
    assert k.relu_forward(y, 0.1, out=y) is y
    np.testing.assert_array_equal(y, want)
    verdict, = k.first_use_checks["relu_forward"].verdicts.values()
    assert verdict is (not broken)


class FastSGD:
    def __init__(self, broken=False):
        self.ref, self.broken, self.calls = ArrayKernels(np), broken, 0

    def sgd_update(self, data, diff, history, rate, momentum, decay):
        self.calls += 1
        self.ref.sgd_update(data, diff, history, rate * (1.5 if self.broken else 1), momentum,
                            decay)


@pytest.mark.parametrize("broken", [False, True])
def test_the_sgd_step_is_checked_on_copies_and_its_result_written_back(broken):
    """An update changes its arguments: the check runs each side on copies, and the arrays
    end as the array kernels would leave them, twice over."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(50).astype(np.float32) for _ in range(3)]
    want = [a.copy() for a in arrays]
    ref = ArrayKernels(np)
    k, fast = ArrayKernels(np), FastSGD(broken)
    caffe_cuda.wrap_update(k, fast)
    for _ in range(2):
        ref.sgd_update(*want, 0.01, 0.9, 0.0005)
        k.sgd_update(*arrays, 0.01, 0.9, 0.0005)
        for a, w in zip(arrays, want):
            np.testing.assert_array_equal(a, w)
    assert fast.calls == (1 if broken else 2)
    verdict, = k.first_use_checks["sgd_update"].verdicts.values()
    assert verdict is (not broken)


class FastLRN:
    def __init__(self, broken=False):
        self.ref, self.broken, self.calls = ArrayKernels(np), broken, 0

    def lrn_forward(self, x, size, alpha, beta, k, out, scale):
        self.calls += 1
        y, s = self.ref.lrn_across_forward(x, size, alpha, beta, k, out=out, scale=scale)
        if self.broken:
            y[...] += 1
        return y, s

    def lrn_backward(self, x, y, scale, dy, size, alpha, beta, out):
        self.calls += 1
        return self.ref.lrn_across_backward(x, y, scale, dy, size, alpha, beta, out=out)


@pytest.mark.parametrize("broken", [False, True])
def test_lrn_is_checked_and_a_backward_into_dy_keeps_its_input(broken):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 3, 3)).astype(np.float32)
    ref = ArrayKernels(np)
    want_y, want_s = ref.lrn_across_forward(x, 5, 1e-4, 0.75, 1.0)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    want_dx = ref.lrn_across_backward(x, want_y, want_s, dy, 5, 1e-4, 0.75)
    k, fast = ArrayKernels(np), FastLRN(broken)
    caffe_cuda.wrap_lrn(k, fast)
    for _ in range(2):
        y, s = k.lrn_across_forward(x, 5, 1e-4, 0.75, 1.0)
        np.testing.assert_array_equal(y, want_y)
        np.testing.assert_array_equal(s, want_s)
        d = dy.copy()
        assert k.lrn_across_backward(x, y, s, d, 5, 1e-4, 0.75, out=d) is d
        np.testing.assert_array_equal(d, want_dx)
    verdicts = {name: list(c.verdicts.values()) for name, c in k.first_use_checks.items()}
    assert verdicts == {"lrn_across_forward": [not broken], "lrn_across_backward": [True]}


def test_each_check_hands_its_temporaries_back_once(capfd):
    """The reference's temporaries (a whole batch's window gathers) go back to the device
    after each geometry's check, not on the calls after it (CaffeKernels.release)."""
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 4)).astype(np.float32)
    k, fast = ArrayKernels(np), FastReLU()
    released = []
    fast.release = lambda: released.append(1)
    caffe_cuda.wrap_relu(k, fast)
    for _ in range(3):
        k.relu_forward(x, 0.0)
    assert len(released) == 1
    k.relu_forward(x[:1], 0.0)                     # another geometry: its own check
    assert len(released) == 2


def _wrapped_everywhere():
    """An ArrayKernels with every wrapper gpu.py applies, over fast kernels that are never
    called here (cudnn's convolutions included: a wrapper only reaches them when called)."""
    from cct.backend import cudnn
    k = ArrayKernels(np)
    caffe_cuda.wrap_all(k, Fast(), shapes.pair)
    cudnn.wrap_lowering(k, object(), shapes.pair)
    return k


def test_every_wrapped_kernel_takes_the_arguments_of_the_one_it_replaces():
    """A wrapper that lacks an argument of the array kernel it stands for breaks every call
    that passes it, and only on a GPU, which CI has not: the fused ReLU backward's relu= made
    every MAX pooling and LRN backward a TypeError on CuPy until their wrappers took it."""
    import inspect
    plain, k = ArrayKernels(np), _wrapped_everywhere()
    wrapped = sorted(name for name in vars(k) if callable(vars(k)[name])
                     and callable(getattr(plain, name, None)))
    assert {"max_pool_forward", "max_pool_backward", "ave_pool_forward", "ave_pool_backward",
            "softmax_loss_forward", "relu_forward", "relu_backward", "sgd_update",
            "lrn_across_forward", "lrn_across_backward", "conv_forward", "conv_backward_data",
            "conv_backward_weight"} <= set(wrapped)
    for name in wrapped:
        want = inspect.signature(getattr(plain, name)).parameters
        got = inspect.signature(getattr(k, name)).parameters
        assert [(p.name, p.kind, p.default) for p in got.values()] == \
            [(p.name, p.kind, p.default) for p in want.values()], name


def test_a_relu_given_to_a_wrapped_backward_gets_the_array_kernels_values():
    """relu= (a fused ReLU's backward) through the wrapped MAX pooling and LRN backward: Caffe's
    kernels have no ReLU, so the array kernels run those calls."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 7, 7)).astype(np.float32)
    src = rng.standard_normal(x.shape).astype(np.float32)
    plain, k = ArrayKernels(np), _wrapped_everywhere()
    geom = ((3, 3), (2, 2), (0, 0), (3, 3))
    for kernels in (plain, k):
        y, mask = kernels.max_pool_forward(x, *geom)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    np.testing.assert_array_equal(
        k.max_pool_backward(dy, mask, x.shape, relu=(src, 0.25)),
        plain.max_pool_backward(dy, mask, x.shape, relu=(src, 0.25)))
    y, scale = plain.lrn_across_forward(x, 5, 1e-2, 0.75, 1.0)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    np.testing.assert_array_equal(
        k.lrn_across_backward(x, y, scale, dy, 5, 1e-2, 0.75, relu=(src, 0.0)),
        plain.lrn_across_backward(x, y, scale, dy, 5, 1e-2, 0.75, relu=(src, 0.0)))
