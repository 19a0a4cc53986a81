// bf16 GEMMs on Intel MKL's cblas_gemm_bf16bf16f32 or cct's own kernel (see bf16.h).
#include "bf16.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <vector>

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
