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
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  CCT_BLAS_SYM(cblas_sgemm)(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(m),
                            int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                 double* c, int64_t ldc) {
  CCT_BLAS_SYM(cblas_dgemm)(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(m),
                            int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
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
