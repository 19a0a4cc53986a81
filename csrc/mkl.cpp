// Intel MKL loaded at run time (see mkl.h).
#include "mkl.h"
#include "parallel.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <stdexcept>

namespace cct {

namespace {

// MKL's prototypes (mkl_cblas.h, mkl_service.h): LP64 integers, MKL_BF16 an unsigned 16-bit
// integer.
using GemmBf16 = void (*)(int layout, int trans_a, int trans_b, int m, int n, int k, float alpha,
                          const uint16_t* a, int lda, const uint16_t* b, int ldb, float beta,
                          float* c, int ldc);
using Sgemm = void (*)(int layout, int trans_a, int trans_b, int m, int n, int k, float alpha,
                       const float* a, int lda, const float* b, int ldb, float beta, float* c,
                       int ldc);
using SgemmBatchStrided = void (*)(int layout, int trans_a, int trans_b, int m, int n, int k,
                                   float alpha, const float* a, int lda, int stride_a,
                                   const float* b, int ldb, int stride_b, float beta, float* c,
                                   int ldc, int stride_c, int batch);
using SetThreadingLayer = int (*)(int layer);
using SetInt = void (*)(int value);
using SetIntLocal = int (*)(int value);
using VersionString = void (*)(char* buffer, int length);
constexpr int kMklRowMajor = 101, kMklNoTrans = 111, kMklTrans = 112;
constexpr int kMklThreadingSequential = 1, kMklThreadingGnu = 3;

std::mutex g_load_mutex;
std::atomic<GemmBf16> g_gemm_bf16{nullptr};
std::atomic<Sgemm> g_sgemm{nullptr};
std::atomic<SgemmBatchStrided> g_sgemm_batch{nullptr};  // null where this MKL lacks it
// MKL's per-thread thread count; set when MKL was loaded with its GNU OpenMP threading layer.
std::atomic<SetIntLocal> g_set_threads_local{nullptr};
std::atomic<bool> g_sgemm_offered{false};
std::string g_version;  // written once under g_load_mutex, before g_sgemm is published

int trans(bool t) { return t ? kMklTrans : kMklNoTrans; }

// Runs call() on `threads` MKL threads where MKL has its threading layer and more than one is
// asked for (then restores the calling thread's count), else as it is: one thread, the
// process-wide count load_mkl set (a column block's call, tens of microseconds, pays nothing).
template <typename F>
void on_threads(int threads, F&& call) {
  const SetIntLocal set_local = g_set_threads_local.load();
  if (set_local == nullptr || threads <= 1) return call();
  park_workers();  // MKL's OpenMP threads need the cores
  const int before = set_local(threads);
  call();
  set_local(before);
}

}  // namespace

std::string load_mkl(const std::string& path, bool threaded) {
  std::lock_guard<std::mutex> lock(g_load_mutex);
  if (g_sgemm.load() != nullptr) return "";
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return std::string(dlerror());
  auto gemm_bf16 = reinterpret_cast<GemmBf16>(dlsym(lib, "cblas_gemm_bf16bf16f32"));
  auto sgemm = reinterpret_cast<Sgemm>(dlsym(lib, "cblas_sgemm"));
  auto sgemm_batch =
      reinterpret_cast<SgemmBatchStrided>(dlsym(lib, "cblas_sgemm_batch_strided"));
  auto layer = reinterpret_cast<SetThreadingLayer>(dlsym(lib, "MKL_Set_Threading_Layer"));
  auto set_threads = reinterpret_cast<SetInt>(dlsym(lib, "MKL_Set_Num_Threads"));
  auto set_dynamic = reinterpret_cast<SetInt>(dlsym(lib, "MKL_Set_Dynamic"));
  auto set_local = reinterpret_cast<SetIntLocal>(dlsym(lib, "MKL_Set_Num_Threads_Local"));
  auto version = reinterpret_cast<VersionString>(dlsym(lib, "MKL_Get_Version_String"));
  if (gemm_bf16 == nullptr || sgemm == nullptr || layer == nullptr || set_threads == nullptr ||
      set_dynamic == nullptr || set_local == nullptr || version == nullptr) {
    dlclose(lib);
    return path + " has no cblas_gemm_bf16bf16f32 (an MKL older than 2020?)";
  }
  // The layer holds for the library's life and must be set before any other MKL call.
  if (threaded && layer(kMklThreadingGnu) == kMklThreadingGnu) {
    set_threads(1);
    set_dynamic(0);
    g_set_threads_local = set_local;
  } else {
    layer(kMklThreadingSequential);
  }
  char text[256] = {};
  version(text, int(sizeof(text)) - 1);
  g_version = text;
  g_gemm_bf16 = gemm_bf16;
  g_sgemm_batch = sgemm_batch;
  g_sgemm = sgemm;
  return "";
}

bool mkl_loaded() { return g_sgemm.load() != nullptr; }
bool mkl_threaded() { return g_set_threads_local.load() != nullptr; }

std::string mkl_version() {
  std::lock_guard<std::mutex> lock(g_load_mutex);
  return g_version;
}

void mkl_sgemm(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  const Sgemm sgemm = g_sgemm.load();
  if (sgemm == nullptr) throw std::runtime_error("MKL's sgemm without MKL loaded");
  on_threads(threads, [&] {
    sgemm(kMklRowMajor, trans(ta), trans(tb), int(m), int(n), int(k), alpha, a, int(lda), b,
          int(ldb), beta, c, int(ldc));
  });
}

bool mkl_has_sgemm_batch() { return g_sgemm_batch.load() != nullptr; }

void mkl_sgemm_batch_strided(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                             float alpha, const float* a, int64_t lda, int64_t stride_a,
                             const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                             int64_t ldc, int64_t stride_c, int64_t count) {
  const SgemmBatchStrided batch = g_sgemm_batch.load();
  if (batch == nullptr) throw std::runtime_error("MKL's batched sgemm without MKL loaded");
  on_threads(threads, [&] {
    batch(kMklRowMajor, trans(ta), trans(tb), int(m), int(n), int(k), alpha, a, int(lda),
          int(stride_a), b, int(ldb), int(stride_b), beta, c, int(ldc), int(stride_c),
          int(count));
  });
}

void mkl_gemm_bf16(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                   float* c, int64_t ldc) {
  const GemmBf16 gemm = g_gemm_bf16.load();
  if (gemm == nullptr) throw std::runtime_error("bf16 GEMM without its engine loaded");
  on_threads(threads, [&] {
    gemm(kMklRowMajor, trans(ta), trans(tb), int(m), int(n), int(k), alpha, a, int(lda), b,
         int(ldb), beta, c, int(ldc));
  });
}

void set_mkl_sgemm_offered(bool on) {
  if (on && !mkl_loaded())
    throw std::runtime_error("MKL's sgemm cannot join the GEMM races: MKL is not loaded");
  g_sgemm_offered = on;
}

bool mkl_sgemm_offered() { return g_sgemm_offered.load(std::memory_order_relaxed); }

}  // namespace cct
