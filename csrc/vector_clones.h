// CCT_VECTOR_CLONES: a function compiled twice, for AVX2 and for the baseline, the clone chosen
// at load time for the CPU it runs on (GCC's target_clones on x86-64). For loops written plainly
// for the compiler to vectorize (the Winograd transforms, pooling across a row's windows): the
// baseline build alone would give them SSE2's 4 lanes. Elsewhere (Clang, other CPUs) a
// function is built once.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CCT_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CCT_VECTOR_CLONES
#endif
