// Intel MKL's runtime library (libmkl_rt), loaded at run time: one owner for the library that
// bf16.cpp's engines (cblas_gemm_bf16bf16f32) and gemm.cpp's float32 candidate (cblas_sgemm)
// call. cct links OpenBLAS; MKL is optional (the `mkl` and `bf16` extras install its wheel) and
// is opened with RTLD_LOCAL, so its symbols never stand in for OpenBLAS's.
//
// Threads: MKL runs on its GNU OpenMP layer where that loads (the caller checks libgomp), one
// thread by default, so that a call from cct's threads (a batch partition, a column block)
// never starts threads of its own to compete with them; a call given `threads` > 1 runs whole
// on that many MKL threads (not dynamic: a count gives one split of the work, so one set of
// bits). Loaded without the layer, MKL is sequential and `threads` is ignored.
#pragma once
#include <cstdint>
#include <string>

namespace cct {

// Loads MKL from a shared library's path, with its GNU threading layer when threaded; returns
// "" on success, else why it failed. The first load holds for the process.
std::string load_mkl(const std::string& path, bool threaded);
bool mkl_loaded();
bool mkl_threaded();  // loaded with the threading layer: a call may run on several threads
std::string mkl_version();  // MKL's version string, "" before it is loaded

// Row-major C = alpha op(A) op(B) + beta C in one MKL call on `threads` threads (see above);
// both throw when MKL is not loaded.
void mkl_sgemm(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);
// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count, X_i = X + i * stride_x (each offset
// under 2^31 elements: MKL takes 32-bit integers), in one MKL call, as mkl_sgemm; where this
// MKL has cblas_sgemm_batch_strided (mkl_has_sgemm_batch).
bool mkl_has_sgemm_batch();
void mkl_sgemm_batch_strided(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                             float alpha, const float* a, int64_t lda, int64_t stride_a,
                             const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                             int64_t ldc, int64_t stride_c, int64_t count);
void mkl_gemm_bf16(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                   float* c, int64_t ldc);

// Whether the float32 GEMM races (gemm.cpp) time MKL's sgemm as a candidate (needs MKL
// loaded; cct/backend/mkl.py turns it on where MKL is installed, unless told not to).
void set_mkl_sgemm_offered(bool on);
bool mkl_sgemm_offered();

}  // namespace cct
