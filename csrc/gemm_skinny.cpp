// The skinny GEMM engine (gemm_skinny.h): C (m x n) = op(A) op(B) + beta C for small m.
//
// Why: a fully connected layer at batch 32 multiplies 32 rows of the bottom by a weight matrix
// read once from memory (fc6: 4096 x 9216, 151 MB). OpenBLAS packs the weights into its own
// layout first, then multiplies from the packed copy: the packing is bound by memory and the
// multiply by arithmetic, one after the other, and the forward ran at 53% of the SGEMM peak
// (fc6 29.4 ms on a Zen 3's two cores, bench/RESULTS.md). Here the weights are never copied:
// each tile reads six rows of B as they are, contiguous along the summed dimension, while the
// hardware prefetchers stream them, so the memory traffic hides under the arithmetic.
//
// The tile: 6 rows of B (6 columns of C) x 16 rows of op(A) as two vectors of 8, twelve
// accumulators; for every k one broadcast per B row and two loads of op(A), which is packed
// k-major (its values for one k contiguous) in 1 MiB panels (in L2 on cores with 1-2 MiB of
// it; in L3 on Zen 3's 512 KiB). The accumulators are C held transposed (rows of B x lanes of
// A) in a buffer whose rows each thread keeps to its own, so each C value is one chain of
// fused multiply-adds in k's order from 0, then beta C added with one rounding: its bits
// depend on nothing but the shape and the values (not on the threads, the panels or the
// steps). beta C comes last, as the BLAS adds it: a chain started from it rounds every step
// at C's scale (a large bias under small products lost their low bits, 2e-5 of a logit of
// 100 where OpenBLAS was exact to one rounding).
//
// Per panel of op(A) (1 MiB packed), cct's threads pack it together, then take blocks of B's
// rows over it. (Each packing every panel for itself cost a shape with few rows of B and a
// long k, a thin convolution's weight gradient, a second copy of op(A) per thread.)
//
// The engine takes op(B) = B as well (B stored k x n: a fully connected layer's backward data,
// dx = dy W, where OpenBLAS reached 55-64% of the SGEMM peak on a Zen 4 for fc6 at batch 32):
// C^T = B^T op(A)^T is the same tile with B's values read along its rows instead, the tile's
// six rows of B^T being six adjacent columns of one row of B per k. A k-step then runs every
// tile of the thread's columns before the next, so that a cache line of B's row, read for one
// tile, serves the next two from L1; each C value is the same chain, as the contract says.
//
// On CPUs with AVX-512 the tile can take vectors of 16 lanes instead (6 rows of B x 32 rows of
// op(A): a batch of 32 reads B's six rows once per step rather than twice). Each C value is
// the same chain in the same order, so the bits are the same as the 8-lane tile's; gemm.cpp
// races the two as choices 4 and 6, since on Zen 4, which splits a 512-bit FMA in two, which
// is faster is a question for the stopwatch (as for the direct convolution's 16-pixel tile).
// A plan naming the 16-lane tile on a CPU without AVX-512 runs the 8-lane one: same bits.
#include "gemm_skinny.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "parallel.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx512.h"

namespace cct {

namespace {

constexpr int kTileRows = 6;           // rows of B per tile
constexpr int64_t kStep = 256;         // k per pass of a tile: 6 rows x 1 KiB of B, kept in L1
                                       // while the tile runs over op(A)'s lane groups
constexpr int64_t kPanelBytes = 1 << 20;  // op(A) packed per panel of k: in L2 (or L3 with 512 KiB)

// acc (R rows x V vectors of lanes) = ot's values; then for k in [0, kc) acc[r] += b[r][k] *
// ap[k]; then back to ot. ap is the panel at this step and lane group (row stride mpad). B's
// value b[r][k] is at b + r * ldb + k (TransB: B stored n x k) or b + k * ldb + r (B stored
// k x n).
template <int R, int V, bool TransB>
__attribute__((target("avx2,fma"))) void skinny_tile(const float* b, int64_t ldb,
                                                    const float* ap, int64_t mpad, int64_t kc,
                                                    float* ot, int64_t mpad_ot) {
  // The loops over r and v unrolled, so that GCC keeps acc in registers (rolled, it stored
  // every accumulator to the stack after each multiply-add: 0.6x the speed).
  __m256 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_loadu_ps(ot + r * mpad_ot + 8 * v);
  for (int64_t k = 0; k < kc; ++k) {
    __m256 x[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) x[v] = _mm256_loadu_ps(ap + k * mpad + 8 * v);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(TransB ? b + r * ldb + k : b + k * ldb + r);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(w, x[v], acc[r][v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(ot + r * mpad_ot + 8 * v, acc[r][v]);
}

// skinny_tile with vectors of 16 lanes. Written out again rather than one template over the
// vector width: GCC does not inline a target's intrinsics into a template body that has no
// target of its own.
template <int R, int V, bool TransB>
CCT_AVX512F_TARGET void skinny_tile16(const float* b, int64_t ldb, const float* ap, int64_t mpad,
                                      int64_t kc, float* ot, int64_t mpad_ot) {
  __m512 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_loadu_ps(ot + r * mpad_ot + 16 * v);
  for (int64_t k = 0; k < kc; ++k) {
    __m512 x[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) x[v] = _mm512_loadu_ps(ap + k * mpad + 16 * v);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 w = _mm512_set1_ps(TransB ? b[r * ldb + k] : b[k * ldb + r]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(w, x[v], acc[r][v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(ot + r * mpad_ot + 16 * v, acc[r][v]);
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);

// The tile of `rows` rows of B^T (1 to kTileRows) and V vectors of `Lanes` lanes.
template <int Lanes, int V, bool TransB>
TileFn tile_of(int rows) {
  if constexpr (Lanes == 16) {
    switch (rows) {
      case 1: return skinny_tile16<1, V, TransB>;
      case 2: return skinny_tile16<2, V, TransB>;
      case 3: return skinny_tile16<3, V, TransB>;
      case 4: return skinny_tile16<4, V, TransB>;
      case 5: return skinny_tile16<5, V, TransB>;
      default: return skinny_tile16<6, V, TransB>;
    }
  } else {
    switch (rows) {
      case 1: return skinny_tile<1, V, TransB>;
      case 2: return skinny_tile<2, V, TransB>;
      case 3: return skinny_tile<3, V, TransB>;
      case 4: return skinny_tile<4, V, TransB>;
      case 5: return skinny_tile<5, V, TransB>;
      default: return skinny_tile<6, V, TransB>;
    }
  }
}

// ot[j][i] += op(A)(i, :) . B^T(j, :) for rows j of B^T in [j0, j1): every tile of those rows
// over one packed panel of op(A), k in [0, pk), in lane groups of two vectors of Lanes (mpad a
// multiple of Lanes; the last group one vector where one is left). With TransB (B^T's rows
// are B's, contiguous along k) each tile runs all its steps in turn; else (B^T's rows are B's
// columns) each step runs all the tiles in turn, which share the cache lines of B's rows.
template <int Lanes, bool TransB>
void skinny_rows(const float* ap, int64_t mpad, int64_t pk, const float* b, int64_t ldb,
                 float* ot, int64_t j0, int64_t j1) {
  const auto tile = [&](int64_t r0, int64_t s0) {
    const int rows = int(std::min<int64_t>(kTileRows, j1 - r0));
    const TileFn two = tile_of<Lanes, 2, TransB>(rows), one = tile_of<Lanes, 1, TransB>(rows);
    const int64_t kc = std::min(kStep, pk - s0);
    const float* bt = TransB ? b + r0 * ldb + s0 : b + s0 * ldb + r0;
    for (int64_t i0 = 0; i0 < mpad; i0 += 2 * Lanes)
      (mpad - i0 >= 2 * Lanes ? two : one)(bt, ldb, ap + s0 * mpad + i0, mpad, kc,
                                           ot + r0 * mpad + i0, mpad);
  };
  if constexpr (TransB) {
    for (int64_t r0 = j0; r0 < j1; r0 += kTileRows)
      for (int64_t s0 = 0; s0 < pk; s0 += kStep) tile(r0, s0);
  } else {
    for (int64_t s0 = 0; s0 < pk; s0 += kStep)
      for (int64_t r0 = j0; r0 < j1; r0 += kTileRows) tile(r0, s0);
  }
}

}  // namespace

bool gemm_skinny_available() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

bool gemm_skinny16_available() {
  static const bool has = gemm_skinny_available() && CCT_CPU_HAS_AVX512F();
  return has;
}

void gemm_skinny(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                 int lanes) {
  if (lanes != 8 && lanes != 16) throw std::invalid_argument("gemm_skinny: lanes must be 8 or 16");
  const bool wide = lanes == 16 && gemm_skinny16_available();
  const int64_t mpad = wide ? (m + 15) / 16 * 16 : (m + 7) / 8 * 8;
  const int64_t panel = std::max<int64_t>(kStep, kPanelBytes / int64_t(sizeof(float) * mpad));
  const int64_t blocks = (n + kTileRows - 1) / kTileRows;
  // The calling thread's buffers; each part of a parallel_for writes its own rows of them
  // (through these pointers: in a lambda run by a worker, the names would be its own).
  thread_local std::vector<float> ap_buf, ot_buf;
  ap_buf.resize(size_t(std::min(panel, k) * mpad));
  ot_buf.resize(size_t(n * mpad));
  float* const ap = ap_buf.data();
  float* const ot = ot_buf.data();
  // ot (C transposed) starts at 0; op(A)'s lanes past m are 0 and their results never stored.
  parallel_for(n, mpad, [&](int64_t j0, int64_t j1) {
    std::fill(ot + j0 * mpad, ot + j1 * mpad, 0.0f);
  });
  for (int64_t p0 = 0; p0 < k; p0 += panel) {
    const int64_t pk = std::min(panel, k - p0);
    parallel_for(pk, mpad, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) std::fill(ap + q * mpad + m, ap + (q + 1) * mpad, 0.0f);
      if (ta) {
        for (int64_t q = q0; q < q1; ++q)
          std::copy(a + (p0 + q) * lda, a + (p0 + q) * lda + m, ap + q * mpad);
        return;
      }
      // A's rows read in runs of 64 along k (one packed row per k at a time read 4 bytes
      // from each of m rows: 19% of a thin weight gradient's samples)
      for (int64_t qb = q0; qb < q1; qb += 64)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t q = qb; q < std::min(q1, qb + 64); ++q)
            ap[q * mpad + i] = a[i * lda + p0 + q];
    });
    const float* bp = tb ? b + p0 : b + p0 * ldb;  // the panel's k of B
    parallel_for(blocks, kTileRows * pk * mpad, [&](int64_t begin, int64_t end) {
      const int64_t j0 = begin * kTileRows, j1 = std::min(n, end * kTileRows);
      if (wide && tb) {
        skinny_rows<16, true>(ap, mpad, pk, bp, ldb, ot, j0, j1);
      } else if (wide) {
        skinny_rows<16, false>(ap, mpad, pk, bp, ldb, ot, j0, j1);
      } else if (tb) {
        skinny_rows<8, true>(ap, mpad, pk, bp, ldb, ot, j0, j1);
      } else {
        skinny_rows<8, false>(ap, mpad, pk, bp, ldb, ot, j0, j1);
      }
    });
  }
  parallel_for(m, n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = 0; j < n; ++j)  // C unread when beta is 0 (it may hold NaN)
        c[i * ldc + j] = beta == 0.0f ? ot[j * mpad + i]
                                      : std::fma(beta, c[i * ldc + j], ot[j * mpad + i]);
  });
}

}  // namespace cct

#else
namespace cct {
// Not an x86 CPU (or not GCC/Clang): no kernel; gemm_skinny_applies is false, so the races
// never pick the engine and a plan naming it runs the BLAS (gemm.cpp).
bool gemm_skinny_available() { return false; }
bool gemm_skinny16_available() { return false; }
void gemm_skinny(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                 int64_t, float, float*, int64_t, int) {
  throw std::logic_error("gemm_skinny: no kernel on this CPU (gemm_skinny_applies is false)");
}
}  // namespace cct
#endif

namespace cct {

bool gemm_skinny_applies(int64_t m, int64_t n, int64_t k, float alpha) {
  return m >= 1 && m <= kSkinnyMaxRows && n >= 1 && k >= 1 && alpha == 1.0f &&
         gemm_skinny_available();
}

}  // namespace cct
