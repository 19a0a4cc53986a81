// BLAS access for cct's kernels: row-major GEMM in float and double, and control of the BLAS
// thread count.
//
// Two builds (chosen by setup.py, see CMakeLists.txt):
//   CCT_BLAS_SCIPY   OpenBLAS from the scipy-openblas32 wheel, whose symbols carry the prefix
//                    `scipy_` (scipy_cblas_sgemm, scipy_openblas_set_num_threads ...); its
//                    library is copied next to cct/_C*.so and found through an $ORIGIN rpath.
//   (otherwise)      the system's BLAS from CMake's find_package(BLAS), plain CBLAS names;
//                    thread control only when that BLAS is OpenBLAS (weak symbols).
// The prototypes are declared here rather than taken from a cblas.h, so that the system build
// needs no BLAS headers. The interface is LP64 (32-bit integers), as in both builds.
#pragma once
#include <cstdint>

#include "bf16.h"
#include "parallel.h"

#if defined(CCT_BLAS_SCIPY)
#define CCT_BLAS_SYM(name) scipy_##name
#else
#define CCT_BLAS_SYM(name) name
#endif

extern "C" {
void CCT_BLAS_SYM(cblas_sgemm)(int order, int trans_a, int trans_b, int m, int n, int k,
                               float alpha, const float* a, int lda, const float* b, int ldb,
                               float beta, float* c, int ldc);
void CCT_BLAS_SYM(cblas_dgemm)(int order, int trans_a, int trans_b, int m, int n, int k,
                               double alpha, const double* a, int lda, const double* b, int ldb,
                               double beta, double* c, int ldc);
// Strided batched GEMM (OpenBLAS >= 0.3.30): weak, so that a BLAS without it still links and
// gemm_batch_strided falls back to one GEMM per item.
void CCT_BLAS_SYM(cblas_sgemm_batch_strided)(int order, int trans_a, int trans_b, int m, int n,
                                             int k, float alpha, const float* a, int lda,
                                             int stride_a, const float* b, int ldb, int stride_b,
                                             float beta, float* c, int ldc, int stride_c,
                                             int count) __attribute__((weak));
void CCT_BLAS_SYM(cblas_dgemm_batch_strided)(int order, int trans_a, int trans_b, int m, int n,
                                             int k, double alpha, const double* a, int lda,
                                             int stride_a, const double* b, int ldb,
                                             int stride_b, double beta, double* c, int ldc,
                                             int stride_c, int count) __attribute__((weak));
#if defined(CCT_BLAS_SCIPY)
void scipy_openblas_set_num_threads(int num_threads);
int scipy_openblas_get_num_threads(void);
char* scipy_openblas_get_config(void);
#else
void openblas_set_num_threads(int num_threads) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
char* openblas_get_config(void) __attribute__((weak));
#endif
}

namespace cct {

enum : int { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };

// C (m x n) = alpha op(A) op(B) + beta C, all row-major; op(A) is m x k, op(B) is k x n.
// In float32 with bf16 operands while bf16 GEMMs are on (bf16.h).
// float32_only: in float32 whatever the precision (the float32 calls the races make under bf16,
// Winograd's 6x6 tiles' products, gemm_batch_measured's float32 choices).
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                 bool float32_only = false) {
  if (!float32_only && bf16_gemm_enabled())
    return gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  park_workers();  // the BLAS's threads need the cores
  CCT_BLAS_SYM(cblas_sgemm)(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(m),
                            int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                 double* c, int64_t ldc, bool /*float32_only*/ = false) {
  park_workers();
  CCT_BLAS_SYM(cblas_dgemm)(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(m),
                            int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count, where X_i = X + i * stride_x (a stride
// of 0 reuses one operand for every item); the C_i must not overlap. One BLAS call where the
// BLAS has a strided batched GEMM (which spreads the items over its threads), else one GEMM
// per item.
template <typename T>
void gemm_batch_strided(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                        int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b,
                        T beta, T* c, int64_t ldc, int64_t stride_c, int64_t count,
                        bool float32_only = false) {
  constexpr bool is_float = sizeof(T) == sizeof(float);
  // bf16 GEMMs go item by item through gemm(), which rounds the operands.
  const bool have = is_float ? CCT_BLAS_SYM(cblas_sgemm_batch_strided) != nullptr &&
                                   (float32_only || !bf16_gemm_enabled())
                             : CCT_BLAS_SYM(cblas_dgemm_batch_strided) != nullptr;
  // The BLAS takes 32-bit strides: offsets past 2^31 elements go item by item.
  const int64_t limit = int64_t(1) << 31;
  if (have && count > 1 && stride_a * count < limit && stride_b * count < limit &&
      stride_c * count < limit) {
    park_workers();
    if constexpr (is_float) {
      CCT_BLAS_SYM(cblas_sgemm_batch_strided)(
          kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(m), int(n), int(k),
          alpha, a, int(lda), int(stride_a), b, int(ldb), int(stride_b), beta, c, int(ldc),
          int(stride_c), int(count));
    } else {
      CCT_BLAS_SYM(cblas_dgemm_batch_strided)(
          kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(m), int(n), int(k),
          alpha, a, int(lda), int(stride_a), b, int(ldb), int(stride_b), beta, c, int(ldc),
          int(stride_c), int(count));
    }
    return;
  }
  for (int64_t i = 0; i < count; ++i)
    gemm(ta, tb, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
         c + i * stride_c, ldc, float32_only);
}

// Whether the linked BLAS has a strided batched GEMM.
inline bool blas_has_batch_strided() {
  return CCT_BLAS_SYM(cblas_sgemm_batch_strided) != nullptr;
}

inline void blas_set_num_threads(int n) {
#if defined(CCT_BLAS_SCIPY)
  scipy_openblas_set_num_threads(n);
#else
  if (openblas_set_num_threads) openblas_set_num_threads(n);
#endif
}

// The BLAS's own thread count, or 0 when the BLAS does not say.
inline int blas_get_num_threads() {
#if defined(CCT_BLAS_SCIPY)
  return scipy_openblas_get_num_threads();
#else
  return openblas_get_num_threads ? openblas_get_num_threads() : 0;
#endif
}

// A description of the BLAS linked in (OpenBLAS's config string where available).
inline const char* blas_config() {
#if defined(CCT_BLAS_SCIPY)
  return scipy_openblas_get_config();
#else
  return openblas_get_config ? openblas_get_config() : "system BLAS (not OpenBLAS)";
#endif
}

}  // namespace cct
