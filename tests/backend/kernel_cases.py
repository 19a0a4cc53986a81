"""Geometries, inputs and tolerances shared by the kernel tests (test_cpu_kernels.py for the C++
kernels, test_array_kernels.py for the array-generic ones): both check a backend against the
NumPy reference (cct.backend.reference) on the same hand-picked cases plus each its own random
ones, so a geometry one backend gets wrong is tried on the other too."""
import numpy as np
import pytest

from cct.backend import cpu, reference

# (n, c, h, w, o, kernel, stride, pad, dilation, group)
CONV_CASES = [
    (2, 3, 7, 9, 4, (3, 3), (1, 1), (0, 0), (1, 1), 1),      # plain, odd sizes
    (1, 3, 8, 8, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1),      # batch 1, pad
    (3, 4, 11, 10, 6, (3, 5), (2, 1), (1, 2), (1, 1), 2),    # rectangular, groups
    (2, 6, 9, 9, 6, (3, 3), (1, 1), (2, 2), (2, 2), 3),      # dilation
    (2, 2, 13, 12, 3, (2, 2), (4, 3), (1, 0), (1, 1), 1),    # stride > kernel
    (2, 3, 5, 6, 2, (1, 1), (1, 1), (0, 0), (1, 1), 1),      # 1x1
    (2, 2, 5, 5, 3, (3, 3), (1, 1), (4, 3), (1, 1), 1),      # pad > kernel
    (1, 2, 6, 7, 2, (6, 7), (1, 1), (0, 0), (1, 1), 1),      # kernel = bottom: 1x1 top
    (2, 4, 17, 15, 4, (5, 3), (3, 2), (2, 1), (2, 3), 4),    # depthwise-like, everything
    (2, 3, 27, 27, 8, (11, 11), (4, 4), (0, 0), (1, 1), 1),  # CaffeNet conv1 in small
]

# (n, c, h, w, kernel, stride, pad, ceil_mode)
POOL_CASES = [
    (2, 3, 7, 9, (3, 3), (2, 2), (0, 0), True),    # CaffeNet-like overlapping windows
    (1, 2, 8, 8, (2, 2), (2, 2), (0, 0), True),    # batch 1, tiling windows
    (2, 2, 9, 11, (3, 2), (1, 3), (1, 1), True),   # rectangular, pad, stride > kernel in w
    (3, 1, 10, 7, (2, 2), (3, 3), (1, 0), False),  # stride > kernel, floor mode
    (2, 3, 5, 5, (5, 5), (1, 1), (0, 0), True),    # global
    (1, 4, 13, 13, (3, 3), (2, 2), (2, 2), True),  # pad, last window dropped by the clip rule
]

DTYPES = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def random_conv_cases(count, seed):
    """``count`` random convolution geometries (groups, dilation, stride > kernel, pad > kernel,
    batch 1) whose dilated kernel fits the padded bottom."""
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        group = int(rng.choice([1, 1, 2, 3]))
        c, o = group * int(rng.integers(1, 4)), group * int(rng.integers(1, 4))
        kernel = tuple(int(k) for k in rng.integers(1, 6, 2))
        stride = tuple(int(s) for s in rng.integers(1, 5, 2))
        pad = tuple(int(p) for p in rng.integers(0, 4, 2))
        dilation = tuple(int(d) for d in rng.integers(1, 3, 2))
        h, w = (int(s) for s in rng.integers(1, 14, 2))
        extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
        if h + 2 * pad[0] < extent[0] or w + 2 * pad[1] < extent[1]:
            continue
        cases.append((int(rng.integers(1, 4)), c, h, w, o, kernel, stride, pad, dilation,
                      group))
    return cases


def pooled_shape(h, w, kernel, stride, pad, ceil_mode):
    return tuple(cpu.pool_out_size(s, k, st, p, ceil_mode)
                 for s, k, st, p in zip((h, w), kernel, stride, pad))


def has_empty_window(size, geom):
    """Whether ceil rounding placed a last window wholly beyond a bottom of ``size`` (h, w):
    Caffe gives it a -FLT_MAX MAX top and a non-positive AVE divisor; the reference has none."""
    kernel, stride, pad, pooled = geom
    return any((p - 1) * st - pd >= s for s, st, pd, p in zip(size, stride, pad, pooled))


def random_pool_cases(count, seed, empty_windows=True):
    """``count`` random pooling geometries (pad < kernel, as Caffe requires); with
    ``empty_windows`` False, none with a window wholly beyond the bottom."""
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        kernel = tuple(int(k) for k in rng.integers(1, 5, 2))
        stride = tuple(int(s) for s in rng.integers(1, 5, 2))
        pad = tuple(int(rng.integers(0, k)) for k in kernel)
        h, w = (int(s) for s in rng.integers(1, 15, 2))
        ceil_mode = bool(rng.integers(0, 2))
        if h + 2 * pad[0] < kernel[0] or w + 2 * pad[1] < kernel[1]:
            continue
        pooled = pooled_shape(h, w, kernel, stride, pad, ceil_mode)
        if not empty_windows and has_empty_window((h, w), (kernel, stride, pad, pooled)):
            continue
        cases.append((int(rng.integers(1, 4)), int(rng.integers(1, 4)), h, w, kernel, stride,
                      pad, ceil_mode))
    return cases


def rand(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def close(got, want, dtype):
    """got has want's dtype and shape and its values to the dtype's TOL, relative to want's
    largest magnitude where that exceeds 1."""
    assert got.dtype == np.dtype(dtype)
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got / scale, want / scale, **TOL[dtype])


def conv_arrays(case, dtype, seed=0):
    """x, weight, bias and top diff dy for a CONV_CASES row, and the geometry arguments the
    kernels take after them."""
    n, c, h, w, o, kernel, stride, pad, dilation, group = case
    ho = cpu.conv_out_size(h, kernel[0], stride[0], pad[0], dilation[0])
    wo = cpu.conv_out_size(w, kernel[1], stride[1], pad[1], dilation[1])
    x = rand((n, c, h, w), dtype, seed)
    weight = rand((o, c // group) + kernel, dtype, seed + 1)
    bias = rand(o, dtype, seed + 2)
    dy = rand((n, o, ho, wo), dtype, seed + 3)
    return x, weight, bias, dy, (kernel, stride, pad, dilation, group)


def pool_arrays(case, dtype):
    """x and top diff dy for a POOL_CASES row, and the geometry arguments the kernels take."""
    n, c, h, w, kernel, stride, pad, ceil_mode = case
    pooled = pooled_shape(h, w, kernel, stride, pad, ceil_mode)
    x = rand((n, c, h, w), dtype, 2)
    dy = rand((n, c) + pooled, dtype, 3)
    return x, dy, (kernel, stride, pad, pooled)


def check_conv(kernels, x, weight, bias, dy, geom, dtype, weight_grad=True, no_bias=False):
    """``kernels``' conv_forward (with ``no_bias`` also without the bias), conv_backward_data
    and (with ``weight_grad``) conv_backward_weight against the reference."""
    close(kernels.conv_forward(x, weight, bias, *geom),
          reference.conv_forward(x, weight, bias, *geom), dtype)
    if no_bias:
        close(kernels.conv_forward(x, weight, None, *geom),
              reference.conv_forward(x, weight, None, *geom), dtype)
    close(kernels.conv_backward_data(dy, weight, x.shape, *geom),
          reference.conv_backward_data(dy, weight, x.shape, *geom), dtype)
    if weight_grad:
        close(kernels.conv_backward_weight(x, dy, *geom),
              reference.conv_backward_weight(x, dy, *geom), dtype)


def check_pooling_writes_into_out(kernels, dtype):
    """MAX and AVE pooling, forward and backward, write into the out= (and mask=) arrays
    given, overwriting what they held, and return them; an out overlapping dy is refused."""
    x, dy, geom = pool_arrays(POOL_CASES[2], dtype)
    y_ref, mask_ref = reference.max_pool_forward(x, *geom)
    y, mask = np.full(y_ref.shape, np.nan, dtype), np.full(y_ref.shape, -7, np.int32)
    got = kernels.max_pool_forward(x, *geom, out=y, mask=mask)
    assert got[0] is y and got[1] is mask
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(mask, mask_ref)
    dx = np.full(x.shape, np.nan, dtype)
    assert kernels.max_pool_backward(dy, mask, x.shape, out=dx) is dx
    close(dx, reference.max_pool_backward(dy, mask_ref, x.shape), dtype)
    assert kernels.ave_pool_forward(x, *geom, out=y) is y
    close(y, reference.ave_pool_forward(x, *geom), dtype)
    assert kernels.ave_pool_backward(dy, x.shape, *geom, out=dx) is dx
    close(dx, reference.ave_pool_backward(dy, x.shape, *geom), dtype)
    with pytest.raises(ValueError, match="out overlaps dy"):
        kernels.ave_pool_backward(dy, dy.shape, (1, 1), (1, 1), (0, 0), dy.shape[2:], out=dy)


def check_max_pool(kernels, want, case, dtype):
    """``kernels``' MAX pooling, forward (top and mask) and backward, equal to ``want``'s (a
    module of the same kernels: the reference or cct.backend.cpu) on a POOL_CASES row."""
    x, dy, geom = pool_arrays(case, dtype)
    y, mask = kernels.max_pool_forward(x, *geom)
    want_y, want_mask = want.max_pool_forward(x, *geom)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(mask, want_mask)
    assert y.dtype == np.dtype(dtype) and mask.dtype == np.int32
    dx = kernels.max_pool_backward(dy, mask, x.shape)
    close(dx, want.max_pool_backward(dy, want_mask, x.shape), dtype)
    # through an in-place ReLU's backward on the bottom (x its data: zeros too, and a slope),
    # the bits of the two kernels one after the other
    x.reshape(-1)[::4] = 0
    for slope in (0.0, 0.1):
        fused = kernels.max_pool_backward(dy, mask, x.shape, relu=(x, slope))
        assert fused.tobytes() == kernels.relu_backward(x, dx, slope).tobytes(), slope
        close(fused, want.max_pool_backward(dy, want_mask, x.shape, relu=(x, slope)), dtype)


def check_ave_pool(kernels, want, case, dtype):
    """``kernels``' AVE pooling, forward and backward, against ``want``'s (as check_max_pool)."""
    x, dy, geom = pool_arrays(case, dtype)
    close(kernels.ave_pool_forward(x, *geom), want.ave_pool_forward(x, *geom), dtype)
    close(kernels.ave_pool_backward(dy, x.shape, *geom),
          want.ave_pool_backward(dy, x.shape, *geom), dtype)


def check_relu(kernels, shape, slope, dtype):
    """relu_forward and relu_backward equal the reference's bit for bit, returned and written
    in place (out= the input)."""
    x, dy = rand(shape, dtype), rand(shape, dtype, 1)
    y = kernels.relu_forward(x, slope)
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y, reference.relu_forward(x, slope))
    np.testing.assert_array_equal(kernels.relu_backward(x, dy, slope),
                                  reference.relu_backward(x, dy, slope))
    buf = x.copy()
    assert kernels.relu_forward(buf, slope, out=buf) is buf
    np.testing.assert_array_equal(buf, y)
    want = reference.relu_backward(x, dy, slope)
    assert kernels.relu_backward(x, dy, slope, out=dy) is dy
    np.testing.assert_array_equal(dy, want)


# (bottom shapes, axis) of Concat (and Slice, its reverse): every axis; runs of one element;
# one run; an empty bottom; the last one's first bottom (over csrc's kParallelGrain, 65,536
# elements) are split between threads inside their runs
CONCAT_CASES = [
    ([(2, 3, 4, 5), (2, 1, 4, 5), (2, 6, 4, 5)], 1),
    ([(1, 3, 4, 5), (3, 3, 4, 5)], 0),
    ([(2, 3, 1, 5), (2, 3, 2, 5)], 2),
    ([(2, 3, 4, 2), (2, 3, 4, 1), (2, 3, 4, 3)], 3),
    ([(4, 7), (4, 2)], 1),
    ([(3,)], 0),
    ([(2, 0, 3), (2, 4, 3)], 1),   # an empty bottom
    ([(2, 300, 30, 30), (2, 17, 30, 30), (2, 7, 30, 30)], 1),
]


def check_concat_backward(kernels, dy, axis, counts, shapes, fused, dtype):
    outs = [np.full(shape, 5, dtype) for shape in shapes]
    if len(outs) > 2:
        outs[-1] = None
    wants = reference.concat_backward(dy, axis, counts,
                                      [None if o is None else o.copy() for o in outs],
                                      relu=fused)
    gots = kernels.concat_backward(dy, axis, counts, outs, relu=fused)
    assert len(gots) == len(shapes)
    for k, (g, w, o) in enumerate(zip(gots, wants, outs)):
        if o is None:
            assert g is None and w is None
        else:
            assert g is o and g.tobytes() == w.tobytes(), (k, fused is not None)


def check_concat(kernels, case, dtype):
    """concat_forward and concat_backward equal the reference's bit for bit, returned and
    written into out= (a non-contiguous one too); the backward through a ReLU's backward on
    every bottom but the last (slopes 0 and 0.1: -0, NaN and infinity kept as relu_backward
    keeps them), a bottom not wanted (None) left alone."""
    shapes, axis = case
    bottoms = [rand(shape, dtype, seed) for seed, shape in enumerate(shapes)]
    want = reference.concat_forward(bottoms, axis)
    got = kernels.concat_forward(bottoms, axis)
    assert got.dtype == np.dtype(dtype) and got.tobytes() == want.tobytes()
    out = np.zeros(want.shape, dtype, order="F")
    assert kernels.concat_forward(bottoms, axis, out=out) is out
    np.testing.assert_array_equal(out, want)
    dy = rand(want.shape, dtype, 7)
    flat = dy.reshape(-1)
    flat[::5], flat[1::7], flat[2::11] = -np.inf, np.nan, -0.0
    counts = [s[axis] for s in shapes]
    srcs = [rand(shape, dtype, 9 + k) for k, shape in enumerate(shapes)]
    srcs[0].reshape(-1)[::3] = 0
    last = len(shapes) - 1
    for slope in (None, 0.0, 0.1):  # a ReLU on every bottom but the last
        fused = None if slope is None else [None if k == last else (src, slope)
                                            for k, src in enumerate(srcs)]
        with np.errstate(invalid="ignore"):  # relu_backward's 0 * inf, as Caffe's makes NaN
            check_concat_backward(kernels, dy, axis, counts, shapes, fused, dtype)
    with pytest.raises(ValueError, match="counts"):
        kernels.concat_backward(dy, axis, counts[:-1] + [counts[-1] + 1], [None] * len(counts))
    if len(shapes) > 1:
        wrong = list(shapes[1])
        wrong[(axis + 1) % len(wrong)] += 1
        with pytest.raises(ValueError, match="must agree on every axis but"):
            kernels.concat_forward([bottoms[0], rand(tuple(wrong), dtype)], axis)


# S < 8 runs NumPy's expressions on the CPU backend, S >= 8 the numba loops (cpu.py)
BATCH_NORM_SHAPES = [(1, 1, 1), (2, 3, 1), (5, 7, 13), (4, 32, 256), (100, 3, 2), (3, 2, 8),
                     (2, 5, 23)]


def check_batch_norm(kernels, shape, dtype):
    """batch_norm_statistics, _normalize and _backward (batch and global statistics) against
    the float64 reference, returned and written into out= (backward in place on the top diff,
    as an in-place BatchNorm runs it)."""
    x = rand(shape, dtype) * dtype(3) + dtype(0.5)
    mean, var = kernels.batch_norm_statistics(x)
    assert mean.dtype == var.dtype == np.dtype(dtype) and mean.shape == (shape[1],)
    want_mean, want_var = reference.batch_norm_statistics(x)
    close(mean, want_mean, dtype)
    close(var, want_var, dtype)
    std = np.sqrt(var + dtype(1e-5))
    y = kernels.batch_norm_normalize(x, mean, std)
    close(y, reference.batch_norm_normalize(x, mean, std), dtype)
    out = np.full(shape, np.nan, dtype)
    assert kernels.batch_norm_normalize(x, mean, std, out=out) is out
    np.testing.assert_array_equal(out, y)
    for global_stats in (False, True):
        dy = rand(shape, dtype, 1)
        want = reference.batch_norm_backward(dy, y, std, global_stats)
        close(kernels.batch_norm_backward(dy, y, std, global_stats), want, dtype)
        assert kernels.batch_norm_backward(dy, y, std, global_stats, out=dy) is dy
        close(dy, want, dtype)


# (shape, number of bottoms)
ELTWISE_CASES = [((1,), 2), ((2, 3, 5, 7), 2), ((4, 1, 1), 3), ((3, 17), 4), ((2, 32, 9, 9), 2),
                 ((3, 7, 33, 35), 4)]  # the last: several blocks of the C++ sum per thread


def check_eltwise(kernels, shape, count, dtype):
    """eltwise_sum (with coefficients), _prod, _max (its mask by Caffe's tie rule, on values
    drawn from a few integers so that ties are common) and _max_backward against the
    reference, returned and into out=, also when out is a bottom (an in-place layer), and
    SUM's and PROD's bits against the NumPy expressions the layer used before."""
    rng = np.random.default_rng(count)
    bottoms = [rand(shape, dtype, seed) for seed in range(count)]
    coeffs = [1.0, -0.5, 2.0, 0.25][:count]
    got = kernels.eltwise_sum(bottoms, coeffs)
    close(got, reference.eltwise_sum(bottoms, coeffs), dtype)
    staged = dtype(coeffs[0]) * bottoms[0]
    for c, b in zip(coeffs[1:], bottoms[1:]):
        staged += dtype(c) * b
    np.testing.assert_array_equal(got, staged)
    prod = kernels.eltwise_prod(bottoms)
    close(prod, reference.eltwise_prod(bottoms), dtype)
    staged = bottoms[0] * bottoms[1]
    for b in bottoms[2:]:
        staged *= b
    np.testing.assert_array_equal(prod, staged)
    in_place = [b.copy() for b in bottoms]
    assert kernels.eltwise_sum(in_place, coeffs, out=in_place[0]) is in_place[0]
    np.testing.assert_array_equal(in_place[0], got)
    # every coefficient 1 (Split's backward): Caffe's add then adds, to the bit, also into the
    # first or the second bottom
    ones = [1.0] * count
    split = bottoms[0] + bottoms[1]
    for b in bottoms[2:]:
        split += b
    np.testing.assert_array_equal(kernels.eltwise_sum(bottoms, ones), split)
    for k in (0, 1):
        in_place = [b.copy() for b in bottoms]
        assert kernels.eltwise_sum(in_place, ones, out=in_place[k]) is in_place[k]
        np.testing.assert_array_equal(in_place[k], split)
    if count > 2:      # out over a later bottom: the sum still reads that bottom as it was
        in_place = [b.copy() for b in bottoms]
        assert kernels.eltwise_sum(in_place, ones, out=in_place[2]) is in_place[2]
        np.testing.assert_array_equal(in_place[2], split)
    in_place = [b.copy() for b in bottoms]
    assert kernels.eltwise_prod(in_place, out=in_place[-1]) is in_place[-1]
    np.testing.assert_array_equal(in_place[-1], prod)

    ties = [rng.integers(-2, 3, shape).astype(dtype) for _ in range(count)]
    want_top, want_mask = reference.eltwise_max(ties)
    top, mask = kernels.eltwise_max(ties)
    assert mask.dtype == np.int32
    np.testing.assert_array_equal(mask, want_mask)
    close(top, want_top, dtype)
    out, given = np.full(shape, np.nan, dtype), np.full(shape, -1, np.int32)
    got_top, got_mask = kernels.eltwise_max(ties, out=out, mask=given)
    assert got_top is out and got_mask is given
    np.testing.assert_array_equal(given, want_mask)
    dy = rand(shape, dtype, 7)
    for index in range(count):
        dx = np.full(shape, np.nan, dtype)
        assert kernels.eltwise_max_backward(dy, mask, index, out=dx) is dx
        close(dx, reference.eltwise_max_backward(dy, want_mask, index), dtype)
    with pytest.raises(ValueError, match="two or more"):
        kernels.eltwise_sum(bottoms[:1], coeffs[:1])
    with pytest.raises(ValueError, match="must agree"):
        kernels.eltwise_prod([bottoms[0], np.zeros((9,) + shape, dtype)])


def check_lrn(kernels, shape, params, dtype):
    """lrn_across_forward (top and scale allocated, and given as out= and scale=) and
    lrn_across_backward in place on the top diff, against the reference."""
    size, alpha, beta, k = params
    x, dy = rand(shape, dtype), rand(shape, dtype, 1)
    y, scale = kernels.lrn_across_forward(x, size, alpha, beta, k)
    want_y, want_scale = reference.lrn_across_forward(x, size, alpha, beta, k)
    close(scale, want_scale, dtype)
    close(y, want_y, dtype)
    out, given = np.empty_like(x), np.empty_like(x)
    got = kernels.lrn_across_forward(x, size, alpha, beta, k, out=out, scale=given)
    assert got[0] is out and got[1] is given
    close(given, want_scale, dtype)
    close(out, want_y, dtype)
    dx = dy.copy()
    assert kernels.lrn_across_backward(x, y, scale, dx, size, alpha, beta, out=dx) is dx
    close(dx, reference.lrn_across_backward(x, want_y, want_scale, dy, size, alpha, beta),
          dtype)
    # through an in-place ReLU's backward on the bottom (its data, zeros and negatives: here
    # x), in place on the top diff too: the bits of the two kernels one after the other
    src = x.copy()
    src.reshape(-1)[::4] = 0
    for slope in (0.0, 0.1):
        fused = dy.copy()
        assert kernels.lrn_across_backward(x, y, scale, fused, size, alpha, beta, out=fused,
                                           relu=(src, slope)) is fused
        assert fused.tobytes() == kernels.relu_backward(src, dx, slope).tobytes(), slope


def check_softmax(kernels, shape, dtype):
    """softmax_forward and softmax_backward against the reference, returned and in place."""
    x, dy = 5 * rand(shape, dtype), rand(shape, dtype, 1)
    y = kernels.softmax_forward(x)
    close(y, reference.softmax_forward(x), dtype)
    close(kernels.softmax_backward(y, dy), reference.softmax_backward(y, dy), dtype)
    buf = x.copy()
    assert kernels.softmax_forward(buf, out=buf) is buf
    np.testing.assert_array_equal(buf, y)
    want = reference.softmax_backward(y, dy)
    kernels.softmax_backward(y, dy, out=dy)
    close(dy, want, dtype)


def check_softmax_loss(kernels, shape, ignore, dtype):
    """softmax_loss_forward (probabilities allocated and given as prob=) and
    softmax_loss_backward against the reference; labels with a fraction (None ``ignore``) or
    with ``ignore`` in every other row's every third place."""
    outer, channels, inner = shape
    x = 3 * rand(shape, dtype)
    lab = np.random.default_rng(2).integers(0, channels, (outer, inner))
    if ignore is not None:
        lab[::2, ::3] = ignore
    label = (lab + 0.7 * (ignore is None)).astype(dtype)  # truncated to int, as in Caffe
    prob, loss, count, bad = kernels.softmax_loss_forward(x, label, ignore)
    want_prob, want_loss, want_count, want_bad = reference.softmax_loss_forward(x, label, ignore)
    close(prob, want_prob, dtype)
    assert isinstance(loss, np.dtype(dtype).type)
    np.testing.assert_allclose(loss, want_loss, **TOL[dtype])
    assert (count, bad) == (want_count, want_bad) and bad is None
    given = np.empty(shape, dtype)
    assert kernels.softmax_loss_forward(x, label, ignore, prob=given)[0] is given
    np.testing.assert_array_equal(given, prob)
    dx = np.full(shape, 9, dtype)
    assert kernels.softmax_loss_backward(prob, label, ignore, 0.25, out=dx) is dx
    close(dx, reference.softmax_loss_backward(prob, label, ignore, 0.25), dtype)


def check_softmax_loss_bad_label(kernels):
    """The count of labels used and the first label outside [0, channels) (4 here; -1 is the
    ignore_label in the second call), as the reference reports them."""
    x = rand((3, 4, 2), np.float32)
    label = np.array([[0, 3], [4, -1], [7, 2]], np.float32)
    assert kernels.softmax_loss_forward(x, label, None)[2:] == (3, 4)
    assert reference.softmax_loss_forward(x, label, None)[2:] == (3, 4)
    assert kernels.softmax_loss_forward(x, label, 4)[2:] == (3, -1)


def check_softmax_loss_floor(kernels):
    """A probability below FLT_MIN costs -log(FLT_MIN), as Caffe clamps it."""
    x = np.array([[[0.0], [-200.0]]], np.float32)
    _, loss, _, _ = kernels.softmax_loss_forward(x, np.array([[1.0]], np.float32), None)
    np.testing.assert_allclose(loss, -np.log(np.finfo(np.float32).tiny), rtol=1e-6)


def check_sgd_update(kernels, shape, decay, dtype):
    """sgd_update (lr 0.01, momentum 0.9) updates data, diff and history in place exactly as
    the reference does; with clear_diff (the solver's step loop, between two iterations) the
    diff alone differs: +0, as a clear writes it, where it would hold the update value."""
    data, diff, hist = rand(shape, dtype), rand(shape, dtype, 1), rand(shape, dtype, 2)
    want = [a.copy() for a in (data, diff, hist)]
    reference.sgd_update(*want, 0.01, 0.9, decay)
    kernels.sgd_update(data, diff, hist, 0.01, 0.9, decay)
    for got, w in zip((data, diff, hist), want):
        np.testing.assert_array_equal(got, w)
    cleared = rand(shape, dtype), rand(shape, dtype, 1), rand(shape, dtype, 2)
    kernels.sgd_update(*cleared, 0.01, 0.9, decay, clear_diff=True)
    np.testing.assert_array_equal(cleared[0], want[0])
    np.testing.assert_array_equal(cleared[2], want[2])
    assert not np.any(cleared[1]) and not np.signbit(cleared[1]).any()
    return data, diff, hist
