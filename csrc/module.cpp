// pybind11 bindings of the CPU kernels (module cct._C). Arrays are NCHW, C-contiguous, float32
// or float64; every kernel releases the GIL while it runs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bf16.h"
#include "mkl.h"
#include "onednn.h"
#include "conv_direct.h"
#include "gemm.h"
#include "gemm_skinny.h"
#include "gemm_thin.h"
#include "kernels.h"
#include "parallel.h"
#include "race.h"

namespace py = pybind11;
using Pair = std::array<int, 2>;

namespace {

template <typename T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;

// Outputs are taken as they are (no conversion, so an output is never a silent copy):
// C-contiguous, of the overload's dtype, of the expected shape, and overlapping no input;
// cct.backend.cpu makes them so or allocates them.
template <typename T>
using Buf = py::array_t<T, py::array::c_style>;

template <typename A>
void check_out(const A& out, std::initializer_list<int64_t> shape, const char* kernel) {
  bool same = out.ndim() == py::ssize_t(shape.size());
  int axis = 0;
  for (int64_t d : shape) same = same && out.shape(axis++) == d;
  if (!same) throw std::invalid_argument(std::string(kernel) + ": out has the wrong shape");
}

// Refuses an output that shares bytes with an input: the kernels read their inputs while they
// write (a chunk, a plane or an image at a time), so an overlap would corrupt the result.
template <typename A, typename B>
void check_disjoint(const A& out, const B& in, const char* kernel, const char* what) {
  const char* o = reinterpret_cast<const char*>(out.data());
  const char* i = reinterpret_cast<const char*>(in.data());
  if (o < i + in.nbytes() && i < o + out.nbytes())
    throw std::invalid_argument(std::string(kernel) + ": out overlaps " + what);
}

using Mask = py::array_t<int32_t, py::array::c_style>;

template <typename T>
void max_pool_forward(Arr<T> x, Pair k, Pair s, Pair p, Pair pooled, Buf<T> out, Mask mask) {
  if (x.ndim() != 4) throw std::invalid_argument("max_pool_forward: bottom must be 4-D (NCHW)");
  const int64_t n = x.shape(0), c = x.shape(1);
  const int h = int(x.shape(2)), w = int(x.shape(3));
  check_out(out, {n, c, pooled[0], pooled[1]}, "max_pool_forward");
  check_out(mask, {n, c, pooled[0], pooled[1]}, "max_pool_forward (mask)");
  check_disjoint(out, x, "max_pool_forward", "x");
  const T* xd = x.data();
  T* yd = out.mutable_data();
  int32_t* md = mask.mutable_data();
  py::gil_scoped_release release;
  cct::max_pool_forward<T>(xd, yd, md, n * c, h, w, k[0], k[1], s[0], s[1], p[0], p[1],
                           pooled[0], pooled[1]);
}

template <typename T>
void max_pool_backward(Arr<T> dy, Arr<int32_t> mask, Buf<T> out,
                       std::optional<Buf<T>> relu_src, double negative_slope) {
  if (out.ndim() != 4 || dy.ndim() != 4)
    throw std::invalid_argument("max_pool_backward: dy and out must be 4-D (NCHW)");
  if (mask.size() != dy.size() || dy.shape(0) != out.shape(0) || dy.shape(1) != out.shape(1))
    throw std::invalid_argument("max_pool_backward: dy, mask and out do not fit");
  check_disjoint(out, dy, "max_pool_backward", "dy");
  const T* sd = nullptr;
  if (relu_src) {
    if (relu_src->size() != out.size())
      throw std::invalid_argument("max_pool_backward: relu_src must be out's size");
    check_disjoint(out, *relu_src, "max_pool_backward", "relu_src");
    sd = relu_src->data();
  }
  const T* dyd = dy.data();
  const int32_t* md = mask.data();
  T* dxd = out.mutable_data();
  py::gil_scoped_release release;
  cct::max_pool_backward<T>(dyd, md, dxd, out.shape(0) * out.shape(1), int(out.shape(2)),
                            int(out.shape(3)), int(dy.shape(2)), int(dy.shape(3)), sd,
                            T(negative_slope));
}

template <typename T>
void ave_pool_forward(Arr<T> x, Pair k, Pair s, Pair p, Pair pooled, Buf<T> out) {
  if (x.ndim() != 4) throw std::invalid_argument("ave_pool_forward: bottom must be 4-D (NCHW)");
  const int64_t n = x.shape(0), c = x.shape(1);
  check_out(out, {n, c, pooled[0], pooled[1]}, "ave_pool_forward");
  check_disjoint(out, x, "ave_pool_forward", "x");
  const T* xd = x.data();
  T* yd = out.mutable_data();
  py::gil_scoped_release release;
  cct::ave_pool_forward<T>(xd, yd, n * c, int(x.shape(2)), int(x.shape(3)), k[0], k[1], s[0],
                           s[1], p[0], p[1], pooled[0], pooled[1]);
}

template <typename T>
void ave_pool_backward(Arr<T> dy, Pair k, Pair s, Pair p, Buf<T> out) {
  if (out.ndim() != 4 || dy.ndim() != 4)
    throw std::invalid_argument("ave_pool_backward: dy and out must be 4-D (NCHW)");
  if (dy.shape(0) != out.shape(0) || dy.shape(1) != out.shape(1))
    throw std::invalid_argument("ave_pool_backward: dy and out do not fit");
  check_disjoint(out, dy, "ave_pool_backward", "dy");
  const T* dyd = dy.data();
  T* dxd = out.mutable_data();
  py::gil_scoped_release release;
  cct::ave_pool_backward<T>(dyd, dxd, out.shape(0) * out.shape(1), int(out.shape(2)),
                            int(out.shape(3)), k[0], k[1], s[0], s[1], p[0], p[1],
                            int(dy.shape(2)), int(dy.shape(3)));
}

// --- convolution ------------------------------------------------------------------------------

int64_t conv_out(int64_t size, int k, int s, int p, int d) {
  return (size + 2 * p - (int64_t(d) * (k - 1) + 1)) / s + 1;
}

// Checks what the kernels rely on; the layers have already checked what a user can get wrong.
cct::ConvGeom conv_geom(std::array<int64_t, 4> x, std::array<int64_t, 4> w, Pair k, Pair s,
                        Pair p, Pair d, int group, int64_t ho, int64_t wo) {
  if (group < 1 || w[0] % group != 0 || w[1] * group != x[1])
    throw std::invalid_argument("conv: weight shape does not fit the channels and group");
  if (w[2] != k[0] || w[3] != k[1])
    throw std::invalid_argument("conv: weight shape does not match the kernel size");
  if (k[0] < 1 || k[1] < 1 || s[0] < 1 || s[1] < 1 || p[0] < 0 || p[1] < 0 || d[0] < 1 ||
      d[1] < 1)
    throw std::invalid_argument("conv: kernel, stride and dilation must be >= 1, pad >= 0");
  if (ho != conv_out(x[2], k[0], s[0], p[0], d[0]) || wo != conv_out(x[3], k[1], s[1], p[1], d[1]) ||
      ho < 1 || wo < 1)
    throw std::invalid_argument("conv: top size does not match the geometry, or is empty");
  return {x[0], x[1], x[2], x[3], w[0], ho, wo, k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1],
          group};
}

template <typename A>
std::array<int64_t, 4> shape4(const A& a, const char* what) {
  if (a.ndim() != 4) throw std::invalid_argument(std::string("conv: ") + what + " must be 4-D");
  return {a.shape(0), a.shape(1), a.shape(2), a.shape(3)};
}

template <typename T>
void conv_forward(Arr<T> x, Arr<T> weight, std::optional<Arr<T>> bias, Pair k, Pair s, Pair p,
                  Pair d, int group, Buf<T> out, bool caffe_engine, bool relu) {
  const auto xs = shape4(x, "bottom"), ws = shape4(weight, "weight");
  const int64_t ho = conv_out(xs[2], k[0], s[0], p[0], d[0]);
  const int64_t wo = conv_out(xs[3], k[1], s[1], p[1], d[1]);
  const cct::ConvGeom g = conv_geom(xs, ws, k, s, p, d, group, ho, wo);
  if (bias && bias->size() != g.o) throw std::invalid_argument("conv: bias size != num_output");
  check_out(out, {g.n, g.o, ho, wo}, "conv_forward");
  check_disjoint(out, x, "conv_forward", "x");
  check_disjoint(out, weight, "conv_forward", "weight");
  if (bias) check_disjoint(out, *bias, "conv_forward", "bias");
  const T* xd = x.data();
  const T* wd = weight.data();
  const T* bd = bias ? bias->data() : nullptr;
  T* yd = out.mutable_data();
  py::gil_scoped_release release;
  cct::conv_forward<T>(xd, wd, bd, yd, g, caffe_engine, relu);
}

template <typename T>
void conv_backward_data(Arr<T> dy, Arr<T> weight, Pair k, Pair s, Pair p, Pair d, int group,
                        Buf<T> out, bool caffe_engine) {
  const auto ys = shape4(dy, "top diff"), ws = shape4(weight, "weight");
  const auto xs = shape4(out, "out");
  const cct::ConvGeom g = conv_geom(xs, ws, k, s, p, d, group, ys[2], ys[3]);
  if (ys[0] != g.n || ys[1] != g.o) throw std::invalid_argument("conv: top diff shape");
  check_disjoint(out, dy, "conv_backward_data", "dy");
  check_disjoint(out, weight, "conv_backward_data", "weight");
  const T* dyd = dy.data();
  const T* wd = weight.data();
  T* dxd = out.mutable_data();
  py::gil_scoped_release release;
  cct::conv_backward_data<T>(dyd, wd, dxd, g, caffe_engine);
}

template <typename T>
void conv_backward_weight(Arr<T> x, Arr<T> dy, Pair k, Pair s, Pair p, Pair d, int group,
                          Buf<T> out, bool accumulate, bool caffe_engine) {
  const auto xs = shape4(x, "bottom"), ys = shape4(dy, "top diff");
  const std::array<int64_t, 4> ws{ys[1], xs[1] / group, k[0], k[1]};
  const cct::ConvGeom g = conv_geom(xs, ws, k, s, p, d, group, ys[2], ys[3]);
  if (ys[0] != g.n) throw std::invalid_argument("conv: top diff shape");
  check_out(out, {ws[0], ws[1], ws[2], ws[3]}, "conv_backward_weight");
  check_disjoint(out, x, "conv_backward_weight", "x");
  check_disjoint(out, dy, "conv_backward_weight", "dy");
  const T* xd = x.data();
  const T* dyd = dy.data();
  T* dwd = out.mutable_data();
  py::gil_scoped_release release;
  cct::conv_backward_weight<T>(xd, dyd, dwd, g, accumulate, caffe_engine);
}

// dy viewed as (num, channels, pixels): axis 1 is the channel, the axes after it the pixels.
template <typename T>
void bias_backward(Arr<T> dy, Buf<T> out, bool accumulate) {
  if (dy.ndim() < 2) throw std::invalid_argument("bias_backward: dy must have >= 2 axes");
  const int64_t num = dy.shape(0), channels = dy.shape(1);
  if (out.size() != channels)
    throw std::invalid_argument("bias_backward: out size != dy's channels (axis 1)");
  check_disjoint(out, dy, "bias_backward", "dy");
  int64_t pixels = 1;
  for (py::ssize_t axis = 2; axis < dy.ndim(); ++axis) pixels *= dy.shape(axis);
  const T* dyd = dy.data();
  T* dbd = out.mutable_data();
  py::gil_scoped_release release;
  if (num * pixels == 0) {
    if (!accumulate) std::fill(dbd, dbd + channels, T(0));
    return;
  }
  cct::bias_backward<T>(dyd, dbd, num, channels, pixels, accumulate);
}

// c[i] = op(a[i]) @ op(b[i]) for 3-D arrays (items along axis 0), through gemm_batch_measured:
// one strided batched call of the BLAS's, or MKL's where the batched race chose it. Into out
// when given (out[i] += ... with accumulate), else a new array.
template <typename T>
py::array gemm_batch(Arr<T> a, Arr<T> b, bool trans_a, bool trans_b, std::optional<Buf<T>> out,
                     bool accumulate) {
  if (a.ndim() != 3 || b.ndim() != 3)
    throw std::invalid_argument("gemm_batch: a and b must be 3-D (items, rows, columns)");
  const int64_t count = a.shape(0);
  if (b.shape(0) != count) throw std::invalid_argument("gemm_batch: a and b differ in items");
  const int64_t m = trans_a ? a.shape(2) : a.shape(1), k = trans_a ? a.shape(1) : a.shape(2);
  const int64_t kb = trans_b ? b.shape(2) : b.shape(1), n = trans_b ? b.shape(1) : b.shape(2);
  if (k != kb) throw std::invalid_argument("gemm_batch: inner dimensions differ");
  if (accumulate && !out) throw std::invalid_argument("gemm_batch: accumulate needs out");
  Buf<T> c = out ? *out : Buf<T>({count, m, n});
  if (out) {
    check_out(c, {count, m, n}, "gemm_batch");
    check_disjoint(c, a, "gemm_batch", "a");
    check_disjoint(c, b, "gemm_batch", "b");
  }
  const T* ad = a.data();
  const T* bd = b.data();
  T* cd = c.mutable_data();
  if (count == 0 || m == 0 || n == 0) return c;
  py::gil_scoped_release release;
  if (k == 0) {
    if (!accumulate) std::fill(cd, cd + count * m * n, T(0));
  } else {
    cct::gemm_batch_measured<T>(trans_a, trans_b, m, n, k, T(1), ad, a.shape(2), m * k, bd,
                                b.shape(2), k * n, accumulate ? T(1) : T(0), cd, n, m * n,
                                count);
  }
  return c;
}

// c = op(a) @ op(b) for 2-D arrays through the linked BLAS: as asked (the bench times it for
// the peak), or in the operand order measured fastest for the shape (measured=True). Into out
// when given (out += op(a) @ op(b) with accumulate), else a new array.
template <typename T>
py::array gemm(Arr<T> a, Arr<T> b, bool trans_a, bool trans_b, bool measured,
               std::optional<Buf<T>> out, bool accumulate) {
  if (a.ndim() != 2 || b.ndim() != 2) throw std::invalid_argument("gemm: a and b must be 2-D");
  const int64_t m = trans_a ? a.shape(1) : a.shape(0), k = trans_a ? a.shape(0) : a.shape(1);
  const int64_t kb = trans_b ? b.shape(1) : b.shape(0), n = trans_b ? b.shape(0) : b.shape(1);
  if (k != kb) throw std::invalid_argument("gemm: inner dimensions differ");
  if (accumulate && !out) throw std::invalid_argument("gemm: accumulate needs out");
  Buf<T> c = out ? *out : Buf<T>({m, n});
  if (out) {
    check_out(c, {m, n}, "gemm");
    check_disjoint(c, a, "gemm", "a");
    check_disjoint(c, b, "gemm", "b");
  }
  const T* ad = a.data();
  const T* bd = b.data();
  T* cd = c.mutable_data();
  if (m == 0 || n == 0) return c;
  {
    py::gil_scoped_release release;
    if (k == 0) {
      if (!accumulate) std::fill(cd, cd + m * n, T(0));
    } else {
      auto run = measured ? &cct::gemm_measured<T> : &cct::gemm_kernel<T>;
      run(trans_a, trans_b, m, n, k, T(1), ad, a.shape(1), bd, b.shape(1),
          accumulate ? T(1) : T(0), cd, n);
    }
  }
  return c;
}

// --- in-place kernels: ReLU, LRN, softmax, SoftmaxWithLoss, SGD -------------------------------
// All their arrays are taken as they are (Buf), inputs too.

template <typename T>
void same_size(const Buf<T>& a, const Buf<T>& b, const char* kernel) {
  if (a.size() != b.size())
    throw std::invalid_argument(std::string(kernel) + ": arrays of different sizes");
}

template <typename T>
void relu_forward(Buf<T> x, Buf<T> out, double negative_slope) {
  same_size(x, out, "relu_forward");
  const T* xd = x.data();
  T* yd = out.mutable_data();
  py::gil_scoped_release release;
  cct::relu_forward<T>(xd, yd, x.size(), T(negative_slope));
}

template <typename T>
void relu_backward(Buf<T> src, Buf<T> dy, Buf<T> out, double negative_slope) {
  same_size(src, dy, "relu_backward");
  same_size(src, out, "relu_backward");
  const T* sd = src.data();
  const T* dyd = dy.data();
  T* dxd = out.mutable_data();
  py::gil_scoped_release release;
  cct::relu_backward<T>(sd, dyd, dxd, src.size(), T(negative_slope));
}

// src's runs (each `run` elements, `src_pitch` apart from `src_offset`) into dst's; both whole
// arrays, the offsets and pitches in elements, checked here against their sizes.
template <typename T>
void concat_copy(Buf<T> src, int64_t src_offset, int64_t src_pitch, Buf<T> dst,
                 int64_t dst_offset, int64_t dst_pitch, int64_t runs, int64_t run,
                 std::optional<Buf<T>> relu_src, double negative_slope) {
  const auto fits = [&](int64_t offset, int64_t pitch, int64_t size) {
    return offset >= 0 && pitch >= run &&
           (runs == 0 || offset + (runs - 1) * pitch + run <= size);
  };
  if (runs < 0 || run < 0 || !fits(src_offset, src_pitch, src.size()) ||
      !fits(dst_offset, dst_pitch, dst.size()))
    throw std::invalid_argument("concat_copy: the runs do not fit in src and dst");
  check_disjoint(dst, src, "concat_copy", "src");
  const T* mask = nullptr;
  if (relu_src) {
    if (relu_src->size() != runs * run || dst_offset != 0 || dst_pitch != run)
      throw std::invalid_argument("concat_copy: relu_src must be laid out as a whole dst");
    check_disjoint(dst, *relu_src, "concat_copy", "relu_src");
    mask = relu_src->data();
  }
  const T* sd = src.data() + src_offset;
  T* dd = dst.mutable_data() + dst_offset;
  py::gil_scoped_release release;
  cct::concat_copy<T>(sd, src_pitch, dd, dst_pitch, runs, run, mask, T(negative_slope));
}

template <typename T>
void eltwise_sum(std::vector<Buf<T>> arrays, std::vector<double> coeffs, Buf<T> out) {
  if (arrays.size() < 2 || coeffs.size() != arrays.size())
    throw std::invalid_argument("eltwise_sum: two or more arrays, one coefficient each");
  std::vector<const T*> data;
  std::vector<T> c;
  for (size_t k = 0; k < arrays.size(); ++k) {
    same_size(arrays[k], out, "eltwise_sum");
    if (k >= 2) check_disjoint(out, arrays[k], "eltwise_sum", "an array after the second");
    data.push_back(arrays[k].data());
    c.push_back(T(coeffs[k]));
  }
  T* od = out.mutable_data();
  py::gil_scoped_release release;
  cct::eltwise_sum<T>(data.data(), c.data(), int64_t(data.size()), od, out.size());
}

template <typename T>
void sgd_update(Buf<T> data, Buf<T> diff, Buf<T> history, double local_rate, double momentum,
                double local_decay, bool clear_diff) {
  same_size(data, diff, "sgd_update");
  same_size(data, history, "sgd_update");
  T* w = data.mutable_data();
  T* g = diff.mutable_data();
  T* h = history.mutable_data();
  py::gil_scoped_release release;
  cct::sgd_update<T>(w, g, h, data.size(), T(local_rate), T(momentum), T(local_decay),
                     clear_diff);
}

template <typename T>
std::array<int64_t, 3> lrn_dims(const Buf<T>& x) {
  if (x.ndim() != 4) throw std::invalid_argument("lrn: bottom must be 4-D (NCHW)");
  return {x.shape(0), x.shape(1), x.shape(2) * x.shape(3)};
}

template <typename T>
void lrn_across_forward(Buf<T> x, Buf<T> out, Buf<T> scale, int size, double alpha,
                        double beta, double k) {
  const auto d = lrn_dims(x);
  same_size(x, out, "lrn_across_forward");
  same_size(x, scale, "lrn_across_forward");
  if (size < 1) throw std::invalid_argument("lrn: size must be >= 1");
  const T* xd = x.data();
  T* yd = out.mutable_data();
  T* sd = scale.mutable_data();
  if (xd == yd) throw std::invalid_argument("lrn_across_forward: out must not be x");
  py::gil_scoped_release release;
  cct::lrn_across_forward<T>(xd, yd, sd, d[0], d[1], d[2], size, T(alpha), T(beta), T(k));
}

template <typename T>
void lrn_across_backward(Buf<T> x, Buf<T> y, Buf<T> scale, Buf<T> dy, Buf<T> out, int size,
                         double alpha, double beta, std::optional<Buf<T>> relu_src,
                         double negative_slope) {
  const auto d = lrn_dims(x);
  for (const Buf<T>* a : {&y, &scale, &dy, &out}) same_size(x, *a, "lrn_across_backward");
  if (size < 1) throw std::invalid_argument("lrn: size must be >= 1");
  const T* rs = nullptr;
  if (relu_src) {
    same_size(x, *relu_src, "lrn_across_backward");
    check_disjoint(out, *relu_src, "lrn_across_backward", "relu_src");
    rs = relu_src->data();
  }
  const T* xd = x.data();
  const T* yd = y.data();
  const T* sd = scale.data();
  const T* dyd = dy.data();
  T* dxd = out.mutable_data();
  py::gil_scoped_release release;
  cct::lrn_across_backward<T>(xd, yd, sd, dyd, dxd, d[0], d[1], d[2], size, T(alpha), T(beta),
                              rs, T(negative_slope));
}

template <typename T>
std::array<int64_t, 3> softmax_dims(const Buf<T>& x) {
  if (x.ndim() != 3) throw std::invalid_argument("softmax: x must be 3-D (outer, channels, inner)");
  return {x.shape(0), x.shape(1), x.shape(2)};
}

template <typename T>
void softmax_forward(Buf<T> x, Buf<T> out) {
  const auto d = softmax_dims(x);
  same_size(x, out, "softmax_forward");
  const T* xd = x.data();
  T* yd = out.mutable_data();
  py::gil_scoped_release release;
  cct::softmax_forward<T>(xd, yd, d[0], d[1], d[2]);
}

template <typename T>
void softmax_backward(Buf<T> y, Buf<T> dy, Buf<T> out) {
  const auto d = softmax_dims(y);
  same_size(y, dy, "softmax_backward");
  same_size(y, out, "softmax_backward");
  const T* yd = y.data();
  const T* dyd = dy.data();
  T* dxd = out.mutable_data();
  py::gil_scoped_release release;
  cct::softmax_backward<T>(yd, dyd, dxd, d[0], d[1], d[2]);
}

template <typename T>
py::tuple softmax_loss_forward(Buf<T> x, Buf<T> label, Buf<T> prob,
                               std::optional<int64_t> ignore_label) {
  const auto d = softmax_dims(x);
  same_size(x, prob, "softmax_loss_forward");
  if (label.size() != d[0] * d[2])
    throw std::invalid_argument("softmax_loss_forward: label count != outer * inner");
  const T* xd = x.data();
  const T* ld = label.data();
  T* pd = prob.mutable_data();
  cct::SoftmaxLossResult<T> r;
  {
    py::gil_scoped_release release;
    r = cct::softmax_loss_forward<T>(xd, ld, pd, d[0], d[1], d[2], ignore_label.has_value(),
                                     ignore_label.value_or(0));
  }
  return py::make_tuple(double(r.loss), r.count,
                        r.bad ? py::object(py::int_(r.bad_label)) : py::object(py::none()));
}

template <typename T>
void softmax_loss_backward(Buf<T> prob, Buf<T> label, Buf<T> out,
                           std::optional<int64_t> ignore_label, double scale) {
  const auto d = softmax_dims(prob);
  same_size(prob, out, "softmax_loss_backward");
  if (label.size() != d[0] * d[2])
    throw std::invalid_argument("softmax_loss_backward: label count != outer * inner");
  const T* pd = prob.data();
  const T* ld = label.data();
  T* dxd = out.mutable_data();
  py::gil_scoped_release release;
  cct::softmax_loss_backward<T>(pd, ld, dxd, d[0], d[1], d[2], ignore_label.has_value(),
                                ignore_label.value_or(0), T(scale));
}

template <typename T>
void bind_dtype(py::module_& m) {
  m.def("conv_forward", &conv_forward<T>, py::arg("x"), py::arg("weight"), py::arg("bias"),
        py::arg("kernel"), py::arg("stride"), py::arg("pad"), py::arg("dilation"),
        py::arg("group"), py::arg("out").noconvert(), py::arg("caffe_engine") = false,
        py::arg("relu") = false);
  m.def("conv_backward_data", &conv_backward_data<T>, py::arg("dy"), py::arg("weight"),
        py::arg("kernel"), py::arg("stride"), py::arg("pad"), py::arg("dilation"),
        py::arg("group"), py::arg("out").noconvert(), py::arg("caffe_engine") = false);
  m.def("conv_backward_weight", &conv_backward_weight<T>, py::arg("x"), py::arg("dy"),
        py::arg("kernel"), py::arg("stride"), py::arg("pad"), py::arg("dilation"),
        py::arg("group"), py::arg("out").noconvert(), py::arg("accumulate") = false,
        py::arg("caffe_engine") = false);
  m.def("bias_backward", &bias_backward<T>, py::arg("dy"), py::arg("out").noconvert(),
        py::arg("accumulate") = false);
  m.def("gemm_batch", &gemm_batch<T>, py::arg("a"), py::arg("b"), py::arg("trans_a") = false,
        py::arg("trans_b") = false, py::arg("out").noconvert() = py::none(),
        py::arg("accumulate") = false);
  m.def("gemm", &gemm<T>, py::arg("a"), py::arg("b"), py::arg("trans_a") = false,
        py::arg("trans_b") = false, py::arg("measured") = false,
        py::arg("out").noconvert() = py::none(), py::arg("accumulate") = false);
  m.def("max_pool_forward", &max_pool_forward<T>, py::arg("x"), py::arg("kernel"),
        py::arg("stride"), py::arg("pad"), py::arg("pooled"), py::arg("out").noconvert(),
        py::arg("mask").noconvert());
  m.def("max_pool_backward", &max_pool_backward<T>, py::arg("dy"), py::arg("mask"),
        py::arg("out").noconvert(), py::arg("relu_src").noconvert() = py::none(),
        py::arg("negative_slope") = 0.0);
  m.def("ave_pool_forward", &ave_pool_forward<T>, py::arg("x"), py::arg("kernel"),
        py::arg("stride"), py::arg("pad"), py::arg("pooled"), py::arg("out").noconvert());
  m.def("ave_pool_backward", &ave_pool_backward<T>, py::arg("dy"), py::arg("kernel"),
        py::arg("stride"), py::arg("pad"), py::arg("out").noconvert());
  m.def("relu_forward", &relu_forward<T>, py::arg("x").noconvert(), py::arg("out").noconvert(),
        py::arg("negative_slope"));
  m.def("relu_backward", &relu_backward<T>, py::arg("src").noconvert(),
        py::arg("dy").noconvert(), py::arg("out").noconvert(), py::arg("negative_slope"));
  m.def("concat_copy", &concat_copy<T>, py::arg("src").noconvert(), py::arg("src_offset"),
        py::arg("src_pitch"), py::arg("dst").noconvert(), py::arg("dst_offset"),
        py::arg("dst_pitch"), py::arg("runs"), py::arg("run"),
        py::arg("relu_src").noconvert() = py::none(), py::arg("negative_slope") = 0.0);
  m.def("eltwise_sum", &eltwise_sum<T>, py::arg("arrays"), py::arg("coeffs"),
        py::arg("out").noconvert());
  m.def("sgd_update", &sgd_update<T>, py::arg("data").noconvert(), py::arg("diff").noconvert(),
        py::arg("history").noconvert(), py::arg("local_rate"), py::arg("momentum"),
        py::arg("local_decay"), py::arg("clear_diff") = false);
  m.def("lrn_across_forward", &lrn_across_forward<T>, py::arg("x").noconvert(),
        py::arg("out").noconvert(), py::arg("scale").noconvert(), py::arg("size"),
        py::arg("alpha"), py::arg("beta"), py::arg("k"));
  m.def("lrn_across_backward", &lrn_across_backward<T>, py::arg("x").noconvert(),
        py::arg("y").noconvert(), py::arg("scale").noconvert(), py::arg("dy").noconvert(),
        py::arg("out").noconvert(), py::arg("size"), py::arg("alpha"), py::arg("beta"),
        py::arg("relu_src").noconvert() = py::none(), py::arg("negative_slope") = 0.0);
  m.def("softmax_forward", &softmax_forward<T>, py::arg("x").noconvert(),
        py::arg("out").noconvert());
  m.def("softmax_backward", &softmax_backward<T>, py::arg("y").noconvert(),
        py::arg("dy").noconvert(), py::arg("out").noconvert());
  m.def("softmax_loss_forward", &softmax_loss_forward<T>, py::arg("x").noconvert(),
        py::arg("label").noconvert(), py::arg("prob").noconvert(), py::arg("ignore_label"));
  m.def("softmax_loss_backward", &softmax_loss_backward<T>, py::arg("prob").noconvert(),
        py::arg("label").noconvert(), py::arg("out").noconvert(), py::arg("ignore_label"),
        py::arg("scale"));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "cct CPU kernels (C++)";
  // float64 first: pybind11 tries overloads in order and forcecast would narrow doubles.
  bind_dtype<double>(m);
  bind_dtype<float>(m);
  m.def("set_num_threads", &cct::set_num_threads, py::arg("n"),
        "Threads for the BLAS and cct's kernels; n < 1 means the cores available.");
  m.def("get_num_threads", &cct::num_threads,
        "The calling thread's count (its own, else the process-wide one).");
  m.def("set_thread_num_threads", &cct::set_thread_num_threads, py::arg("n"),
        "The calling thread's own count for cct's loops; 0 returns it to the process-wide one.");
  m.def("set_blas_num_threads", &cct::blas_set_num_threads, py::arg("n"),
        "The BLAS's process-wide thread count alone.");
  m.def("available_cores", &cct::available_cores);
  m.def("blas_num_threads", &cct::blas_get_num_threads,
        "The BLAS's own thread count (0 when the BLAS does not say).");
  m.def("blas_config", []() { return std::string(cct::blas_config()); });
  m.def("set_col_buffer_limit", &cct::set_col_buffer_limit, py::arg("bytes"),
        "Bytes of lowered matrices one convolution may hold; it takes the batch in chunks.");
  m.def("get_col_buffer_limit", &cct::col_buffer_limit);
  m.def("set_partition_mode", &cct::set_partition_mode, py::arg("mode"),
        "Convolution batch partitioning: 0 measure per layer (default), 1 one partition with "
        "threaded BLAS, 2 one partition per thread with single-threaded BLAS.");
  m.def("set_conv_layout", &cct::set_conv_layout, py::arg("mode"),
        "Convolution layout: 0 measure per layer among those that apply (default), 1 lowered, "
        "2 pointwise where it applies (1x1, stride 1, pad 0), 3 direct where it applies "
        "(stride-1 float on AVX2/FMA), 4 Winograd F(2x2, 3x3) or F(2x2, 5x5) where it "
        "applies (3x3 or 5x5 stride-1 undilated float), 5 Winograd F(4x4, 3x3) where it applies "
        "(3x3 stride-1 undilated float), 6-8 direct, Winograd F(2x2) and F(4x4) on a strided "
        "undilated float layer's phase form (conv_phase.h) where they apply to it, 9 direct "
        "with vectors of 16 pixels (AVX-512; forward and backward data), 10 that on the "
        "phase form; the others lowered.");
  m.def("cpu_has_avx512", &cct::cpu_has_avx512,
        "Whether this CPU runs the direct convolution's 16-pixel tile (AVX-512F).");
  m.def("cpu_has_direct_conv", &cct::cpu_has_direct_conv,
        "Whether this CPU runs the direct convolution layout (AVX2 and FMA).");
  m.def("cpu_has_bf16_units", &cct::cpu_has_bf16_units,
        "Whether this CPU runs bf16 arithmetic natively (AVX512-BF16 or AMX-BF16).");
  m.def("load_mkl", &cct::load_mkl, py::arg("path"), py::arg("threaded") = false,
        "Loads Intel MKL's runtime library from path (the bf16 engines', and the float32 "
        "GEMM races' candidate), with MKL's GNU threading layer when threaded: '' or why it "
        "failed.");
  m.def("mkl_loaded", &cct::mkl_loaded);
  m.def("mkl_threaded", &cct::mkl_threaded,
        "Whether MKL was loaded with its threading layer ('mkl_threaded' can run).");
  m.def("mkl_version", &cct::mkl_version, "MKL's version string ('' before it is loaded).");
  m.def("set_mkl_sgemm_offered", &cct::set_mkl_sgemm_offered, py::arg("on"),
        "Whether the float32 GEMM races time MKL's sgemm (GEMM choice 5; needs MKL loaded).");
  m.def("mkl_sgemm_offered", &cct::mkl_sgemm_offered);
  m.def("load_onednn", &cct::load_onednn, py::arg("path"),
        "Loads oneDNN 3 (OpenMP build) from path and opens a CPU engine for the convolutions' "
        "'onednn' layout: '' or why it failed.");
  m.def("onednn_loaded", &cct::onednn_loaded);
  m.def("onednn_version", &cct::onednn_version, "oneDNN's version ('' before it is loaded).");
  m.def("set_onednn_offered", &cct::set_onednn_offered, py::arg("float32"), py::arg("bf16"),
        "Whether the convolution races time oneDNN's layout (layout 10; needs oneDNN loaded) "
        "in float32, and under bf16 GEMMs.");
  m.def("onednn_offered", &cct::onednn_offered, py::arg("bf16"),
        "Whether the races of this precision time oneDNN's layout.");
  m.def(
      "onednn_conv_impl",
      [](int kernel, std::array<int64_t, 4> bottom, int64_t num_output, Pair k, Pair s, Pair p,
         Pair d, int group, bool bf16) {
        if (kernel < 0 || kernel > 2) throw std::invalid_argument("kernel must be 0, 1 or 2");
        const std::array<int64_t, 4> w{num_output, bottom[1] / std::max(group, 1), k[0], k[1]};
        const cct::ConvGeom g =
            conv_geom(bottom, w, k, s, p, d, group, conv_out(bottom[2], k[0], s[0], p[0], d[0]),
                      conv_out(bottom[3], k[1], s[1], p[1], d[1]));
        py::gil_scoped_release release;
        return cct::onednn_conv_impl(kernel, g, bf16);
      },
      py::arg("kernel"), py::arg("bottom"), py::arg("num_output"), py::arg("kernel_size"),
      py::arg("stride"), py::arg("pad"), py::arg("dilation"), py::arg("group"), py::arg("bf16"),
      "The implementation oneDNN runs for a convolution kernel (0 forward, 1 backward data, 2 "
      "backward weight) on this geometry, '' where it has none of its own or is not loaded.");
  m.def(
      "onednn_matmul_impl",
      [](bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t count,
         bool shared_a, bool accumulate) {
        const cct::MatmulShape s{trans_a,       trans_b, m,        n,     k,    trans_a ? m : k,
                                 shared_a ? 0 : m * k,   trans_b ? k : n, k * n, n,    m * n,
                                 count,         accumulate};
        py::gil_scoped_release release;
        return cct::onednn_matmul_impl(s);
      },
      py::arg("trans_a"), py::arg("trans_b"), py::arg("m"), py::arg("n"), py::arg("k"),
      py::arg("count") = 1, py::arg("shared_a") = false, py::arg("accumulate") = false,
      "The implementation oneDNN's bf16 matmul runs (GEMM choice 13) for count compact "
      "products op(a) (m x k) @ op(b) (k x n), a shared by every item with shared_a, added "
      "into c with accumulate; '' where it has none of its own or is not loaded.");
  m.def("set_bf16_engine", &cct::set_bf16_engine, py::arg("name"),
        "The bf16 GEMM engine: 'mkl', 'mkl_threaded' (loaded first) or 'avx512bf16' "
        "(cct's own kernel).");
  m.def("bf16_engine", &cct::bf16_engine);
  m.def("set_bf16_shape_engines", &cct::set_bf16_shape_engines, py::arg("names"),
        "The engines bf16 GEMMs race shape by shape besides the chosen one ('mkl_threaded', "
        "'avx512bf16'; GEMM and batched choices 8 and 9).");
  m.def("bf16_shape_engines", &cct::bf16_shape_engines);
  m.def("bf16_kernel_supported", &cct::bf16_kernel_supported,
        "Whether this CPU runs cct's own bf16 kernel (AVX512-BF16).");
  m.def("set_bf16_gemm", &cct::set_bf16_gemm, py::arg("on"),
        "float32 GEMMs with operands rounded to bf16 (needs the engine loaded).");
  m.def("bf16_gemm_enabled", &cct::bf16_gemm_enabled);
  m.def(
      "round_to_bf16",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> x) {
        py::array_t<float> out(x.request().shape);
        std::vector<uint16_t> half(size_t(x.size()));
        cct::round_to_bf16(x.data(), half.data(), x.size());
        cct::widen_bf16(half.data(), out.mutable_data(), x.size());
        return out;
      },
      py::arg("x"), "x rounded to the nearest bf16 (ties to even), as float32.");
  m.def("partition_choices", &cct::partition_choices,
        "(kernel, geometry, partitions, layout) for each convolution measured.");
  m.def("blas_has_batch_strided", &cct::blas_has_batch_strided,
        "Whether the linked BLAS has a strided batched GEMM (else one GEMM per item).");
  m.def("gemm_choices", &cct::gemm_choices,
        "(trans_a, trans_b, m, n, k, itemsize, BLAS threads, accumulate, choice) per shape "
        "measured; choice 0 direct, 1 transposed, 2 and 3 the same in float32 under bf16, 4 "
        "the skinny engine, 5 MKL's sgemm, 6 the skinny engine's 16-lane tile, 10 the thin "
        "engine (all float32), 8 and 9 the direct order in bf16 on MKL's threads and on cct's "
        "kernel, 11 and 12 cct's bf16 kernel in the skinny and the thin forms.");
  m.def("gemm_batch_choices", &cct::gemm_batch_choices,
        "(trans_a, trans_b, m, n, k, count, itemsize, BLAS threads, accumulate, choice) per "
        "strided batched GEMM shape raced (itemsize 2 under bf16, else 4): choice 0 the BLAS's "
        "float32 batched call, 5 MKL's (where MKL is offered), 7 the items in bf16, 8 and 9 the "
        "same on MKL's threads and on cct's kernel.");
  m.def("load_gemm_batch_choices", &cct::load_gemm_batch_choices, py::arg("entries"),
        "Installs batched-GEMM choices (gemm_batch_choices' rows), replacing those of the same "
        "key.");
  m.def("gemm_candidates", &cct::gemm_candidates, py::arg("m"), py::arg("n"), py::arg("k"),
        py::arg("trans_b") = true,
        "The choices a float32 GEMM of this shape would race now, B stored n x k (trans_b) or "
        "k x n.");
  m.def("gemm_skinny_available", &cct::gemm_skinny_available,
        "Whether this CPU has the skinny GEMM engine's kernel (AVX2 and FMA), which the GEMM "
        "races then try for float32 C = op(A) B^T of at most 64 rows.");
  m.def("gemm_thin_available", &cct::gemm_thin_available,
        "Whether this CPU has the thin GEMM engine's kernel (AVX2 and FMA), which the GEMM races "
        "then try, as choice 10, for float32 C = op(A) B with k at most 256 and B stored k x n.");
  m.def("gemm_thin16_available", &cct::gemm_thin16_available,
        "Whether this CPU also has the thin engine's 16-lane tile (AVX-512F; the same bits), "
        "which choice 10 runs where it does.");
  m.def(
      "gemm_thin",
      [](py::array_t<float, py::array::c_style> a, py::array_t<float, py::array::c_style> b,
         bool trans_a, py::array_t<float, py::array::c_style> out, bool accumulate, int lanes) {
        const int64_t k = b.ndim() == 2 ? b.shape(0) : -1, n = b.ndim() == 2 ? b.shape(1) : -1;
        const int64_t m = out.ndim() == 2 ? out.shape(0) : -1;
        if (a.ndim() != 2 || k < 0 || m < 0 || out.shape(1) != n ||
            a.shape(trans_a ? 1 : 0) != m || a.shape(trans_a ? 0 : 1) != k)
          throw std::invalid_argument("gemm_thin: want op(a) m x k, b k x n and out m x n");
        float* c = out.mutable_data();
        py::gil_scoped_release release;
        cct::gemm_thin(trans_a, m, n, k, a.data(), a.shape(1), b.data(), n,
                       accumulate ? 1.0f : 0.0f, c, n, lanes);
      },
      py::arg("a"), py::arg("b"), py::arg("trans_a"), py::arg("out"), py::arg("accumulate"),
      py::arg("lanes"),
      "The thin engine itself (tests): out = op(a) @ b (+ out with accumulate) through its "
      "`lanes` (8 or 16) tile, 16 running the 8-lane one on a CPU without AVX-512F.");
  m.def("gemm_skinny16_available", &cct::gemm_skinny16_available,
        "Whether this CPU also has the skinny engine's 16-lane tile (AVX-512F; the same bits), "
        "which the races then try as GEMM choice 6.");
  m.def("conv_plan_table", &cct::conv_plan_table,
        "(kernel, geometry, itemsize, threads, modes, partitions, layout, cache_chunks) per "
        "convolution plan in the table.");
  m.def("conv_layout_names", &cct::conv_layout_names,
        "The convolution layouts' names, by the number a plan holds.");
  m.def("load_conv_plans", &cct::load_conv_plans, py::arg("entries"),
        "Installs convolution plans (conv_plan_table's rows), replacing those of the same key.");
  m.def("load_gemm_choices", &cct::load_gemm_choices, py::arg("entries"),
        "Installs GEMM operand orders (gemm_choices' rows), replacing those of the same key.");
  m.def("set_plan_measurement", &cct::set_plan_measurement, py::arg("measure"),
        "True: time every new shape's plans (default); False: a fixed rule, no timing.");
  m.def("plan_measurement", &cct::plan_measurement);
  m.def(
      "plan_race",
      [](const std::vector<std::vector<double>>& times, double skip_over) {
        for (const auto& t : times)
          if (t.empty()) throw std::invalid_argument("every candidate needs a time");
        std::vector<size_t> seen(times.size(), 0), runs;
        const cct::RaceResult result = cct::race(times.size(), skip_over, [] {}, [&](size_t i) {
          runs.push_back(i);
          return times[i][std::min(seen[i]++, times[i].size() - 1)];
        });
        return py::make_tuple(result.fastest, result.last_run, runs);
      },
      py::arg("times"), py::arg("skip_over"),
      "The plans' race (race.h) on given times instead of timed runs: times[i] are candidate "
      "i's seconds on its successive runs (its last repeated). Returns (fastest, the candidate "
      "run last, every run's candidate in order).");
  m.def("plan_count", &cct::plan_count,
        "Entries in the convolution-plan and GEMM tables (batched GEMMs' too).");
  m.def("clear_plans", &cct::clear_plans, "Empties the convolution-plan and GEMM tables.");
  m.def("set_gemm_order", &cct::set_gemm_order, py::arg("order"),
        "0: measure the two operand orders per shape (default); 1: direct; 2: transposed.");
  cct::set_num_threads(0);
}
