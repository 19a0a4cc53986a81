// GEMM with the operand order chosen by measurement.
//
// C = op(A) op(B) can also be computed as C^T = op(B)^T op(A)^T followed by a transpose of the
// m x n result. On shapes with a long inner dimension and a small result (the weight gradients
// of convolution and inner product layers) OpenBLAS's speed depends strongly on that order:
// measured here, up to 4x either way, with no simple rule. The first call with a given shape
// times both orders on scratch outputs and caches the faster; later calls just run it. The
// two orders round differently, so the choice is part of what makes a run reproducible: the
// table can be saved and installed in another process (cct/backend/plans.py).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gemm.h"
#include "kernels.h"
#include "parallel.h"

namespace cct {

namespace {

// ta tb m n k element-size BLAS-threads
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int>;
std::mutex g_mutex;
std::map<Key, bool> g_transposed;
std::atomic<int> g_order{0};  // 0 measure, 1 direct, 2 transposed

template <typename F>
double seconds_of(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// C (m x n, ldc) = beta C + T^T, T being n x m (contiguous).
template <typename T>
void add_transposed(const T* t, int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  parallel_for(m, n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T* row = c + i * ldc;
      if (beta == T(0)) {
        for (int64_t j = 0; j < n; ++j) row[j] = t[j * m + i];
      } else {
        for (int64_t j = 0; j < n; ++j) row[j] = beta * row[j] + t[j * m + i];
      }
    }
  });
}

template <typename T>
void gemm_transposed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                     int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc,
                     std::vector<T>& scratch) {
  scratch.resize(size_t(m * n));
  gemm(!tb, !ta, n, m, k, alpha, b, ldb, a, lda, T(0), scratch.data(), m);
  add_transposed(scratch.data(), m, n, beta, c, ldc);
}

template <typename T>
bool choose_transposed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a,
                       int64_t lda, const T* b, int64_t ldb, std::vector<T>& scratch) {
  if (g_order != 0) return g_order == 2;
  // bf16 GEMMs (bf16.h) take their own orders: element size 2.
  const int64_t size = std::is_same_v<T, float> && bf16_gemm_enabled() ? 2 : int64_t(sizeof(T));
  const Key key{ta, tb, m, n, k, size, blas_get_num_threads()};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_transposed.find(key);
    if (it != g_transposed.end()) return it->second;
    if (!plan_measurement()) return g_transposed.emplace(key, false).first->second;
  }
  std::vector<T> out(size_t(m * n));
  const double direct =
      seconds_of([&] { gemm(ta, tb, m, n, k, T(1), a, lda, b, ldb, T(0), out.data(), n); });
  const double transposed = seconds_of([&] {
    gemm_transposed(ta, tb, m, n, k, T(1), a, lda, b, ldb, T(0), out.data(), n, scratch);
  });
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_transposed.emplace(key, transposed < direct).first->second;
}

}  // namespace

template <typename T>
void gemm_measured(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  thread_local std::vector<T> scratch;
  if (choose_transposed(ta, tb, m, n, k, a, lda, b, ldb, scratch)) {
    gemm_transposed(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, scratch);
  } else {
    gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

std::vector<GemmChoice> gemm_choices() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<GemmChoice> out;
  for (const auto& [key, transposed] : g_transposed)
    out.emplace_back(std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<3>(key),
                     std::get<4>(key), std::get<5>(key), std::get<6>(key), transposed);
  return out;
}

void load_gemm_choices(const std::vector<GemmChoice>& entries) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& [ta, tb, m, n, k, size, threads, transposed] : entries)
    g_transposed[Key{ta, tb, m, n, k, size, threads}] = transposed;
}

int64_t gemm_choice_count() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return int64_t(g_transposed.size());
}

void clear_gemm_choices() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_transposed.clear();
}

void set_gemm_order(int order) {
  if (order < 0 || order > 2) throw std::invalid_argument("gemm order must be 0, 1 or 2");
  g_order = order;
}

template void gemm_measured<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                   int64_t, const float*, int64_t, float, float*, int64_t);
template void gemm_measured<double>(bool, bool, int64_t, int64_t, int64_t, double,
                                    const double*, int64_t, const double*, int64_t, double,
                                    double*, int64_t);

}  // namespace cct
