// oneDNN's convolutions and matmul, loaded at run time: one more layout in the convolution
// races (conv.cpp's kOnednn) and one more bf16 engine in the GEMM races (gemm.cpp's choice
// 13), for the CPUs where a library kernel beats cct's own. Issue 34's case: on
// an Intel Xeon with AMX, oneDNN's bf16 convolutions run on AMX's tiles over the whole batch,
// the engine PyTorch's bf16 uses there; cct's bf16 GEMMs reach AMX only through MKL's GEMM on
// lowered matrices. Like every layout it is timed against the others on its first call per
// geometry and kept only where it wins.
//
// cct links no oneDNN: the `onednn` extra installs Intel's wheel (onednn-cpu-gomp, oneDNN 3.x
// with GNU OpenMP), whose libdnnl.so.3 cct/backend/onednn.py finds and loads here with
// RTLD_LOCAL. Only oneDNN's C API is called, through prototypes declared in onednn.cpp (its ABI
// is stable within a major version; the loader refuses another major).
//
// Data: the blobs stay cct's float32 NCHW. Each call reorders its operands into the layouts
// oneDNN's kernel asked for (blocked channels, and bf16 under cct's bf16 GEMMs: one pass that
// rounds to nearest even, as cct's own bf16 does) and its result back to NCHW float32 (adding
// into the weight diff when asked). Accumulation is float32 in both precisions, as in cct's bf16
// GEMMs: the operands are bf16, never the sums.
//
// Threads: oneDNN runs each call whole on `num_threads()` OpenMP threads (GNU OpenMP's
// per-thread count, set around the call), cct's workers parked first so that the cores are
// oneDNN's. Its sums depend on its blocking, which depends on the thread count: the thread count
// is part of every cached primitive's key, as it is of the plans'.
#pragma once
#include <cstdint>
#include <string>

#include "kernels.h"

namespace cct {

// Loads libdnnl from a shared library's path and opens a CPU engine; "" on success, else why
// not. The first load holds for the process.
std::string load_onednn(const std::string& path);
bool onednn_loaded();
std::string onednn_version();  // "3.2.0 (commit ...)", "" before it is loaded

// Whether the convolution races time oneDNN's layout, in float32 and under bf16 GEMMs (needs
// oneDNN loaded; cct/backend/onednn.py turns it on where oneDNN is installed, for bf16 unless
// told otherwise).
void set_onednn_offered(bool float32, bool bf16);
bool onednn_offered(bool bf16);

// kernel: 0 forward, 1 backward data, 2 backward weight (conv.cpp's Kernel).
// Whether oneDNN has a kernel of its own (not its reference code) for this convolution in this
// precision, bias and fused ReLU included; false where oneDNN is not loaded. The answer, and the
// primitive it built to find out, are kept for the process.
bool onednn_conv_applies(int kernel, const ConvGeom& g, bool bf16);
// The implementation oneDNN chose ("brg:avx512_core_amx", "jit:avx512_core_bf16", ...), or ""
// where it has none.
std::string onednn_conv_impl(int kernel, const ConvGeom& g, bool bf16);

// The three kernels on the whole batch; each throws where onednn_conv_applies is false.
// forward: y = conv(x, weight) + bias (bias may be null), then max(y, 0) with relu.
void onednn_conv_forward(bool bf16, const float* x, const float* weight, const float* bias,
                         bool relu, float* y, const ConvGeom& g);
void onednn_conv_backward_data(bool bf16, const float* dy, const float* weight, float* dx,
                               const ConvGeom& g);
// dweight = (or += with accumulate) the weight gradient summed over the batch.
void onednn_conv_backward_weight(bool bf16, const float* x, const float* dy, float* dweight,
                                 bool accumulate, const ConvGeom& g);

// A strided batched GEMM for oneDNN's matmul: C[i] (m x n, row stride ldc) = op(A[i]) op(B[i])
// (+ C[i] with accumulate) for i < count, A[i] at a + i * stride_a (stride 0: one matrix for
// every item, a convolution's weights), B[i] and C[i] likewise; a plain GEMM is count 1.
struct MatmulShape {
  bool ta, tb;
  int64_t m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, count;
  bool accumulate;
};
// Whether oneDNN has a kernel of its own (not its reference code) for this product with bf16
// operands; false where oneDNN is not loaded. Kept for the process, like the convolutions'.
bool onednn_matmul_applies(const MatmulShape& s);
// The implementation oneDNN chose ("brg:avx512_core_amx", ...), or "" where it has none.
std::string onednn_matmul_impl(const MatmulShape& s);
// The product with bf16 operands and float32 accumulation and result, as cct's bf16 GEMMs:
// oneDNN's reorders round A and B to bf16 (to nearest even, as cct's rounding does; a denormal
// may become zero where they use AVX512-BF16's conversion instruction) into buffers of the
// calling thread's, and its matmul multiplies them on the thread count of the call (1 inside a
// batch partition; then several partitions run it at once). Its sums follow oneDNN's blocking:
// its own bits, fixed per shape and thread count. Returns false, having run nothing, where
// onednn_matmul_applies is false (one look-up of the shape's primitive for both answers).
bool onednn_matmul_bf16(const MatmulShape& s, const float* a, const float* b, float* c);
// Frees the calling thread's bf16 buffers of onednn_matmul_bf16 (a race oneDNN lost gives them
// back; the next call that runs it grows them again).
void onednn_release_matmul_buffer();

}  // namespace cct
