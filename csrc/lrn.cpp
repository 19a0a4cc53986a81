// Local response normalisation across channels, Caffe's CrossChannelForward_cpu and
// CrossChannelBackward_cpu (lrn_layer.cpp) with the same running sums over the channel window:
//
//   scale_c = k + alpha/size * sum of x_j^2 over the `size` channels centred on c
//   y_c     = x_c * scale_c^-beta
//   dx_c    = dy_c * scale_c^-beta - 2 alpha beta / size * x_c * sum over the same window
//             of dy_j * y_j / scale_j
//
// Work is split into (image, block of pixels) items between cct's threads; each item walks the
// channels with the whole block's pixels side by side, so the inner loops are contiguous. dx may
// be dy (in place); y must not be x.
#include "kernels.h"
#include "parallel.h"
#include "vector_clones.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cct {

namespace {

// s^-beta; Caffe's default beta 0.75 as 1 / (sqrt(s) sqrt(sqrt(s))), several times faster than
// pow and within a few ulp of it.
template <typename T>
struct NegPow {
  T beta;
  bool three_quarters;
  explicit NegPow(T b) : beta(b), three_quarters(b == T(0.75)) {}
  T operator()(T s) const {
    if (three_quarters) {
      const T r = std::sqrt(s);
      return T(1) / (r * std::sqrt(r));
    }
    return std::pow(s, -beta);
  }
};

// Pixels per item. Each item walks the channels once, holding only the channel window's rows
// of squares (or ratios) in a ring, so its block can be a whole plane (up to 4,096 pixels, 16
// KiB runs of every channel plane, which the prefetchers follow) while there are images
// enough for the threads; a small batch cuts its planes into as many blocks as keep them
// busy, down to 256 pixels. The first version kept every channel's squares and so cut blocks
// to 64 KiB / channels: 85 pixels at 192 channels, 340-byte runs over 192 pages, 1.4-1.8x
// slower on GoogLeNet's norm2 (bench/RESULTS.md). The block changes no arithmetic.
int64_t lrn_block(int64_t num, int64_t pixels) {
  const int64_t per_image = (2 * int64_t(num_threads()) + num - 1) / std::max<int64_t>(num, 1);
  const int64_t block = (pixels + per_image - 1) / per_image;
  return std::clamp<int64_t>(block, std::min<int64_t>(256, pixels), 4096);
}

}  // namespace

// One (image, block of pixels) item of the forward pass; `ring` holds size + 1 rows of `block`
// squares (alpha/size * x^2), channel j's in row j % (size + 1): the window of channel c
// spans the squares of c - 1 - pre (leaving) to c + size - 1 - pre (entering), size + 1 rows.
// The window's running sum is Caffe's: channel c's scale is channel c-1's plus the head's
// square minus the tail's, in that order (two roundings, as Caffe's axpy calls make).
template <typename T>
CCT_VECTOR_CLONES void lrn_forward_item(const T* x, T* y, T* scale, T* ring, int64_t channels,
                                        int64_t pixels, int64_t block, int64_t len, int size,
                                        T alpha_over_size, T k, NegPow<T> negpow) {
  const int pre = (size - 1) / 2;
  const int64_t rows = size + 1;
  const auto square = [&](int64_t c) {
    const T* xc = x + c * pixels;
    T* sc = ring + (c % rows) * block;
    for (int64_t i = 0; i < len; ++i) sc[i] = alpha_over_size * (xc[i] * xc[i]);
    return sc;
  };
  // Channel 0's window covers padded channels 0 .. size-1, i.e. real ones -pre .. size-1-pre.
  std::fill(scale, scale + len, k);
  for (int64_t j = 0; j < std::min<int64_t>(size - pre, channels); ++j) {
    const T* sj = square(j);
    for (int64_t i = 0; i < len; ++i) scale[i] += sj[i];
  }
  for (int64_t i = 0; i < len; ++i) y[i] = negpow(scale[i]) * x[i];
  for (int64_t c = 1; c < channels; ++c) {
    const T* prev = scale + (c - 1) * pixels;
    T* cur = scale + c * pixels;
    const int64_t head = c + size - 1 - pre, tail = c - 1 - pre;
    const T* st = tail >= 0 ? ring + (tail % rows) * block : nullptr;
    if (head < channels) {
      // The entering channel's square in the same pass as the sum that takes it (two passes
      // before: 1.1x slower on GoogLeNet's norm2, bench/RESULTS.md). Fusing the top's pass in
      // too ran 3.5x slower: GCC vectorized that loop poorly.
      const T* xh = x + head * pixels;
      T* sh = ring + (head % rows) * block;
      if (st) {
        for (int64_t i = 0; i < len; ++i) {
          const T square_h = alpha_over_size * (xh[i] * xh[i]);
          sh[i] = square_h;
          cur[i] = (prev[i] + square_h) - st[i];
        }
      } else {
        for (int64_t i = 0; i < len; ++i) {
          const T square_h = alpha_over_size * (xh[i] * xh[i]);
          sh[i] = square_h;
          cur[i] = prev[i] + square_h;
        }
      }
    } else if (st) {
      for (int64_t i = 0; i < len; ++i) cur[i] = prev[i] - st[i];
    } else {
      std::copy(prev, prev + len, cur);
    }
    const T* xc = x + c * pixels;
    T* yc = y + c * pixels;
    for (int64_t i = 0; i < len; ++i) yc[i] = negpow(cur[i]) * xc[i];
  }
}

template <typename T>
void lrn_across_forward(const T* x, T* y, T* scale, int64_t num, int64_t channels, int64_t pixels,
                        int size, T alpha, T beta, T k) {
  if (num == 0 || channels == 0 || pixels == 0) return;
  const int64_t block = lrn_block(num, pixels);
  const int64_t blocks = (pixels + block - 1) / block;
  const T alpha_over_size = alpha / T(size);
  const NegPow<T> negpow(beta);
  parallel_for(num * blocks, channels * block * 4, [&](int64_t begin, int64_t end) {
    std::vector<T> ring(static_cast<size_t>((size + 1) * block));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / blocks, p0 = (item % blocks) * block;
      const int64_t base = n * channels * pixels + p0;
      lrn_forward_item(x + base, y + base, scale + base, ring.data(), channels, pixels, block,
                       std::min(block, pixels - p0), size, alpha_over_size, k, negpow);
    }
  });
}

// One item of the backward pass: `ring` holds size + 1 rows of ratios dy * y / scale (channel
// j's in row j % (size + 1)), `accum` the window's running sum. With relu_src (laid out as x),
// each channel's row of dx then goes through relu_backward_span while it is in L1. Folded into
// the loop that computes dx, the extra array kept that loop from vectorising: GoogLeNet's
// norm2 took 2.7x as long as the LRN and the ReLU's pass apart (bench/RESULTS.md).
template <typename T>
CCT_VECTOR_CLONES void lrn_backward_item(const T* x, const T* y, const T* scale, const T* dy,
                                         T* dx, T* ring, T* accum, int64_t channels,
                                         int64_t pixels, int64_t block, int64_t len, int size,
                                         T cache_ratio, NegPow<T> negpow, const T* relu_src,
                                         T negative_slope) {
  const int pre = (size - 1) / 2;
  const int64_t rows = size + 1;
  // Channel j's ratio is written before dx of any channel at or past j - pre is: in place
  // (dx = dy) the ratios read dy before it is overwritten.
  const auto ratio = [&](int64_t j) {
    const int64_t off = j * pixels;
    T* rj = ring + (j % rows) * block;
    for (int64_t i = 0; i < len; ++i) rj[i] = (dy[off + i] * y[off + i]) / scale[off + i];
    return rj;
  };
  // accum holds the window sum of channel c: padded channels c .. c+size-1.
  std::fill(accum, accum + len, T(0));
  for (int64_t j = 0; j < std::min<int64_t>(size - 1 - pre, channels); ++j) {
    const T* rj = ratio(j);
    for (int64_t i = 0; i < len; ++i) accum[i] += rj[i];
  }
  for (int64_t c = 0; c < channels; ++c) {
    const int64_t off = c * pixels;
    const int64_t head = c + size - 1 - pre, tail = c - pre;
    if (head < channels) {
      // The entering ratio added to the window's sum in the pass that computes it, and the
      // leaving one taken off in dx's pass: the same operations in the same order as a pass
      // each, with fewer passes over accum.
      const int64_t offh = head * pixels;
      T* rh = ring + (head % rows) * block;
      for (int64_t i = 0; i < len; ++i) {
        const T r = (dy[offh + i] * y[offh + i]) / scale[offh + i];
        rh[i] = r;
        accum[i] += r;
      }
    }
    if (tail >= 0) {
      const T* rt = ring + (tail % rows) * block;
      for (int64_t i = 0; i < len; ++i) {
        const T d = negpow(scale[off + i]) * dy[off + i];
        const T xa = x[off + i] * accum[i];
        dx[off + i] = d - cache_ratio * xa;
        accum[i] -= rt[i];
      }
    } else {
      for (int64_t i = 0; i < len; ++i) {
        const T d = negpow(scale[off + i]) * dy[off + i];
        const T xa = x[off + i] * accum[i];
        dx[off + i] = d - cache_ratio * xa;
      }
    }
    if (relu_src != nullptr)
      relu_backward_span(relu_src + off, dx + off, dx + off, len, negative_slope);
  }
}

template <typename T>
void lrn_across_backward(const T* x, const T* y, const T* scale, const T* dy, T* dx, int64_t num,
                         int64_t channels, int64_t pixels, int size, T alpha, T beta,
                         const T* relu_src, T negative_slope) {
  if (num == 0 || channels == 0 || pixels == 0) return;
  const int64_t block = lrn_block(num, pixels);
  const int64_t blocks = (pixels + block - 1) / block;
  const T cache_ratio = T(2) * alpha * beta / T(size);
  const NegPow<T> negpow(beta);
  parallel_for(num * blocks, channels * block * 6, [&](int64_t begin, int64_t end) {
    std::vector<T> ring(static_cast<size_t>((size + 1) * block));
    std::vector<T> accum(static_cast<size_t>(block));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / blocks, p0 = (item % blocks) * block;
      const int64_t base = n * channels * pixels + p0;
      lrn_backward_item(x + base, y + base, scale + base, dy + base, dx + base, ring.data(),
                        accum.data(), channels, pixels, block, std::min(block, pixels - p0),
                        size, cache_ratio, negpow, relu_src ? relu_src + base : nullptr,
                        negative_slope);
    }
  });
}

#define CCT_INSTANTIATE(T)                                                                   \
  template void lrn_across_forward<T>(const T*, T*, T*, int64_t, int64_t, int64_t, int, T, T, \
                                      T);                                                    \
  template void lrn_across_backward<T>(const T*, const T*, const T*, const T*, T*, int64_t,  \
                                       int64_t, int64_t, int, T, T, const T*, T);
CCT_INSTANTIATE(float)
CCT_INSTANTIATE(double)
#undef CCT_INSTANTIATE

}  // namespace cct
