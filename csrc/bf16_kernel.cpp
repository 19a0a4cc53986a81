// cct's own bf16 GEMM on AVX512-BF16's dot-product instruction (see bf16.h).
//
// VDPBF16PS adds to each float32 lane the two products of a pair of bf16 values: the operands
// are packed so that one 32-bit lane holds two consecutive k of one row of op(A) or one column
// of op(B) ("pairs"), rounded to bf16 while packed. op(A) is packed whole, in panels of kRows
// rows; each thread packs one panel of kCols columns of op(B) at a time and runs every row
// panel against it, accumulating the whole k in registers: one rounding per element of C, and
// no element's arithmetic depends on how the panels fall to threads. Its skinny form (below)
// gives the same bits for a fully connected layer's forward at a small batch, B rounded as it
// streams rather than packed first.
#include <stdexcept>

#include "bf16.h"

// x86-64 with GCC or Clang (target attributes); elsewhere the kernel is absent and
// bf16_kernel_supported() says so.
#if defined(__x86_64__) && defined(__GNUC__)
#include "avx512.h"  // the target and CPU check; SIMDe's intrinsics in an emulated test build

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "parallel.h"
#include "thin_walk.h"
#include "workspace.h"

namespace cct {

namespace {

constexpr int kRows = 8;   // rows of C per micro-kernel: 8 x 2 accumulator registers
constexpr int kCols = 32;  // columns of C per micro-kernel: two registers of 16 lanes
constexpr int kGroup = 4;  // panels of op(B) a thread packs in one pass

#define CCT_BF16_TARGET CCT_AVX512BF16_TARGET

// The pair (lo, hi) of float32 as one lane of two bf16, each rounded to nearest even (NaN
// kept a NaN), as round_to_bf16 rounds.
inline uint32_t pair_scalar(float lo, float hi) {
  uint16_t out[2];
  const float in[2] = {lo, hi};
  round_to_bf16(in, out, 2);
  return uint32_t(out[0]) | uint32_t(out[1]) << 16;
}

// 16 float32 lanes rounded to bf16, left in the high half of each 32-bit lane.
CCT_BF16_TARGET inline __m512i rounded_high(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F800000));
  const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
  return _mm512_and_si512(_mm512_mask_mov_epi32(r, nan, quiet),
                          _mm512_set1_epi32(int(0xFFFF0000u)));
}

// dst[i] = pair(lo[i], hi[i]) for i < count: k-pairs that run across two rows of the source.
CCT_BF16_TARGET void pair_rows(const float* lo, const float* hi, int64_t count, uint32_t* dst) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512i l = rounded_high(_mm512_loadu_si512(lo + i));
    const __m512i h = hi ? rounded_high(_mm512_loadu_si512(hi + i)) : _mm512_setzero_si512();
    _mm512_storeu_si512(dst + i, _mm512_or_si512(_mm512_srli_epi32(l, 16), h));
  }
  for (; i < count; ++i) dst[i] = pair_scalar(lo[i], hi ? hi[i] : 0.0f);
}

// Sixteen k-pairs of 32 consecutive floats: lane p holds pair(src[2p], src[2p + 1]).
CCT_BF16_TARGET inline __m512i pairs16(const float* src) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i x0 = _mm512_loadu_si512(src), x1 = _mm512_loadu_si512(src + 16);
  const __m512i l = rounded_high(_mm512_permutex2var_epi32(x0, even, x1));
  const __m512i h = rounded_high(_mm512_permutex2var_epi32(x0, odd, x1));
  return _mm512_or_si512(_mm512_srli_epi32(l, 16), h);
}

// dst[p * stride] = pair(src[2p], src[2p + 1]) for p < ceil(k / 2): k-pairs along one row of
// the source (a zero completes an odd k).
CCT_BF16_TARGET void pair_along(const float* src, int64_t k, uint32_t* dst, int64_t stride) {
  int64_t p = 0;
  alignas(64) uint32_t lanes[16];
  for (; 2 * p + 32 <= k; p += 16) {
    _mm512_store_si512(lanes, pairs16(src + 2 * p));
    for (int j = 0; j < 16; ++j) dst[(p + j) * stride] = lanes[j];
  }
  for (; 2 * p < k; ++p)
    dst[p * stride] = pair_scalar(src[2 * p], 2 * p + 1 < k ? src[2 * p + 1] : 0.0f);
}

// Panels of `width` rows or columns of an operand from `first` on, `lanes` to a panel, as
// k-pairs: panel q holds pairs[q * kp * lanes + p * lanes + r] for its r-th row (of op(A)) or
// column (of op(B)); lanes past width are zero. `across` is true where the operand's k runs
// across memory rows (op(A) = A^T, op(B) = B): then each pair of memory rows is read once for
// all the panels, `width` floats in a row rather than `lanes` (fewer pages touched per byte).
void pack_panels(const float* x, int64_t ld, bool across, int64_t first, int64_t width,
                 int64_t k, int lanes, uint32_t* pairs) {
  const int64_t kp = (k + 1) / 2, panels = (width + lanes - 1) / lanes;
  if (width % lanes) {
    uint32_t* last = pairs + (panels - 1) * kp * lanes;
    std::memset(last, 0, sizeof(uint32_t) * size_t(kp * lanes));
  }
  if (across) {
    thread_local std::vector<uint32_t> row;
    uint32_t* lane = grown(row, size_t(width));
    for (int64_t p = 0; p < kp; ++p) {
      const float* lo = x + 2 * p * ld + first;
      pair_rows(lo, 2 * p + 1 < k ? lo + ld : nullptr, width, lane);
      for (int64_t q = 0; q < panels; ++q) {
        const int64_t count = std::min<int64_t>(lanes, width - q * lanes);
        std::memcpy(pairs + q * kp * lanes + p * lanes, lane + q * lanes,
                    sizeof(uint32_t) * size_t(count));
      }
    }
  } else {
    for (int64_t r = 0; r < width; ++r)
      pair_along(x + (first + r) * ld, k, pairs + (r / lanes) * kp * lanes + r % lanes, lanes);
  }
}

// C[0:rows, 0:cols] = alpha (A panel . B panel) + beta C over kp pairs.
CCT_BF16_TARGET void micro_kernel(int64_t kp, const uint32_t* a, const uint32_t* b, float alpha,
                                  float beta, float* c, int64_t ldc, int rows, int cols) {
  __m512 acc[kRows][2];
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * kCols);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * kCols + 16);
    const uint32_t* ap = a + p * kRows;
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(ap[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  const __mmask16 m0 = cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32 ? __mmask16(0xFFFF)
                                  : cols > 16 ? __mmask16((1u << (cols - 16)) - 1) : 0;
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    __m512 y0 = _mm512_mul_ps(va, acc[r][0]), y1 = _mm512_mul_ps(va, acc[r][1]);
    if (beta != 0.0f) {  // beta 0 never reads C (BLAS's rule: C may hold NaN)
      y0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), y0);
      y1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), y1);
    }
    _mm512_mask_storeu_ps(cr, m0, y0);
    _mm512_mask_storeu_ps(cr + 16, m1, y1);
  }
}

}  // namespace

bool bf16_kernel_supported() {
  static const bool has = CCT_CPU_HAS_AVX512BF16();
  return has;
}

void gemm_bf16_kernel(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) {
  const int64_t kp = (k + 1) / 2;
  const int64_t row_panels = (m + kRows - 1) / kRows, col_panels = (n + kCols - 1) / kCols;
  thread_local std::vector<uint32_t> a_buffer;
  uint32_t* a_pairs = grown(a_buffer, size_t(row_panels * kp * kRows));
  parallel_for(row_panels, kp * kRows * 2, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      pack_panels(a, lda, ta, i * kRows, std::min<int64_t>(kRows, m - i * kRows), k, kRows,
                  a_pairs + i * kp * kRows);
  });
  parallel_for(col_panels, m * k * kCols, [&](int64_t begin, int64_t end) {
    thread_local std::vector<uint32_t> b_buffer;
    uint32_t* b_pairs = grown(b_buffer, size_t(kGroup * kp * kCols));
    for (int64_t j0 = begin; j0 < end; j0 += kGroup) {
      const int64_t j1 = std::min(end, j0 + kGroup);
      pack_panels(b, ldb, !tb, j0 * kCols, std::min(n, j1 * kCols) - j0 * kCols, k, kCols,
                  b_pairs);
      for (int64_t j = j0; j < j1; ++j) {
        const int cols = int(std::min<int64_t>(kCols, n - j * kCols));
        for (int64_t i = 0; i < row_panels; ++i) {
          const int rows = int(std::min<int64_t>(kRows, m - i * kRows));
          micro_kernel(kp, a_pairs + i * kp * kRows, b_pairs + (j - j0) * kp * kCols, alpha,
                       beta, c + i * kRows * ldc + j * kCols, ldc, rows, cols);
        }
      }
    }
  });
}

// The skinny form (bf16.h's gemm_bf16_skinny): the float32 skinny engine's tile
// (gemm_skinny.cpp) on VDPBF16PS. op(A)'s few rows are the lanes, packed once as k-pairs;
// B's rows (a fully connected layer's weights, n x k) are read where they lie, each tile's six
// rows rounded into pairs a step at a time in L1, so the weights stream from memory once with
// their rounding fused in (the kernel above packs B's panels through L2 first and reached
// 128 GFLOP/s on fc6 at batch 32 on a Zen 4, below float32's skinny engine at 206).
namespace {

constexpr int kSkinnyTileRows = 6;        // rows of B per tile
constexpr int64_t kSkinnyStepPairs = 128;  // k-pairs per step: six rows of 1 KiB of B
constexpr int64_t kSkinnyPanelBytes = int64_t(1) << 20;  // op(A)'s pairs per panel, in L2

// dst[p] = pair(src[2p], src[2p + 1]) for the `count` floats of src, a zero completing an odd
// count: a row of B's floats as k-pairs, contiguous.
CCT_BF16_TARGET void pairs_of(const float* src, int64_t count, uint32_t* dst) {
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) _mm512_storeu_si512(dst + i / 2, pairs16(src + i));
  for (; i < count; i += 2) dst[i / 2] = pair_scalar(src[i], i + 1 < count ? src[i + 1] : 0.0f);
}

// acc (R rows of B x V vectors of op(A)'s lanes) = ot's values; then for p in [0, kcp)
// acc[r] += pair bb[r][p] . ap[p]; then back to ot. While it runs it prefetches `next`, the
// block of B the thread rounds next (R of B's rows, 1 KiB = 16 lines of each), one line a
// pair: without it the rounding's loads waited on memory while no tile ran, and the two took
// their sum (fc6 at batch 32 on a Zen 4: 10.6-11.6 ms, against 7.6-8.9 with it).
template <int R, int V>
CCT_BF16_TARGET void skinny_bf16_tile(const uint32_t* bb, const uint32_t* ap, int64_t mpad,
                                      int64_t kcp, float* ot, const float* next, int64_t ldb) {
  __m512 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_loadu_ps(ot + r * mpad + 16 * v);
  const int64_t lines = next ? std::min<int64_t>(kcp, R * 16) : 0;
  for (int64_t p = 0; p < kcp; ++p) {
    if (p < lines) _mm_prefetch(reinterpret_cast<const char*>(next + (p >> 4) * ldb +
                                                              ((p & 15) << 4)), _MM_HINT_T0);
    __m512bh x[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) x[v] = (__m512bh)_mm512_loadu_si512(ap + p * mpad + 16 * v);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512bh w = (__m512bh)_mm512_set1_epi32(int(bb[r * kSkinnyStepPairs + p]));
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], x[v], w);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(ot + r * mpad + 16 * v, acc[r][v]);
}

using SkinnyTile = void (*)(const uint32_t*, const uint32_t*, int64_t, int64_t, float*,
                            const float*, int64_t);

template <int V>
SkinnyTile skinny_tile_of(int rows) {
  switch (rows) {
    case 1: return skinny_bf16_tile<1, V>;
    case 2: return skinny_bf16_tile<2, V>;
    case 3: return skinny_bf16_tile<3, V>;
    case 4: return skinny_bf16_tile<4, V>;
    case 5: return skinny_bf16_tile<5, V>;
    default: return skinny_bf16_tile<6, V>;
  }
}

// ot[j][i] += op(A)(i, :) . B(j, :) over one panel of op(A)'s pairs (pk of them, from pair p0
// of the k floats of B's rows) for B's rows j in [j0, j1): each tile of six rows runs its
// steps in turn, each step's block of B rounded into bb and run over every lane group.
void skinny_bf16_rows(const uint32_t* ap, int64_t mpad, int64_t p0, int64_t pk, int64_t k,
                      const float* b, int64_t ldb, float* ot, int64_t j0, int64_t j1) {
  alignas(64) uint32_t bb[kSkinnyTileRows * kSkinnyStepPairs];
  for (int64_t r0 = j0; r0 < j1; r0 += kSkinnyTileRows) {
    const int rows = int(std::min<int64_t>(kSkinnyTileRows, j1 - r0));
    const SkinnyTile two = skinny_tile_of<2>(rows), one = skinny_tile_of<1>(rows);
    for (int64_t s = 0; s < pk; s += kSkinnyStepPairs) {
      const int64_t kcp = std::min(kSkinnyStepPairs, pk - s), first = 2 * (p0 + s);
      const int64_t floats = std::min(2 * kcp, k - first);
      for (int r = 0; r < rows; ++r)
        pairs_of(b + (r0 + r) * ldb + first, floats, bb + r * kSkinnyStepPairs);
      // The block after this one: the tile's next step, else the next tile's first.
      const float* next = s + kSkinnyStepPairs < pk ? b + r0 * ldb + first + 2 * kcp
                          : r0 + kSkinnyTileRows < j1 ? b + (r0 + kSkinnyTileRows) * ldb + 2 * p0
                                                      : nullptr;
      for (int64_t i0 = 0; i0 < mpad; i0 += 32) {
        (mpad - i0 >= 32 ? two : one)(bb, ap + s * mpad + i0, mpad, kcp, ot + r0 * mpad + i0,
                                      next, ldb);
        next = nullptr;  // prefetched by the first lane group's run
      }
    }
  }
}

}  // namespace

void gemm_bf16_skinny(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (!gemm_bf16_skinny_applies(true, m, n, k, 1.0f))
    throw std::invalid_argument("gemm_bf16_skinny: outside its form (bf16.h)");
  const int64_t mpad = (m + 15) / 16 * 16, kp = (k + 1) / 2;
  // A panel a whole number of steps, so that every step but the last of all is whole.
  const int64_t panel = std::max<int64_t>(
      1, kSkinnyPanelBytes / (int64_t(sizeof(uint32_t)) * mpad * kSkinnyStepPairs)) *
      kSkinnyStepPairs;
  const int64_t blocks = (n + kSkinnyTileRows - 1) / kSkinnyTileRows;
  // The calling thread's buffers, written by the parallel parts through these pointers.
  thread_local std::vector<uint32_t> ap_buf;
  thread_local std::vector<float> ot_buf;
  uint32_t* const ap = grown(ap_buf, size_t(std::min(panel, kp) * mpad));
  float* const ot = grown(ot_buf, size_t(n * mpad));
  // ot (C transposed) starts at 0; op(A)'s lanes past m are 0 and their results never stored.
  parallel_for(n, mpad, [&](int64_t j0, int64_t j1) {
    std::fill(ot + j0 * mpad, ot + j1 * mpad, 0.0f);
  });
  for (int64_t p0 = 0; p0 < kp; p0 += panel) {
    const int64_t pk = std::min(panel, kp - p0);
    parallel_for(pk, mpad, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        uint32_t* row = ap + q * mpad;
        std::fill(row + m, row + mpad, 0u);
        if (ta) {  // op(A)'s k runs down A's rows: a pair of them gives every lane its pair
          const float* lo = a + 2 * (p0 + q) * lda;
          pair_rows(lo, 2 * (p0 + q) + 1 < k ? lo + lda : nullptr, m, row);
        }
      }
      if (!ta) {
        const int64_t floats = std::min(2 * q1, k - 2 * p0) - 2 * q0;
        for (int64_t i = 0; i < m; ++i)
          pair_along(a + i * lda + 2 * (p0 + q0), floats, ap + q0 * mpad + i, mpad);
      }
    });
    parallel_for(blocks, kSkinnyTileRows * pk * mpad, [&](int64_t begin, int64_t end) {
      skinny_bf16_rows(ap, mpad, p0, pk, k, b, ldb, ot, begin * kSkinnyTileRows,
                       std::min(n, end * kSkinnyTileRows));
    });
  }
  // C = ot^T + beta C: the kernel's y = 1 * acc, then fma(beta, C, y) (C unread when beta is 0:
  // it may hold NaN), so the bits are gemm_bf16_kernel's.
  parallel_for(m, n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == 0.0f ? ot[j * mpad + i]
                                      : std::fma(beta, c[i * ldc + j], ot[j * mpad + i]);
  });
}

// The thin form (bf16.h's gemm_bf16_thin): the float32 thin engine's tile (gemm_thin.cpp) on
// VDPBF16PS, for a short k: a fully connected layer's weight gradient at a small batch, dW (m x
// n) += dy^T x with k the batch, and a lowered convolution's backward data with few filters.
// Each value of C gets only k multiply-adds, so C's stream through memory must hide behind
// them; VDPBF16PS halves the instructions per value. The kernel above, whose 8 x 32 tile does
// not prefetch C, ran fc6's weight gradient at batch 32 at 107 GFLOP/s on a Zen 4, the float32
// thin engine at 179, this form at 250-270 (bench/RESULTS.md).
namespace {

constexpr int kThinTileRows = kThinWalkRows;  // thin_walk.h's tiles
constexpr int kThinTileVectors = 4;
constexpr int64_t kThinTileColumns = kThinWalkColumns;  // kThinTileVectors of 16
constexpr int64_t kThinBlockBytes = int64_t(512) << 10;  // B's pairs per block, kept in L2

// c (R rows x V vectors of 16 columns, ldc) = chains over kp pairs of op(A)'s R rows (ap,
// pair-major, ldap to a pair) and B's columns (bp, ldp pairs to a k-pair), then
// fma(beta, c, chain) (c unread when beta is 0). With Tail the last vector's lanes outside
// `last` are neither read nor written. `next` is where the tile after this one starts: its
// lines are prefetched now, a tile's arithmetic ahead of their use (gemm_thin.cpp's reason).
template <int R, int V, bool Tail>
CCT_BF16_TARGET void thin_bf16_tile(const uint32_t* ap, int64_t ldap, const uint32_t* bp,
                                    int64_t ldp, int64_t kp, float beta, float* c, int64_t ldc,
                                    __mmask16 last, const float* next) {
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(next);  // may pass C's end: no fault
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + sizeof(float) * (r * ldc + 16 * v)),
                   _MM_HINT_T0);
  __m512 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh x[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const uint32_t* at = bp + p * ldp + 16 * v;
      x[v] = (__m512bh)(Tail && v == V - 1 ? _mm512_maskz_loadu_epi32(last, at)
                                           : _mm512_loadu_si512(at));
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512bh w = (__m512bh)_mm512_set1_epi32(int(ap[p * ldap + r]));
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], w, x[v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(beta);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      float* cv = c + r * ldc + 16 * v;
      if (Tail && v == V - 1) {
        const __m512 out = beta == 0.0f  // C unread (it may hold NaN)
                               ? acc[r][v]
                               : _mm512_fmadd_ps(scale, _mm512_maskz_loadu_ps(last, cv), acc[r][v]);
        _mm512_mask_storeu_ps(cv, last, out);
      } else {
        _mm512_storeu_ps(cv, beta == 0.0f ? acc[r][v]
                                          : _mm512_fmadd_ps(scale, _mm512_loadu_ps(cv), acc[r][v]));
      }
    }
}

using ThinTile = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t, float,
                          float*, int64_t, __mmask16, const float*);

template <int R, bool Tail>
ThinTile thin_tile_of_vectors(int vectors) {
  switch (vectors) {
    case 1: return thin_bf16_tile<R, 1, Tail>;
    case 2: return thin_bf16_tile<R, 2, Tail>;
    case 3: return thin_bf16_tile<R, 3, Tail>;
    default: return thin_bf16_tile<R, 4, Tail>;
  }
}

template <bool Tail>
ThinTile thin_tile_of_rows(int rows, int vectors) {
  switch (rows) {
    case 1: return thin_tile_of_vectors<1, Tail>(vectors);
    case 2: return thin_tile_of_vectors<2, Tail>(vectors);
    case 3: return thin_tile_of_vectors<3, Tail>(vectors);
    case 4: return thin_tile_of_vectors<4, Tail>(vectors);
    case 5: return thin_tile_of_vectors<5, Tail>(vectors);
    default: return thin_tile_of_vectors<6, Tail>(vectors);
  }
}

// The tile of `rows` rows (1 to kThinTileRows) and `columns` columns (1 to kThinTileColumns).
ThinTile thin_tile_of(int rows, int64_t columns) {
  const int vectors = int((columns + 15) / 16);
  return columns % 16 ? thin_tile_of_rows<true>(rows, vectors)
                      : thin_tile_of_rows<false>(rows, vectors);
}

}  // namespace

void gemm_bf16_thin(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                    const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (!gemm_bf16_thin_applies(false, m, n, k, 1.0f))
    throw std::invalid_argument("gemm_bf16_thin: outside its form (bf16.h)");
  const int64_t kp = (k + 1) / 2;
  const int64_t width = thin_walk_width(n, int64_t(sizeof(uint32_t)) * kp, kThinBlockBytes);
  // op(A) as k-pairs once for all the tiles, pair-major: ap[p * m + i] for its row i. (The
  // calling thread's buffer, written by the parallel parts through this pointer.)
  thread_local std::vector<uint32_t> ap_buffer;
  uint32_t* const ap = grown(ap_buffer, size_t(kp * m));
  if (ta) {  // op(A)'s k runs down A's rows: a pair of them gives every row its pair
    parallel_for(kp, 2 * m, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p)
        pair_rows(a + 2 * p * lda, 2 * p + 1 < k ? a + (2 * p + 1) * lda : nullptr, m,
                  ap + p * m);
    });
  } else {
    parallel_for(m, k, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pair_along(a + i * lda, k, ap + i, m);
    });
  }
  thin_walk(m, n, width, c, ldc, kThinTileRows * width * k, [&] {
    // A run rounds a block's B into pairs when it enters the block (its thread's buffer).
    thread_local std::vector<uint32_t> bp_buffer;
    return [&, bp = grown(bp_buffer, size_t(kp * width))](int64_t i0, int rows, bool entered,
                                                          int64_t j0, int64_t j1) {
      if (entered)
        for (int64_t p = 0; p < kp; ++p) {
          const float* lo = b + 2 * p * ldb + j0;
          pair_rows(lo, 2 * p + 1 < k ? lo + ldb : nullptr, j1 - j0, bp + p * width);
        }
      return [&, rows, i0, j0](int64_t j, int64_t columns, const float* next) {
        const int tail = int(columns % 16);
        const __mmask16 last = tail ? __mmask16((1u << tail) - 1) : __mmask16(0xFFFF);
        thin_tile_of(rows, columns)(ap + i0, m, bp + (j - j0), width, kp, beta,
                                    c + i0 * ldc + j, ldc, last, next);
      };
    };
  });
}

}  // namespace cct

#else  // not x86-64 with GCC or Clang

namespace cct {

bool bf16_kernel_supported() { return false; }

void gemm_bf16_kernel(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                      const float*, int64_t, float, float*, int64_t) {
  throw std::runtime_error("cct's bf16 kernel needs an x86-64 build with AVX512-BF16");
}

void gemm_bf16_skinny(bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                      int64_t, float, float*, int64_t) {
  throw std::runtime_error("cct's bf16 kernel needs an x86-64 build with AVX512-BF16");
}

void gemm_bf16_thin(bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                    int64_t, float, float*, int64_t) {
  throw std::runtime_error("cct's bf16 kernel needs an x86-64 build with AVX512-BF16");
}

}  // namespace cct

#endif

namespace cct {

bool gemm_bf16_skinny_applies(bool tb, int64_t m, int64_t n, int64_t k, float alpha) {
  return tb && m >= 1 && m <= kBf16SkinnyMaxRows && n >= 1 && k >= 1 && alpha == 1.0f &&
         bf16_kernel_supported();
}

bool gemm_bf16_thin_applies(bool tb, int64_t m, int64_t n, int64_t k, float alpha) {
  return !tb && m >= 1 && n >= 1 && k >= 1 && k <= kBf16ThinMaxK && alpha == 1.0f &&
         bf16_kernel_supported();
}

}  // namespace cct
