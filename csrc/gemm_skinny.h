// A float32 GEMM engine for results with few rows whose large operand streams along the summed
// dimension: C (m x n) = op(A) op(B) + beta C with m <= kSkinnyMaxRows, and B stored n x k
// (op(B) = B^T: a fully connected layer's forward) or k x n (op(B) = B: its backward data),
// row-major. gemm.cpp races it against the BLAS's two operand orders (gemm_measured).
#pragma once
#include <cstdint>

namespace cct {

constexpr int64_t kSkinnyMaxRows = 64;

// Whether this CPU has the engine's kernel (x86-64 with AVX2 and FMA).
bool gemm_skinny_available();

// Whether it also has the kernel's 16-lane tile (AVX-512F), which gives the same bits.
bool gemm_skinny16_available();

// Whether gemm_skinny takes such a call: 1 <= m <= kSkinnyMaxRows, alpha 1, and the kernel on
// this CPU.
bool gemm_skinny_applies(int64_t m, int64_t n, int64_t k, float alpha);

// C (m x n, ldc) = op(A) op(B) + beta C; op(A) is m x k (A stored m x k, or k x m when ta), B is
// n x k with tb, else k x n (ldb). Each C[i][j] is one chain of fused multiply-adds in k's order
// from 0, then fma(beta, C[i][j], chain) (C not read when beta is 0), whatever the threads: its
// bits depend on the shape and the values alone, and not on `lanes`: the tile's vectors of 8
// lanes, or of 16 where the CPU has them (else 8).
void gemm_skinny(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                 int lanes = 8);

}  // namespace cct
