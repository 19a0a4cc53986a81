// bf16 mixed precision for cct's float32 GEMMs (cct train --precision=bf16).
//
// The weights, their history and the update stay float32 (the solver never sees bf16); while
// bf16 is on, every float32 GEMM that goes through gemm() in gemm.h (the lowered convolution's,
// InnerProduct's) rounds its two operands to bf16 (round to nearest even) and multiplies them
// with float32 accumulation in the bf16 GEMM engine, writing float32 as before.
//
// Three engines, which Python picks between by timing them (cct/backend/precision.py):
// - Intel MKL's cblas_gemm_bf16bf16f32, loaded at run time (mkl.h) from the path the Python
//   side finds (the `mkl` wheel, cct[bf16]): AMX or AVX512-BF16 kernels on Intel CPUs, a float32
//   emulation elsewhere (correct, but slower than cct's float32: that is why Python turns bf16
//   on only where the CPU has the units, or when asked to emulate them). On AMD's Zen 4, which
//   has AVX512-BF16, MKL 2026.2 still emulates: half cct's float32 speed. Two ways to call it:
//   "mkl", blocks of 64 columns of C spread over cct's threads, one MKL thread each (the result
//   independent of the thread count), and "mkl_threaded", the whole GEMM in one call on MKL's
//   own OpenMP threads (GNU layer), as AMX wants it; inside a batch partition both are one
//   call per column block.
// - cct's own kernel on AVX512-BF16's VDPBF16PS (bf16_kernel.cpp): no library, any CPU with
//   the instruction. Like VDPBF16PS, it treats denormal bf16 operands as zero.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace cct {

// The engines by number: set_bf16_engine's names in this order.
enum Bf16Engine : int { kBf16Mkl = 0, kBf16MklThreaded = 1, kBf16Kernel = 2 };

// Whether this CPU (and the OS) runs bf16 arithmetic natively: AVX512-BF16 or AMX-BF16.
bool cpu_has_bf16_units();

// Picks the engine: "mkl", "mkl_threaded" (need MKL loaded, mkl.h's load_mkl; the second with
// its threading layer) or "avx512bf16" (needs the CPU's support); throws otherwise. MKL until
// set.
void set_bf16_engine(const std::string& name);
std::string bf16_engine();
// Whether `engine` can run now: MKL loaded (with its threading layer for kBf16MklThreaded),
// or the CPU's AVX512-BF16 for cct's kernel.
bool bf16_engine_runs(int engine);

// The engines that bf16 GEMMs race shape by shape besides the chosen one (gemm.cpp's choices
// 8 and 9): "mkl_threaded" and "avx512bf16" where they beat float32 on the engine race's GEMM
// (cct/backend/precision.py). One engine wins that race on a convolution-sized GEMM; on an
// AMX Xeon MKL's whole-GEMM calls are expected to win the large ones and lose the small ones
// (OpenMP's start, AMX's 16-row tiles) to cct's kernel, which the per-shape race can then
// give them. None until set; "mkl" (column blocks) is never offered: it is the engine of
// thread-count-independent results, which a per-shape race does not give anyway.
void set_bf16_shape_engines(const std::vector<std::string>& names);
std::vector<std::string> bf16_shape_engines();
// Whether the per-shape races offer `engine`: set so, runnable, and not the chosen engine
// (whose GEMMs the plain bf16 choices already run).
bool bf16_shape_engine_offered(int engine);
bool bf16_kernel_supported();  // the CPU runs cct's own kernel (AVX512-BF16, -BW, -VL)

// Turns bf16 GEMMs on or off (on needs the chosen engine; throws otherwise).
void set_bf16_gemm(bool on);
bool bf16_gemm_enabled();

// float32 -> bf16, round to nearest even; NaN stays NaN (a payload in the low half only would
// round to infinity: it is kept a quiet NaN).
inline uint16_t to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return uint16_t(nan ? (u >> 16) | 0x40u : rounded);
}
void round_to_bf16(const float* src, uint16_t* dst, int64_t count);
// bf16 -> float32 (exact).
void widen_bf16(const uint16_t* src, float* dst, int64_t count);

// gemm()'s float32 contract (row-major C = alpha op(A) op(B) + beta C) with bf16 operands.
void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// Whether bf16 GEMMs are on with an MKL engine, which multiplies operands already in bf16: a
// caller that makes an operand itself (the lowered convolution's im2col, its gathered top
// diff) can write it in bf16 and call gemm_bf16_rounded_b or gemm_bf16_rounded, sparing a
// float32 copy written and read back to be rounded. cct's kernel rounds while it packs: no
// such copy to spare.
bool bf16_takes_rounded_operands();
// gemm_bf16 with B given in bf16 (k x n, or n x k with tb; leading dimension ldb): the same
// bits.
void gemm_bf16_rounded_b(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float* a, int64_t lda, const uint16_t* b16, int64_t ldb,
                         float beta, float* c, int64_t ldc);
// gemm_bf16 with both operands given in bf16, contiguous (A m x k, or k x m with ta; B k x n,
// or n x k with tb): the same bits.
void gemm_bf16_rounded(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const uint16_t* a16, const uint16_t* b16, float beta, float* c,
                       int64_t ldc);
// gemm_bf16 on `engine` rather than the chosen one. The caller checks that it runs
// (bf16_engine_runs): not checked again here, on every bf16 GEMM's path.
void gemm_bf16_on(int engine, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                  float* c, int64_t ldc);
// The same on cct's own kernel, whatever engine is chosen (bf16_kernel_supported() only).
void gemm_bf16_kernel(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc);

// cct's kernel in the skinny engine's form (gemm_skinny.h): C (m x n) = op(A) B^T + beta C
// with m <= kBf16SkinnyMaxRows and B stored n x k (a fully connected layer's forward at a small
// batch: B its weights, rounded as they stream from memory rather than packed first). The
// same bits as gemm_bf16_kernel's with alpha 1, whatever the threads. gemm.cpp races it under
// bf16 as GEMM choice 11.
constexpr int64_t kBf16SkinnyMaxRows = 64;
// Whether it takes a call: op(B) = B^T, 1 <= m <= kBf16SkinnyMaxRows, alpha 1, and cct's
// kernel on this CPU.
bool gemm_bf16_skinny_applies(bool tb, int64_t m, int64_t n, int64_t k, float alpha);
void gemm_bf16_skinny(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// cct's kernel in the thin engine's form (gemm_thin.h): C (m x n) = op(A) B + beta C with
// k <= kBf16ThinMaxK and B stored k x n (a fully connected layer's weight gradient at a small
// batch, k the batch; a lowered convolution's backward data with few filters). The same bits as gemm_bf16_kernel's with alpha 1, whatever the threads.
// gemm.cpp races it under bf16 as GEMM choice 12.
constexpr int64_t kBf16ThinMaxK = 256;
// Whether it takes a call: op(B) = B, 1 <= k <= kBf16ThinMaxK, alpha 1, and cct's kernel on
// this CPU.
bool gemm_bf16_thin_applies(bool tb, int64_t m, int64_t n, int64_t k, float alpha);
void gemm_bf16_thin(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                    const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace cct
