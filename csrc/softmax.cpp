// Softmax over the channel axis of an (outer, channels, inner) array (Caffe's softmax_layer.cpp)
// and the core of SoftmaxWithLoss (softmax_loss_layer.cpp).
//
//   y_c = exp(x_c - max_j x_j) / sum_j exp(x_j - max_j x_j)
//   softmax backward:  dx_c = (dy_c - sum_j dy_j y_j) y_c
//   loss:  sum over non-ignored positions of -log(max(p[label], FLT_MIN))
//   loss backward: dx = (p - onehot(label)) * scale, 0 at ignored positions
//
// Sums over channels run in channel order, as Caffe's. Work is split over the outer index (and
// blocks of the inner one) between cct's threads. Outputs may be their inputs (in place).
#include "kernels.h"
#include "parallel.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

namespace cct {

namespace {

constexpr int64_t kInnerBlock = 256;

// Calls f(o, i0, len) for every (outer index, block of inner positions), split between threads.
template <typename F>
void for_blocks(int64_t outer, int64_t channels, int64_t inner, int64_t cost, F&& f) {
  const int64_t block = std::min(kInnerBlock, std::max<int64_t>(inner, 1));
  const int64_t blocks = (inner + block - 1) / block;
  parallel_for(outer * blocks, channels * block * cost, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t o = item / blocks, i0 = (item % blocks) * block;
      f(o, i0, std::min(block, inner - i0));
    }
  });
}

}  // namespace

template <typename T>
void softmax_forward(const T* x, T* y, int64_t outer, int64_t channels, int64_t inner) {
  if (outer == 0 || channels == 0 || inner == 0) return;
  for_blocks(outer, channels, inner, 8, [&](int64_t o, int64_t i0, int64_t len) {
    T m[kInnerBlock], s[kInnerBlock];
    const int64_t base = o * channels * inner + i0;
    std::copy(x + base, x + base + len, m);
    for (int64_t c = 1; c < channels; ++c) {
      const T* xc = x + base + c * inner;
      for (int64_t i = 0; i < len; ++i) m[i] = std::max(m[i], xc[i]);
    }
    std::fill(s, s + len, T(0));
    for (int64_t c = 0; c < channels; ++c) {
      const T* xc = x + base + c * inner;
      T* yc = y + base + c * inner;
      for (int64_t i = 0; i < len; ++i) {
        yc[i] = std::exp(xc[i] - m[i]);
        s[i] += yc[i];
      }
    }
    for (int64_t c = 0; c < channels; ++c) {
      T* yc = y + base + c * inner;
      for (int64_t i = 0; i < len; ++i) yc[i] /= s[i];
    }
  });
}

template <typename T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t outer, int64_t channels,
                      int64_t inner) {
  if (outer == 0 || channels == 0 || inner == 0) return;
  for_blocks(outer, channels, inner, 4, [&](int64_t o, int64_t i0, int64_t len) {
    T dot[kInnerBlock];
    const int64_t base = o * channels * inner + i0;
    std::fill(dot, dot + len, T(0));
    for (int64_t c = 0; c < channels; ++c) {
      const T* yc = y + base + c * inner;
      const T* dyc = dy + base + c * inner;
      for (int64_t i = 0; i < len; ++i) dot[i] += dyc[i] * yc[i];
    }
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t off = base + c * inner;
      for (int64_t i = 0; i < len; ++i) dx[off + i] = (dy[off + i] - dot[i]) * y[off + i];
    }
  });
}

template <typename T>
SoftmaxLossResult<T> softmax_loss_forward(const T* x, const T* label, T* prob, int64_t outer,
                                          int64_t channels, int64_t inner, bool has_ignore,
                                          int64_t ignore_label) {
  softmax_forward(x, prob, outer, channels, inner);
  SoftmaxLossResult<T> r{T(0), 0, false, 0};
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t l = int64_t(static_cast<int>(label[o * inner + i]));
      if (has_ignore && l == ignore_label) continue;
      if (l < 0 || l >= channels) {
        if (!r.bad) r = {r.loss, r.count, true, l};
        continue;
      }
      r.loss -= std::log(std::max(prob[(o * channels + l) * inner + i], T(FLT_MIN)));
      ++r.count;
    }
  }
  return r;
}

template <typename T>
void softmax_loss_backward(const T* prob, const T* label, T* dx, int64_t outer, int64_t channels,
                           int64_t inner, bool has_ignore, int64_t ignore_label, T scale) {
  if (outer == 0 || channels == 0 || inner == 0) return;
  for_blocks(outer, channels, inner, 1, [&](int64_t o, int64_t i0, int64_t len) {
    const int64_t base = o * channels * inner + i0;
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t off = base + c * inner;
      std::copy(prob + off, prob + off + len, dx + off);
    }
    for (int64_t i = 0; i < len; ++i) {
      const int64_t l = int64_t(static_cast<int>(label[o * inner + i0 + i]));
      if (has_ignore && l == ignore_label) {
        for (int64_t c = 0; c < channels; ++c) dx[base + c * inner + i] = T(0);
      } else if (l >= 0 && l < channels) {
        dx[base + l * inner + i] -= T(1);
      }
    }
    for (int64_t c = 0; c < channels; ++c) {
      T* d = dx + base + c * inner;
      for (int64_t i = 0; i < len; ++i) d[i] *= scale;
    }
  });
}

#define CCT_INSTANTIATE(T)                                                                   \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t, int64_t);                 \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t);      \
  template SoftmaxLossResult<T> softmax_loss_forward<T>(const T*, const T*, T*, int64_t,     \
                                                        int64_t, int64_t, bool, int64_t);    \
  template void softmax_loss_backward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t,  \
                                         bool, int64_t, T);
CCT_INSTANTIATE(float)
CCT_INSTANTIATE(double)
#undef CCT_INSTANTIATE

}  // namespace cct
