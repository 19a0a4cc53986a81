// The AVX-512F tiles' target and CPU check (gemm_skinny.cpp's 16-lane tile, gemm_thin.cpp's
// tile, conv_direct.cpp's 16-pixel tile), in one place so that a test build can run those tiles
// on a CPU without AVX-512.
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
// Not emulated: bf16_kernel.cpp's VDPBF16PS (SIMDe sums each pair of products in the other
// order and keeps denormals, so it would not stand for the hardware's bits), and the compiler's
// AVX-512 clones of CCT_VECTOR_CLONES (vector_clones.h), which the emulated build's dispatch
// never picks on a CPU without AVX-512.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#if defined(CCT_EMULATE_AVX512)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
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
static inline void cct_emulated_mask_storeu_ps(float* p, simde__mmask16 k, simde__m512 a) {
  float v[16];
  simde_mm512_storeu_ps(v, a);
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) p[i] = v[i];
}
#pragma GCC pop_options
// The tiles' AVX-512 types and intrinsics, as SIMDe's. Named one by one rather than through
// SIMDe's native aliases, which would declare the types again beside GCC's immintrin.h. A tile
// given an intrinsic not named here fails to build emulated (GCC: "target specific option
// mismatch"): name it here too.
#define __m512 simde__m512
#define __mmask16 simde__mmask16
#define _mm512_fmadd_ps simde_mm512_fmadd_ps
#define _mm512_loadu_ps simde_mm512_loadu_ps
#define _mm512_mask_storeu_ps cct_emulated_mask_storeu_ps
#define _mm512_maskz_loadu_ps cct_emulated_maskz_loadu_ps
#define _mm512_set1_ps simde_mm512_set1_ps
#define _mm512_setzero_ps simde_mm512_setzero_ps
#define _mm512_storeu_ps simde_mm512_storeu_ps
#define CCT_AVX512F_TARGET __attribute__((target("avx2,fma")))
#define CCT_CPU_HAS_AVX512F() (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
#else
#define CCT_AVX512F_TARGET __attribute__((target("avx512f")))
#define CCT_CPU_HAS_AVX512F() __builtin_cpu_supports("avx512f")
#endif
#endif
