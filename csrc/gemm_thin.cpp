// The thin GEMM engine (gemm_thin.h): C (m x n) = op(A) B + beta C for a short k.
//
// Why: a fully connected layer's weight gradient at batch 32 is dW (4096 x 9216 for fc6) +=
// dy^T x, 32 fused multiply-adds per value of a C of 151 MB that is read and written once.
// Each value's 8 bytes of memory traffic carry only 64 flops, so the multiply must run while C
// streams: OpenBLAS's direct order, which the races had chosen, ran it at 142 GFLOP/s on a
// Zen 4's two cores (70% of the SGEMM peak; MKL's sgemm 129, PyTorch's mm 43), and a plain tile
// with C's lines loaded on demand at 154: each thread stalled on its own misses (76 GFLOP/s on
// one thread). Here each tile prefetches the C lines of the tile that comes next while it
// multiplies: 183 GFLOP/s in the same sketch (bench/RESULTS.md).
//
// The tile: 6 rows of C x 64 columns (four vectors of 16 lanes), 24 accumulators; for every k
// one load per vector of B's row and one broadcast per row of op(A), which is packed k-major
// for the tile's rows (6 x k values, in L1). B's columns run in blocks of equal width and at
// most about 512 KiB of B (4,096 columns at k = 32), which stay in L2 while a thread walks its
// rows of C over them; a thread's share is a run of (block, six rows) items, so it visits C
// row by row within a block, in runs the hardware prefetchers follow too (thin_walk.h, which
// bf16_kernel.cpp's thin form walks too). The last vector of a row's columns is masked (no
// tail loop).
//
// Each C value is one chain of fused multiply-adds in k's order from 0, then beta C added with
// one rounding (C unread when beta is 0): the skinny engine's contract, so where both take a
// call they give the same bits, and neither the threads nor the blocks change them.
//
// Two tiles, the same bits (each C value the same chain): AVX-512F's above, and on CPUs without
// it (AVX2 and FMA: Zen 2/3, Intel's without AVX-512) one of 6 rows x 16 columns (two vectors of
// 8, twelve accumulators of the sixteen registers), which runs the walk's 64 columns as four
// such tiles over the same packed rows of op(A), each prefetching its quarter of the next walk
// tile's C. It reads B packed: each thread copies its block of B into panels of 16 columns,
// k-major, when it enters the block (pack_panels says why). Its last vector is masked with
// AVX's maskload/maskstore, which touch only the mask's lanes. A build with CCT_EMULATE_AVX512
// compiles the AVX-512 tile through SIMDe (avx512.h), so that its tests run on CPUs without
// AVX-512 too.
#include "gemm_thin.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "parallel.h"
#include "thin_walk.h"
#include "workspace.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx512.h"

namespace cct {

namespace {

constexpr int kTileRows = kThinWalkRows;
constexpr int kTileVectors = 4;
constexpr int64_t kTileColumns = kThinWalkColumns;  // kTileVectors of 16
constexpr int64_t kPanelColumns = 16;  // the 8-lane tile's columns: two vectors
constexpr int64_t kBlockBytes = int64_t(512) << 10;  // B's block of columns, kept in L2

// c (R rows x V vectors of 16 columns, ldc) = op(A)'s R rows times B's columns (b, ldb), plus
// beta c: ap holds those rows k-major (row stride kTileRows). With Tail the last vector's lanes
// outside `last` are neither read (from B or C) nor written; without, every vector is whole
// (masking every tile's last vector cost 3-5%). `next` is where the tile after this one starts:
// its lines are prefetched now, a tile's arithmetic ahead of their use.
template <int R, int V, bool Tail>
CCT_AVX512F_TARGET void thin_tile(const float* ap, const float* b, int64_t ldb, int64_t k,
                                  float beta, float* c, int64_t ldc, __mmask16 last,
                                  const float* next) {
  // Integer arithmetic: `next` + rows may pass the end of C (a prefetch does not fault).
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(next);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + sizeof(float) * (r * ldc + 16 * v)),
                   _MM_HINT_T0);
  // The loops over r and v unrolled, so that GCC keeps acc in registers.
  __m512 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t q = 0; q < k; ++q) {
    __m512 x[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      x[v] = Tail && v == V - 1 ? _mm512_maskz_loadu_ps(last, b + q * ldb + 16 * v)
                                : _mm512_loadu_ps(b + q * ldb + 16 * v);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 w = _mm512_set1_ps(ap[q * kTileRows + r]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(w, x[v], acc[r][v]);
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

// thin_tile for CPUs without AVX-512F: R rows x V (1 or 2) vectors of 8 columns, the last
// vector's lanes outside `mask` (8 int32 lanes, -1 where a column is C's; unread without Tail)
// neither read nor written. `next` (R rows from it) is prefetched, as above. Written out again
// rather than one template over the vector width, as gemm_skinny.cpp's two tiles: GCC does not
// inline a target's intrinsics into a template body without a target of its own, and the masks
// differ (AVX's int lanes, AVX-512's mask register).
template <int R, int V, bool Tail>
__attribute__((target("avx2,fma"))) void thin_tile8(const float* ap, const float* b, int64_t k,
                                                   float beta, float* c, int64_t ldc,
                                                   const int32_t* mask, const float* next) {
  const __m256i last = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mask));
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(next);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
    _mm_prefetch(reinterpret_cast<const char*>(ahead + sizeof(float) * r * ldc), _MM_HINT_T0);
  __m256 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t q = 0; q < k; ++q) {
    __m256 x[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) x[v] = _mm256_loadu_ps(b + q * kPanelColumns + 8 * v);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(ap + q * kTileRows + r);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(w, x[v], acc[r][v]);
    }
  }
  const __m256 scale = _mm256_set1_ps(beta);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      float* cv = c + r * ldc + 8 * v;
      if (Tail && v == V - 1) {
        const __m256 out = beta == 0.0f  // C unread (it may hold NaN)
                               ? acc[r][v]
                               : _mm256_fmadd_ps(scale, _mm256_maskload_ps(cv, last), acc[r][v]);
        _mm256_maskstore_ps(cv, last, out);
      } else {
        _mm256_storeu_ps(cv, beta == 0.0f ? acc[r][v]
                                          : _mm256_fmadd_ps(scale, _mm256_loadu_ps(cv), acc[r][v]));
      }
    }
}

using Tile8Fn = void (*)(const float*, const float*, int64_t, float, float*, int64_t,
                         const int32_t*, const float*);

template <int R, bool Tail>
Tile8Fn tile8_of_vectors(int vectors) {
  return vectors == 1 ? thin_tile8<R, 1, Tail> : thin_tile8<R, 2, Tail>;
}

template <bool Tail>
Tile8Fn tile8_of_rows(int rows, int vectors) {
  switch (rows) {
    case 1: return tile8_of_vectors<1, Tail>(vectors);
    case 2: return tile8_of_vectors<2, Tail>(vectors);
    case 3: return tile8_of_vectors<3, Tail>(vectors);
    case 4: return tile8_of_vectors<4, Tail>(vectors);
    case 5: return tile8_of_vectors<5, Tail>(vectors);
    default: return tile8_of_vectors<6, Tail>(vectors);
  }
}

// The walk's tile of `rows` rows and `columns` columns (1 to kTileColumns) as tiles of up to 16
// columns, each prefetching the same 16 columns (one line) of the walk's next tile; bp is the
// block's B in panels of kPanelColumns (pack_panels), the first at this tile's columns.
void walk_tile8(int rows, int64_t columns, const float* ap, const float* bp, int64_t k,
                float beta, float* c, int64_t ldc, const float* next) {
  for (int64_t j = 0; j < columns; j += kPanelColumns) {
    const int64_t width = std::min<int64_t>(kPanelColumns, columns - j);
    const int tail = int(width % 8);
    int32_t mask[8];
    for (int i = 0; i < 8; ++i) mask[i] = i < tail ? -1 : 0;
    const int vectors = int((width + 7) / 8);
    (tail ? tile8_of_rows<true>(rows, vectors) : tile8_of_rows<false>(rows, vectors))(
        ap, bp + j * k, k, beta, c + j, ldc, mask, next + j);
  }
}

// B's rows [0, k) x columns [j0, j1) into panels of kPanelColumns columns, each k-major (a
// panel's values for one k contiguous), the last padded with zeros: the 8-lane tile reads B
// along each panel in order. (Read where they lie, B's k rows are n floats apart, on a fully
// connected layer a multiple of 4 KiB, so that a tile's lines of B all fall in one set of L1:
// the tile ran fc6's and fc7's weight gradients at 0.5-0.6x OpenBLAS's speed on a Zen 3, and
// 1.0-1.2x packed.)
void pack_panels(const float* b, int64_t ldb, int64_t k, int64_t j0, int64_t j1, float* bp) {
  for (int64_t j = j0; j < j1; j += kPanelColumns) {
    const int64_t width = std::min<int64_t>(kPanelColumns, j1 - j);
    for (int64_t q = 0; q < k; ++q, bp += kPanelColumns) {
      std::copy(b + q * ldb + j, b + q * ldb + j + width, bp);
      std::fill(bp + width, bp + kPanelColumns, 0.0f);
    }
  }
}

using TileFn = void (*)(const float*, const float*, int64_t, int64_t, float, float*, int64_t,
                        __mmask16, const float*);

template <int R, bool Tail>
TileFn tile_of_vectors(int vectors) {
  switch (vectors) {
    case 1: return thin_tile<R, 1, Tail>;
    case 2: return thin_tile<R, 2, Tail>;
    case 3: return thin_tile<R, 3, Tail>;
    default: return thin_tile<R, 4, Tail>;
  }
}

template <bool Tail>
TileFn tile_of_rows(int rows, int vectors) {
  switch (rows) {
    case 1: return tile_of_vectors<1, Tail>(vectors);
    case 2: return tile_of_vectors<2, Tail>(vectors);
    case 3: return tile_of_vectors<3, Tail>(vectors);
    case 4: return tile_of_vectors<4, Tail>(vectors);
    case 5: return tile_of_vectors<5, Tail>(vectors);
    default: return tile_of_vectors<6, Tail>(vectors);
  }
}

// The tile of `rows` rows (1 to kTileRows) and `columns` columns (1 to kTileColumns).
TileFn tile_of(int rows, int64_t columns) {
  const int vectors = int((columns + 15) / 16);
  return columns % 16 ? tile_of_rows<true>(rows, vectors) : tile_of_rows<false>(rows, vectors);
}

}  // namespace

bool gemm_thin_available() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

bool gemm_thin16_available() {
  static const bool has = gemm_thin_available() && CCT_CPU_HAS_AVX512F();
  return has;
}

void gemm_thin(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int lanes) {
  if (lanes != 8 && lanes != 16) throw std::invalid_argument("gemm_thin: lanes must be 8 or 16");
  if (!gemm_thin_applies(false, m, n, k, 1.0f))
    throw std::invalid_argument("gemm_thin: the call is outside the engine's form");
  const bool wide = lanes == 16 && gemm_thin16_available();
  const int64_t width = thin_walk_width(n, int64_t(sizeof(float)) * k, kBlockBytes);
  thin_walk(m, n, width, c, ldc, kTileRows * width * k, [&] {
    // A run's op(A) rows of its current item, k-major; for the 8-lane tile, its block of B in
    // panels, packed when the run enters the block into its thread's buffer (kept across
    // calls: a new one each call cost small GEMMs its page faults), at a cache line's start
    // so that no panel row straddles two.
    thread_local std::vector<float> bp_buffer;
    float* bp = nullptr;
    if (!wide) {
      const uintptr_t raw = reinterpret_cast<uintptr_t>(
          grown(bp_buffer, size_t(width * k + kPanelColumns)));
      bp = reinterpret_cast<float*>((raw + 63) / 64 * 64);
    }
    return [&, bp, ap = std::vector<float>(size_t(kTileRows * k))](
               int64_t i0, int rows, bool entered, int64_t j0, int64_t j1) mutable {
      for (int64_t q = 0; q < k; ++q)
        for (int r = 0; r < rows; ++r)
          ap[q * kTileRows + r] = ta ? a[q * lda + i0 + r] : a[(i0 + r) * lda + q];
      if (!wide && entered) pack_panels(b, ldb, k, j0, j1, bp);
      return [&, rows, i0, j0, at = ap.data(), bt = bp](int64_t j, int64_t columns,
                                                        const float* next) {
        if (!wide) {
          walk_tile8(rows, columns, at, bt + (j - j0) * k, k, beta, c + i0 * ldc + j, ldc, next);
          return;
        }
        const int tail = int(columns % 16);
        const __mmask16 last = tail ? __mmask16((1u << tail) - 1) : __mmask16(0xFFFF);
        tile_of(rows, columns)(at, b + j, ldb, k, beta, c + i0 * ldc + j, ldc, last, next);
      };
    };
  });
}

}  // namespace cct

#else
namespace cct {
// Not an x86 CPU (or not GCC/Clang): no kernel; gemm_thin_applies is false, so the races never
// pick the engine and a plan naming it runs the BLAS (gemm.cpp).
bool gemm_thin_available() { return false; }
bool gemm_thin16_available() { return false; }
void gemm_thin(bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t,
               float, float*, int64_t, int) {
  throw std::logic_error("gemm_thin: no kernel on this CPU (gemm_thin_applies is false)");
}
}  // namespace cct
#endif

namespace cct {

bool gemm_thin_applies(bool tb, int64_t m, int64_t n, int64_t k, float alpha) {
  return !tb && m >= 1 && n >= 1 && k >= 1 && k <= kThinMaxK && alpha == 1.0f &&
         gemm_thin_available();
}

}  // namespace cct
