// bf16 GEMMs on Intel MKL's cblas_gemm_bf16bf16f32 or cct's own kernel (see bf16.h).
#include "bf16.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "mkl.h"
#include "parallel.h"
#include "workspace.h"

namespace cct {

namespace {

constexpr int kMkl = kBf16Mkl, kMklThreaded = kBf16MklThreaded, kKernel = kBf16Kernel;
constexpr const char* kEngineNames[] = {"mkl", "mkl_threaded", "avx512bf16"};

std::atomic<bool> g_on{false};
std::atomic<int> g_engine{kMkl};
std::atomic<int> g_shape_engines{0};  // bit e: engine e offered to the per-shape races

// Columns of C per engine call when a GEMM is split over cct's threads: a multiple of the
// 16 float32 lanes of an AMX tile row and of an AVX-512 register.
constexpr int64_t kColumnBlock = 64;

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
__attribute__((target_clones("avx2", "default")))
#endif
void round_block(const float* src, uint16_t* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = to_bf16(src[i]);
}

// The rows x cols matrix at src (leading dimension ld) as contiguous bf16, rounded by cct's
// threads.
uint16_t* rounded_copy(std::vector<uint16_t>& buffer, const float* src, int64_t rows,
                       int64_t cols, int64_t ld) {
  uint16_t* dst = grown(buffer, size_t(rows * cols));
  parallel_for(rows, cols, [&](int64_t begin, int64_t end) {
    if (ld == cols) {
      round_block(src + begin * ld, dst + begin * cols, (end - begin) * cols);
    } else {
      for (int64_t r = begin; r < end; ++r) round_block(src + r * ld, dst + r * cols, cols);
    }
  });
  return dst;
}

}  // namespace

bool cpu_has_bf16_units() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  static const bool has =
      __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
  return has;
#else
  return false;
#endif
}

void set_bf16_engine(const std::string& name) {
  if (name == "mkl" || name == "mkl_threaded") {
    if (!mkl_loaded())
      throw std::runtime_error("bf16 engine '" + name +
                               "' is not loaded: call load_mkl first");
    if (name == "mkl_threaded" && !mkl_threaded())
      throw std::runtime_error("bf16 engine 'mkl_threaded' needs MKL loaded with its GNU "
                               "threading layer (load_mkl(path, threaded=True))");
    g_engine = name == "mkl" ? kMkl : kMklThreaded;
  } else if (name == "avx512bf16") {
    if (!bf16_kernel_supported())
      throw std::runtime_error("bf16 engine 'avx512bf16' needs a CPU with AVX512-BF16");
    g_engine = kKernel;
  } else {
    throw std::runtime_error("unknown bf16 engine '" + name +
                             "' (expected mkl, mkl_threaded or avx512bf16)");
  }
}

std::string bf16_engine() { return kEngineNames[g_engine.load()]; }

bool bf16_engine_runs(int engine) {
  switch (engine) {
    case kMkl: return mkl_loaded();
    case kMklThreaded: return mkl_loaded() && mkl_threaded();
    case kKernel: return bf16_kernel_supported();
    default: return false;
  }
}

void set_bf16_shape_engines(const std::vector<std::string>& names) {
  int bits = 0;
  for (const std::string& name : names) {
    const auto named = std::find(std::begin(kEngineNames), std::end(kEngineNames), name);
    const int engine = int(named - std::begin(kEngineNames));
    if (engine != kMklThreaded && engine != kKernel)
      throw std::runtime_error("bf16 engine '" + name + "' cannot race shape by shape (expected "
                               "mkl_threaded or avx512bf16)");
    bits |= 1 << engine;
  }
  g_shape_engines = bits;
}

std::vector<std::string> bf16_shape_engines() {
  std::vector<std::string> names;
  for (int engine : {kMklThreaded, kKernel})
    if (g_shape_engines.load() & (1 << engine)) names.push_back(kEngineNames[engine]);
  return names;
}

bool bf16_shape_engine_offered(int engine) {
  return (g_shape_engines.load(std::memory_order_relaxed) & (1 << engine)) &&
         engine != g_engine.load() && bf16_engine_runs(engine);
}

void set_bf16_gemm(bool on) {
  if (on && g_engine != kKernel && !mkl_loaded())
    throw std::runtime_error("bf16 GEMMs need an engine: call load_mkl first, or "
                             "set_bf16_engine('avx512bf16') on a CPU with AVX512-BF16");
  g_on = on;
}

bool bf16_gemm_enabled() { return g_on.load(std::memory_order_relaxed); }

void round_to_bf16(const float* src, uint16_t* dst, int64_t count) {
  round_block(src, dst, count);
}

namespace {

// Sixteen columns (channels) x nr rows (pixels) of a column-strided source, rounded as channel
// pairs: pairs[j][r] holds column 2j's value in its low half and 2j + 1's in its high half, as
// they lie in dst's row r. Each column's run is read in order, which the prefetchers follow
// (reading 16 x 16 tiles straight across the columns ran at 2.5 GB/s, a cache miss at a time).
void round_column_pairs_scalar(const float* src, int64_t r0, int64_t nr, int64_t src_cs,
                               uint32_t (*pairs)[256]) {
  for (int64_t j = 0; j < 8; ++j) {
    const float* lo = src + 2 * j * src_cs;
    const float* hi = lo + src_cs;
    for (int64_t r = r0; r < nr; ++r)
      pairs[j][r] = uint32_t(to_bf16_daz(lo[r])) | uint32_t(to_bf16_daz(hi[r])) << 16;
  }
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
// Eight float32 lanes rounded as to_bf16_daz, each lane's bf16 in its high half (the compiler
// left to itself spilled registers here and ran at 5 GB/s).
__attribute__((target("avx2"))) inline __m256i rounded_high_daz(__m256i u) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                         _mm256_set1_epi32(0x7F800000));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
  const __m256i denormal = _mm256_cmpeq_epi32(
      _mm256_and_si256(u, _mm256_set1_epi32(0x7F800000)), _mm256_setzero_si256());
  return _mm256_blendv_epi8(r, _mm256_and_si256(u, _mm256_set1_epi32(int(0x80000000u))),
                            denormal);
}

__attribute__((target("avx2"))) void round_column_pairs_avx2(const float* src, int64_t nr,
                                                             int64_t src_cs,
                                                             uint32_t (*pairs)[256]) {
  const int64_t whole = nr / 8 * 8;
  for (int64_t j = 0; j < 8; ++j) {
    const float* lo = src + 2 * j * src_cs;
    const float* hi = lo + src_cs;
    for (int64_t r = 0; r < whole; r += 8) {
      const __m256i l = rounded_high_daz(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + r)));
      const __m256i h = rounded_high_daz(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + r)));
      const __m256i pair = _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi32(int(0xFFFF0000u))),
                                           _mm256_srli_epi32(l, 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs[j] + r), pair);
    }
  }
  round_column_pairs_scalar(src, whole, nr, src_cs, pairs);
}

// dst[i] = to_bf16_daz(src[i]) for i < count, sixteen at a time.
__attribute__((target("avx2"))) void round_run_avx2(const float* src, uint16_t* dst,
                                                    int64_t count) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i a = rounded_high_daz(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m256i b = rounded_high_daz(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)));
    // packus works within 128-bit lanes: a0-3 b0-3 a4-7 b4-7, put back in order
    const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(a, 16), _mm256_srli_epi32(b, 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0)));
  }
  for (; i < count; ++i) dst[i] = to_bf16_daz(src[i]);
}
#endif

// A contiguous run rounded as to_bf16_daz.
void round_run(const float* src, uint16_t* dst, int64_t count) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return round_run_avx2(src, dst, count);
#endif
  for (int64_t i = 0; i < count; ++i) dst[i] = to_bf16_daz(src[i]);
}

// Sixteen columns' rows r < nr as pairs (above).
void round_column_pairs(const float* src, int64_t nr, int64_t src_cs, uint32_t (*pairs)[256]) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return round_column_pairs_avx2(src, nr, src_cs, pairs);
#endif
  round_column_pairs_scalar(src, 0, nr, src_cs, pairs);
}

// dst's rows r < nr (dst_ld apart), 16 bf16 each, from pairs: eight rows at a time through an
// 8 x 8 transpose of 32-bit lanes in AVX registers where the CPU has AVX2.
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
__attribute__((target("avx2"))) void store_pair_rows_avx2(const uint32_t (*pairs)[256],
                                                          int64_t nr, uint16_t* dst,
                                                          int64_t dst_ld) {
  int64_t r = 0;
  for (; r + 8 <= nr; r += 8) {
    __m256 t[8], s[8];
    for (int j = 0; j < 8; j += 2) {
      const __m256 a = _mm256_loadu_ps(reinterpret_cast<const float*>(pairs[j] + r));
      const __m256 b = _mm256_loadu_ps(reinterpret_cast<const float*>(pairs[j + 1] + r));
      t[j] = _mm256_unpacklo_ps(a, b);
      t[j + 1] = _mm256_unpackhi_ps(a, b);
    }
    for (int h = 0; h < 8; h += 4) {
      s[h] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
      s[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
      s[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
      s[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int q = 0; q < 4; ++q) {  // rows q and q + 4 of the eight: s[q]'s and s[q + 4]'s
      _mm256_storeu_ps(reinterpret_cast<float*>(dst + (r + q) * dst_ld),
                       _mm256_permute2f128_ps(s[q], s[q + 4], 0x20));
      _mm256_storeu_ps(reinterpret_cast<float*>(dst + (r + q + 4) * dst_ld),
                       _mm256_permute2f128_ps(s[q], s[q + 4], 0x31));
    }
  }
  for (; r < nr; ++r)
    for (int64_t j = 0; j < 8; ++j) std::memcpy(dst + r * dst_ld + 2 * j, &pairs[j][r], 4);
}
#endif

void store_pair_rows(const uint32_t (*pairs)[256], int64_t nr, uint16_t* dst, int64_t dst_ld) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return store_pair_rows_avx2(pairs, nr, dst, dst_ld);
#endif
  for (int64_t r = 0; r < nr; ++r)
    for (int64_t j = 0; j < 8; ++j) std::memcpy(dst + r * dst_ld + 2 * j, &pairs[j][r], 4);
}

}  // namespace

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void round_to_bf16_daz_2d(const float* src, int64_t rows, int64_t cols, int64_t src_rs,
                          int64_t src_cs, uint16_t* dst, int64_t dst_ld, int64_t padded_cols) {
  if (src_cs == 1 || src_rs != 1) {  // row by row (a strided row is rare: read as it comes)
    for (int64_t r = 0; r < rows; ++r) {
      const float* s = src + r * src_rs;
      uint16_t* d = dst + r * dst_ld;
      if (src_cs == 1) {
        round_run(s, d, cols);
      } else {
        for (int64_t c = 0; c < cols; ++c) d[c] = to_bf16_daz(s[c * src_cs]);
      }
      std::fill(d + cols, d + padded_cols, uint16_t(0));
    }
    return;
  }
  // Sixteen columns x up to 256 rows at a time, through a buffer in L1.
  constexpr int64_t kCols = 16, kRows = 256;
  alignas(64) uint32_t pairs[kCols / 2][kRows];
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int64_t nr = std::min(kRows, rows - r0);
    int64_t c0 = 0;
    for (; c0 + kCols <= cols; c0 += kCols) {
      round_column_pairs(src + c0 * src_cs + r0, nr, src_cs, pairs);
      store_pair_rows(pairs, nr, dst + r0 * dst_ld + c0, dst_ld);
    }
    for (int64_t c = c0; c < cols; ++c) {  // the last columns, under sixteen
      const float* s = src + c * src_cs + r0;
      for (int64_t r = 0; r < nr; ++r) dst[(r0 + r) * dst_ld + c] = to_bf16_daz(s[r]);
    }
    for (int64_t r = 0; r < nr; ++r)
      std::fill(dst + (r0 + r) * dst_ld + cols, dst + (r0 + r) * dst_ld + padded_cols,
                uint16_t(0));
  }
}

void widen_bf16(const uint16_t* src, float* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t u = uint32_t(src[i]) << 16;
    std::memcpy(&dst[i], &u, sizeof(u));
  }
}

namespace {

// MKL on operands already in bf16 (contiguous rows, a16's of a_cols values, b16's of b_ld):
// whole on MKL's threads (mkl_threaded, outside a partition), else one call per column block.
void mkl_gemm(int chosen, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
              const uint16_t* a16, int64_t a_cols, const uint16_t* b16, int64_t b_ld, float beta,
              float* c, int64_t ldc) {
  const int threads = num_threads();  // 1 inside a partition (SerialScope)
  if (chosen == kMklThreaded && threads > 1) {
    // The whole GEMM in one call on MKL's own threads: AMX's tiles want large, whole GEMMs
    // (a 3072^3 bf16 GEMM on two Sapphire Rapids cores: 709 GFLOP/s one thread, 1,489 two
    // threads of MKL's, against column blocks of 64 on cct's threads). MKL's split of the work
    // follows the thread count: the result does too.
    return mkl_gemm_bf16(threads, ta, tb, m, n, k, alpha, a16, a_cols, b16, b_ld, beta, c, ldc);
  }
  const int blocks = int((n + kColumnBlock - 1) / kColumnBlock);
  // One engine call per column block whatever the thread count, so that the result does not
  // depend on how the blocks fall to threads.
  parallel_for(blocks, m * k * kColumnBlock, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t j0 = block * kColumnBlock, j1 = std::min(n, j0 + kColumnBlock);
      mkl_gemm_bf16(1, ta, tb, m, j1 - j0, k, alpha, a16, a_cols,
                    b16 + (tb ? j0 * b_ld : j0), b_ld, beta, c + j0, ldc);
    }
  });
}

}  // namespace

void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_bf16_on(g_engine.load(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bf16_on(int chosen, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                  float* c, int64_t ldc) {
  if (chosen == kKernel)
    return gemm_bf16_kernel(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  // Separate from thread_workspace(): the lowered matrix being multiplied lives there.
  thread_local std::vector<uint16_t> a_buffer, b_buffer;
  const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  const uint16_t* a16 = rounded_copy(a_buffer, a, a_rows, a_cols, lda);
  const uint16_t* b16 = rounded_copy(b_buffer, b, b_rows, b_cols, ldb);
  mkl_gemm(chosen, ta, tb, m, n, k, alpha, a16, a_cols, b16, b_cols, beta, c, ldc);
}

bool bf16_takes_rounded_operands() {
  return g_on.load(std::memory_order_relaxed) && g_engine.load() != kKernel;
}

void gemm_bf16_rounded_b(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float* a, int64_t lda, const uint16_t* b16, int64_t ldb,
                         float beta, float* c, int64_t ldc) {
  const int chosen = g_engine.load();
  if (chosen == kKernel)
    throw std::runtime_error("gemm_bf16_rounded_b without an MKL engine");
  thread_local std::vector<uint16_t> a_buffer;
  const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const uint16_t* a16 = rounded_copy(a_buffer, a, a_rows, a_cols, lda);
  mkl_gemm(chosen, ta, tb, m, n, k, alpha, a16, a_cols, b16, ldb, beta, c, ldc);
}

void gemm_bf16_rounded(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const uint16_t* a16, const uint16_t* b16, float beta, float* c,
                       int64_t ldc) {
  const int chosen = g_engine.load();
  if (chosen == kKernel) throw std::runtime_error("gemm_bf16_rounded without an MKL engine");
  mkl_gemm(chosen, ta, tb, m, n, k, alpha, a16, ta ? m : k, b16, tb ? k : n, beta, c, ldc);
}

}  // namespace cct
