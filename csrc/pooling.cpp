// Pooling kernels with Caffe's exact window rules (pooling_layer.cpp), over the whole batch.
//
// Windows start at ph*stride - pad. MAX scans the window clipped to the bottom and keeps the
// first strict maximum (Caffe's `>`), recording its flat index within the H*W plane. AVE divides
// by the window size clipped to the padded bottom (padding counts, what lies beyond it does not).
// Planes (image, channel) are split between cct's threads.
#include "kernels.h"
#include "padding.h"
#include "parallel.h"
#include "vector_clones.h"
#include "workspace.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CCT_POOL_AVX2 1
#endif

namespace cct {

// One MAX window, clipped to the bottom: Caffe's loop (row-major scan, strict `>`, so ties go
// to the first element and NaN never wins; -FLT_MAX and -1 when the window is empty).
template <typename T>
inline void max_window(const T* xp, int hs, int he, int ws, int we, int w, T* y, int32_t* mask) {
  T best = -std::numeric_limits<T>::max();
  int32_t arg = -1;
  for (int i = hs; i < he; ++i)
    for (int j = ws; j < we; ++j)
      if (xp[i * w + j] > best) {
        best = xp[i * w + j];
        arg = i * w + j;
      }
  *y = best;
  *mask = arg;
}

#if defined(__SSE2__)
// The new best of a MAX window's scan, Caffe's `if (v > best) best = v`: MAXPS returns its first
// operand where it is greater than the second (an ordered compare) and the second otherwise, so
// a NaN tap or a tie keeps best, as the blend on the same compare did, to the bit. The scan's
// argmax still takes that compare; best no longer waits on it: a blend on a compare was two
// dependent operations per tap (three with the sign test GCC puts before VBLENDVPS), and the
// taps of a window form one chain through best.
inline __m128 max_select(__m128 v, __m128 best) { return _mm_max_ps(v, best); }

// Four windows side by side (outputs ow .. ow + 3, all inside the bottom horizontally), in SSE
// registers: each tap is one compare and two selects for the four, in the same row-major order
// and with the same strict `>` as max_window. Stride 1 or 2 (the zoo's pooling layers); with
// stride 2 the taps of the four windows are the even lanes of eight consecutive floats.
template <int SW>
inline void max_windows4(const float* xp, int hs, int he, int col0, int kw, int w, float* y,
                         int32_t* mask) {
  __m128 best = _mm_set1_ps(-std::numeric_limits<float>::max());
  __m128i arg = _mm_set1_epi32(-1);
  const __m128i lanes = _mm_setr_epi32(0, SW, 2 * SW, 3 * SW);
  for (int i = hs; i < he; ++i) {
    for (int j = 0; j < kw; ++j) {
      const int at = i * w + col0 + j;
      __m128 v;
      if (SW == 1) {
        v = _mm_loadu_ps(xp + at);
      } else {
        v = _mm_shuffle_ps(_mm_loadu_ps(xp + at), _mm_loadu_ps(xp + at + 4),
                           _MM_SHUFFLE(2, 0, 2, 0));
      }
      const __m128 gt = _mm_cmpgt_ps(v, best);
      best = max_select(v, best);
      const __m128i g = _mm_castps_si128(gt);
      const __m128i idx = _mm_add_epi32(_mm_set1_epi32(at), lanes);
      arg = _mm_or_si128(_mm_and_si128(g, idx), _mm_andnot_si128(g, arg));
    }
  }
  _mm_storeu_ps(y, best);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(mask), arg);
}

// Outputs [ow0, ow1) of a row done four at a time; returns where that stopped. A group must
// lie inside the bottom horizontally, and with stride 2 its last load reads one float past its
// last tap, which must still be inside the row.
template <int SW>
int max_row_vectorized(const float* xp, int hs, int he, int w, int kw, int pw, int ow0, int ow1,
                       float* y, int32_t* mask) {
  int ow = ow0;
  for (; ow + 4 <= ow1 && (ow + 3) * SW - pw + kw - 1 + (SW - 1) < w; ow += 4)
    max_windows4<SW>(xp, hs, he, ow * SW - pw, kw, w, y + ow, mask + ow);
  return ow;
}
#endif

#if defined(CCT_POOL_AVX2)
#define CCT_AVX2 __attribute__((target("avx2")))
// Stride 2's lanes (outputs 0 1 4 5 2 3 6 7) in output order.
CCT_AVX2 inline __m256 in_order(__m256 v) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), _MM_SHUFFLE(3, 1, 2, 0)));
}

CCT_AVX2 inline __m256 max_select(__m256 v, __m256 best) { return _mm256_max_ps(v, best); }

// Eight windows side by side in AVX registers (max_windows4's taps, eight outputs per
// compare-and-blend). `src` is the first window's first tap in a plane `pitch` floats a row
// (the bottom itself, or a padded copy of it), `at0` that tap's flat index in the bottom (w a
// row), `rows` the windows' rows. Stride 2 loads sixteen floats per tap and keeps their even
// ones in the order one in-lane shuffle leaves them (outputs 0 1 4 5 2 3 6 7), put back in
// order once, at the store. kPadded false: `src` is the bottom plane's origin and `pitch`
// unused, each tap loaded at its own index (one integer for the load and the index: the
// general form measured 4-12% slower on the unpadded rows). KH, KW: the window's rows and
// taps a row when known when compiled (0: `rows`, `kw`), so that the zoo's 3x3 and 2x2
// windows run unrolled; the taps' indices are one vector stepped along (both cut the
// instructions a tap takes: max_windows8_k picks).
template <int SW, bool kPadded, int KH = 0, int KW = 0>
CCT_AVX2 inline void max_windows8(const float* src, int pitch, int at0, int rows_, int kw_, int w,
                                  float* y, int32_t* mask) {
  const int rows = KH ? KH : rows_, kw = KW ? KW : kw_;
  const __m256i lanes = SW == 1 ? _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
                                : _mm256_setr_epi32(0, 2, 8, 10, 4, 6, 12, 14);
  const __m256i one = _mm256_set1_epi32(1), next_row = _mm256_set1_epi32(w - kw);
  __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(at0), lanes);  // the tap's, lane by lane
  __m256 best = _mm256_set1_ps(-std::numeric_limits<float>::max());
  __m256 arg = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  for (int i = 0; i < rows; ++i, idx = _mm256_add_epi32(idx, next_row)) {
    for (int j = 0; j < kw; ++j, idx = _mm256_add_epi32(idx, one)) {
      const float* tap = kPadded ? src + i * pitch + j : src + at0 + i * w + j;
      const __m256 v = SW == 1 ? _mm256_loadu_ps(tap)
                               : _mm256_shuffle_ps(_mm256_loadu_ps(tap), _mm256_loadu_ps(tap + 8),
                                                   _MM_SHUFFLE(2, 0, 2, 0));
      // Ordered compare: a NaN never wins, as with Caffe's `>`.
      const __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
      best = max_select(v, best);
      arg = _mm256_blendv_ps(arg, _mm256_castsi256_ps(idx), gt);
    }
  }
  if (SW == 2) {
    best = in_order(best);
    arg = in_order(arg);
  }
  _mm256_storeu_ps(y, best);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(mask), _mm256_castps_si256(arg));
}

// max_windows8 unrolled for the zoo's windows: 3x3 (and its one-row pass, max_plane_by_rows),
// 2x2; any other shape through the loops.
template <int SW, bool kPadded>
CCT_AVX2 inline void max_windows8_k(const float* src, int pitch, int at0, int rows, int kw,
                                    int w, float* y, int32_t* mask) {
  if (kw == 3 && rows == 3) {
    max_windows8<SW, kPadded, 3, 3>(src, pitch, at0, rows, kw, w, y, mask);
  } else if (kw == 3 && rows == 1) {
    max_windows8<SW, kPadded, 1, 3>(src, pitch, at0, rows, kw, w, y, mask);
  } else if (kw == 2 && rows == 2) {
    max_windows8<SW, kPadded, 2, 2>(src, pitch, at0, rows, kw, w, y, mask);
  } else {
    max_windows8<SW, kPadded>(src, pitch, at0, rows, kw, w, y, mask);
  }
}

// Whether max_row_avx2 can run windows ow .. ow + 7 as one group: inside the row, stride 2's
// sixteen-float loads included (their last float is one past the last tap).
inline bool group_fits(int ow, int sw, int pw, int kw, int w) {
  return (ow + 7) * sw - pw + kw - 1 + (sw - 1) < w;
}

// Outputs [ow0, ow1) of a row, eight at a time, under max_row_vectorized's conditions; a tail
// of fewer than eight is one more group ending at ow1, overlapping the last (its outputs come
// out the same): a row's scalar windows are its dearest. Returns where it stopped. Against
// SSE alone (max_windows4), same bits: CIFAR10-quick's pool1 (3x3/2, 15 interior windows a
// row) 1.72 -> 0.80 ms, GoogLeNet's 3x3/1 on 28x28 8.2 -> 4.2 ms, its 3x3/2 on 112x112
// 11.3 -> 4.7 ms (bench/RESULTS.md). (The same loop written around a next-group helper ran
// 5-10% slower.)
template <int SW>
CCT_AVX2 int max_row_avx2(const float* xp, int hs, int he, int w, int kw, int pw, int ow0,
                          int ow1, float* y, int32_t* mask) {
  int ow = ow0;
  for (; ow + 8 <= ow1 && group_fits(ow, SW, pw, kw, w); ow += 8)
    max_windows8_k<SW, false>(xp, 0, hs * w + ow * SW - pw, he - hs, kw, w, y + ow, mask + ow);
  if (ow < ow1 && ow1 - 8 >= ow0 && group_fits(ow1 - 8, SW, pw, kw, w)) {
    max_windows8_k<SW, false>(xp, 0, hs * w + (ow1 - 8) * SW - pw, he - hs, kw, w, y + ow1 - 8,
                              mask + ow1 - 8);
    ow = ow1;
  }
  return ow;
}

// How many windows of a row max_row_avx2 leaves to narrower code: those crossing the
// bottom's edge (outside [c0, c1)) and what its groups cannot reach (its loop, counted).
inline int windows_left_by_groups(int c0, int c1, int wo, int sw, int pw, int kw, int w) {
  int ow = c0;
  while (ow + 8 <= c1 && group_fits(ow, sw, pw, kw, w)) ow += 8;
  if (ow < c1 && c1 - 8 >= c0 && group_fits(c1 - 8, sw, pw, kw, w)) ow = c1;
  return c0 + (wo - c1) + (c1 - ow);
}

thread_local std::vector<float> t_max_padded;

// pad_plane (padding.h) for the small planes of the AVX2 pooling kernels, the same buffer: each
// row copied eight floats at a time, the last eight ending at the row's end, and only the
// margins filled. pad_plane fills the whole buffer first and copies each row with a memmove
// call, which was a third of the samples of a 28x28 MAX forward (GoogLeNet's pool3). A row's
// right margin is filled in whole vectors that may run up to seven floats on, into the next
// row (written after it) or the buffer's slack: `dst` must hold rows * width + 8 floats. For
// planes that fit whole at row `top` >= 0 and column `left` >= 0, w >= 8; else pad_plane.
CCT_AVX2 void pad_plane_avx2(const float* src, int h, int w, int top, int left, float* dst,
                             int rows, int width, float fill) {
  if (w < 8 || top < 0 || left < 0 || top + h > rows || left + w > width) {
    pad_plane(src, h, w, top, left, dst, rows, width, fill);
    return;
  }
  const __m256 f = _mm256_set1_ps(fill);
  for (int r = 0; r < rows; ++r) {
    float* row = dst + int64_t(r) * width;
    const int sr = r - top;
    if (sr < 0 || sr >= h) {
      for (int c = 0; c < width; c += 8) _mm256_storeu_ps(row + c, f);
      continue;
    }
    for (int c = 0; c < left; c += 8) _mm256_storeu_ps(row + c, f);  // then overwritten
    const float* in = src + int64_t(sr) * w;
    float* out = row + left;
    for (int c = 0; c + 8 <= w; c += 8) _mm256_storeu_ps(out + c, _mm256_loadu_ps(in + c));
    _mm256_storeu_ps(out + w - 8, _mm256_loadu_ps(in + w - 8));
    for (int c = left + w; c < width; c += 8) _mm256_storeu_ps(row + c, f);
  }
}

thread_local std::vector<float> t_row_best;
thread_local std::vector<int32_t> t_row_arg;

// max_plane_padded's windows row by row, for vertical stride 1 (GoogLeNet's 3x3/1 inception
// pools): first each padded row's kw taps for every group of eight windows (max_windows8 over
// one row: Caffe's strict `>`, best and argmax kept per row, lanes in output order), then
// each window's kh rows merged in row order, a later row winning only where it is strictly
// greater. A window's scan in row-major
// order keeps the first of its largest taps, and so does this: within a row the tap scan is
// the same, across rows a tie keeps the earlier row; a NaN or a -FLT_MAX tap never wins, and a
// row without a winner is (-FLT_MAX, -1), which no merge takes. So the tops and masks are the
// scan's, to the bit, and each row's taps are compared once instead of once per window row
// (kh times). `pad` is the padded plane (`width` floats a row, row r the bottom's r - ph).
// GoogLeNet's inception_3a/pool (b32, 192 x 28 x 28, 3x3/1 pad 1) on an AVX2-only Zen 3, best
// of five processes: 4.96 -> 3.70 ms; the 14x14 ones unchanged (bench/RESULTS.md; the 7x7
// ones, under eight windows a row, now go eight planes side by side: pool_planes8).
template <int SW>
CCT_AVX2 void max_plane_by_rows(const float* pad, int width, int w, int kh, int kw, int ph,
                                int pw, int ho, int wo, float* y, int32_t* mask) {
  const int last = std::max(wo, 8) - 8;
  const int groups = (std::max(wo, 8) + 7) / 8;
  const int rows = ho - 1 + kh;
  float* row_best = grown(t_row_best, size_t(rows) * groups * 8);
  int32_t* row_arg = grown(t_row_arg, size_t(rows) * groups * 8);
  for (int r = 0; r < rows; ++r) {
    const float* row = pad + r * width;
    const int at_row = (r - ph) * w - pw;
    for (int g = 0; g < groups; ++g) {
      const int first = std::min(8 * g, last);
      max_windows8_k<SW, true>(row + first * SW, width, at_row + first * SW, 1, kw, w,
                               row_best + (r * groups + g) * 8, row_arg + (r * groups + g) * 8);
    }
  }
  alignas(32) float top[8];
  alignas(32) int32_t top_arg[8];
  for (int oh = 0; oh < ho; ++oh, y += wo, mask += wo) {
    for (int g = 0; g < groups; ++g) {
      const int64_t at = (int64_t(oh) * groups + g) * 8;
      __m256 best = _mm256_loadu_ps(row_best + at);
      __m256 arg = _mm256_loadu_ps(reinterpret_cast<const float*>(row_arg) + at);
      for (int i = 1; i < kh; ++i) {
        const int64_t below = at + int64_t(i) * groups * 8;
        const __m256 v = _mm256_loadu_ps(row_best + below);
        const __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
        best = max_select(v, best);
        arg = _mm256_blendv_ps(arg, _mm256_loadu_ps(reinterpret_cast<const float*>(row_arg) +
                                                    below), gt);
      }
      if (wo < 8) {
        _mm256_store_ps(top, best);
        _mm256_store_si256(reinterpret_cast<__m256i*>(top_arg), _mm256_castps_si256(arg));
        std::copy(top, top + wo, y);
        std::copy(top_arg, top_arg + wo, mask);
      } else {
        const int first = std::min(8 * g, last);
        _mm256_storeu_ps(y + first, best);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(mask + first), _mm256_castps_si256(arg));
      }
    }
  }
}

// A whole MAX plane through max_windows8, edge windows included, from a copy of the plane
// padded with -FLT_MAX far enough for every window's full kh x kw taps and every lane's
// loads: a -FLT_MAX tap never passes Caffe's strict `>` against a best that starts at
// -FLT_MAX, so the tops and masks are those of the windows clipped to the bottom (a window
// wholly past it stays -FLT_MAX, -1). For small planes whose rows max_row_avx2 cannot cover
// (max_pool_forward's rule): the zoo's 3x3 stride-1 pad-1 pools on 7x7 to 28x28 (GoogLeNet's
// inception pools) ran their edge windows one by one, with a branch per tap.
template <int SW>
CCT_AVX2 void max_plane_padded(const float* xp, int h, int w, int kh, int kw, int sh, int ph,
                               int pw, int ho, int wo, float* y, int32_t* mask) {
  const int last = std::max(wo, 8) - 8;  // the last group's first output
  const int width = last * SW + kw + 16;  // its last lane's last tap, and stride 2's loads
  const int rows = std::max((ho - 1) * sh + kh, h + ph);
  float* pad = grown(t_max_padded, size_t(rows) * width + 8);
  pad_plane_avx2(xp, h, w, ph, pw, pad, rows, width, -std::numeric_limits<float>::max());
  if (sh == 1 && kh > 1) {
    max_plane_by_rows<SW>(pad, width, w, kh, kw, ph, pw, ho, wo, y, mask);
    return;
  }
  alignas(32) float top[8];
  alignas(32) int32_t arg[8];
  for (int oh = 0; oh < ho; ++oh, y += wo, mask += wo) {
    const float* row = pad + oh * sh * width;
    const int at = (oh * sh - ph) * w - pw;
    if (wo < 8) {
      max_windows8_k<SW, true>(row, width, at, kh, kw, w, top, arg);
      std::copy(top, top + wo, y);
      std::copy(arg, arg + wo, mask);
      continue;
    }
    // a tail of fewer than eight is one more group ending at wo (as max_row_avx2)
    for (int ow = 0;; ow += 8) {
      const int first = std::min(ow, last);
      max_windows8_k<SW, true>(row + first * SW, width, at + first * SW, kh, kw, w, y + first,
                               mask + first);
      if (first == last) break;
    }
  }
}

thread_local std::vector<float> t_padded_plane;

// The padded plane the vector AVE kernels read: the bottom's h rows, each from column -pw,
// zero outside [0, w), `width` floats.
float* padded_plane(const float* xp, int h, int w, int pw, int width) {
  float* pad = grown(t_padded_plane, size_t(h) * width + 8);
  pad_plane_avx2(xp, h, w, 0, pw, pad, h, width, 0.0f);
  return pad;
}

// AVE pooling of one float plane, eight windows of a row at a time (rows of few windows, the
// small planes of CIFAR10-quick's pool2 and pool3, were a scalar loop per window). Each lane
// adds its window's taps in Caffe's row-major order from zero; a tap outside the bottom adds
// the padded plane's +0.0, which leaves a sum that starts at +0.0 unchanged to the bit, so a
// lane's sum is Caffe's; the divisor is Caffe's (he - hs) * (we - ws) per lane (col_size: the
// we - ws of each window, padded to whole groups). SW: the stride along the row, 1 or 2 (2 as
// in max_windows8: sixteen floats, their even ones, lanes put in order at the end).
template <int SW>
CCT_AVX2 void ave_plane_avx2(const float* pad, int width, int h, int kh, int kw, int sh,
                             int ph, int ho, int wo, const int32_t* col_size, float* yp) {
  for (int oh = 0; oh < ho; ++oh) {
    const int hs = oh * sh - ph, he = std::min(hs + kh, h + ph);
    const int r0 = std::max(hs, 0), r1 = std::min(he, h);
    const __m256i rows = _mm256_set1_epi32(he - hs);
    for (int ow0 = 0; ow0 < wo; ow0 += 8) {
      __m256 sum = _mm256_setzero_ps();
      for (int i = r0; i < r1; ++i) {
        const float* at = pad + i * width + ow0 * SW;
        for (int j = 0; j < kw; ++j) {
          const __m256 v = SW == 1 ? _mm256_loadu_ps(at + j)
                                   : _mm256_shuffle_ps(_mm256_loadu_ps(at + j),
                                                       _mm256_loadu_ps(at + j + 8),
                                                       _MM_SHUFFLE(2, 0, 2, 0));
          sum = _mm256_add_ps(sum, v);
        }
      }
      if (SW == 2) sum = in_order(sum);
      const __m256i cols =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col_size + ow0));
      const __m256 y = _mm256_div_ps(sum, _mm256_cvtepi32_ps(_mm256_mullo_epi32(rows, cols)));
      if (ow0 + 8 <= wo) {
        _mm256_storeu_ps(yp + oh * wo + ow0, y);
      } else {
        alignas(32) float last[8];
        _mm256_store_ps(last, y);
        std::copy(last, last + (wo - ow0), yp + oh * wo + ow0);
      }
    }
  }
}

thread_local std::vector<float> t_strided_diff, t_window_diff;

// AVE pooling backward of one float plane (rows of few windows, as ave_plane_avx2), with
// Caffe's sums to the bit. Caffe adds each window's dy / size into its taps, window after
// window, so a bottom element receives its windows' shares in window order. Here the element
// gathers them: for the element at padded column q (= column + pw), the windows ow with
// q = ow * SW + j, 0 <= j < kw, taken in ascending ow (descending j), eight elements per
// vector. With stride 2 the columns are kept as two planes, even and odd q (in each, q / 2 is
// contiguous), interleaved into dx at the end; `g` holds a row of windows' shares with zeros
// for windows outside [0, wo), whose +0.0 leaves a sum that started at +0.0 unchanged. Every
// update of a vector of elements is one load and one store, so no load waits on a store it
// only partly overlaps (a tap-by-tap scatter would).
template <int SW>
CCT_AVX2 void ave_plane_backward_avx2(const float* dyp, float* dxp, int h, int w, int kh,
                                      int kw, int sh, int ph, int pw, int ho, int wo) {
  // per parity: t = q / SW for q in [0, w + pw), in whole vectors
  const int t_count = ((w + pw + SW - 1) / SW + 7) / 8 * 8;
  const int lead = (kw - 1) / SW;  // g[ow] at lead + ow, windows down to -lead read as zero
  float* strided = grown(t_strided_diff, size_t(SW) * h * t_count);
  std::fill(strided, strided + int64_t(SW) * h * t_count, 0.0f);
  float* g = grown(t_window_diff, size_t(lead + t_count + 8));
  std::fill(g, g + lead + t_count + 8, 0.0f);
  for (int oh = 0; oh < ho; ++oh) {
    const int hs = oh * sh - ph, he = std::min(hs + kh, h + ph);
    for (int ow = 0; ow < wo; ++ow) {
      const int ws = ow * SW - pw, we = std::min(ws + kw, w + pw);
      g[lead + ow] = dyp[oh * wo + ow] / float((he - hs) * (we - ws));
    }
    for (int i = std::max(hs, 0); i < std::min(he, h); ++i) {
      for (int r = 0; r < std::min(SW, kw); ++r) {
        float* row = strided + (int64_t(r) * h + i) * t_count;
        // the taps of parity r, from the last (the earliest window) to the first
        const int j_last = r + (kw - 1 - r) / SW * SW;
        for (int t0 = 0; t0 < t_count; t0 += 8) {
          __m256 v = _mm256_loadu_ps(row + t0);
          for (int j = j_last; j >= r; j -= SW)
            v = _mm256_add_ps(v, _mm256_loadu_ps(g + lead + t0 - (j - r) / SW));
          _mm256_storeu_ps(row + t0, v);
        }
      }
    }
  }
  for (int i = 0; i < h; ++i) {
    const float* even = strided + int64_t(i) * t_count;
    float* out = dxp + i * w;
    if (SW == 1) {
      std::copy(even + pw, even + pw + w, out);
      continue;
    }
    const float* odd = strided + (int64_t(h) + i) * t_count;
    for (int t0 = 0; t0 < t_count; t0 += 8) {
      // padded columns q = 2 t0 .. 2 t0 + 15, in order
      const __m256 e = _mm256_loadu_ps(even + t0), o = _mm256_loadu_ps(odd + t0);
      const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
      alignas(32) float q[16];
      _mm256_store_ps(q, _mm256_permute2f128_ps(lo, hi, 0x20));
      _mm256_store_ps(q + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
      const int col0 = 2 * t0 - pw;
      for (int k = std::max(0, -col0); k < 16 && col0 + k < w; ++k) out[col0 + k] = q[k];
    }
  }
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// Eight planes side by side (lane l: plane p + l), for planes whose rows hold too few windows
// to fill a vector (LeNet's pool2 and CIFAR10-quick's pool3, 4 a row; GoogLeNet's 7x7
// inception pools and its 5x5/3 loss pools; CaffeNet's pool5, 6): the rows' kernels above
// leave half their lanes idle or go window by window, and the scalar AVE backward's scatter
// waits on its own stores (CIFAR10-quick's pool3: 1.5 GB/s). Here every window is Caffe's
// loop over its taps clipped to the bottom, run for the eight planes at once: the same
// compares, the same adds in the same order, the same divisions, so the same bits as the
// scalar loops. The planes are interleaved into a buffer (and the results back) eight
// floats at a time through an 8 x 8 transpose.
CCT_AVX2 inline void transpose8(__m256& r0, __m256& r1, __m256& r2, __m256& r3, __m256& r4,
                                __m256& r5, __m256& r6, __m256& r7) {
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r0 = _mm256_permute2f128_ps(u0, u4, 0x20);
  r1 = _mm256_permute2f128_ps(u1, u5, 0x20);
  r2 = _mm256_permute2f128_ps(u2, u6, 0x20);
  r3 = _mm256_permute2f128_ps(u3, u7, 0x20);
  r4 = _mm256_permute2f128_ps(u0, u4, 0x31);
  r5 = _mm256_permute2f128_ps(u1, u5, 0x31);
  r6 = _mm256_permute2f128_ps(u2, u6, 0x31);
  r7 = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// dst[q * 8 + l] = src[l * stride + q] for q < n (eight planes of n floats into lanes).
CCT_AVX2 inline void interleave8(const float* src, int64_t stride, int n, float* dst) {
  int q = 0;
  for (; q + 8 <= n; q += 8) {
    const float* s = src + q;
    __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + stride),
           r2 = _mm256_loadu_ps(s + 2 * stride), r3 = _mm256_loadu_ps(s + 3 * stride),
           r4 = _mm256_loadu_ps(s + 4 * stride), r5 = _mm256_loadu_ps(s + 5 * stride),
           r6 = _mm256_loadu_ps(s + 6 * stride), r7 = _mm256_loadu_ps(s + 7 * stride);
    transpose8(r0, r1, r2, r3, r4, r5, r6, r7);
    float* d = dst + q * 8;
    _mm256_storeu_ps(d, r0);
    _mm256_storeu_ps(d + 8, r1);
    _mm256_storeu_ps(d + 16, r2);
    _mm256_storeu_ps(d + 24, r3);
    _mm256_storeu_ps(d + 32, r4);
    _mm256_storeu_ps(d + 40, r5);
    _mm256_storeu_ps(d + 48, r6);
    _mm256_storeu_ps(d + 56, r7);
  }
  for (; q < n; ++q)
    for (int l = 0; l < 8; ++l) dst[q * 8 + l] = src[l * stride + q];
}

// The inverse: dst[l * stride + q] = src[q * 8 + l], of floats or (MAX's mask) int32s, moved
// as 32-bit lanes either way.
template <typename T>
CCT_AVX2 inline __m256 load_lanes(const T* p) {
  static_assert(sizeof(T) == sizeof(float), "32-bit lanes");
  return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
}
template <typename T>
CCT_AVX2 inline void store_lanes(T* p, __m256 v) {
  _mm256_storeu_ps(reinterpret_cast<float*>(p), v);
}

template <typename T>
CCT_AVX2 inline void deinterleave8(const T* src, int n, T* dst, int64_t stride) {
  int q = 0;
  for (; q + 8 <= n; q += 8) {
    const T* s = src + q * 8;
    __m256 r0 = load_lanes(s), r1 = load_lanes(s + 8), r2 = load_lanes(s + 16),
           r3 = load_lanes(s + 24), r4 = load_lanes(s + 32), r5 = load_lanes(s + 40),
           r6 = load_lanes(s + 48), r7 = load_lanes(s + 56);
    transpose8(r0, r1, r2, r3, r4, r5, r6, r7);
    store_lanes(dst + q, r0);
    store_lanes(dst + stride + q, r1);
    store_lanes(dst + 2 * stride + q, r2);
    store_lanes(dst + 3 * stride + q, r3);
    store_lanes(dst + 4 * stride + q, r4);
    store_lanes(dst + 5 * stride + q, r5);
    store_lanes(dst + 6 * stride + q, r6);
    store_lanes(dst + 7 * stride + q, r7);
  }
  for (; q < n; ++q)
    for (int l = 0; l < 8; ++l) dst[l * stride + q] = src[q * 8 + l];
}

// A window's extent, Caffe's: taps [hs, he) x [ws, we) clipped to the bottom, and AVE's divisor
// (the window clipped to the padded bottom).
struct Window {
  int hs, he, ws, we, size;
  Window(int oh, int ow, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw) {
    const int h0 = oh * sh - ph, w0 = ow * sw - pw;
    const int h1 = std::min(h0 + kh, h + ph), w1 = std::min(w0 + kw, w + pw);
    size = (h1 - h0) * (w1 - w0);
    hs = std::max(h0, 0), he = std::min(h0 + kh, h);
    ws = std::max(w0, 0), we = std::min(w0 + kw, w);
  }
};

thread_local std::vector<float> t_planes_in, t_planes_out;
thread_local std::vector<int32_t> t_planes_mask;

enum class Pool8 { kMax, kAve, kAveBackward };

// Eight consecutive planes from `in` on: MAX or AVE forward (x -> y, and MAX's mask) or AVE
// backward (dy -> dx).
template <Pool8 kKind>
CCT_AVX2 void pool_planes8(const float* in, float* out, int32_t* mask, int h, int w, int kh,
                           int kw, int sh, int sw, int ph, int pw, int ho, int wo) {
  const int plane = h * w, pooled = ho * wo;
  const bool backward = kKind == Pool8::kAveBackward;
  float* a = grown(t_planes_in, size_t(backward ? pooled : plane) * 8);
  float* b = grown(t_planes_out, size_t(backward ? plane : pooled) * 8);
  interleave8(in, backward ? pooled : plane, backward ? pooled : plane, a);
  if (backward) std::fill(b, b + int64_t(plane) * 8, 0.0f);
  int32_t* m = kKind == Pool8::kMax ? grown(t_planes_mask, size_t(pooled) * 8) : nullptr;
  for (int oh = 0; oh < ho; ++oh) {
    for (int ow = 0; ow < wo; ++ow) {
      const Window win(oh, ow, h, w, kh, kw, sh, sw, ph, pw);
      const int r = oh * wo + ow;
      if (kKind == Pool8::kMax) {
        __m256 best = _mm256_set1_ps(-std::numeric_limits<float>::max());
        __m256 arg = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        const auto tap = [&](int at) CCT_AVX2 {
          const __m256 v = _mm256_loadu_ps(a + at * 8);
          const __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
          best = max_select(v, best);
          arg = _mm256_blendv_ps(arg, _mm256_castsi256_ps(_mm256_set1_epi32(at)), gt);
        };
        if (win.he - win.hs == 3 && win.we - win.ws == 3) {
          // a whole 3x3 window (the zoo's), its nine taps unrolled in the same order
          const int at = win.hs * w + win.ws;
          tap(at), tap(at + 1), tap(at + 2);
          tap(at + w), tap(at + w + 1), tap(at + w + 2);
          tap(at + 2 * w), tap(at + 2 * w + 1), tap(at + 2 * w + 2);
        } else {
          for (int i = win.hs; i < win.he; ++i)
            for (int j = win.ws; j < win.we; ++j) tap(i * w + j);
        }
        _mm256_storeu_ps(b + r * 8, best);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(m + r * 8), _mm256_castps_si256(arg));
      } else if (kKind == Pool8::kAve) {
        __m256 sum = _mm256_setzero_ps();
        for (int i = win.hs; i < win.he; ++i)
          for (int j = win.ws; j < win.we; ++j)
            sum = _mm256_add_ps(sum, _mm256_loadu_ps(a + (i * w + j) * 8));
        _mm256_storeu_ps(b + r * 8, _mm256_div_ps(sum, _mm256_set1_ps(float(win.size))));
      } else {
        const __m256 g = _mm256_div_ps(_mm256_loadu_ps(a + r * 8),
                                       _mm256_set1_ps(float(win.size)));
        for (int i = win.hs; i < win.he; ++i)
          for (int j = win.ws; j < win.we; ++j) {
            float* d = b + (i * w + j) * 8;
            _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), g));
          }
      }
    }
  }
  deinterleave8(b, backward ? plane : pooled, out, backward ? plane : pooled);
  if (kKind == Pool8::kMax) deinterleave8(m, pooled, mask, pooled);
}

// Whether a float layer's planes go eight side by side: at least one group of eight planes,
// small enough that eight of them stay in L1 (the zoo's are 7x7 to 16x16); forward, rows of
// fewer than eight windows (the rows' kernels fill their vectors from eight on: GoogLeNet's
// 14x14 inception pools measured 0.9x side by side); AVE backward, any row (CIFAR10-quick's
// pool2, 8 windows a row, 0.67 -> 0.34 ms; bench/RESULTS.md).
inline bool planes_side_by_side(int64_t planes, int h, int w, int wo, bool backward) {
  return cpu_has_avx2() && planes >= 8 && (backward || wo < 8) && int64_t(h) * w <= 256;
}

// Runs pool_planes8 over every whole group of eight planes; returns the planes it did (the
// rest, fewer than eight, are left to the kernels above).
template <Pool8 kKind>
int64_t pool_by_planes8(const float* in, float* out, int32_t* mask, int64_t planes, int h, int w,
                        int kh, int kw, int sh, int sw, int ph, int pw, int ho, int wo) {
  const int64_t groups = planes / 8;
  const int64_t in_plane = kKind == Pool8::kAveBackward ? int64_t(ho) * wo : int64_t(h) * w;
  const int64_t out_plane = kKind == Pool8::kAveBackward ? int64_t(h) * w : int64_t(ho) * wo;
  parallel_for(groups, 8 * int64_t(ho) * wo * kh * kw, [&](int64_t begin, int64_t end) {
    for (int64_t grp = begin; grp < end; ++grp)
      pool_planes8<kKind>(in + grp * 8 * in_plane, out + grp * 8 * out_plane,
                          mask ? mask + grp * 8 * out_plane : nullptr, h, w, kh, kw, sh, sw, ph,
                          pw, ho, wo);
  });
  return groups * 8;
}

#endif

// The outputs whose windows lie inside the bottom horizontally: [first, last).
struct Interior {
  int first, last;
  Interior(int w, int kw, int sw, int pw, int wo)
      : first(std::min(wo, (pw + sw - 1) / sw)),
        last(std::max(first, std::min(wo, w + pw - kw >= 0 ? (w + pw - kw) / sw + 1 : 0))) {}
};

template <typename T>
void max_pool_forward(const T* x, T* y, int32_t* mask, int64_t planes, int h, int w,
                      int kh, int kw, int sh, int sw, int ph, int pw, int ho, int wo) {
#if defined(CCT_POOL_AVX2)
  if constexpr (std::is_same_v<T, float>) {
    if (planes_side_by_side(planes, h, w, wo, false)) {
      const int64_t done = pool_by_planes8<Pool8::kMax>(x, y, mask, planes, h, w, kh, kw, sh,
                                                        sw, ph, pw, ho, wo);
      x += done * h * w, y += done * ho * wo, mask += done * ho * wo, planes -= done;
    }
  }
#endif
  const Interior in(w, kw, sw, pw, wo);
  const int c0 = in.first, c1 = in.last;
#if defined(CCT_POOL_AVX2)
  if constexpr (std::is_same_v<T, float>) {
    // Planes under 32 x 32 whose rows the groups of eight do not cover (bench/RESULTS.md,
    // both builds in one process, best of 9): GoogLeNet's inception pools 7x7 1.68 -> 0.75
    // ms, 14x14 1.81 -> 1.13, 28x28 2.14 -> 1.79 (batch 16), CaffeNet's 27x27 stride 2 0.96
    // -> 0.79, LeNet's 24x24 stride 2 0.23 -> 0.17. From 32x32 up the copy costs more than the
    // windows left over did (32x32 stride 2 1.09x the time, 56x56 1.07x, 224x224 1.36x), and
    // so it does on rows the groups already cover (24x24 2x2 stride 1: 1.29x).
    if (cpu_has_avx2() && (sw == 1 || sw == 2) && int64_t(h) * w < 32 * 32 &&
        windows_left_by_groups(c0, c1, wo, sw, pw, kw, w) > 0) {
      parallel_for(planes, int64_t(ho) * wo * kh * kw, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          if (sw == 1)
            max_plane_padded<1>(x + p * h * w, h, w, kh, kw, sh, ph, pw, ho, wo, y + p * ho * wo,
                                mask + p * ho * wo);
          else
            max_plane_padded<2>(x + p * h * w, h, w, kh, kw, sh, ph, pw, ho, wo, y + p * ho * wo,
                                mask + p * ho * wo);
        }
      });
      return;
    }
  }
#endif
  parallel_for(planes, int64_t(ho) * wo * kh * kw, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* xp = x + p * h * w;
      T* yp = y + p * ho * wo;
      int32_t* mp = mask + p * ho * wo;
      for (int oh = 0; oh < ho; ++oh, yp += wo, mp += wo) {
        const int hs = std::max(oh * sh - ph, 0), he = std::min(oh * sh - ph + kh, h);
        int ow = 0;
#if defined(__SSE2__)
        if constexpr (std::is_same_v<T, float>) {
          for (; ow < c0; ++ow)
            max_window(xp, hs, he, std::max(ow * sw - pw, 0), std::min(ow * sw - pw + kw, w), w,
                       yp + ow, mp + ow);
#if defined(CCT_POOL_AVX2)
          if (cpu_has_avx2()) {
            if (sw == 1) ow = max_row_avx2<1>(xp, hs, he, w, kw, pw, ow, c1, yp, mp);
            if (sw == 2) ow = max_row_avx2<2>(xp, hs, he, w, kw, pw, ow, c1, yp, mp);
          }
#endif
          if (sw == 1) ow = max_row_vectorized<1>(xp, hs, he, w, kw, pw, ow, c1, yp, mp);
          if (sw == 2) ow = max_row_vectorized<2>(xp, hs, he, w, kw, pw, ow, c1, yp, mp);
        }
#endif
        for (; ow < wo; ++ow)
          max_window(xp, hs, he, std::max(ow * sw - pw, 0), std::min(ow * sw - pw + kw, w), w,
                     yp + ow, mp + ow);
      }
    }
  });
}

// AVE's windows side by side. Outputs [ow0, ow1) of one output row whose windows lie inside
// the bottom horizontally (bottom rows [hs, he)), kBlock at a time: each tap is one pass over
// the block, which the compiler vectorizes across the outputs (8 lanes in the AVX2 clone), and
// each output still adds its taps in Caffe's row-major order from zero, so the sums are the
// scalar loop's to the bit, where a lone sum is a chain of dependent adds (3x3 stride 1 on
// 28x28: 3.8x faster; CIFAR10-quick's pool2: 1.2-1.7x). SW: the stride, 1 or 2. (MAX has
// its own SSE and AVX2 code: the same pattern with a compare and two selects per tap
// vectorized too, but ran up to 4x slower on rows of 12-27 windows.)
constexpr int kBlock = 64;
// Fewer windows than this in a row's interior run one by one: the passes' set-up outweighs
// what they save (GoogLeNet's 7x7 pool to 1x1 ran 2.4x slower through ave_row, CIFAR10-quick's
// pool3, 3 windows a row, 1.1x).
constexpr int kMinRow = 6;
// Rows of 2 to kMaxPlaneRow - 1 windows take the whole-plane AVX2 kernel (ave_plane_avx2):
// measured faster there (CIFAR10-quick's pool2 0.61 -> 0.24 ms, pool3 0.40 -> 0.26, 3x3/1 on
// 28x28 4.5 -> 2.3), slower on GoogLeNet's 7x7 global pool (one window a row: seven lanes
// idle, 0.9 -> 1.3 ms) and on 112-wide rows, where ave_row's blocks do better (5.3 -> 7.4).
constexpr int kMaxPlaneRow = 32;
// Backward, from 8 windows a row: on CIFAR10-quick's pool3 (4 a row, half of each vector
// idle) the gather measured no faster than the scalar scatter (0.58-0.74 against 0.45-0.65
// ms); pool2 0.85 -> 0.53, 3x3/1 on 28x28 20.4 -> 3.0, LeNet-sized 2x2/2 0.58 -> 0.40.
constexpr int kMinPlaneRowBackward = 8;

template <typename T, int SW>
CCT_VECTOR_CLONES void ave_row(const T* xp, int w, int hs, int he, int kw, int pw, T size,
                               int ow0, int ow1, T* y) {
  for (int b0 = ow0; b0 < ow1; b0 += kBlock) {
    const int n = std::min(kBlock, ow1 - b0);
    T sum[kBlock];
    std::fill(sum, sum + n, T(0));
    for (int i = hs; i < he; ++i)
      for (int j = 0; j < kw; ++j) {
        const T* src = xp + i * w + b0 * SW - pw + j;
        for (int k = 0; k < n; ++k) sum[k] += src[k * SW];
      }
    for (int k = 0; k < n; ++k) y[b0 + k] = sum[k] / size;
  }
}

template <typename T>
void max_pool_backward(const T* dy, const int32_t* mask, T* dx, int64_t planes, int h, int w,
                       int ho, int wo, const T* relu_src, T negative_slope) {
  parallel_for(planes, int64_t(h) * w + int64_t(ho) * wo, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* dyp = dy + p * ho * wo;
      const int32_t* mp = mask + p * ho * wo;
      T* dxp = dx + p * h * w;
      std::fill(dxp, dxp + int64_t(h) * w, T(0));
      for (int k = 0; k < ho * wo; ++k)
        if (mp[k] >= 0) dxp[mp[k]] += dyp[k];
      if (relu_src != nullptr)   // on the plane just written, while it is in cache
        relu_backward_span(relu_src + p * h * w, dxp, dxp, int64_t(h) * w, negative_slope);
    }
  });
}

template <typename T>
void ave_pool_forward(const T* x, T* y, int64_t planes, int h, int w, int kh, int kw, int sh,
                      int sw, int ph, int pw, int ho, int wo) {
#if defined(CCT_POOL_AVX2)
  if constexpr (std::is_same_v<T, float>) {
    if (planes_side_by_side(planes, h, w, wo, false)) {
      const int64_t done = pool_by_planes8<Pool8::kAve>(x, y, nullptr, planes, h, w, kh, kw,
                                                        sh, sw, ph, pw, ho, wo);
      x += done * h * w, y += done * ho * wo, planes -= done;
    }
  }
#endif
  const Interior in(w, kw, sw, pw, wo);
#if defined(CCT_POOL_AVX2)
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_has_avx2() && (sw == 1 || sw == 2) && wo >= 2 && wo < kMaxPlaneRow) {
      const int groups = (wo + 7) / 8;
      // wide enough for every lane's taps, and stride 2's sixteen-float loads
      const int width = groups * 8 * sw + kw + 8;
      std::vector<int32_t> col_size(size_t(groups) * 8, 1);
      for (int ow = 0; ow < wo; ++ow) {
        const int ws = ow * sw - pw;
        col_size[ow] = std::min(ws + kw, w + pw) - ws;
      }
      parallel_for(planes, int64_t(ho) * wo * kh * kw, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          const float* pad = padded_plane(x + p * h * w, h, w, pw, width);
          if (sw == 1)
            ave_plane_avx2<1>(pad, width, h, kh, kw, sh, ph, ho, wo, col_size.data(),
                              y + p * ho * wo);
          else
            ave_plane_avx2<2>(pad, width, h, kh, kw, sh, ph, ho, wo, col_size.data(),
                              y + p * ho * wo);
        }
      });
      return;
    }
  }
#endif
  parallel_for(planes, int64_t(ho) * wo * kh * kw, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* xp = x + p * h * w;
      T* yp = y + p * ho * wo;
      for (int oh = 0; oh < ho; ++oh) {
        int hs = oh * sh - ph;
        int he = std::min(hs + kh, h + ph);
        const auto window = [&](int ow) {
          int ws = ow * sw - pw;
          int we = std::min(ws + kw, w + pw);
          const T size = T((he - hs) * (we - ws));
          T sum = 0;
          for (int i = std::max(hs, 0); i < std::min(he, h); ++i)
            for (int j = std::max(ws, 0); j < std::min(we, w); ++j) sum += xp[i * w + j];
          yp[oh * wo + ow] = sum / size;
        };
        int ow = 0;
        if ((sw == 1 || sw == 2) && in.last - in.first >= kMinRow) {
          for (; ow < in.first; ++ow) window(ow);
          // inside the bottom horizontally, a window's divisor counts kw columns
          const T size = T((he - hs) * kw);
          const int rows0 = std::max(hs, 0), rows1 = std::min(he, h);
          if (sw == 1)
            ave_row<T, 1>(xp, w, rows0, rows1, kw, pw, size, in.first, in.last, yp + oh * wo);
          if (sw == 2)
            ave_row<T, 2>(xp, w, rows0, rows1, kw, pw, size, in.first, in.last, yp + oh * wo);
          ow = in.last;
        }
        for (; ow < wo; ++ow) window(ow);
      }
    }
  });
}

template <typename T>
void ave_pool_backward(const T* dy, T* dx, int64_t planes, int h, int w, int kh, int kw, int sh,
                       int sw, int ph, int pw, int ho, int wo) {
#if defined(CCT_POOL_AVX2)
  if constexpr (std::is_same_v<T, float>) {
    if (planes_side_by_side(planes, h, w, wo, true)) {
      const int64_t done = pool_by_planes8<Pool8::kAveBackward>(dy, dx, nullptr, planes, h, w,
                                                                kh, kw, sh, sw, ph, pw, ho, wo);
      dy += done * ho * wo, dx += done * h * w, planes -= done;
    }
    if (cpu_has_avx2() && (sw == 1 || sw == 2) && wo >= kMinPlaneRowBackward &&
        wo < kMaxPlaneRow) {
      parallel_for(planes, int64_t(ho) * wo * kh * kw, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          if (sw == 1)
            ave_plane_backward_avx2<1>(dy + p * ho * wo, dx + p * h * w, h, w, kh, kw, sh, ph,
                                       pw, ho, wo);
          else
            ave_plane_backward_avx2<2>(dy + p * ho * wo, dx + p * h * w, h, w, kh, kw, sh, ph,
                                       pw, ho, wo);
        }
      });
      return;
    }
  }
#endif
  parallel_for(planes, int64_t(ho) * wo * kh * kw, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* dyp = dy + p * ho * wo;
      T* dxp = dx + p * h * w;
      std::fill(dxp, dxp + int64_t(h) * w, T(0));
      for (int oh = 0; oh < ho; ++oh) {
        int hs = oh * sh - ph;
        int he = std::min(hs + kh, h + ph);
        for (int ow = 0; ow < wo; ++ow) {
          int ws = ow * sw - pw;
          int we = std::min(ws + kw, w + pw);
          const T g = dyp[oh * wo + ow] / T((he - hs) * (we - ws));
          for (int i = std::max(hs, 0); i < std::min(he, h); ++i)
            for (int j = std::max(ws, 0); j < std::min(we, w); ++j) dxp[i * w + j] += g;
        }
      }
    }
  });
}

#define CCT_INSTANTIATE(T)                                                                    \
  template void max_pool_forward<T>(const T*, T*, int32_t*, int64_t, int, int, int, int, int, \
                                    int, int, int, int, int);                                 \
  template void max_pool_backward<T>(const T*, const int32_t*, T*, int64_t, int, int, int,    \
                                     int, const T*, T);                                       \
  template void ave_pool_forward<T>(const T*, T*, int64_t, int, int, int, int, int, int, int, \
                                    int, int, int);                                           \
  template void ave_pool_backward<T>(const T*, T*, int64_t, int, int, int, int, int, int, int,\
                                     int, int, int);
CCT_INSTANTIATE(float)
CCT_INSTANTIATE(double)
#undef CCT_INSTANTIATE

}  // namespace cct
