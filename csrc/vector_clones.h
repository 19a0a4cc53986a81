// CCT_VECTOR_CLONES: a function compiled three times, for AVX-512, for AVX2 and for the baseline,
// the clone chosen at load time for the CPU it runs on (GCC's target_clones on x86-64). For loops
// written plainly for the compiler to vectorize (the Winograd transforms, pooling across a row's
// windows, LRN): the baseline build alone would give them SSE2's 4 lanes, and AVX2's 8 leave
// half of an AVX-512 CPU's vector width unused (the Winograd input transform took more time
// than the GEMMs on an Intel Xeon). Element by element, the clones compute the same bits: the
// files that use this build with -ffp-contract=off (CMakeLists.txt), since AVX-512F brings its
// own FMA, which would otherwise fuse a*b+c in that clone alone. Elsewhere (Clang, other CPUs)
// a function is built once.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CCT_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CCT_VECTOR_CLONES
#endif
