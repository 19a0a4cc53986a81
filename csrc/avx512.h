// The AVX-512F tiles' target and CPU check (gemm_skinny.cpp's 16-lane tile, gemm_thin.cpp's 16-lane
// tile, conv_direct.cpp's 16-pixel and weight-gradient tiles) and the AVX512-BF16 tiles'
// (bf16_kernel.cpp), in one place so that a test build can run those tiles on a CPU without
// AVX-512.
//
// Why: cct's own AVX-512 code runs only where a CPU has AVX-512, and the races pick it by speed,
// so a wrong index in it would train wrong numbers on exactly those CPUs, and no test on an AVX2
// machine (CI's, this project's) would have run it. A build configured with CMake's
// CCT_EMULATE_AVX512 (SIMDe's include folder) compiles those tiles for AVX2 and FMA, with
// SIMDe's portable AVX-512 intrinsics: each 512-bit FMA is two 256-bit FMAs, each lane rounded
// once as AVX-512's would be. tests/backend/test_avx512_emulated.py builds it and runs the
// tiles' tests on it, which compare them to the 8-lane tiles and to the FMA chains they promise.
// Nothing else in the build changes: SIMDe is compiled under AVX2's target only, between the
// pragmas below, and the rest of each file keeps the build's own target. A test build only:
// the emulated tiles are slower than the 8-lane ones.
//
// bf16_kernel.cpp's tiles on AVX512-BF16 (with AVX512BW's integer operations) are emulated too,
// for the same reason: they run only on a Zen 4 or a Xeon with bf16 units. Not SIMDe's
// VDPBF16PS, which (compiled by GCC for x86) adds the low half's product first and keeps
// denormals, so it does not give the instruction's bits (24 of test_bf16_kernel.py's tests
// fail on it). cct_emulated_dpbf16_ps below does the instruction as Intel's SDM writes it;
// test_bf16_kernel.py checks the kernel's chains against that definition, on the hardware
// where a CPU has the instruction and on this build where it does not.
// Not emulated: the compiler's AVX-512 clones of CCT_VECTOR_CLONES (vector_clones.h), which
// the emulated build's dispatch never picks on a CPU without AVX-512.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#if defined(CCT_EMULATE_AVX512)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <cmath>
#include <cstdint>
#include <cstring>

#include <simde/x86/avx512.h>
// AVX-512's masked load and store touch only the mask's lanes (the thin engine's last vector of
// a row, whose other lanes lie past C's row or past its end). SIMDe's read and write all 16, its
// store writing 0 to the lanes outside the mask: these emulate the hardware's instead.
static inline simde__m512 cct_emulated_maskz_loadu_ps(simde__mmask16 k, const float* p) {
  float v[16] = {};
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) v[i] = p[i];
  return simde_mm512_loadu_ps(v);
}
static inline simde__m512 cct_emulated_mask_loadu_ps(simde__m512 src, simde__mmask16 k,
                                                     const float* p) {
  float v[16];
  simde_mm512_storeu_ps(v, src);
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) v[i] = p[i];
  return simde_mm512_loadu_ps(v);
}
static inline void cct_emulated_mask_storeu_ps(float* p, simde__mmask16 k, simde__m512 a) {
  float v[16];
  simde_mm512_storeu_ps(v, a);
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) p[i] = v[i];
}
static inline simde__m512i cct_emulated_maskz_loadu_epi32(simde__mmask16 k, const void* p) {
  int32_t v[16] = {};
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) std::memcpy(v + i, static_cast<const char*>(p) + 4 * i, 4);
  return simde_mm512_loadu_si512(v);
}
// One step of VDPBF16PS in one lane: acc + x y as one FMA rounded to nearest even, denormal
// inputs read as zero and a denormal result flushed to a zero of its sign. x86 detects a tiny
// result after rounding (to float32's 24 bits with the exponent unbounded), so a sum just
// under 2^-126 that rounds up to it is kept: fmaf rounds to the denormal grid instead, so
// there the step is done again on operands scaled by 2^64, where the grid is the normal one.
// (An exact sum under 2^-100 needs |acc| and |x y| under 2^-60: a larger one, a float32 or a
// product of two bf16, leaves a multiple of 2^-83. So the scaled operands are exact.)
static inline float cct_emulated_daz(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}
static inline float cct_emulated_dpbf16_step(float acc, float x, float y) {
  acc = cct_emulated_daz(acc), x = cct_emulated_daz(x), y = cct_emulated_daz(y);
  const float r = __builtin_fmaf(x, y, acc);
  if (r == 0.0f || !(std::fabs(r) < 0x1p-100f)) return r;  // NaN too
  const float s = __builtin_fmaf(x * 0x1p64f, y, acc * 0x1p64f);
  return std::fabs(s) < 0x1p-62f ? std::copysign(0.0f, s) : s * 0x1p-64f;
}
// VDPBF16PS as the SDM's Operation section has it: lane i adds the product of a's and b's
// bf16 number 2i+1 (the lane's high half), then that of number 2i (its low half).
static inline simde__m512 cct_emulated_dpbf16_ps(simde__m512 acc, simde__m512bh a,
                                                 simde__m512bh b) {
  float sum[16];
  uint32_t pa[16], pb[16];
  simde_mm512_storeu_ps(sum, acc);
  std::memcpy(pa, &a, sizeof pa);
  std::memcpy(pb, &b, sizeof pb);
  const auto value = [](uint32_t half) {
    float f;
    const uint32_t bits = half << 16;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  for (int i = 0; i < 16; ++i) {
    sum[i] = cct_emulated_dpbf16_step(sum[i], value(pa[i] >> 16), value(pb[i] >> 16));
    sum[i] = cct_emulated_dpbf16_step(sum[i], value(pa[i] & 0xFFFF), value(pb[i] & 0xFFFF));
  }
  return simde_mm512_loadu_ps(sum);
}
#pragma GCC pop_options
// The tiles' AVX-512 types and intrinsics, as SIMDe's. Named one by one rather than through
// SIMDe's native aliases, which would declare the types again beside GCC's immintrin.h. A tile
// given an intrinsic not named here fails to build emulated (GCC: "target specific option
// mismatch"): name it here too.
#define __m512 simde__m512
#define __mmask16 simde__mmask16
#define _mm512_add_ps simde_mm512_add_ps
#define _mm512_broadcast_f64x4 simde_mm512_broadcast_f64x4
#define _mm512_castpd_ps simde_mm512_castpd_ps
#define _mm512_castps_pd simde_mm512_castps_pd
#define _mm512_castps512_ps256 simde_mm512_castps512_ps256
#define _mm512_extractf64x4_pd simde_mm512_extractf64x4_pd
#define _mm512_fmadd_ps simde_mm512_fmadd_ps
#define _mm512_loadu_ps simde_mm512_loadu_ps
#define _mm512_mask_loadu_ps cct_emulated_mask_loadu_ps
#define _mm512_mask_storeu_ps cct_emulated_mask_storeu_ps
#define _mm512_maskz_loadu_ps cct_emulated_maskz_loadu_ps
#define _mm512_mask_blend_ps simde_mm512_mask_blend_ps
#define _mm512_max_ps simde_mm512_max_ps
#define _mm512_min_ps simde_mm512_min_ps
#define _mm512_mul_ps simde_mm512_mul_ps
#define _mm512_set1_ps simde_mm512_set1_ps
#define _mm512_setzero_ps simde_mm512_setzero_ps
#define _mm512_storeu_ps simde_mm512_storeu_ps
// bf16_kernel.cpp's, besides.
#define __m512i simde__m512i
#define __m512bh simde__m512bh
#define _mm512_add_epi32 simde_mm512_add_epi32
#define _mm512_and_si512 simde_mm512_and_si512
#define _mm512_cmpgt_epu32_mask(a, b) simde_mm512_cmp_epu32_mask(a, b, SIMDE_MM_CMPINT_NLE)
#define _mm512_dpbf16_ps cct_emulated_dpbf16_ps
#define _mm512_loadu_si512 simde_mm512_loadu_si512
#define _mm512_mask_mov_epi32 simde_mm512_mask_mov_epi32
#define _mm512_maskz_loadu_epi32 cct_emulated_maskz_loadu_epi32
#define _mm512_or_si512 simde_mm512_or_si512
#define _mm512_permutex2var_epi32 simde_mm512_permutex2var_epi32
#define _mm512_set1_epi32 simde_mm512_set1_epi32
#define _mm512_set_epi32 simde_mm512_set_epi32
#define _mm512_setzero_si512 simde_mm512_setzero_si512
#define _mm512_srli_epi32 simde_mm512_srli_epi32
#define _mm512_store_si512 simde_mm512_store_si512
#define _mm512_storeu_si512 simde_mm512_storeu_si512
#define CCT_AVX512F_TARGET __attribute__((target("avx2,fma")))
#define CCT_CPU_HAS_AVX512F() (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
#define CCT_AVX512BF16_TARGET CCT_AVX512F_TARGET
#define CCT_CPU_HAS_AVX512BF16() CCT_CPU_HAS_AVX512F()
#else
#define CCT_AVX512F_TARGET __attribute__((target("avx512f")))
#define CCT_CPU_HAS_AVX512F() __builtin_cpu_supports("avx512f")
// bf16_kernel.cpp's tiles: VDPBF16PS with AVX512BW's and AVX512VL's integer operations.
#define CCT_AVX512BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define CCT_CPU_HAS_AVX512BF16()                                                   \
  (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") && \
   __builtin_cpu_supports("avx512vl"))
#endif
#endif
