"""Caffe's own CUDA kernels for pooling (pooling_layer.cu), SoftmaxWithLoss's forward
(softmax_layer.cu with softmax_loss_layer.cu), ReLU (relu_layer.cu), LRN (lrn_layer.cu) and
the SGD step, one launch per call, for the GPU backend; the array kernels
(cct/backend/array_kernels.py) take several gathers, an argmax, reductions and a transpose
for each, and on a GPU each of those is a launch the device waits for.

A kernel here is **taken for a geometry only once it gave the array kernels' result there**:
the first call of each geometry runs both and compares (MAX pooling to the bit, values and
argmax indices alike, since both pick the first maximum with Caffe's strict ``>``; ReLU, LRN
and the SGD step to the bit, since they round each operation as the array kernels do; AVE
pooling, pooling's backward passes and the loss, which add in another order, within float
rounding). One that fails
to compile or disagrees is dropped for that geometry with one warning, and the array kernels
run it. So a GPU this code was never run on still computes what the array kernels compute.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np

from ..glog import warning
from .shapes import disjoint

_SOURCE = r"""
#define LOOP(i, n) for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
                        i += (long)blockDim.x * gridDim.x)

extern "C" __global__ void max_pool_forward(
    const T* bottom, T* top, int* mask, const long n, const int height, const int width,
    const int pooled_h, const int pooled_w, const int kernel_h, const int kernel_w,
    const int stride_h, const int stride_w, const int pad_h, const int pad_w) {
  LOOP(index, n) {
    const int pw = index % pooled_w;
    const int ph = (index / pooled_w) % pooled_h;
    const long plane = index / pooled_w / pooled_h;
    int hstart = ph * stride_h - pad_h;
    int wstart = pw * stride_w - pad_w;
    const int hend = min(hstart + kernel_h, height);
    const int wend = min(wstart + kernel_w, width);
    hstart = max(hstart, 0);
    wstart = max(wstart, 0);
    T maxval = LOWEST;
    int maxidx = -1;
    const T* slice = bottom + plane * height * width;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) {
        if (slice[h * width + w] > maxval) {
          maxidx = h * width + w;
          maxval = slice[maxidx];
        }
      }
    }
    top[index] = maxval;
    mask[index] = maxidx;
  }
}

extern "C" __global__ void max_pool_backward(
    const T* top_diff, const int* mask, T* bottom_diff, const long n, const int height,
    const int width, const int pooled_h, const int pooled_w, const int kernel_h,
    const int kernel_w, const int stride_h, const int stride_w, const int pad_h,
    const int pad_w) {
  LOOP(index, n) {
    const int w = index % width;
    const int h = (index / width) % height;
    const long plane = index / width / height;
    const int phstart = (h + pad_h < kernel_h) ? 0 : (h + pad_h - kernel_h) / stride_h + 1;
    const int phend = min((h + pad_h) / stride_h + 1, pooled_h);
    const int pwstart = (w + pad_w < kernel_w) ? 0 : (w + pad_w - kernel_w) / stride_w + 1;
    const int pwend = min((w + pad_w) / stride_w + 1, pooled_w);
    const long offset = plane * pooled_h * pooled_w;
    T gradient = 0;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        if (mask[offset + ph * pooled_w + pw] == h * width + w) {
          gradient += top_diff[offset + ph * pooled_w + pw];
        }
      }
    }
    bottom_diff[index] = gradient;
  }
}

extern "C" __global__ void ave_pool_forward(
    const T* bottom, T* top, const long n, const int height, const int width,
    const int pooled_h, const int pooled_w, const int kernel_h, const int kernel_w,
    const int stride_h, const int stride_w, const int pad_h, const int pad_w) {
  LOOP(index, n) {
    const int pw = index % pooled_w;
    const int ph = (index / pooled_w) % pooled_h;
    const long plane = index / pooled_w / pooled_h;
    int hstart = ph * stride_h - pad_h;
    int wstart = pw * stride_w - pad_w;
    int hend = min(hstart + kernel_h, height + pad_h);
    int wend = min(wstart + kernel_w, width + pad_w);
    const int pool_size = (hend - hstart) * (wend - wstart);
    hstart = max(hstart, 0);
    wstart = max(wstart, 0);
    hend = min(hend, height);
    wend = min(wend, width);
    T aveval = 0;
    const T* slice = bottom + plane * height * width;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) {
        aveval += slice[h * width + w];
      }
    }
    top[index] = aveval / pool_size;
  }
}

extern "C" __global__ void ave_pool_backward(
    const T* top_diff, T* bottom_diff, const long n, const int height, const int width,
    const int pooled_h, const int pooled_w, const int kernel_h, const int kernel_w,
    const int stride_h, const int stride_w, const int pad_h, const int pad_w) {
  LOOP(index, n) {
    const int w = index % width + pad_w;
    const int h = (index / width) % height + pad_h;
    const long plane = index / width / height;
    const int phstart = (h < kernel_h) ? 0 : (h - kernel_h) / stride_h + 1;
    const int phend = min(h / stride_h + 1, pooled_h);
    const int pwstart = (w < kernel_w) ? 0 : (w - kernel_w) / stride_w + 1;
    const int pwend = min(w / stride_w + 1, pooled_w);
    const T* slice = top_diff + plane * pooled_h * pooled_w;
    T gradient = 0;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        const int hstart = ph * stride_h - pad_h;
        const int wstart = pw * stride_w - pad_w;
        const int hend = min(hstart + kernel_h, height + pad_h);
        const int wend = min(wstart + kernel_w, width + pad_w);
        gradient += slice[ph * pooled_w + pw] / ((hend - hstart) * (wend - wstart));
      }
    }
    bottom_diff[index] = gradient;
  }
}

// SoftmaxWithLoss's forward (softmax_layer.cu's five kernels and softmax_loss_layer.cu's
// SoftmaxLossForwardGPU as one): per position, the channel max, exp, the sum, the
// probabilities, and -log(max(p[label], FLT_MIN)); flags 1 where the label counts, 2 where it
// is out of range and not ignored, 0 where ignored.
extern "C" __global__ void softmax_loss_forward(
    const T* x, const T* label, T* prob, T* nll, int* flags, const long n, const int channels,
    const long inner, const int ignore_label, const int has_ignore) {
  LOOP(index, n) {
    const long base = (index / inner) * channels * inner + index % inner;
    T top = x[base];
    for (int c = 1; c < channels; ++c) {
      const T v = x[base + c * inner];
      if (v > top || isnan(v)) top = v;
    }
    T sum = 0;
    for (int c = 0; c < channels; ++c) {
      const T e = exp(x[base + c * inner] - top);
      prob[base + c * inner] = e;
      sum += e;
    }
    for (int c = 0; c < channels; ++c) prob[base + c * inner] /= sum;
    const int lab = (int)label[index];
    if (has_ignore && lab == ignore_label) {
      nll[index] = 0;
      flags[index] = 0;
    } else if (lab < 0 || lab >= channels) {
      nll[index] = 0;
      flags[index] = 2;
    } else {
      // max() of CUDA drops a NaN; the array kernels' maximum keeps it, and so must this
      const T q = prob[base + lab * inner];
      nll[index] = -log((q > (T)1.175494351e-38 || isnan(q)) ? q : (T)1.175494351e-38);
      flags[index] = 1;
    }
  }
}

// LRN across channels (lrn_layer.cu's three kernels), float32, each product, sum and quotient
// rounded as the array kernels round it (the window summed from its first channel up, zero
// beyond the ends; no running sum, whose cancellation Caffe's LRNFillScale has).
extern "C" __global__ void lrn_across_forward(
    const float* x, float* y, float* scale, const long n, const int channels,
    const long plane, const int size, const float alpha_over_size, const float k,
    const float neg_beta) {
  LOOP(index, n) {
    const long hw = index % plane;
    const int c = (index / plane) % channels;
    const long base = (index / plane / channels) * channels * plane + hw;
    const int pre = (size - 1) / 2;
    float acc = 0;
    for (int i = 0; i < size; ++i) {
      const int ch = c - pre + i;
      const float v = (ch >= 0 && ch < channels) ? x[base + ch * plane] : 0.0f;
      const float sq = __fmul_rn(v, v);
      acc = i ? __fadd_rn(acc, sq) : sq;
    }
    const float s = __fadd_rn(__fmul_rn(acc, alpha_over_size), k);
    scale[index] = s;
    y[index] = __fmul_rn(powf(s, neg_beta), x[index]);
  }
}

extern "C" __global__ void lrn_across_backward(
    const float* x, const float* y, const float* scale, const float* dy, float* dx,
    const long n, const int channels, const long plane, const int size, const float neg_beta,
    const float ratio_coef) {
  LOOP(index, n) {
    const long hw = index % plane;
    const int c = (index / plane) % channels;
    const long base = (index / plane / channels) * channels * plane + hw;
    const int pre = (size - 1) / 2;
    float acc = 0;
    for (int i = 0; i < size; ++i) {
      const int ch = c - pre + i;
      const long at = base + ch * plane;
      const float t = (ch >= 0 && ch < channels)
          ? __fdiv_rn(__fmul_rn(dy[at], y[at]), scale[at]) : 0.0f;
      acc = i ? __fadd_rn(acc, t) : t;
    }
    const float ratio = __fmul_rn(__fmul_rn(acc, x[index]), ratio_coef);
    dx[index] = __fsub_rn(__fmul_rn(powf(scale[index], neg_beta), dy[index]), ratio);
  }
}
"""

_TYPES = {np.dtype(np.float32): ("float", "(-3.402823466e+38F)"),
          np.dtype(np.float64): ("double", "(-1.7976931348623157e+308)")}
_BLOCK = 256


class FirstUseCheck:
    """Which geometries a fast kernel may run: each key's first call runs the reference and
    the fast kernel and compares them (``agree``); the fast one is taken from then on if they
    agree, else never for that key (one warning)."""

    def __init__(self, name: str, instead: str = "runs in the array kernels: Caffe's CUDA "
                                                  "kernel", release: Optional[Callable] = None):
        self.name = name
        self.instead = instead      # what the warning says runs instead, and of what
        self.verdicts: Dict[tuple, bool] = {}
        # called after each check: gives the memory the reference's temporaries left cached
        # back to the device (a pooling gather of a whole batch is 9x its output)
        self.release = release

    def __call__(self, key: tuple, fast: Callable, reference: Callable, agree: Callable,
                 put: Callable):
        """``fast(into)`` and ``reference(into)`` run the call, into the caller's out= arrays
        with ``into``, else into fresh ones: the check runs both into fresh arrays (it
        compares two results, and an in-place call still has its input for the second), then
        ``put`` writes the one taken where the caller asked; ``agree(got, want)`` says how
        they differ ('' when they do not)."""
        verdict = self.verdicts.get(key)
        if verdict is True:
            return fast(True)
        if verdict is False:
            return reference(True)
        want, got = reference(False), None
        try:
            got = fast(False)
            why = agree(got, want)
        except Exception as e:  # a kernel that does not compile or launch here
            why = f"failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        self.verdicts[key] = not why
        if why:
            warning("caffe_cuda.py:0", f"{self.name} for {key} {self.instead} {why}")
        result = put(want if why else got)
        got = want = None       # the result not taken is a temporary too
        if self.release is not None:
            self.release()
        return result


def _differs(got, want, exact: bool, tolerance: float = 1e-5) -> str:
    """'' when each array of ``got`` is ``want``'s (bit for bit, or within float rounding:
    ``tolerance`` of the largest magnitude), else what differs."""
    for g, w in zip(got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"gave {g.dtype}{g.shape} where {w.dtype}{w.shape} was wanted"
        if exact:
            if not bool((g == w).all()):
                return "gave other values"
        else:
            scale = float(abs(w).max()) if w.size else 0.0
            if float(abs(g - w).max() if g.size else 0.0) > tolerance * max(scale, 1e-30):
                return "differs beyond float rounding"
    return ""


class PoolingKernels:
    """Caffe's pooling kernels on ``cupy``, compiled once per dtype when first used."""

    def __init__(self, cupy):
        self.cupy = cupy
        self._modules = {}

    def _kernel(self, name: str, dtype):
        dt = np.dtype(dtype)
        module = self._modules.get(dt)
        if module is None:
            ctype, lowest = _TYPES[dt]
            module = self._modules[dt] = self.cupy.RawModule(
                code=f"#define T {ctype}\n#define LOWEST {lowest}\n" + _SOURCE)
        return module.get_function(name)

    def _launch(self, name, dtype, n, args):
        """``name`` over ``n`` elements with ``args`` = (arrays, scalars): the element count
        goes first as a long, Python ints as ints; scalars already typed (np.int64 for a long,
        np.float32) go as they are."""
        grid = min((n + _BLOCK - 1) // _BLOCK, 65535)
        scalars = [v if isinstance(v, np.generic) else np.int32(v) for v in args[1]]
        self._kernel(name, dtype)((max(grid, 1),), (_BLOCK,),
                                  tuple(args[0]) + (np.int64(n),) + tuple(scalars))

    def max_forward(self, x, kernel, stride, pad, pooled, out, mask):
        cupy = self.cupy
        n, c, h, w = x.shape
        shape = (n, c) + tuple(pooled)
        x = cupy.ascontiguousarray(x)
        top = out if out is not None and out.flags.c_contiguous else cupy.empty(shape, x.dtype)
        idx = (mask if mask is not None and mask.flags.c_contiguous and mask.dtype == np.int32
               else cupy.empty(shape, np.int32))
        self._launch("max_pool_forward", x.dtype, top.size,
                     ((x, top, idx), (h, w, *pooled, *kernel, *stride, *pad)))
        return _into(top, out), _into(idx, mask)

    def max_backward(self, dy, mask, x_shape, kernel, stride, pad, out):
        cupy = self.cupy
        n, c, h, w = x_shape
        dy, mask = cupy.ascontiguousarray(dy), cupy.ascontiguousarray(mask, dtype=np.int32)
        dx = out if out is not None and out.flags.c_contiguous else cupy.empty(x_shape, dy.dtype)
        self._launch("max_pool_backward", dy.dtype, dx.size,
                     ((dy, mask, dx), (h, w, *dy.shape[2:], *kernel, *stride, *pad)))
        return _into(dx, out)

    def ave_forward(self, x, kernel, stride, pad, pooled, out):
        cupy = self.cupy
        n, c, h, w = x.shape
        x = cupy.ascontiguousarray(x)
        shape = (n, c) + tuple(pooled)
        top = out if out is not None and out.flags.c_contiguous else cupy.empty(shape, x.dtype)
        self._launch("ave_pool_forward", x.dtype, top.size,
                     ((x, top), (h, w, *pooled, *kernel, *stride, *pad)))
        return _into(top, out)

    def ave_backward(self, dy, x_shape, kernel, stride, pad, pooled, out):
        cupy = self.cupy
        n, c, h, w = x_shape
        dy = cupy.ascontiguousarray(dy)
        dx = out if out is not None and out.flags.c_contiguous else cupy.empty(x_shape, dy.dtype)
        self._launch("ave_pool_backward", dy.dtype, dx.size,
                     ((dy, dx), (h, w, *pooled, *kernel, *stride, *pad)))
        return _into(dx, out)


class CaffeKernels(PoolingKernels):
    """Besides pooling: SoftmaxWithLoss's forward in one launch and three reductions (the
    array kernels take a dozen launches), with the array kernels' results (prob, loss, count,
    bad_label), on the device with ``deferred``; ReLU forward and backward in one launch each
    (relu_layer.cu, with the CPU's formula, which the array kernels follow); the SGD step in
    one launch per param."""

    def __init__(self, cupy):
        super().__init__(cupy)
        self._elementwise = {}

    def release(self) -> None:
        """Hand the memory pool's cached blocks back to the device, as cuDNN's plan race does
        (not while a stream captures: the capture's memory is the graph's). A first-use check
        runs the array kernels once on the layer's whole batch: CaffeNet b256's pool1 gathers
        670 MB that no later iteration uses, and CuPy's pool would hold it for the run."""
        if not self.cupy.cuda.get_current_stream().is_capturing():
            self.cupy.get_default_memory_pool().free_all_blocks()

    def _relu_kernel(self, which: str):
        kernel = self._elementwise.get(which)
        if kernel is None:
            # std::max(x, 0) and std::min(x, 0) as C++ has them (a NaN passes), not CUDA's
            # fmax, which drops it
            body = {"forward": "y = ((x < 0) ? (T)0 : x) + slope * ((0 < x) ? (T)0 : x)",
                    "backward": "y = dy * ((T)(src > 0) + (T)(src <= 0) * slope)"}[which]
            args = {"forward": "T x, T slope", "backward": "T src, T dy, T slope"}[which]
            kernel = self._elementwise[which] = self.cupy.ElementwiseKernel(
                args, "T y", body, f"cct_relu_{which}")
        return kernel

    def relu_forward(self, x, negative_slope, out):
        y = out if out is not None and out.shape == x.shape else self.cupy.empty_like(x)
        self._relu_kernel("forward")(x, x.dtype.type(negative_slope), y)
        return _into(y, out)

    def relu_backward(self, src, dy, negative_slope, out):
        dx = out if out is not None and out.shape == dy.shape else self.cupy.empty_like(dy)
        self._relu_kernel("backward")(src.reshape(dy.shape), dy, dy.dtype.type(negative_slope),
                                      dx)
        return _into(dx, out)

    def sgd_update(self, data, diff, history, local_rate, momentum, local_decay):
        """The SGD step of the array kernels in one launch, each operation rounded as they
        round it (__fmul_rn and __fadd_rn: the compiler may not contract them into an FMA),
        so it gives their bits. float32 only."""
        kernel = self._elementwise.get("sgd")
        if kernel is None:
            kernel = self._elementwise["sgd"] = self.cupy.ElementwiseKernel(
                "float32 rate, float32 momentum, float32 decay, bool use_decay",
                "float32 data, float32 diff, float32 history",
                """
                float g = diff;
                if (use_decay) g = __fadd_rn(g, __fmul_rn(data, decay));
                g = __fmul_rn(g, rate);
                const float h = __fadd_rn(__fmul_rn(history, momentum), g);
                history = h;
                diff = h;
                data = __fsub_rn(data, h);
                """, "cct_sgd_update")
        kernel(np.float32(local_rate), np.float32(momentum), np.float32(local_decay),
               bool(local_decay), data, diff, history)

    def lrn_forward(self, x, size, alpha, beta, k, out, scale):
        cupy = self.cupy
        x = cupy.ascontiguousarray(x)
        y = out if out is not None and out.flags.c_contiguous else cupy.empty_like(x)
        s = scale if scale is not None and scale.flags.c_contiguous else cupy.empty_like(x)
        plane = int(np.prod(x.shape[2:], dtype=np.int64))
        self._launch("lrn_across_forward", np.float32, x.size,
                     ((x, y, s), (x.shape[1], np.int64(plane), size, np.float32(alpha / size),
                                  np.float32(k), np.float32(-beta))))
        return _into(y, out), _into(s, scale)

    def lrn_backward(self, x, y, scale, dy, size, alpha, beta, out):
        cupy = self.cupy
        x, y, scale, dy = (cupy.ascontiguousarray(a) for a in (x, y, scale, dy))
        # each element reads its neighbours' dy: the result never goes into dy itself
        dx = (out if out is not None and out.flags.c_contiguous
              and not cupy.may_share_memory(out, dy) else cupy.empty_like(dy))
        plane = int(np.prod(x.shape[2:], dtype=np.int64))
        self._launch("lrn_across_backward", np.float32, x.size,
                     ((x, y, scale, dy, dx), (x.shape[1], np.int64(plane), size,
                                              np.float32(-beta),
                                              np.float32(2.0 * alpha * beta / size))))
        return _into(dx, out)

    def softmax_loss_forward(self, x, label, ignore_label, prob, deferred):
        cupy = self.cupy
        outer, channels, inner = x.shape
        x = cupy.ascontiguousarray(x)
        label = cupy.ascontiguousarray(label.reshape(outer, inner), dtype=x.dtype)
        p = (prob.reshape(x.shape) if prob is not None and prob.flags.c_contiguous
             else cupy.empty(x.shape, x.dtype))
        nll = cupy.empty((outer, inner), x.dtype)
        flags = cupy.empty((outer, inner), np.int32)
        has_ignore = ignore_label is not None
        self._launch("softmax_loss_forward", x.dtype, outer * inner,
                     ((x, label, p, nll, flags),
                      (channels, np.int64(inner), int(ignore_label) if has_ignore else 0,
                       int(has_ignore))))
        bad = (flags == 2).reshape(-1)
        stats = cupy.stack([nll.sum(dtype=np.float64), (flags == 1).sum(dtype=np.float64),
                            bad.any().astype(np.float64),
                            label.reshape(-1)[bad.astype(np.int8).argmax()]
                            .astype(np.int64).astype(np.float64)])   # truncated, as Caffe's int
        p = prob if p is not None and prob is not None and p.data.ptr == prob.data.ptr \
            else _into(p, prob)
        if deferred:
            return p, stats[0].astype(x.dtype), stats[1], stats[2:]
        loss, count, any_bad, first = (float(v) for v in stats.get())
        return p, x.dtype.type(loss), int(count), (int(first) if any_bad else None)


def _into(result, out):
    """``result`` written into ``out`` when the kernel could not write there itself."""
    if out is None or result is out:
        return result
    out[...] = result
    return out


def wrap_pooling(kernels, fast, pair: Callable) -> None:
    """Route ``kernels``' four pooling kernels through ``fast`` (a :class:`PoolingKernels`,
    or anything with its methods), each geometry once checked against the array kernels. An
    out= that overlaps the input is refused first, as the array kernels refuse it: the check
    writes into fresh arrays, and a CUDA kernel reading what it writes would not say so.
    MAX backward needs the one window geometry its forward used for those sizes; with
    several (two layers of the same sizes, other windows) it stays in the array kernels."""
    array_max_f, array_max_b = kernels.max_pool_forward, kernels.max_pool_backward
    array_ave_f, array_ave_b = kernels.ave_pool_forward, kernels.ave_pool_backward
    release = getattr(fast, "release", None)
    checks = {name: FirstUseCheck(f"{name}", release=release) for name in
              ("max_pool_forward", "max_pool_backward", "ave_pool_forward", "ave_pool_backward")}

    def usable(dt) -> bool:
        return np.dtype(dt) in _TYPES

    def max_pool_forward(x, kernel, stride, pad, pooled, out=None, mask=None):
        disjoint(kernels.xp, "max_pool_forward", out, x=x)
        geom = tuple(pair(v) for v in (kernel, stride, pad, pooled))
        if not usable(x.dtype):
            return array_max_f(x, kernel, stride, pad, pooled, out=out, mask=mask)
        key = (tuple(x.shape), str(x.dtype)) + geom
        return checks["max_pool_forward"](
            key, lambda into: fast.max_forward(x, *geom, out if into else None,
                                               mask if into else None),
            lambda into: array_max_f(x, kernel, stride, pad, pooled, out=out if into else None,
                                     mask=mask if into else None),
            lambda got, want: _differs(got, want, exact=True),
            lambda r: (_into(r[0], out), _into(r[1], mask)))

    def max_pool_backward(dy, mask, x_shape, out=None, relu=None):
        disjoint(kernels.xp, "max_pool_backward", out, dy=dy)
        h, w = int(x_shape[2]), int(x_shape[3])
        geoms = kernels._pool_geometries.get((h, w) + tuple(int(s) for s in dy.shape[2:]), ())
        # Caffe's kernel has no ReLU in it (the fused ReLU backward is the CPU's, so relu is
        # None on a GPU; the array kernels take it where it is not).
        if len(geoms) != 1 or not usable(dy.dtype) or relu is not None:
            return array_max_b(dy, mask, x_shape, out=out, relu=relu)
        (geom,) = geoms
        key = (tuple(int(s) for s in x_shape), str(dy.dtype)) + tuple(geom)
        return checks["max_pool_backward"](
            key, lambda into: fast.max_backward(dy, mask, tuple(int(s) for s in x_shape), *geom,
                                                out if into else None),
            lambda into: array_max_b(dy, mask, x_shape, out=out if into else None),
            lambda got, want: _differs([got], [want], exact=False), lambda r: _into(r, out))

    def ave_pool_forward(x, kernel, stride, pad, pooled, out=None):
        disjoint(kernels.xp, "ave_pool_forward", out, x=x)
        geom = tuple(pair(v) for v in (kernel, stride, pad, pooled))
        if not usable(x.dtype):
            return array_ave_f(x, kernel, stride, pad, pooled, out=out)
        key = (tuple(x.shape), str(x.dtype)) + geom
        return checks["ave_pool_forward"](
            key, lambda into: fast.ave_forward(x, *geom, out if into else None),
            lambda into: array_ave_f(x, kernel, stride, pad, pooled, out=out if into else None),
            lambda got, want: _differs([got], [want], exact=False), lambda r: _into(r, out))

    def ave_pool_backward(dy, x_shape, kernel, stride, pad, pooled, out=None):
        disjoint(kernels.xp, "ave_pool_backward", out, dy=dy)
        geom = tuple(pair(v) for v in (kernel, stride, pad, pooled))
        if not usable(dy.dtype):
            return array_ave_b(dy, x_shape, kernel, stride, pad, pooled, out=out)
        shape = tuple(int(s) for s in x_shape)
        key = (shape, str(dy.dtype)) + geom
        return checks["ave_pool_backward"](
            key, lambda into: fast.ave_backward(dy, shape, *geom, out if into else None),
            lambda into: array_ave_b(dy, x_shape, kernel, stride, pad, pooled,
                                     out=out if into else None),
            lambda got, want: _differs([got], [want], exact=False), lambda r: _into(r, out))

    kernels.max_pool_forward = max_pool_forward
    kernels.max_pool_backward = max_pool_backward
    kernels.ave_pool_forward = ave_pool_forward
    kernels.ave_pool_backward = ave_pool_backward
    kernels.first_use_checks = checks


def wrap_loss(kernels, fast) -> None:
    """Route ``kernels``' softmax_loss_forward through ``fast`` (a :class:`CaffeKernels`),
    each shape once checked against the array kernels (within float rounding: the sums add
    in another order)."""
    array_loss = kernels.softmax_loss_forward
    check = FirstUseCheck("softmax_loss_forward", release=getattr(fast, "release", None))

    def softmax_loss_forward(x, label, ignore_label, prob=None, deferred=False):
        if np.dtype(x.dtype) not in _TYPES:
            return array_loss(x, label, ignore_label, prob=prob, deferred=deferred)
        key = (tuple(x.shape), str(x.dtype), ignore_label)

        def agree(got, want):
            # the probabilities within rounding; the loss within rounding; count and check exact
            (gp, gl, gc, gb), (wp, wl, wc, wb) = got, want
            why = _differs([gp, _array(gl)], [wp, _array(wl)], exact=False)
            if why:
                return why
            same = [bool((_array(a) == _array(b)).all()) for a, b in ((gc, wc), (gb, wb))] \
                if deferred else [gc == wc, gb == wb]
            return "" if all(same) else "gave another count or label check"

        return check(key, lambda into: fast.softmax_loss_forward(
                         x, label, ignore_label, prob if into else None, deferred),
                     lambda into: array_loss(x, label, ignore_label,
                                             prob=prob if into else None, deferred=deferred),
                     agree, lambda r: (_into(r[0], prob),) + tuple(r[1:]))

    kernels.softmax_loss_forward = softmax_loss_forward
    kernels.first_use_checks = dict(getattr(kernels, "first_use_checks", {}),
                                    softmax_loss_forward=check)


def wrap_relu(kernels, fast) -> None:
    """Route ``kernels``' ReLU through ``fast`` (a :class:`CaffeKernels`), each shape once
    checked against the array kernels, to the bit."""
    array_f, array_b = kernels.relu_forward, kernels.relu_backward
    release = getattr(fast, "release", None)
    checks = {"relu_forward": FirstUseCheck("relu_forward", release=release),
              "relu_backward": FirstUseCheck("relu_backward", release=release)}

    def exact(got, want):
        return _differs([got], [want], exact=True)

    def relu_forward(x, negative_slope, out=None):
        if np.dtype(x.dtype) not in _TYPES:
            return array_f(x, negative_slope, out=out)
        key = (tuple(x.shape), str(x.dtype), float(negative_slope))
        return checks["relu_forward"](
            key, lambda into: fast.relu_forward(x, negative_slope, out if into else None),
            lambda into: array_f(x, negative_slope, out=out if into else None), exact,
            lambda r: _into(r, out))

    def relu_backward(src, dy, negative_slope, out=None):
        if np.dtype(dy.dtype) not in _TYPES or src.dtype != dy.dtype:
            return array_b(src, dy, negative_slope, out=out)
        key = (tuple(dy.shape), str(dy.dtype), float(negative_slope))
        return checks["relu_backward"](
            key, lambda into: fast.relu_backward(src, dy, negative_slope, out if into else None),
            lambda into: array_b(src, dy, negative_slope, out=out if into else None), exact,
            lambda r: _into(r, out))

    kernels.relu_forward, kernels.relu_backward = relu_forward, relu_backward
    kernels.first_use_checks = dict(getattr(kernels, "first_use_checks", {}), **checks)


def wrap_update(kernels, fast) -> None:
    """Route ``kernels``' sgd_update through ``fast`` (a :class:`CaffeKernels`) for float32,
    the first call of each size checked against the array kernels on copies of the three
    arrays, to the bit (an update changes its arguments, so each side runs on its own copies
    and the one taken is written back)."""
    array_sgd = kernels.sgd_update
    check = FirstUseCheck("sgd_update", release=getattr(fast, "release", None))

    def sgd_update(data, diff, history, local_rate, momentum, local_decay, clear_diff=False):
        arrays = (data, diff, history)
        if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in arrays):
            return array_sgd(data, diff, history, local_rate, momentum, local_decay, clear_diff)
        args = (local_rate, momentum, local_decay)

        def run(step, into):
            target = arrays if into else tuple(a.copy() for a in arrays)
            step(*target, *args)
            return target

        def put(result):
            for a, r in zip(arrays, result):
                if r is not a:
                    a[...] = r
        check((data.size,), lambda into: run(fast.sgd_update, into),
              lambda into: run(array_sgd, into),
              lambda got, want: _differs(got, want, exact=True), put)
        if clear_diff:   # the fast kernel leaves the update value there
            diff.fill(0)

    kernels.sgd_update = sgd_update
    kernels.first_use_checks = dict(getattr(kernels, "first_use_checks", {}),
                                    sgd_update=check)


def wrap_lrn(kernels, fast) -> None:
    """Route ``kernels``' LRN across channels through ``fast`` (a :class:`CaffeKernels`) for
    float32, each shape once checked against the array kernels, to the bit."""
    array_f, array_b = kernels.lrn_across_forward, kernels.lrn_across_backward
    release = getattr(fast, "release", None)
    checks = {"lrn_across_forward": FirstUseCheck("lrn_across_forward", release=release),
              "lrn_across_backward": FirstUseCheck("lrn_across_backward", release=release)}

    def lrn_across_forward(x, size, alpha, beta, k, out=None, scale=None):
        if x.dtype != np.float32:
            return array_f(x, size, alpha, beta, k, out=out, scale=scale)
        key = (tuple(x.shape), int(size), float(alpha), float(beta), float(k))
        return checks["lrn_across_forward"](
            key, lambda into: fast.lrn_forward(x, int(size), alpha, beta, k,
                                               out if into else None, scale if into else None),
            lambda into: array_f(x, size, alpha, beta, k, out=out if into else None,
                                 scale=scale if into else None),
            lambda got, want: _differs(got, want, exact=True),
            lambda r: (_into(r[0], out), _into(r[1], scale)))

    def lrn_across_backward(x, y, scale, dy, size, alpha, beta, out=None, relu=None):
        # relu: as max_pool_backward's, the array kernels' (Caffe's kernel has no ReLU in it)
        if any(a.dtype != np.float32 for a in (x, y, scale, dy)) or relu is not None:
            return array_b(x, y, scale, dy, size, alpha, beta, out=out, relu=relu)
        key = (tuple(x.shape), int(size), float(alpha), float(beta))
        return checks["lrn_across_backward"](
            key, lambda into: fast.lrn_backward(x, y, scale, dy, int(size), alpha, beta,
                                                out if into else None),
            lambda into: array_b(x, y, scale, dy, size, alpha, beta,
                                 out=out if into else None),
            lambda got, want: _differs([got], [want], exact=True), lambda r: _into(r, out))

    kernels.lrn_across_forward = lrn_across_forward
    kernels.lrn_across_backward = lrn_across_backward
    kernels.first_use_checks = dict(getattr(kernels, "first_use_checks", {}), **checks)


def wrap_all(kernels, fast, pair: Callable) -> None:
    """Every wrapper above over ``fast``, as gpu.py applies them (and the ``numpy`` device,
    over its stand-in for Caffe's kernels): pooling, the loss, ReLU, SGD, LRN."""
    wrap_pooling(kernels, fast, pair)
    wrap_loss(kernels, fast)
    wrap_relu(kernels, fast)
    wrap_update(kernels, fast)
    wrap_lrn(kernels, fast)


def _array(v):
    """A 0-d or host value as an array to compare (0-d device arrays stay where they are)."""
    return v if hasattr(v, "shape") and not isinstance(v, np.generic) else np.asarray(v)
