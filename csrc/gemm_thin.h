// A float32 GEMM engine for a short summed dimension: C (m x n) = op(A) B + beta C with
// k <= kThinMaxK and B stored k x n, row-major: a fully connected layer's weight gradient at a
// small batch (dW = dy^T x, k the batch). gemm.cpp races it against the BLAS's two operand
// orders and the other engines (gemm_measured).
#pragma once
#include <cstdint>

namespace cct {

constexpr int64_t kThinMaxK = 256;

// Whether this CPU has the engine's kernel (x86-64 with AVX2 and FMA), and its 16-lane tile
// (AVX-512F as well).
bool gemm_thin_available();
bool gemm_thin16_available();

// Whether gemm_thin takes such a call: B stored k x n (not tb), 1 <= k <= kThinMaxK, alpha 1,
// and the kernel on this CPU.
bool gemm_thin_applies(bool tb, int64_t m, int64_t n, int64_t k, float alpha);

// C (m x n, ldc) = op(A) B + beta C; op(A) is m x k (A stored m x k, or k x m when ta), B is
// k x n (ldb). Each C[i][j] is one chain of fused multiply-adds in k's order from 0, then
// fma(beta, C[i][j], chain) (C not read when beta is 0): the skinny engine's contract
// (gemm_skinny.h), so the two give the same bits where both apply, whatever the threads and
// whichever tile: `lanes` 16 runs AVX-512F's where the CPU has it, else (and with 8) AVX2's.
void gemm_thin(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int lanes = 16);

}  // namespace cct
