// Direct convolution (no lowered matrix) for stride-1 float layers on CPUs with AVX2 and FMA.
//
// Why: on the thin layers of small nets (CIFAR10-quick's 32 filters of 5x5 over 32 channels)
// the lowered GEMM is bound by memory, not arithmetic. Its K x M matrix is 25x the bottom
// (82 MB for conv2 at batch 100), written by im2col, read back by the BLAS and, for backward
// data, written again and folded by col2im. The GEMM alone on it reaches 62-86% of the SGEMM
// peak and the whole convolution 52-58% (bench/RESULTS.md). The direct kernel reads each
// image's bottom (zero-padded once into a per-thread buffer) straight into registers.
//
// The tile: 4 output channels x 3 vectors of 8 output pixels, twelve accumulators, for every
// (input channel, tap) one broadcast weight per channel and one unaligned load per vector:
// with stride 1, eight consecutive output pixels read eight consecutive input pixels. A
// vector may reach past the row's last output pixel: those lanes read the buffer's zero
// slack and are not stored. The weights are packed per 4 channels in the loop's order, so
// they stream from L1; the padded image (51 KB for CIFAR10-quick's conv2) stays in L2.
//
// On CPUs with AVX-512 the tile can take vectors of 16 pixels instead (the same 4 channels x
// 3 vectors): each lane computes the same chain of fused multiply-adds in the same order, so
// the top is the same to the bit. On an Intel CPU with two 512-bit FMA units that is the
// difference between half the peak and all of it; on Zen 4, which splits a 512-bit FMA in
// two, it measured faster on some layers (rows of 32 and 112 pixels) and slower on others
// (16, 55): conv.cpp measures the two as layouts. Rows whose width leaves a last vector of 8
// pixels or fewer (LeNet's 8 and 24, CIFAR10-quick's conv3 at 8) would waste up to half of
// each 16-pixel vector; there a 512-bit vector holds two output channels' 8 pixels instead
// (forward_tile_pairs: 2 channel pairs x 4 vectors), again the same chain per lane, the same
// bits.
//
// Backward data of a stride-1 convolution is itself one: dx = dy convolved with the weights
// flipped in both spatial axes and with channels swapped, pad (k - 1) * d - p. The same tile
// computes it (no col2im, nothing accumulated through memory).
//
// Backward weight: dW[o, c, i, j] is a sum over every image's pixels of dy[o] times the bottom
// shifted by tap (i, j). The tile holds 4 output channels x 3 taps as vectors of 8 pixels and
// runs over a chunk of images whose padded bottoms and dy fit L2; the lanes are summed once,
// at the end (always 8 of them, whatever the CPU: 16 pixels would sum in another order). On
// AVX-512 a 512-bit vector holds two output channels' 8 pixels instead: each lane sums the
// same pixels in the same order as the 8-lane tile's, so the gradient is the same to the bit
// and the tile does twice the work per FMA (weight_tile_avx512).
//
// Rounding: forward and backward data sum each output in one fixed order (channel, tap)
// whatever the threads and the batch partitions; the weight gradient in one fixed order for a
// given partitioning (threads take output channels, not images). A plan that chooses this
// layout repeats to the bit, as the lowered ones do.
#include "conv_direct.h"

#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include "avx512.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "padding.h"
#include "parallel.h"
#include "workspace.h"

namespace cct {

namespace {

constexpr int kRows = 4;   // output channels per tile
constexpr int kLanes = 8;  // floats per AVX2 vector
constexpr int kVecs = 3;   // vectors of output pixels per tile

inline int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// A convolution as the tile sees it: `in` channels of h x w, padded by (ph, pw), taps kh x kw
// dilated by (dh, dw), stride 1, giving `out` channels of ho x wo.
struct Shape {
  int64_t in, h, w, out, ho, wo, kh, kw, ph, pw, dh, dw;
  int64_t lanes = kLanes;  // output pixels per vector: 8, or 16 for the AVX-512 forward tile
  // Taps per input channel as (rows, columns) pairs, `in` of them; null: kh x kw each (a
  // strided layer's phase form runs only the layer's own: conv_direct.h).
  const int32_t* extent = nullptr;
  int64_t rows(int64_t c) const { return extent ? extent[2 * c] : kh; }
  int64_t cols(int64_t c) const { return extent ? extent[2 * c + 1] : kw; }
  // Taps summed per output channel: the packed weights' length per output channel.
  int64_t taps() const {
    int64_t t = 0;
    for (int64_t c = 0; c < in; ++c) t += rows(c) * cols(c);
    return t;
  }
  int64_t hp() const { return ho + (kh - 1) * dh; }
  // Row stride of the padded image: every vector of a row's last tile, at every tap, inside.
  int64_t wp() const { return round_up(wo, lanes) + (kw - 1) * dw; }
  int64_t plane() const { return hp() * wp(); }
};

// Copies one image's `in` channels (each h x w, channel stride `stride`) into the padded
// buffer `xp`, one plane() per channel (rows or columns of the bottom that a negative-pad
// geometry never reads are cut).
void pad_image(const float* x, int64_t stride, const Shape& s, float* xp) {
  for (int64_t c = 0; c < s.in; ++c)
    pad_plane(x + c * stride, s.h, s.w, s.ph, s.pw, xp + c * s.plane(), s.hp(), s.wp());
}

// A tile's twelve accumulators to dst[0..96), one by one. Gathered into an array and stored
// in a loop, GCC spilled them and copied the array with `rep movsq` (8% of LeNet conv1's
// forward, whose tiles sum only 25 taps).
__attribute__((target("avx2,fma"), always_inline)) inline void store_twelve(
    float* dst, __m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
    __m256 a7, __m256 a8, __m256 a9, __m256 a10, __m256 a11) {
  _mm256_storeu_ps(dst, a0), _mm256_storeu_ps(dst + 8, a1), _mm256_storeu_ps(dst + 16, a2);
  _mm256_storeu_ps(dst + 24, a3), _mm256_storeu_ps(dst + 32, a4);
  _mm256_storeu_ps(dst + 40, a5), _mm256_storeu_ps(dst + 48, a6);
  _mm256_storeu_ps(dst + 56, a7), _mm256_storeu_ps(dst + 64, a8);
  _mm256_storeu_ps(dst + 72, a9), _mm256_storeu_ps(dst + 80, a10);
  _mm256_storeu_ps(dst + 88, a11);
}

// One vector of a tile's top: x plus the channel's bias, through caffe_relu with `relu`, to y.
// MAXPS(0, x) and MINPS(0, x) return x where std::max(x, 0) and std::min(x, 0) do (x NaN, or a
// zero of either sign), so the bits are the scalar loop's lane by lane.
__attribute__((target("avx2,fma"), always_inline)) inline void store_vector(float* y, __m256 x,
                                                                           __m256 b, bool relu) {
  const __m256 zero = _mm256_setzero_ps();
  x = _mm256_add_ps(x, b);
  if (relu)  // caffe_relu(x, 0): max(x, 0) + 0 * min(x, 0)
    x = _mm256_add_ps(_mm256_max_ps(zero, x), _mm256_mul_ps(zero, _mm256_min_ps(zero, x)));
  _mm256_storeu_ps(y, x);
}

// A tile's outputs (kRows x kVecs vectors of 8 in `out`) into their channels' planes: lane l
// of vector v of row r to dst[r] + pix[v] + l for l < count[v], plus bias[r], through
// caffe_relu with `relu`. Full vectors go as vectors (store_vector), the rest lane by lane.
__attribute__((target("avx2,fma"))) void store_tile(const float* out, int rows, int nv,
                                                    const int64_t* pix, const int64_t* count,
                                                    float* const* dst, const float* bias,
                                                    bool relu) {
  for (int r = 0; r < rows; ++r) {
    const __m256 b = _mm256_set1_ps(bias[r]);
    for (int v = 0; v < nv; ++v) {
      const float* src = out + (r * kVecs + v) * kLanes;
      float* y = dst[r] + pix[v];
      if (count[v] == kLanes) {
        store_vector(y, _mm256_load_ps(src), b, relu);
      } else if (relu) {
        for (int64_t l = 0; l < count[v]; ++l) y[l] = caffe_relu(src[l] + bias[r], 0.0f);
      } else {
        for (int64_t l = 0; l < count[v]; ++l) y[l] = src[l] + bias[r];
      }
    }
  }
}

// Where a tile's vectors of output pixels are: the padded image's pixel each reads first (at),
// the top's pixel it writes first (pix) and how many of its lanes lie inside the row (count);
// nv of them, the rest repeating the first.
template <int Vecs>
struct Vectors {
  const float* at[Vecs];
  int64_t pix[Vecs], count[Vecs];
  int nv;
  bool full(int lanes) const {
    if (nv != Vecs) return false;
    for (int v = 0; v < Vecs; ++v)
      if (count[v] != lanes) return false;
    return true;
  }
};
using TileVectors = Vectors<kVecs>;

// The forward tile: out[r][v] (8 lanes) = sum over `channels` and taps (i, j) of the packed
// weight w[c][i][j][r] times the padded image at t.at[v] + c * plane + i * row + j * col,
// channel c's taps kh x kw or, with `extent`, extent[2c] x extent[2c + 1]; then stored through
// store_vector straight from the registers when all of the tile lies inside the top (the
// common case), else through `out` and store_tile. Twelve named accumulators: as an array,
// GCC keeps them on the stack.
__attribute__((target("avx2,fma"))) void forward_tile(const float* w, const TileVectors& t,
                                                      int64_t channels, int64_t plane,
                                                      int64_t kh, int64_t kw,
                                                      const int32_t* extent, int64_t row,
                                                      int64_t col, int rows, float* const* dst,
                                                      const float* bias, bool relu,
                                                      float* out) {
  const float *p0 = t.at[0], *p1 = t.at[1], *p2 = t.at[2];
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
  __m256 c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
  for (int64_t c = 0; c < channels; ++c) {
    const int64_t rows = extent ? extent[2 * c] : kh, cols = extent ? extent[2 * c + 1] : kw;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t base = c * plane + i * row;
      for (int64_t j = 0; j < cols; ++j, w += kRows) {
        const int64_t off = base + j * col;
        const __m256 b0 = _mm256_loadu_ps(p0 + off), b1 = _mm256_loadu_ps(p1 + off),
                     b2 = _mm256_loadu_ps(p2 + off);
        __m256 a = _mm256_broadcast_ss(w);
        c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
        c02 = _mm256_fmadd_ps(a, b2, c02);
        a = _mm256_broadcast_ss(w + 1);
        c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
        c12 = _mm256_fmadd_ps(a, b2, c12);
        a = _mm256_broadcast_ss(w + 2);
        c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
        c22 = _mm256_fmadd_ps(a, b2, c22);
        a = _mm256_broadcast_ss(w + 3);
        c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
        c32 = _mm256_fmadd_ps(a, b2, c32);
      }
    }
  }
  if (rows == kRows && t.full(kLanes)) {
    const int64_t* pix = t.pix;
    __m256 b = _mm256_set1_ps(bias[0]);
    store_vector(dst[0] + pix[0], c00, b, relu), store_vector(dst[0] + pix[1], c01, b, relu);
    store_vector(dst[0] + pix[2], c02, b, relu);
    b = _mm256_set1_ps(bias[1]);
    store_vector(dst[1] + pix[0], c10, b, relu), store_vector(dst[1] + pix[1], c11, b, relu);
    store_vector(dst[1] + pix[2], c12, b, relu);
    b = _mm256_set1_ps(bias[2]);
    store_vector(dst[2] + pix[0], c20, b, relu), store_vector(dst[2] + pix[1], c21, b, relu);
    store_vector(dst[2] + pix[2], c22, b, relu);
    b = _mm256_set1_ps(bias[3]);
    store_vector(dst[3] + pix[0], c30, b, relu), store_vector(dst[3] + pix[1], c31, b, relu);
    store_vector(dst[3] + pix[2], c32, b, relu);
    return;
  }
  store_twelve(out, c00, c01, c02, c10, c11, c12, c20, c21, c22, c30, c31, c32);
  store_tile(out, rows, t.nv, t.pix, t.count, dst, bias, relu);
}

// x plus b, through caffe_relu with `relu`: store_vector's operations on 16 lanes (its bits).
CCT_AVX512F_TARGET inline __m512 add_bias_relu(__m512 x, __m512 b, bool relu) {
  const __m512 zero = _mm512_setzero_ps();
  x = _mm512_add_ps(x, b);
  if (relu)  // caffe_relu(x, 0): max(x, 0) + 0 * min(x, 0)
    x = _mm512_add_ps(_mm512_max_ps(zero, x), _mm512_mul_ps(zero, _mm512_min_ps(zero, x)));
  return x;
}

// forward_tile with vectors of 16 pixels, each stored from the registers under a mask of its
// lanes inside the row, with store_vector's operations (its bits). Written out again rather
// than one template over the vector width: GCC does not inline a target's intrinsics into a
// template body that has no target of its own.
CCT_AVX512F_TARGET void forward_tile_avx512(const float* w, const TileVectors& t,
                                            int64_t channels, int64_t plane, int64_t kh,
                                            int64_t kw, const int32_t* extent, int64_t row,
                                            int64_t col, int rows, float* const* dst,
                                            const float* bias, bool relu) {
  const float *p0 = t.at[0], *p1 = t.at[1], *p2 = t.at[2];
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
  __m512 c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
  for (int64_t c = 0; c < channels; ++c) {
    const int64_t rows = extent ? extent[2 * c] : kh, cols = extent ? extent[2 * c + 1] : kw;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t base = c * plane + i * row;
      for (int64_t j = 0; j < cols; ++j, w += kRows) {
        const int64_t off = base + j * col;
        const __m512 b0 = _mm512_loadu_ps(p0 + off), b1 = _mm512_loadu_ps(p1 + off),
                     b2 = _mm512_loadu_ps(p2 + off);
        __m512 a = _mm512_set1_ps(w[0]);
        c00 = _mm512_fmadd_ps(a, b0, c00), c01 = _mm512_fmadd_ps(a, b1, c01);
        c02 = _mm512_fmadd_ps(a, b2, c02);
        a = _mm512_set1_ps(w[1]);
        c10 = _mm512_fmadd_ps(a, b0, c10), c11 = _mm512_fmadd_ps(a, b1, c11);
        c12 = _mm512_fmadd_ps(a, b2, c12);
        a = _mm512_set1_ps(w[2]);
        c20 = _mm512_fmadd_ps(a, b0, c20), c21 = _mm512_fmadd_ps(a, b1, c21);
        c22 = _mm512_fmadd_ps(a, b2, c22);
        a = _mm512_set1_ps(w[3]);
        c30 = _mm512_fmadd_ps(a, b0, c30), c31 = _mm512_fmadd_ps(a, b1, c31);
        c32 = _mm512_fmadd_ps(a, b2, c32);
      }
    }
  }
  const __m512 acc[kRows * kVecs] = {c00, c01, c02, c10, c11, c12, c20, c21, c22, c30, c31, c32};
  for (int r = 0; r < rows; ++r) {
    const __m512 b = _mm512_set1_ps(bias[r]);
    for (int v = 0; v < t.nv; ++v)
      _mm512_mask_storeu_ps(dst[r] + t.pix[v], __mmask16((1u << t.count[v]) - 1),
                            add_bias_relu(acc[r * kVecs + v], b, relu));
  }
}

// Eight floats at p in both halves of a 512-bit vector: one VBROADCASTF64X4 from memory (the
// AVX512F form; AVX512DQ's VBROADCASTF32X8 is the same load).
CCT_AVX512F_TARGET inline __m512 broadcast_eight(const float* p) {
  const __m256d eight = _mm256_loadu_pd(reinterpret_cast<const double*>(p));
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(eight));
}

// The pair form of the 16-lane tile, for rows that 16-pixel vectors would fill badly (wo % 16
// in 1..8: rows of 8 waste half of each vector, rows of 24 a quarter): vectors of 8 pixels as
// weight_tile_avx512 holds them, a 512-bit vector holding two output channels' 8 pixels, low
// half channel 2p, high half 2p + 1. The tile: 2 pairs x kPairVecs vectors of 8 pixels; per tap
// two loads of weights packed eight times over (pack_weights with 8 copies) and one
// VBROADCASTF64X4 of each vector's 8 bottom pixels. Each output sums the same products in the
// same order as forward_tile's, and goes through store_vector's operations: the same bits.
constexpr int kPairVecs = 4;

// Lane i < count of a 256-bit half, for VMASKMOVPS.
__attribute__((target("avx2,fma"))) inline __m256i first_lanes(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(count)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// One accumulator of the pair tile: x plus the pair's biases, through caffe_relu with `relu`,
// its low half to lo and its high half to hi (the first `count` lanes of each; null: a channel
// past the layer's last, not stored).
CCT_AVX512F_TARGET inline void store_pair(float* lo, float* hi, __m512 x, __m512 b, bool relu,
                                          int64_t count) {
  x = add_bias_relu(x, b, relu);
  const __m256 low = _mm512_castps512_ps256(x);
  const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
  if (count == kLanes) {
    _mm256_storeu_ps(lo, low);
    if (hi) _mm256_storeu_ps(hi, high);
  } else {
    const __m256i mask = first_lanes(count);
    _mm256_maskstore_ps(lo, mask, low);
    if (hi) _mm256_maskstore_ps(hi, mask, high);
  }
}

CCT_AVX512F_TARGET void forward_tile_pairs(const float* w, const Vectors<kPairVecs>& t,
                                           int64_t channels, int64_t plane, int64_t kh,
                                           int64_t kw, const int32_t* extent, int64_t row,
                                           int64_t col, int rows, float* const* dst,
                                           const float* bias, bool relu) {
  const float *p0 = t.at[0], *p1 = t.at[1], *p2 = t.at[2], *p3 = t.at[3];
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00;
  __m512 c10 = c00, c11 = c00, c12 = c00, c13 = c00;
  for (int64_t c = 0; c < channels; ++c) {
    const int64_t rows_c = extent ? extent[2 * c] : kh, cols = extent ? extent[2 * c + 1] : kw;
    for (int64_t i = 0; i < rows_c; ++i) {
      const int64_t base = c * plane + i * row;
      for (int64_t j = 0; j < cols; ++j, w += kRows * kLanes) {
        const int64_t off = base + j * col;
        const __m512 a0 = _mm512_loadu_ps(w), a1 = _mm512_loadu_ps(w + 2 * kLanes);
        __m512 b = broadcast_eight(p0 + off);
        c00 = _mm512_fmadd_ps(a0, b, c00), c10 = _mm512_fmadd_ps(a1, b, c10);
        b = broadcast_eight(p1 + off);
        c01 = _mm512_fmadd_ps(a0, b, c01), c11 = _mm512_fmadd_ps(a1, b, c11);
        b = broadcast_eight(p2 + off);
        c02 = _mm512_fmadd_ps(a0, b, c02), c12 = _mm512_fmadd_ps(a1, b, c12);
        b = broadcast_eight(p3 + off);
        c03 = _mm512_fmadd_ps(a0, b, c03), c13 = _mm512_fmadd_ps(a1, b, c13);
      }
    }
  }
  const __m512 acc[2][kPairVecs] = {{c00, c01, c02, c03}, {c10, c11, c12, c13}};
  for (int p = 0; p < 2 && 2 * p < rows; ++p) {
    const float high = 2 * p + 1 < rows ? bias[2 * p + 1] : 0.0f;
    const __m512 b =
        _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(bias[2 * p]), _mm512_set1_ps(high));
    for (int v = 0; v < t.nv; ++v)
      store_pair(dst[2 * p] + t.pix[v], 2 * p + 1 < rows ? dst[2 * p + 1] + t.pix[v] : nullptr,
                 acc[p][v], b, relu, t.count[v]);
  }
}

// One image's tiles: for each quad of output channels (o0, `rows` of them, dst[r] = y's plane
// of channel o0 + r, b[r] its bias or 0), the image's vectors of `lanes` output pixels (a row's
// last one partly past its end), Vecs to a tile: tile(o0, rows, dst, b, t). A last tile of
// fewer repeats its first, computed and not stored. Each tile's vectors are stepped to from the
// last's rather than divided out of their index, and the tiles store their own tops: a tile's
// fixed cost (three 64-bit divisions, a second call, the accumulators through the stack) had
// been a third of a 75-tap tile's time on a Zen 3 (CIFAR10-quick's conv1: bench/RESULTS.md).
template <int Vecs, typename Tile>
inline void for_each_tile(const float* xp, const float* bias, float* y, int64_t ystride,
                          int64_t lanes, const Shape& s, Tile&& tile) {
  const int64_t vectors = s.ho * ((s.wo + lanes - 1) / lanes), wp = s.wp();
  for (int64_t o0 = 0; o0 < s.out; o0 += kRows) {
    const int rows = int(std::min<int64_t>(kRows, s.out - o0));
    float* dst[kRows];
    float b[kRows];
    for (int r = 0; r < rows; ++r)
      dst[r] = y + (o0 + r) * ystride, b[r] = bias ? bias[o0 + r] : 0.0f;
    int64_t oh = 0, ow = 0;  // the next vector's first output pixel
    for (int64_t v0 = 0; v0 < vectors; v0 += Vecs) {
      Vectors<Vecs> t;
      t.nv = int(std::min<int64_t>(Vecs, vectors - v0));
      for (int v = 0; v < Vecs; ++v) {
        if (v >= t.nv) {
          t.at[v] = t.at[0], t.pix[v] = t.pix[0], t.count[v] = t.count[0];
          continue;
        }
        t.at[v] = xp + oh * wp + ow;
        t.pix[v] = oh * s.wo + ow;
        t.count[v] = std::min<int64_t>(lanes, s.wo - ow);  // the lanes inside the row
        if ((ow += lanes) >= s.wo) ow = 0, ++oh;
      }
      tile(o0, rows, dst, b, t);
    }
  }
}

// One image: y (out channels, channel stride ystride) = bias + the convolution of the padded
// image xp with the packed weights wpk, through caffe_relu with `relu`: the 4 x 3 tiles of
// vectors of Lanes pixels.
template <int Lanes>
void forward_image(const float* xp, const float* wpk, const float* bias, bool relu, float* y,
                   int64_t ystride, const Shape& s) {
  const int64_t taps = s.taps(), row = s.dh * s.wp(), plane = s.plane();
  alignas(64) float out[kRows * kVecs * kLanes];  // the 8-lane tile's, for store_tile
  for_each_tile<kVecs>(xp, bias, y, ystride, Lanes, s,
                       [&](int64_t o0, int rows, float* const* dst, const float* b,
                           const TileVectors& t) {
    const float* w = wpk + o0 * taps;
    if constexpr (Lanes == kLanes) {
      forward_tile(w, t, s.in, plane, s.kh, s.kw, s.extent, row, s.dw, rows, dst, b, relu, out);
    } else {
      forward_tile_avx512(w, t, s.in, plane, s.kh, s.kw, s.extent, row, s.dw, rows, dst, b,
                          relu);
    }
  });
}

// forward_image in the pair form (forward_tile_pairs): vectors of 8 pixels, kPairVecs to a
// tile, wpk packed by pack_weights with 8 copies.
void forward_image_pairs(const float* xp, const float* wpk, const float* bias, bool relu,
                         float* y, int64_t ystride, const Shape& s) {
  const int64_t taps = s.taps(), row = s.dh * s.wp(), plane = s.plane();
  for_each_tile<kPairVecs>(xp, bias, y, ystride, kLanes, s,
                           [&](int64_t o0, int rows, float* const* dst, const float* b,
                               const Vectors<kPairVecs>& t) {
    forward_tile_pairs(wpk + o0 * taps * kLanes, t, s.in, plane, s.kh, s.kw, s.extent, row,
                       s.dw, rows, dst, b, relu);
  });
}

thread_local std::vector<float> t_weights, t_padded, t_dy, t_sums;

// Packs weight(o, c, i, j) `copies` times over as [o / 4][c][i][j][o % 4][copies] over each
// channel's taps (s.rows(c) x s.cols(c)), zero rows past `out`: once for the 4 x 3 tiles, 8
// times for forward_tile_pairs (a quad's two pairs of channels one vector each).
template <typename Weight>
const float* pack_weights(const Shape& s, Weight&& weight, int64_t copies = 1) {
  const int64_t taps = s.taps(), size = round_up(s.out, kRows) * taps * copies;
  float* wp = grown(t_weights, size_t(size));
  std::fill(wp, wp + size, 0.0f);
  for (int64_t o = 0; o < s.out; ++o) {
    int64_t t = 0;
    for (int64_t c = 0; c < s.in; ++c)
      for (int64_t i = 0; i < s.rows(c); ++i)
        for (int64_t j = 0; j < s.cols(c); ++j, ++t)
          std::fill_n(wp + ((o / kRows * taps + t) * kRows + o % kRows) * copies, copies,
                      weight(o, c, i, j));
  }
  return wp;
}

// Whether the 16-lane layout runs a geometry's rows in the pair form: where vectors of 8 pixels
// leave fewer lanes idle at a row's end than vectors of 16.
bool pair_form(const Shape& s) {
  return s.lanes == 16 && round_up(s.wo, kLanes) < round_up(s.wo, 16);
}

// Images [begin, end) of a stride-1 convolution, one group at a time: images split across
// threads (one thread inside a partition, parallel.h); s.lanes pixels to a vector.
template <typename Weight>
void convolve(const float* x, int64_t x_image, int64_t x_group, const float* bias, bool relu,
              float* y, int64_t y_image, int64_t y_group, int64_t groups, const Shape& s,
              int64_t begin, int64_t end, Weight&& weight_of_group) {
  for (int64_t grp = 0; grp < groups; ++grp) {
    const auto weight = [&](int64_t o, int64_t c, int64_t i, int64_t j) {
      return weight_of_group(grp, o, c, i, j);
    };
    const bool pairs = pair_form(s);
    const float* wp = pack_weights(s, weight, pairs ? kLanes : 1);
    const float* b = bias ? bias + grp * s.out : nullptr;
    const int64_t cost = s.out * s.taps() * s.ho * s.wo;
    parallel_for(end - begin, cost, [&](int64_t lo, int64_t hi) {
      float* xp = grown(t_padded, size_t(s.in * s.plane()));
      for (int64_t n = begin + lo; n < begin + hi; ++n) {
        pad_image(x + n * x_image + grp * x_group, s.h * s.w, s, xp);
        float* top = y + n * y_image + grp * y_group;
        if (pairs) {
          forward_image_pairs(xp, wp, b, relu, top, s.ho * s.wo, s);
        } else if (s.lanes == 16) {
          forward_image<16>(xp, wp, b, relu, top, s.ho * s.wo, s);
        } else {
          forward_image<kLanes>(xp, wp, b, relu, top, s.ho * s.wo, s);
        }
      }
    });
  }
}

constexpr int kTapsPerTile = 3;

// The weight tile: sum[r][t] (8 lanes each, 4 x 3) += over `images` images, their output rows
// and vectors of 8 pixels, dy row r (d_r: rows of dyw floats, zero past wo, images dy_image
// apart) times the padded bottom at tap t (x_t: rows of wp floats, images x_image apart).
__attribute__((target("avx2,fma"))) void weight_tile(const float* d0, const float* d1,
                                                     const float* d2, const float* d3,
                                                     const float* x0, const float* x1,
                                                     const float* x2, int64_t images,
                                                     int64_t dy_image, int64_t x_image,
                                                     int64_t ho, int64_t dyw, int64_t wp,
                                                     float* sum) {
  __m256 c00 = _mm256_loadu_ps(sum), c01 = _mm256_loadu_ps(sum + 8),
         c02 = _mm256_loadu_ps(sum + 16), c10 = _mm256_loadu_ps(sum + 24),
         c11 = _mm256_loadu_ps(sum + 32), c12 = _mm256_loadu_ps(sum + 40),
         c20 = _mm256_loadu_ps(sum + 48), c21 = _mm256_loadu_ps(sum + 56),
         c22 = _mm256_loadu_ps(sum + 64), c30 = _mm256_loadu_ps(sum + 72),
         c31 = _mm256_loadu_ps(sum + 80), c32 = _mm256_loadu_ps(sum + 88);
  for (int64_t n = 0; n < images; ++n) {
    for (int64_t oh = 0; oh < ho; ++oh) {
      const int64_t d = n * dy_image + oh * dyw, x = n * x_image + oh * wp;
      for (int64_t ow = 0; ow < dyw; ow += kLanes) {
        const __m256 b0 = _mm256_loadu_ps(x0 + x + ow), b1 = _mm256_loadu_ps(x1 + x + ow),
                     b2 = _mm256_loadu_ps(x2 + x + ow);
        __m256 a = _mm256_loadu_ps(d0 + d + ow);
        c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
        c02 = _mm256_fmadd_ps(a, b2, c02);
        a = _mm256_loadu_ps(d1 + d + ow);
        c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
        c12 = _mm256_fmadd_ps(a, b2, c12);
        a = _mm256_loadu_ps(d2 + d + ow);
        c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
        c22 = _mm256_fmadd_ps(a, b2, c22);
        a = _mm256_loadu_ps(d3 + d + ow);
        c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
        c32 = _mm256_fmadd_ps(a, b2, c32);
      }
    }
  }
  store_twelve(sum, c00, c01, c02, c10, c11, c12, c20, c21, c22, c30, c31, c32);
}

// A vector of lo's 8 floats and hi's 8, and back, under masks (hi is past lo: hi - 8 is in
// the same buffer). Once per tile call.
CCT_AVX512F_TARGET inline __m512 load_halves(const float* lo, const float* hi) {
  return _mm512_mask_loadu_ps(_mm512_maskz_loadu_ps(0x00FF, lo), 0xFF00, hi - kLanes);
}
CCT_AVX512F_TARGET inline void store_halves(__m512 a, float* lo, float* hi) {
  _mm512_mask_storeu_ps(lo, 0x00FF, a), _mm512_mask_storeu_ps(hi - kLanes, 0xFF00, a);
}

// weight_tile on AVX-512, for Taps (3 or 6) taps: the sums of 4 output channels x Taps taps
// (8 lanes each) in pairs of channels, a 512-bit vector holding channel 2p's 8 lanes in its low
// half and channel 2p + 1's in its high half. dy is packed per image, row and vector of 8
// pixels as the quad's 4 channels' 8 pixels one after the other (pack_dy_quad): two loads
// give the two pairs; each tap's 8 bottom pixels are loaded into both halves at once. Every
// lane adds the same products in the same order as weight_tile's, so the sums are its bits.
// `sum` holds Taps / 3 of weight_tile's 3-tap blocks, kRows x 3 x 8 floats each.
template <int Taps>
CCT_AVX512F_TARGET void weight_tile_avx512(const float* dq, const float* const* xt,
                                           int64_t images, int64_t dy_image, int64_t x_image,
                                           int64_t ho, int64_t dyw, int64_t wp, float* sum) {
  static_assert(Taps == 3 || Taps == 6, "a tile of one or two 3-tap blocks");
  constexpr int kBlock = kRows * kTapsPerTile * kLanes;
  // accumulator (pair p, tap t): the block of tap t, rows 2p and 2p + 1
  const auto lo = [&](int p, int t) {
    return sum + (t / kTapsPerTile) * kBlock + (2 * p * kTapsPerTile + t % kTapsPerTile) * kLanes;
  };
  const auto hi = [&](int p, int t) { return lo(p, t) + kTapsPerTile * kLanes; };
  // Named, not an array: GCC keeps an array of accumulators on the stack (forward_tile).
  __m512 c00 = load_halves(lo(0, 0), hi(0, 0)), c01 = load_halves(lo(0, 1), hi(0, 1)),
         c02 = load_halves(lo(0, 2), hi(0, 2)), c10 = load_halves(lo(1, 0), hi(1, 0)),
         c11 = load_halves(lo(1, 1), hi(1, 1)), c12 = load_halves(lo(1, 2), hi(1, 2));
  __m512 c03 = c00, c04 = c00, c05 = c00, c13 = c00, c14 = c00, c15 = c00;
  if constexpr (Taps == 6) {
    c03 = load_halves(lo(0, 3), hi(0, 3)), c04 = load_halves(lo(0, 4), hi(0, 4));
    c05 = load_halves(lo(0, 5), hi(0, 5)), c13 = load_halves(lo(1, 3), hi(1, 3));
    c14 = load_halves(lo(1, 4), hi(1, 4)), c15 = load_halves(lo(1, 5), hi(1, 5));
  }
  const float *x0 = xt[0], *x1 = xt[1], *x2 = xt[2];
  const float *x3 = xt[Taps - 3], *x4 = xt[Taps - 2], *x5 = xt[Taps - 1];
  for (int64_t n = 0; n < images; ++n) {
    for (int64_t oh = 0; oh < ho; ++oh) {
      const float* d = dq + n * dy_image + oh * dyw * kRows;
      const int64_t x = n * x_image + oh * wp;
      for (int64_t ow = 0; ow < dyw; ow += kLanes, d += kRows * kLanes) {
        const __m512 a0 = _mm512_loadu_ps(d), a1 = _mm512_loadu_ps(d + 2 * kLanes);
        __m512 b = broadcast_eight(x0 + x + ow);
        c00 = _mm512_fmadd_ps(a0, b, c00), c10 = _mm512_fmadd_ps(a1, b, c10);
        b = broadcast_eight(x1 + x + ow);
        c01 = _mm512_fmadd_ps(a0, b, c01), c11 = _mm512_fmadd_ps(a1, b, c11);
        b = broadcast_eight(x2 + x + ow);
        c02 = _mm512_fmadd_ps(a0, b, c02), c12 = _mm512_fmadd_ps(a1, b, c12);
        if constexpr (Taps == 6) {
          b = broadcast_eight(x3 + x + ow);
          c03 = _mm512_fmadd_ps(a0, b, c03), c13 = _mm512_fmadd_ps(a1, b, c13);
          b = broadcast_eight(x4 + x + ow);
          c04 = _mm512_fmadd_ps(a0, b, c04), c14 = _mm512_fmadd_ps(a1, b, c14);
          b = broadcast_eight(x5 + x + ow);
          c05 = _mm512_fmadd_ps(a0, b, c05), c15 = _mm512_fmadd_ps(a1, b, c15);
        }
      }
    }
  }
  store_halves(c00, lo(0, 0), hi(0, 0)), store_halves(c01, lo(0, 1), hi(0, 1));
  store_halves(c02, lo(0, 2), hi(0, 2)), store_halves(c10, lo(1, 0), hi(1, 0));
  store_halves(c11, lo(1, 1), hi(1, 1)), store_halves(c12, lo(1, 2), hi(1, 2));
  if constexpr (Taps == 6) {
    store_halves(c03, lo(0, 3), hi(0, 3)), store_halves(c04, lo(0, 4), hi(0, 4));
    store_halves(c05, lo(0, 5), hi(0, 5)), store_halves(c13, lo(1, 3), hi(1, 3));
    store_halves(c14, lo(1, 4), hi(1, 4)), store_halves(c15, lo(1, 5), hi(1, 5));
  }
}

// One quad of output channels' dy for weight_tile_avx512: rows o0 to o0 + 3 (those past `out`
// zero) of images [n0, n0 + nb), each output row's vectors of 8 pixels (zero past wo) as
// [vector][channel][8 pixels], an image's rows ho * dyw * 4 floats apart.
void pack_dy_quad(const float* dy, int64_t dy_image, const Shape& s, int64_t o0, int64_t n0,
                  int64_t nb, int64_t dyw, float* dq) {
  for (int64_t m = 0; m < nb; ++m)
    for (int64_t oh = 0; oh < s.ho; ++oh) {
      float* row = dq + (m * s.ho + oh) * dyw * kRows;
      for (int r = 0; r < kRows; ++r) {
        const float* src = o0 + r < s.out ? dy + (n0 + m) * dy_image + ((o0 + r) * s.ho + oh) * s.wo
                                          : nullptr;
        for (int64_t ow = 0; ow < dyw; ow += kLanes) {
          float* dst = row + ow * kRows + r * kLanes;
          const int64_t count = src ? std::min<int64_t>(kLanes, s.wo - ow) : 0;
          // A whole vector as one copy of a size known when compiled: memcpy of `count` alone
          // was a loop of byte and word moves, a fifth of CIFAR10-quick's conv1 weight
          // gradient on a Zen 5 (bench/RESULTS.md).
          if (count == kLanes) {
            std::memcpy(dst, src + ow, kLanes * sizeof(float));
            continue;
          }
          if (count > 0) std::memcpy(dst, src + ow, size_t(count) * sizeof(float));
          std::fill(dst + std::max<int64_t>(count, 0), dst + kLanes, 0.0f);
        }
      }
    }
}

// A fixed pairwise order over the lanes: the same on every run and every thread count.
float lane_sum(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// Bytes of padded bottom a weight-gradient chunk of images holds: with its dy, within L2.
constexpr int64_t kWeightChunkBytes = int64_t(192) << 10;

// dw (out x in x kh x kw) = one group's weight gradient over images [begin, end), or dw += it.
// Threads take quads of output channels. Each pads the images itself, a chunk at a time, as
// [channel][image][row][column] so that a tile runs over the whole chunk before its sums
// leave the registers. The layer's taps (channel by channel, each s.rows(c) x s.cols(c) in
// (i, j) order: the taps a phase form pads with are neither computed nor written) go three to
// a tile as one list, a tile spanning two channels where a channel's taps end mid-tile: 5x5
// taps per channel were four 6-tap tiles and a 3-tap one holding one tap, which ran at half
// the 6-tap tile's speed. A last tile of fewer repeats tap 0. Each tap's sum is its own,
// whatever tile it shares: the same bits.
void weight_slice(const float* x, int64_t x_image, const float* dy, int64_t dy_image,
                  const Shape& s, int64_t begin, int64_t end, float* dw, bool accumulate,
                  bool wide) {
  const int64_t dyw = round_up(s.wo, kLanes), dyplane = s.ho * dyw, taps = s.kh * s.kw;
  const int64_t plane = s.plane(), wp = s.wp();
  const int64_t quads = (s.out + kRows - 1) / kRows;
  const int64_t chunk = std::max<int64_t>(
      1, kWeightChunkBytes / int64_t(sizeof(float)) / (s.in * plane + kRows * dyplane));
  // The layer's taps as one list: each one's bottom in a padded chunk (channel c's planes at
  // c * chunk * plane) and its weight among an output channel's in * kh * kw.
  std::vector<int64_t> tap_x, tap_w;
  for (int64_t c = 0; c < s.in; ++c)
    for (int64_t i = 0; i < s.rows(c); ++i)
      for (int64_t j = 0; j < s.cols(c); ++j) {
        tap_x.push_back(c * chunk * plane + i * s.dh * wp + j * s.dw);
        tap_w.push_back(c * taps + i * s.kw + j);
      }
  const int64_t listed = int64_t(tap_w.size());
  const int64_t tiles = (listed + kTapsPerTile - 1) / kTapsPerTile;
  const int64_t tile_floats = kRows * kTapsPerTile * kLanes;
  const int64_t cost = kRows * s.taps() * dyplane * (end - begin);
  parallel_for(quads, cost, [&](int64_t q0, int64_t q1) {
    const int64_t o0 = q0 * kRows, o1 = std::min(s.out, q1 * kRows), outs = (q1 - q0) * kRows;
    float* xp = grown(t_padded, size_t(s.in * chunk * plane));
    float* dyp = grown(t_dy, size_t(outs * chunk * dyplane));
    const size_t nsum = size_t((q1 - q0) * tiles * tile_floats);
    float* sums = grown(t_sums, nsum);
    std::fill(dyp, dyp + outs * chunk * dyplane, 0.0f);
    std::fill(sums, sums + nsum, 0.0f);
    for (int64_t n0 = begin; n0 < end; n0 += chunk) {
      const int64_t nb = std::min(chunk, end - n0);
      // Channel c of chunk image m at xp + (c * chunk + m) * plane: pad_image's channel
      // stride is then chunk * plane, which one Shape with `in` = 1 per call expresses.
      Shape one = s;
      one.in = 1;
      for (int64_t c = 0; c < s.in; ++c)
        for (int64_t m = 0; m < nb; ++m)
          pad_image(x + (n0 + m) * x_image + c * s.h * s.w, s.h * s.w, one,
                    xp + (c * chunk + m) * plane);
      if (wide) {  // each quad's dy as weight_tile_avx512 reads it
        for (int64_t q = q0; q < q1; ++q)
          pack_dy_quad(dy, dy_image, s, q * kRows, n0, nb, dyw,
                       dyp + (q - q0) * kRows * chunk * dyplane);
      } else {
        for (int64_t o = o0; o < o1; ++o)
          for (int64_t m = 0; m < nb; ++m)
            for (int64_t oh = 0; oh < s.ho; ++oh)
              std::memcpy(dyp + ((o - o0) * chunk + m) * dyplane + oh * dyw,
                          dy + (n0 + m) * dy_image + (o * s.ho + oh) * s.wo,
                          size_t(s.wo) * sizeof(float));
      }
      for (int64_t q = q0; q < q1; ++q) {
        const float* d = dyp + (q - q0) * kRows * chunk * dyplane;
        const int64_t dstep = chunk * dyplane;
        // Two 3-tap blocks to a wide tile while two remain, then one.
        for (int64_t t0 = 0; t0 < listed;) {
          const int block = wide && t0 + kTapsPerTile < listed ? 2 : 1;
          const float* at[2 * kTapsPerTile];
          for (int t = 0; t < block * kTapsPerTile; ++t)
            at[t] = xp + tap_x[size_t(t0 + t < listed ? t0 + t : 0)];
          float* sum = sums + ((q - q0) * tiles + t0 / kTapsPerTile) * tile_floats;
          if (!wide) {
            weight_tile(d, d + dstep, d + 2 * dstep, d + 3 * dstep, at[0], at[1], at[2], nb,
                        dyplane, plane, s.ho, dyw, wp, sum);
          } else if (block == 2) {
            weight_tile_avx512<2 * kTapsPerTile>(d, at, nb, kRows * dyplane, plane, s.ho, dyw,
                                                 wp, sum);
          } else {
            weight_tile_avx512<kTapsPerTile>(d, at, nb, kRows * dyplane, plane, s.ho, dyw, wp,
                                             sum);
          }
          t0 += block * kTapsPerTile;
        }
      }
    }
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t g = 0; g < listed; ++g) {
        const float* l = sums + ((o / kRows - q0) * tiles + g / kTapsPerTile) * tile_floats +
                         (o % kRows * kTapsPerTile + g % kTapsPerTile) * kLanes;
        float& out = dw[o * s.in * taps + tap_w[size_t(g)]];
        out = accumulate ? out + lane_sum(l) : lane_sum(l);
      }
  });
}

Shape forward_shape(const ConvGeom& g) {
  return {g.c / g.group, g.h, g.w, g.o / g.group, g.ho, g.wo, g.kh, g.kw, g.ph, g.pw, g.dh, g.dw};
}

}  // namespace

bool cpu_has_direct_conv() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

bool cpu_has_avx512() {
  static const bool has = CCT_CPU_HAS_AVX512F();
  return has;
}

#define CCT_DIRECT_CONV 1
#else
namespace cct {
// Not an x86 CPU: there are no AVX2 tiles, every plan runs lowered (conv.cpp's usable()) and
// the kernels below are never called.
bool cpu_has_direct_conv() { return false; }
bool cpu_has_avx512() { return false; }
#endif

bool direct_conv_applies(const ConvGeom& g, bool backward_data) {
  if (!cpu_has_direct_conv() || g.sh != 1 || g.sw != 1) return false;
  // Backward data's pad (k - 1) * d - p must not be negative.
  if (backward_data && (g.ph > (g.kh - 1) * g.dh || g.pw > (g.kw - 1) * g.dw)) return false;
  return true;
}

#ifdef CCT_DIRECT_CONV
void conv_forward_direct(const float* x, const float* weight, const float* bias, bool relu,
                         float* y, const ConvGeom& g, int64_t begin, int64_t end, int lanes,
                         const int32_t* extent) {
  Shape s = forward_shape(g);
  s.lanes = lanes == 16 && cpu_has_avx512() ? 16 : kLanes;
  s.extent = extent;
  convolve(x, g.c * g.h * g.w, s.in * g.h * g.w, bias, relu, y, g.o * g.ho * g.wo,
           s.out * g.ho * g.wo, g.group, s, begin, end,
           [&](int64_t grp, int64_t o, int64_t c, int64_t i, int64_t j) {
             return weight[(((grp * s.out + o) * s.in + c) * g.kh + i) * g.kw + j];
           });
}

void conv_backward_data_direct(const float* dy, const float* weight, float* dx,
                               const ConvGeom& g, int64_t begin, int64_t end, int lanes) {
  const int64_t cg = g.c / g.group, og = g.o / g.group;
  // The transposed convolution: dy's og channels in, the bottom's cg channels out.
  const Shape s{og, g.ho, g.wo, cg, g.h, g.w, g.kh, g.kw,
                (g.kh - 1) * g.dh - g.ph, (g.kw - 1) * g.dw - g.pw, g.dh, g.dw,
                lanes == 16 && cpu_has_avx512() ? 16 : kLanes};
  convolve(dy, g.o * g.ho * g.wo, og * g.ho * g.wo, nullptr, false, dx, g.c * g.h * g.w,
           cg * g.h * g.w, g.group, s, begin, end,
           [&](int64_t grp, int64_t c_out, int64_t o_in, int64_t i, int64_t j) {
             return weight[(((grp * og + o_in) * cg + c_out) * g.kh + (g.kh - 1 - i)) * g.kw +
                           (g.kw - 1 - j)];
           });
}

void conv_backward_weight_direct(const float* x, const float* dy, float* dweight,
                                 const ConvGeom& g, int64_t begin, int64_t end,
                                 bool accumulate, const int32_t* extent, int lanes) {
  Shape s = forward_shape(g);
  s.extent = extent;
  const bool wide = lanes == 16 && cpu_has_avx512();
  const int64_t per_group = s.out * s.in * g.kh * g.kw;
  for (int64_t grp = 0; grp < g.group; ++grp)
    weight_slice(x + grp * s.in * g.h * g.w, g.c * g.h * g.w, dy + grp * s.out * g.ho * g.wo,
                 g.o * g.ho * g.wo, s, begin, end, dweight + grp * per_group, accumulate, wide);
}
#else
void conv_forward_direct(const float*, const float*, const float*, bool, float*,
                         const ConvGeom&, int64_t, int64_t, int, const int32_t*) {
  throw std::logic_error("the direct convolution needs an x86 CPU with AVX2 and FMA");
}
void conv_backward_data_direct(const float*, const float*, float*, const ConvGeom&, int64_t,
                               int64_t, int) {
  throw std::logic_error("the direct convolution needs an x86 CPU with AVX2 and FMA");
}
void conv_backward_weight_direct(const float*, const float*, float*, const ConvGeom&, int64_t,
                                 int64_t, bool, const int32_t*, int) {
  throw std::logic_error("the direct convolution needs an x86 CPU with AVX2 and FMA");
}
#endif

}  // namespace cct
