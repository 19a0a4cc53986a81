// Element-by-element kernels: ReLU forward and backward, SGD's fused update, the sum of several
// arrays (Eltwise SUM, Split's backward), and Concat's copies.
//
// Each works on flat arrays split between cct's threads in contiguous slices. Every output may
// be the same array as an input (in place): element i of an output depends only on element i of
// the inputs. The arithmetic is written in the order of Caffe's (relu_layer.cpp,
// sgd_solver.cpp), one rounding per step, so the results equal NumPy's on the same steps.
#include "kernels.h"
#include "parallel.h"
#include "vector_clones.h"

#include <algorithm>
#include <type_traits>

namespace cct {

template <typename T>
void relu_forward(const T* x, T* y, int64_t count, T negative_slope) {
  parallel_for(count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = caffe_relu(x[i], negative_slope);
  });
}

template <typename T>
CCT_VECTOR_CLONES void relu_backward_span(const T* src, const T* dy, T* dx, int64_t count,
                                          T negative_slope) {
  for (int64_t i = 0; i < count; ++i)
    dx[i] = dy[i] * (T(src[i] > T(0)) + negative_slope * T(src[i] <= T(0)));
}

template <typename T>
void relu_backward(const T* src, const T* dy, T* dx, int64_t count, T negative_slope) {
  parallel_for(count, 1, [&](int64_t begin, int64_t end) {
    relu_backward_span(src + begin, dy + begin, dx + begin, end - begin, negative_slope);
  });
}

namespace {

// One pass over the four arrays; the decay and clear tests are hoisted out of the loop so that
// it vectorizes.
template <typename T, bool kDecay, bool kClear>
void sgd_pass(T* data, T* diff, T* history, int64_t begin, int64_t end, T local_rate,
              T momentum, T local_decay) {
  for (int64_t i = begin; i < end; ++i) {
    T g = diff[i];
    if (kDecay) {
      const T decay = data[i] * local_decay;
      g += decay;
    }
    g *= local_rate;
    T h = history[i] * momentum;
    h += g;
    history[i] = h;
    diff[i] = kClear ? T(0) : h;
    data[i] -= h;
  }
}

}  // namespace

template <typename T>
void sgd_update(T* data, T* diff, T* history, int64_t count, T local_rate, T momentum,
                T local_decay, bool clear_diff) {
  parallel_for(count, 1, [&](int64_t begin, int64_t end) {
    const auto pass = [&](auto decay, auto clear) {
      sgd_pass<T, decltype(decay)::value, decltype(clear)::value>(
          data, diff, history, begin, end, local_rate, momentum, local_decay);
    };
    const bool decay = local_decay != T(0);
    if (decay && clear_diff) pass(std::true_type{}, std::true_type{});
    else if (decay) pass(std::true_type{}, std::false_type{});
    else if (clear_diff) pass(std::false_type{}, std::true_type{});
    else pass(std::false_type{}, std::false_type{});
  });
}

namespace {

// Elements per block of eltwise_sum: out's block stays in L1 (16 KiB of floats) while each
// further array is added into it.
constexpr int64_t kSumBlock = 4096;

// out[i] = c0 a0[i] + c1 a1[i] (first) or out[i] += c a[i] (later), for i in [begin, end). A
// coefficient 1 multiplies nothing: x * 1 is x, so the same bits. No product is fused into its
// sum (this file is built with -ffp-contract=off, CMakeLists.txt).
template <typename T>
CCT_VECTOR_CLONES void sum_first(const T* a, T ca, const T* b, T cb, T* out, int64_t begin,
                                 int64_t end) {
  if (ca == T(1) && cb == T(1)) {
    for (int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
  } else {
    for (int64_t i = begin; i < end; ++i) out[i] = a[i] * ca + b[i] * cb;
  }
}

template <typename T>
CCT_VECTOR_CLONES void sum_next(const T* a, T ca, T* out, int64_t begin, int64_t end) {
  if (ca == T(1)) {
    for (int64_t i = begin; i < end; ++i) out[i] += a[i];
  } else {
    for (int64_t i = begin; i < end; ++i) out[i] += a[i] * ca;
  }
}

}  // namespace

template <typename T>
void eltwise_sum(const T* const* arrays, const T* coeffs, int64_t n, T* out, int64_t count) {
  parallel_for(count, n, [&](int64_t begin, int64_t end) {
    for (int64_t b0 = begin; b0 < end; b0 += kSumBlock) {
      const int64_t b1 = std::min(end, b0 + kSumBlock);
      sum_first<T>(arrays[0], coeffs[0], arrays[1], coeffs[1], out, b0, b1);
      for (int64_t k = 2; k < n; ++k) sum_next<T>(arrays[k], coeffs[k], out, b0, b1);
    }
  });
}

template <typename T>
void concat_copy(const T* src, int64_t src_pitch, T* dst, int64_t dst_pitch, int64_t runs,
                 int64_t run, const T* relu_src, T negative_slope) {
  if (runs <= 0 || run <= 0) return;  // an empty bottom: nothing to copy, no run to divide by
  const auto copy = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin / run; r * run < end; ++r) {
      const int64_t i0 = std::max(begin - r * run, int64_t(0));
      const int64_t i1 = std::min(end - r * run, run);
      const T* s = src + r * src_pitch + i0;
      T* d = dst + r * dst_pitch + i0;
      if (relu_src == nullptr)
        std::copy(s, s + (i1 - i0), d);
      else   // dst is laid out as relu_src
        relu_backward_span(relu_src + r * run + i0, s, d, i1 - i0, negative_slope);
    }
  };
  // One flat range of the runs' elements per thread, not whole runs: GoogLeNet's Concats at
  // batch 32 have 32 runs of up to 100 KiB a bottom, which split unevenly between threads.
  // Two threads beat NumPy's one on every GoogLeNet Concat here, the 7x7 inception_5a's too
  // (0.8-1.3 MB a bottom), once cpu.concat_forward's own overhead was cut (bench/RESULTS.md).
  parallel_for(runs * run, 1, copy);
}

#define CCT_INSTANTIATE(T)                                                          \
  template void relu_backward_span<T>(const T*, const T*, T*, int64_t, T);          \
  template void concat_copy<T>(const T*, int64_t, T*, int64_t, int64_t, int64_t,   \
                               const T*, T);                                        \
  template void relu_forward<T>(const T*, T*, int64_t, T);                          \
  template void relu_backward<T>(const T*, const T*, T*, int64_t, T);               \
  template void sgd_update<T>(T*, T*, T*, int64_t, T, T, T, bool);                 \
  template void eltwise_sum<T>(const T* const*, const T*, int64_t, T*, int64_t);
CCT_INSTANTIATE(float)
CCT_INSTANTIATE(double)
#undef CCT_INSTANTIATE

}  // namespace cct
