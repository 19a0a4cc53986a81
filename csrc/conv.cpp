// Convolution lowered to GEMM over the whole mini-batch (Caffe con Troll), forward, backward
// data and backward weight, with groups, pad, stride, dilation and rectangular kernels.
//
// Per group g the input is lowered (im2col) into a K x M matrix, K = C/group * kh * kw rows
// (channel, tap) and M = images * Ho * Wo columns (image, output pixel), and one GEMM does the
// group's work for all those images:
//   forward          Yt (O/g x M) = W_g (O/g x K) * cols (K x M), then Yt -> y (N, O, Ho, Wo)
//   backward data    dcols (K x M) = W_g^T * dYt, then col2im (the adjoint of im2col) -> dx
//   backward weight  dW_g (O/g x K) += dYt (O/g x M) * cols^T
// Caffe instead lowers one image at a time and multiplies small matrices.
//
// The images are taken in chunks so that the lowered matrices of one chunk fit a workspace
// budget (col_buffer_limit(), 64 MiB by default: on CaffeNet b256 as fast as 128
// and 64 MB less resident): the whole batch when it fits, which covers
// most layers; otherwise as many images as fit (each chunk's GEMM is still large: M is
// thousands of columns). The workspace is per thread and reused between calls, so a training
// step does not page-fault fresh buffers in.
//
// Batch partitioning (run_partitioned): alternatively each core takes its own slice of the
// batch and lowers and multiplies it alone, in cache-sized chunks, with single-threaded BLAS.
// Which of the two runs a layer is measured on its first call and cached (run_with_plan);
// neither wins everywhere.
//
// Pointwise layout (CcT's "no expansion"): a 1x1 convolution with stride 1 and no pad needs no
// lowering at all. Image n's bottom x[n, grp * C/g ...] already is the C/g x P matrix the GEMM
// reads, and its top y[n, grp * O/g ...] the O/g x P matrix it writes, so per group one GEMM per
// image (a strided batched GEMM where the BLAS has one) works on the blobs themselves, with no
// workspace, gather or scatter. Whether that beats the lowered layout (one long GEMM, but a
// gather and a scatter through memory) depends on the shape: it is measured with the
// partitioning, per layer and kernel.
//
// Direct layout (conv_direct.cpp): stride-1 float layers on AVX2/FMA CPUs computed from the
// blobs with no lowered matrix at all; the thin layers of small nets, where the lowered GEMM is
// bound by memory, are where it wins. It is one more candidate, measured like the others.
//
// Winograd layouts (conv_winograd.cpp): F(2x2, 3x3) and F(2x2, 5x5) for 3x3 and 5x5 stride-1
// float layers, and F(4x4, 3x3) for 3x3 ones as a layout of its own, all three kernels: 16 or
// 36 GEMMs over transformed tiles, 2.25x, 2.78x or 4x fewer multiplications; for the layers
// where the lowered GEMM is already compute-bound. Which tile pays depends on the layer (a
// 13x13 top wastes 34% of 4x4 tiles, 14% of 2x2 ones): both are measured.
//
// oneDNN's layout (onednn.h): where oneDNN is installed, its convolution on the whole batch, in
// float32 or (under bf16 GEMMs) with bf16 operands; the engine of AMX's tiles on Intel's Xeons.
// One more candidate, measured like the others; never a rule's plan.
//
// Phase layouts (conv_phase.cpp): a strided undilated float layer as a stride-1 one over its
// bottom's phase planes, computed by the direct or a Winograd layout; CaffeNet's 11x11
// stride-4 conv1 becomes a 3x3 layer for Winograd. Measured like the others.
//
// The lowered layout's GEMMs go through gemm_measured, which races the operand orders and the
// other engines per shape (gemm.cpp: MKL's sgemm where offered, the small-GEMM kernels
// OpenBLAS lacks on Intel for these 32- and 64-row products); the deterministic rule runs the
// direct order, as a plain gemm() call would. The weight gradient's (long inner dimension M,
// small result) adds into the weight diff when asked (Caffe accumulates param diffs over
// iter_size and shared params).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "conv_direct.h"
#include "conv_phase.h"
#include "conv_winograd.h"
#include "gemm.h"
#include "kernels.h"
#include "onednn.h"
#include "parallel.h"
#include "race.h"
#include "workspace.h"

namespace cct {

// A grow-only per-thread scratch area.
struct Workspace {
  std::unique_ptr<char[]> data;
  size_t size = 0;
  void* get(size_t bytes) {
    if (bytes > size) {
      data.reset();  // release first: never hold both the old and the new buffer
      data.reset(new char[bytes]);
      size = bytes;
    }
    return data.get();
  }
};

thread_local Workspace t_workspace;

void* thread_workspace(size_t bytes) { return t_workspace.get(bytes); }

namespace {

int64_t g_col_buffer_limit = int64_t(64) << 20;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The output columns [lo, hi) whose input column ow * stride + offset lies inside [0, size).
inline void valid_range(int64_t offset, int64_t stride, int64_t size, int64_t out, int64_t* lo,
                        int64_t* hi) {
  int64_t l = offset >= 0 ? 0 : ceil_div(-offset, stride);
  int64_t h = size - offset <= 0 ? 0 : ceil_div(size - offset, stride);
  *lo = std::min(l, out);
  *hi = std::max(*lo, std::min(h, out));
}

// A bottom value as the lowered matrix holds it: itself, or (Out uint16_t) rounded to bf16.
template <typename Out, typename T>
inline Out lowered(T value) {
  if constexpr (std::is_same_v<Out, uint16_t>) {
    return to_bf16(value);
  } else {
    return value;
  }
}

// Rows (c, i, j) of group `grp`, columns (image n0 .. n1, output pixel) into cols (K x M), in
// T or (Out uint16_t, from float) in bf16.
template <typename T, typename Out = T>
void im2col(const T* x, const ConvGeom& g, int64_t grp, int64_t n0, int64_t n1, Out* cols) {
  const int64_t cg = g.c / g.group, taps = int64_t(g.kh) * g.kw, k = cg * taps;
  const int64_t nb = n1 - n0, p = g.ho * g.wo, m = nb * p, plane = g.h * g.w;
  parallel_for(k * nb, p, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t nn = item / k, r = item % k;
      const int64_t cl = r / taps, i = (r / g.kw) % g.kh, j = r % g.kw;
      const T* src = x + ((n0 + nn) * g.c + grp * cg + cl) * plane;
      Out* dst = cols + r * m + nn * p;
      const int64_t off_w = j * g.dw - g.pw;
      int64_t lo, hi;
      valid_range(off_w, g.sw, g.w, g.wo, &lo, &hi);
      for (int64_t oh = 0; oh < g.ho; ++oh, dst += g.wo) {
        const int64_t ih = oh * g.sh - g.ph + i * g.dh;
        if (ih < 0 || ih >= g.h) {
          std::fill(dst, dst + g.wo, Out(0));
          continue;
        }
        // Plain loops, not memcpy/fill: rows are short (16 to 55 values in the zoo's nets) and
        // a library call per row cost as much as the copy.
        const T* row = src + ih * g.w + off_w;
        for (int64_t ow = 0; ow < lo; ++ow) dst[ow] = Out(0);
        if (g.sw == 1) {
          for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = lowered<Out>(row[ow]);
        } else {
          for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = lowered<Out>(row[ow * g.sw]);
        }
        for (int64_t ow = hi; ow < g.wo; ++ow) dst[ow] = Out(0);
      }
    }
  });
}

// The adjoint of im2col: dx[n, c] = sum over taps of the columns that read it. Each (image,
// channel) plane is owned by one thread, zeroed and then accumulated while it is in cache.
template <typename T>
void col2im(const T* cols, const ConvGeom& g, int64_t grp, int64_t n0, int64_t n1, T* dx) {
  const int64_t cg = g.c / g.group, taps = int64_t(g.kh) * g.kw;
  const int64_t nb = n1 - n0, p = g.ho * g.wo, m = nb * p, plane = g.h * g.w;
  parallel_for(cg * nb, taps * p, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t nn = item / cg, cl = item % cg;
      T* dst = dx + ((n0 + nn) * g.c + grp * cg + cl) * plane;
      std::fill(dst, dst + plane, T(0));
      for (int64_t i = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j) {
          const T* src = cols + ((cl * g.kh + i) * g.kw + j) * m + nn * p;
          const int64_t off_w = j * g.dw - g.pw;
          int64_t lo, hi;
          valid_range(off_w, g.sw, g.w, g.wo, &lo, &hi);
          for (int64_t oh = 0; oh < g.ho; ++oh, src += g.wo) {
            const int64_t ih = oh * g.sh - g.ph + i * g.dh;
            if (ih < 0 || ih >= g.h) continue;
            T* row = dst + ih * g.w + off_w;
            if (g.sw == 1) {
              for (int64_t ow = lo; ow < hi; ++ow) row[ow] += src[ow];
            } else {
              for (int64_t ow = lo; ow < hi; ++ow) row[ow * g.sw] += src[ow];
            }
          }
        }
      }
    }
  });
}

// What a channel's top value becomes once its GEMM has summed it: + *bias where there is one,
// through caffe_relu with `relu`. Calls body(op) with that op, one lambda type per case, so that
// each case's loop is compiled (and vectorized) on its own; not at all when op is the identity.
// The bias is read once: a top row might alias it as far as the compiler knows, and a load per
// element would keep the loop from vectorizing.
template <typename T, typename Body>
void with_top_op(const T* bias, bool relu, Body&& body) {
  const T b = bias ? *bias : T(0);
  if (bias && relu) {
    body([b](T v) { return caffe_relu(v + b, T(0)); });
  } else if (bias) {
    body([b](T v) { return v + b; });
  } else if (relu) {
    body([](T v) { return caffe_relu(v, T(0)); });
  }
}

// y[n0 + nn, grp * og + o, :] = yt[o, nn * P : (nn + 1) * P] (+ bias[grp * og + o]), through
// caffe_relu with `relu`.
template <typename T>
void scatter_top(const T* yt, const T* bias, bool relu, const ConvGeom& g, int64_t grp,
                 int64_t n0, int64_t n1, T* y) {
  const int64_t og = g.o / g.group, nb = n1 - n0, p = g.ho * g.wo, m = nb * p;
  parallel_for(og * nb, p, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t nn = item / og, o = item % og;
      const T* src = yt + o * m + nn * p;
      T* dst = y + ((n0 + nn) * g.o + grp * og + o) * p;
      if (!bias && !relu) {
        std::memcpy(dst, src, size_t(p) * sizeof(T));
        continue;
      }
      with_top_op(bias ? bias + grp * og + o : nullptr, relu, [&](auto op) {
        for (int64_t q = 0; q < p; ++q) dst[q] = op(src[q]);
      });
    }
  });
}

// The inverse of scatter_top (without bias): gather a group's top diff into O/g x M, in T or
// (Out uint16_t, from float) rounded to bf16 as the bf16 GEMM rounds its operands.
template <typename T, typename Out = T>
void gather_top(const T* dy, const ConvGeom& g, int64_t grp, int64_t n0, int64_t n1, Out* dyt) {
  const int64_t og = g.o / g.group, nb = n1 - n0, p = g.ho * g.wo, m = nb * p;
  parallel_for(og * nb, p, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t nn = item / og, o = item % og;
      const T* src = dy + ((n0 + nn) * g.o + grp * og + o) * p;
      if constexpr (std::is_same_v<Out, uint16_t>) {
        round_to_bf16(src, dyt + o * m + nn * p, p);
      } else {
        std::memcpy(dyt + o * m + nn * p, src, size_t(p) * sizeof(T));
      }
    }
  });
}

// Images per chunk: as many as keep the chunk's K x M lowered input and O/g x M top within
// the workspace budget, at least one.
template <typename T>
int64_t chunk_images(const ConvGeom& g, int64_t images, int64_t budget) {
  const int64_t k = g.c / g.group * g.kh * g.kw, og = g.o / g.group;
  const int64_t per_image = (k + og) * g.ho * g.wo * int64_t(sizeof(T));
  return std::max<int64_t>(1, std::min<int64_t>(images, budget / per_image));
}

struct Buffers {
  void* base;
  int64_t k, og, m;
  template <typename T> T* cols() const { return static_cast<T*>(base); }
  template <typename T> T* top() const { return static_cast<T*>(base) + k * m; }
};

template <typename T>
Buffers workspace_for(const ConvGeom& g, int64_t nb) {
  const int64_t k = g.c / g.group * g.kh * g.kw, og = g.o / g.group, m = nb * g.ho * g.wo;
  return {thread_workspace(size_t((k + og) * m) * sizeof(T)), k, og, m};
}

// A chunk of one image needs no gathering: its top (or top diff) for group grp is the block
// y[n, grp * O/g ...] itself, O/g x P with leading dimension P, which the GEMM reads or writes
// in place. A 1x1 convolution with stride 1 and no pad needs no lowering either: its columns
// are the bottom's channels x[n, grp * C/g ...], C/g x P.
inline bool is_pointwise(const ConvGeom& g) {
  return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
}

// One channel's top row (p values) as the GEMM left it, through with_top_op's op in place.
template <typename T>
void finish_top_row(T* row, int64_t p, const T* bias, bool relu) {
  with_top_op(bias, relu, [&](auto op) {
    for (int64_t q = 0; q < p; ++q) row[q] = op(row[q]);
  });
}

// finish_top_row over group grp's channels of image n.
template <typename T>
void finish_top(const T* bias, bool relu, const ConvGeom& g, int64_t grp, int64_t n, T* y) {
  if (!bias && !relu) return;
  const int64_t og = g.o / g.group, p = g.ho * g.wo;
  for (int64_t o = 0; o < og; ++o)
    finish_top_row(y + (n * g.o + grp * og + o) * p, p, bias ? bias + grp * og + o : nullptr,
                   relu);
}

// finish_top_row over images [n0, n1), every channel.
template <typename T>
void finish_top_range(const T* bias, bool relu, const ConvGeom& g, int64_t n0, int64_t n1,
                      T* y) {
  if (!bias && !relu) return;
  const int64_t p = g.ho * g.wo;
  parallel_for((n1 - n0) * g.o, p, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item)
      finish_top_row(y + (n0 * g.o + item) * p, p, bias ? bias + item % g.o : nullptr, relu);
  });
}

// The three kernels over images [begin, end), in chunks of at most `budget` workspace bytes.
template <typename T>
void forward_range(const T* x, const T* weight, const T* bias, bool relu, T* y,
                   const ConvGeom& g, int64_t begin, int64_t end, int64_t budget) {
  const int64_t step = chunk_images<T>(g, end - begin, budget);
  const int64_t cg = g.c / g.group, p = g.ho * g.wo;
  for (int64_t n0 = begin; n0 < end; n0 += step) {
    const int64_t n1 = std::min(end, n0 + step);
    const Buffers buf = workspace_for<T>(g, n1 - n0);
    const bool single = n1 - n0 == 1, direct = single && is_pointwise(g);
    // bf16 on an MKL engine, the shape's race run and won by the bf16 GEMM in the direct
    // order: lowered straight into bf16, which the engine multiplies, rather than into float32
    // written, read back and rounded (bf16.h); the same bits. Until the race has run, and
    // where float32 or an engine raced shape by shape won it, the columns are float32.
    const bool in_bf16 = std::is_same_v<T, float> && !direct && bf16_takes_rounded_operands() &&
                         gemm_known_choice<T>(false, false, buf.og, buf.m, buf.k, T(0)) == 0;
    for (int64_t grp = 0; grp < g.group; ++grp) {
      const T* w = weight + grp * buf.og * buf.k;
      // One image: its top block in y is the product (buf.m == p); else buf's top, scattered.
      T* top = single ? y + (n0 * g.o + grp * buf.og) * p : buf.top<T>();
      if constexpr (std::is_same_v<T, float>) {
        if (in_bf16) {
          uint16_t* cols16 = buf.cols<uint16_t>();
          im2col(x, g, grp, n0, n1, cols16);
          gemm_bf16_rounded_b(false, false, buf.og, buf.m, buf.k, 1.0f, w, buf.k, cols16, buf.m,
                              0.0f, top, buf.m);
        }
      }
      if (!in_bf16) {
        const T* cols = direct ? x + (n0 * g.c + grp * cg) * p : buf.cols<T>();
        if (!direct) im2col(x, g, grp, n0, n1, buf.cols<T>());
        gemm_measured(false, false, buf.og, buf.m, buf.k, T(1), w, buf.k, cols, buf.m, T(0),
                      top, buf.m);
      }
      if (single) {
        finish_top(bias, relu, g, grp, n0, y);
      } else {
        scatter_top(buf.top<T>(), bias, relu, g, grp, n0, n1, y);
      }
    }
  }
}

template <typename T>
void backward_data_range(const T* dy, const T* weight, T* dx, const ConvGeom& g, int64_t begin,
                         int64_t end, int64_t budget) {
  const int64_t step = chunk_images<T>(g, end - begin, budget);
  const int64_t cg = g.c / g.group, p = g.ho * g.wo;
  for (int64_t n0 = begin; n0 < end; n0 += step) {
    const int64_t n1 = std::min(end, n0 + step);
    const Buffers buf = workspace_for<T>(g, n1 - n0);
    const bool single = n1 - n0 == 1, direct = single && is_pointwise(g);
    // bf16 on an MKL engine, the shape's race run and won by the bf16 GEMM in this order: a
    // chunk's top diff gathered straight into bf16, which the engine multiplies, rather than
    // into float32 written, read back and rounded (one image's is read in place: no gather).
    const bool in_bf16 = std::is_same_v<T, float> && !single && bf16_takes_rounded_operands() &&
                         gemm_known_choice<T>(true, false, buf.k, buf.m, buf.og, T(0)) == 0;
    for (int64_t grp = 0; grp < g.group; ++grp) {
      const T* w = weight + grp * buf.og * buf.k;
      // A pointwise convolution's dcols are dx's channels: each bottom element gets one term.
      T* dcols = direct ? dx + (n0 * g.c + grp * cg) * p : buf.cols<T>();
      if constexpr (std::is_same_v<T, float>) {
        if (in_bf16) {
          uint16_t* dyt16 = reinterpret_cast<uint16_t*>(buf.top<T>());
          gather_top(dy, g, grp, n0, n1, dyt16);
          gemm_bf16_rounded_b(true, false, buf.k, buf.m, buf.og, 1.0f, w, buf.k, dyt16, buf.m,
                              0.0f, dcols, buf.m);
        }
      }
      if (!in_bf16) {
        const T* dyt = single ? dy + (n0 * g.o + grp * buf.og) * p : buf.top<T>();
        if (!single) gather_top(dy, g, grp, n0, n1, buf.top<T>());
        gemm_measured(true, false, buf.k, buf.m, buf.og, T(1), w, buf.k, dyt, buf.m, T(0), dcols,
                      buf.m);
      }
      if (!direct) col2im(buf.cols<T>(), g, grp, n0, n1, dx);
    }
  }
}

// dweight = (or +=, with accumulate) the gradient summed over images [begin, end).
template <typename T>
void backward_weight_range(const T* x, const T* dy, T* dweight, const ConvGeom& g,
                           int64_t begin, int64_t end, int64_t budget, bool accumulate) {
  const int64_t step = chunk_images<T>(g, end - begin, budget);
  const int64_t og = g.o / g.group, cg = g.c / g.group, k = cg * g.kh * g.kw, p = g.ho * g.wo;
  if (end == begin && !accumulate) std::fill(dweight, dweight + g.o * k, T(0));
  for (int64_t n0 = begin; n0 < end; n0 += step) {
    const int64_t n1 = std::min(end, n0 + step);
    const Buffers buf = workspace_for<T>(g, n1 - n0);
    const bool single = n1 - n0 == 1, direct = single && is_pointwise(g);
    const T beta = n0 == begin && !accumulate ? T(0) : T(1);
    // bf16 on an MKL engine, the shape's race run and won by the bf16 GEMM in this order: the
    // columns lowered straight into bf16, as the forward does (the race itself, and float32
    // or the other order where they won, need the float32 columns).
    const bool in_bf16 = std::is_same_v<T, float> && !direct && bf16_takes_rounded_operands() &&
                         gemm_known_choice<T>(false, true, og, k, buf.m, beta) == 0;
    for (int64_t grp = 0; grp < g.group; ++grp) {
      const T* dyt = single ? dy + (n0 * g.o + grp * og) * p : buf.top<T>();
      if constexpr (std::is_same_v<T, float>) {
        if (in_bf16) {
          uint16_t* cols16 = buf.cols<uint16_t>();
          im2col(x, g, grp, n0, n1, cols16);
          if (single) {  // the top diff read in place, rounded by the call
            gemm_bf16_rounded_b(false, true, og, k, buf.m, 1.0f, dyt, buf.m, cols16, buf.m,
                                beta, dweight + grp * og * k, k);
          } else {  // gathered straight into bf16, as the columns are lowered
            uint16_t* dyt16 = reinterpret_cast<uint16_t*>(buf.top<T>());
            gather_top(dy, g, grp, n0, n1, dyt16);
            gemm_bf16_rounded(false, true, og, k, buf.m, 1.0f, dyt16, cols16, beta,
                              dweight + grp * og * k, k);
          }
        }
      }
      if (!in_bf16) {
        if (!single) gather_top(dy, g, grp, n0, n1, buf.top<T>());
        const T* cols = direct ? x + (n0 * g.c + grp * cg) * p : buf.cols<T>();
        if (!direct) im2col(x, g, grp, n0, n1, buf.cols<T>());
        gemm_measured(false, true, og, k, buf.m, T(1), dyt, buf.m, cols, buf.m, beta,
                      dweight + grp * og * k, k);
      }
    }
  }
}

// The pointwise layout over images [begin, end), in chunks of whole images whose bottom and top
// fit `budget` (in cache when partitioned), so the bias is added while the chunk's top is hot.
template <typename T>
int64_t pointwise_chunk(const ConvGeom& g, int64_t images, int64_t budget) {
  const int64_t per_image = (g.c + g.o) * g.ho * g.wo * int64_t(sizeof(T));
  return std::max<int64_t>(1, std::min<int64_t>(images, budget / per_image));
}

template <typename T>
void forward_pointwise(const T* x, const T* weight, const T* bias, bool relu, T* y,
                       const ConvGeom& g, int64_t begin, int64_t end, int64_t budget) {
  const int64_t og = g.o / g.group, cg = g.c / g.group, p = g.ho * g.wo;
  const int64_t step = pointwise_chunk<T>(g, end - begin, budget);
  for (int64_t n0 = begin; n0 < end; n0 += step) {
    const int64_t n1 = std::min(end, n0 + step);
    for (int64_t grp = 0; grp < g.group; ++grp)
      gemm_batch_measured(false, false, og, p, cg, T(1), weight + grp * og * cg, cg, 0,
                          x + (n0 * g.c + grp * cg) * p, p, g.c * p, T(0),
                          y + (n0 * g.o + grp * og) * p, p, g.o * p, n1 - n0);
    finish_top_range(bias, relu, g, n0, n1, y);
  }
}

// dx[n, grp] = W_g^T dy[n, grp]: each bottom element gets exactly one term, so no col2im.
template <typename T>
void backward_data_pointwise(const T* dy, const T* weight, T* dx, const ConvGeom& g,
                             int64_t begin, int64_t end) {
  const int64_t og = g.o / g.group, cg = g.c / g.group, p = g.ho * g.wo;
  if (end == begin) return;
  for (int64_t grp = 0; grp < g.group; ++grp)
    gemm_batch_measured(true, false, cg, p, og, T(1), weight + grp * og * cg, cg, 0,
                        dy + (begin * g.o + grp * og) * p, p, g.o * p, T(0),
                        dx + (begin * g.c + grp * cg) * p, p, g.c * p, end - begin);
}

// dW_g (+)= sum over images of dy[n, grp] x[n, grp]^T, one GEMM per image adding into dW_g (a
// batched GEMM cannot: its results must not overlap).
template <typename T>
void backward_weight_pointwise(const T* x, const T* dy, T* dweight, const ConvGeom& g,
                               int64_t begin, int64_t end, bool accumulate) {
  const int64_t og = g.o / g.group, cg = g.c / g.group, p = g.ho * g.wo;
  if (end == begin && !accumulate) std::fill(dweight, dweight + g.o * cg, T(0));
  for (int64_t n = begin; n < end; ++n)
    for (int64_t grp = 0; grp < g.group; ++grp)
      gemm_measured(false, true, og, cg, p, T(1), dy + (n * g.o + grp * og) * p, p,
                    x + (n * g.c + grp * cg) * p, p, n == begin && !accumulate ? T(0) : T(1),
                    dweight + grp * og * cg, cg);
}

// Workspace per partition when the batch is partitioned: about one core's L2 cache, so a chunk
// is lowered into cache and multiplied from there. Measured on CaffeNet's and CIFAR10-quick's
// layers (2 cores, AVX-512): 70-95% of the SGEMM peak, against 45-80% for whole-batch lowering
// with threaded BLAS, whose lowered matrices go through memory.
constexpr int64_t kPartitionChunkBytes = int64_t(1) << 20;

// Batch partitioning (Caffe con Troll): `parts` threads each take a contiguous slice of the
// images and run the whole kernel on it (lowering in cache-sized chunks and single-threaded
// GEMMs), with body(part, begin, end, budget); parts == 1 is one slice, lowered in chunks as
// large as col_buffer_limit() allows, with threaded BLAS and threaded lowering, or in
// cache-sized chunks (`cache_chunks`: what one partition of several does, for a thread that is
// a device of one core by itself, cct/devices.py).
template <typename Body>
void run_partitioned(int64_t n, int parts, bool cache_chunks, Body&& body) {
  if (parts <= 1) {
    body(0, int64_t(0), n,
         cache_chunks ? std::min(g_col_buffer_limit, kPartitionChunkBytes) : g_col_buffer_limit);
    return;
  }
  const int64_t budget = std::min(g_col_buffer_limit / parts, kPartitionChunkBytes);
  const int blas_threads = blas_get_num_threads();
  blas_set_num_threads(1);
  run_parallel(parts, [&](int part) {
    SerialScope serial;
    body(part, n * part / parts, n * (part + 1) / parts, budget);
  });
  blas_set_num_threads(std::max(1, blas_threads));
}

enum Kernel : int { kForward, kBackwardData, kBackwardWeight };
// kWinograd: F(2x2, 3x3) or F(2x2, 5x5); kWinograd4x4: F(4x4, 3x3). kPhase*: the layer in
// phase form (conv_phase.h) computed by the stride-1 layout of the same name. kDirect16: the
// direct layout's AVX-512 tiles (the same bits as kDirect's).
// kOnednn: oneDNN's convolution on the whole batch (onednn.h). New layouts go at the end: the
// numbers are in the plan caches.
enum Layout : int {
  kLowered, kPointwise, kDirect, kWinograd, kWinograd4x4,
  kPhaseDirect, kPhaseWinograd, kPhaseWinograd4x4, kDirect16, kPhaseDirect16, kOnednn
};
constexpr int kLayouts = kOnednn + 1;
constexpr const char* kLayoutNames[kLayouts] = {
    "lowered", "pointwise", "direct", "winograd", "winograd4x4",
    "phase-direct", "phase-winograd", "phase-winograd4x4", "direct16", "phase-direct16",
    "onednn"};

// The stride-1 layout a phase layout runs on the phase form (the layout itself otherwise).
Layout stride1_layout(Layout layout) {
  switch (layout) {
    case kPhaseDirect: return kDirect;
    case kPhaseWinograd: return kWinograd;
    case kPhaseWinograd4x4: return kWinograd4x4;
    case kPhaseDirect16: return kDirect16;
    default: return layout;
  }
}
bool is_phase(Layout layout) { return stride1_layout(layout) != layout; }
// The layouts of cct's own float32 kernels (direct, Winograd, their phase forms).
bool is_float32_kernel(Layout layout) { return layout >= kDirect && layout != kOnednn; }

// How a kernel runs on one geometry: its batch partitions, its layout, and (one partition)
// whether it lowers in cache-sized chunks.
struct Plan {
  int parts;
  Layout layout;
  bool cache_chunks;
};

// kernel, geometry, element size, threads, and the modes (a plan measured under one forced
// mode is not the answer under another)
using PlanKey = std::tuple<int, std::array<int64_t, 16>, int64_t, int, int>;
std::mutex g_plan_mutex;
std::map<PlanKey, Plan> g_plans;
std::atomic<int> g_partition_mode{0};  // 0 measure, 1 one partition, 2 one per thread
// 0 measure, 1 + layout: that layout where it applies (2 pointwise, 3 direct, 4 Winograd F(2x2),
// 5 F(4x4), 6-8 their phase forms, 9 direct's AVX-512 tile, 10 its phase form, 11 oneDNN)
std::atomic<int> g_layout_mode{0};
std::atomic<bool> g_measure{true};     // time new shapes, or give them rule_plan's plan

// A key's modes, one mixed-radix number: a plan found under one mode is never the answer
// under another (the rule's plans never stand for measured ones, a float32 plan is not a bf16
// GEMM's (bf16.h), and a layer asking for Caffe's engine never gets a Winograd plan).
int plan_modes(bool measured, bool bf16, bool caffe_engine) {
  return g_layout_mode +
         (kLayouts + 1) * (g_partition_mode + 3 * (!measured + 2 * (bf16 + 2 * caffe_engine)));
}

// Whether a layout computes this kernel on this geometry here (a plan installed from another
// machine's table may name one this CPU or shape cannot run: it runs lowered).
template <typename T>
bool layout_applies(Layout layout, Kernel kernel, const ConvGeom& g) {
  // The direct and Winograd layouts are float32 kernels (F(2x2, 3x3)'s products excepted,
  // which race bf16 under bf16: conv_winograd.cpp). Under bf16 GEMMs they stay candidates: a
  // layer where float32 measures faster than the bf16 GEMM runs in float32 (CIFAR10-quick's
  // thin layers, CaffeNet's 3x3 ones on AVX512-BF16: bench/RESULTS.md).
  const bool float32_kernels = std::is_same_v<T, float>;
  switch (layout) {
    case kPointwise: return is_pointwise(g);
    case kDirect:
      return float32_kernels && direct_conv_applies(g, kernel == kBackwardData);
    case kWinograd:
      return float32_kernels && winograd_applies(g, kernel == kBackwardData, 2);
    case kWinograd4x4:
      return float32_kernels && winograd_applies(g, kernel == kBackwardData, 4);
    case kDirect16:
      return float32_kernels && cpu_has_avx512() &&
             direct_conv_applies(g, kernel == kBackwardData);
    case kPhaseDirect:
    case kPhaseWinograd:
    case kPhaseWinograd4x4:
    case kPhaseDirect16:
      return phase_applies(g) &&
             layout_applies<T>(stride1_layout(layout), kernel, phase_geometry(g, g.n));
    case kOnednn:  // offered only where oneDNN is installed (cct/backend/onednn.py)
      return float32_kernels && onednn_offered(bf16_gemm_enabled()) &&
             onednn_conv_applies(kernel, g, bf16_gemm_enabled());
    default: return true;
  }
}

template <typename T>
Layout usable(Layout layout, Kernel kernel, const ConvGeom& g) {
  return layout_applies<T>(layout, kernel, g) ? layout : kLowered;
}

// The plans a kernel may use on this geometry under the current modes. Caffe's engine
// (convolution_param { engine: CAFFE }) is Caffe's own arithmetic: the lowered GEMM, or for a
// 1x1 stride-1 unpadded layer the GEMM on the bottom itself, as Caffe skips im2col there.
template <typename T>
std::vector<Plan> candidate_plans(Kernel kernel, const ConvGeom& g, int threads,
                                  bool caffe_engine) {
  std::vector<int> parts;
  if (g_partition_mode != 2) parts.push_back(1);
  if (threads > 1 && g_partition_mode != 1) parts.push_back(threads);
  if (parts.empty()) parts.push_back(1);
  // Modes 2-10 force their layout where it applies, lowered elsewhere.
  std::vector<Layout> layouts;
  const int mode = g_layout_mode;
  for (Layout layout :
       {kPointwise, kDirect, kWinograd, kWinograd4x4, kPhaseDirect, kPhaseWinograd,
        kPhaseWinograd4x4, kDirect16, kPhaseDirect16, kOnednn}) {
    if ((mode == 0 || mode == 1 + int(layout)) && layout_applies<T>(layout, kernel, g) &&
        (!caffe_engine || layout == kPointwise))
      layouts.push_back(layout);
  }
  if (mode <= 1 || layouts.empty()) layouts.insert(layouts.begin(), kLowered);
  std::vector<Plan> plans;
  for (Layout layout : layouts) {
    if (layout == kOnednn) {  // the whole batch in one call on oneDNN's threads
      plans.push_back({1, layout, false});
      continue;
    }
    for (int p : parts) plans.push_back({p, layout, false});
    // One thread: the partitioned kernel's cache-sized chunks are the other candidate.
    if (threads == 1 && layout == kLowered && g_partition_mode != 1)
      plans.push_back({1, layout, true});
  }
  return plans;
}

// Whether the rule takes the direct layout: where the lowered GEMM is thin, 4 to 64 rows (the
// filters per group; for backward data the channels per group) and, for backward data, the
// flipped convolution's pad (k - 1) * d - p is no larger than p (else it multiplies more
// zeros than the lowered GEMM does work). On LeNet, CIFAR10-quick and CaffeNet b32 this picks
// the layout measurement picks on every kernel but one, where the two are within 3%
// (bench/RESULTS.md).
bool rule_prefers_direct(Kernel kernel, const ConvGeom& g) {
  const int64_t rows = kernel == kBackwardData ? g.c / g.group : g.o / g.group;
  if (rows < 4 || rows > 64) return false;
  return kernel != kBackwardData ||
         ((g.kh - 1) * g.dh <= 2 * g.ph && (g.kw - 1) * g.dw <= 2 * g.pw);
}

// Whether the rule takes Winograd F(2x2) (3x3 or 5x5 layers): where the transformed GEMMs have
// at least 16 channels in and 16 out per group (fewer, and the transforms cost more than the
// multiplications saved: CIFAR10-quick's and LeNet's first layers) and, for backward data, the
// flipped pad is no larger than the layer's (LeNet's pad-0 conv2 transforms mostly zeros). On
// LeNet, CIFAR10-quick and CaffeNet b32 measurement picks a Winograd layout on every kernel
// this takes, F(4x4, 3x3) on some of CaffeNet's (not in the rule: its error is 5x larger).
bool rule_prefers_winograd(Kernel kernel, const ConvGeom& g) {
  if (g.c / g.group < 16 || g.o / g.group < 16) return false;
  return kernel != kBackwardData || (g.kh - 1 <= 2 * g.ph && g.kw - 1 <= 2 * g.pw);
}

// The plan used when shapes are not timed (set_plan_measurement(false)): one partition per
// thread (Caffe con Troll's batch partitioning, the faster one on most layers measured here),
// cache-sized chunks on one thread, lowered rather than pointwise, Winograd F(2x2) where
// rule_prefers_winograd says, else direct where rule_prefers_direct says (a strided layer:
// the same on its phase form where that adds at most a third more taps, which makes
// CaffeNet's conv1 Winograd and GoogLeNet's direct); within the forced modes.
Plan rule_plan(const std::vector<Plan>& plans, Kernel kernel, const ConvGeom& g) {
  const ConvGeom form = phase_geometry(g, g.n);
  const bool phase = phase_applies(g) && 3 * form.kh * g.sh * form.kw * g.sw <= 4 * g.kh * g.kw;
  const ConvGeom stride1 = phase ? form : g;
  const bool winograd = rule_prefers_winograd(kernel, stride1);
  const bool direct = rule_prefers_direct(kernel, stride1);
  const auto rank = [winograd, direct, phase](const Plan& q) {
    const Layout layout = is_phase(q.layout) == phase ? stride1_layout(q.layout) : kLowered;
    return std::make_tuple(layout == kWinograd && winograd, layout == kDirect && direct,
                           q.parts, q.layout == kLowered, q.cache_chunks);
  };
  Plan best = plans.front();
  for (const Plan& p : plans) {
    if (rank(p) > rank(best)) best = p;
  }
  return best;
}

bool same_plan(const Plan& a, const Plan& b) {
  return a.parts == b.parts && a.layout == b.layout && a.cache_chunks == b.cache_chunks;
}

// Runs a kernel with the plan measured fastest on this geometry: the first call runs it with
// every candidate plan (one partition with threaded BLAS or one per thread with single-threaded
// BLAS; each layout that applies), races them (race.h), keeps the fastest and caches it.
// run(plan) must compute the full result; a kernel that adds into its output passes that
// output (accumulated, count) so that every measured run starts from what the caller gave.
//
// The plans round differently, so which one produced a result matters for reproducibility:
// the result of the first call is always the chosen plan's (rerun if the last one timed was
// another), the same as every later call's and as a process that installs the table
// (load_conv_plans) gets from its first call on.
template <typename T, typename Run>
void run_with_plan(Kernel kernel, const ConvGeom& g, bool caffe_engine, Run&& run,
                   T* accumulated = nullptr, int64_t count = 0) {
  const int threads = std::max<int>(1, std::min<int64_t>(num_threads(), g.n));
  const std::vector<Plan> plans = candidate_plans<T>(kernel, g, threads, caffe_engine);
  if (plans.size() == 1) return run(plans[0]);
  const bool measure = g_measure;
  const PlanKey key{kernel,
                    {g.n, g.c, g.h, g.w, g.o, g.ho, g.wo, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw,
                     g.dh, g.dw, g.group},
                    int64_t(sizeof(T)), threads,
                    plan_modes(measure, std::is_same_v<T, float> && bf16_gemm_enabled(),
                               caffe_engine)};
  std::optional<Plan> known;
  {
    // Only the lookup holds the lock: threads of different devices (cct/devices.py) run
    // their convolutions at the same time.
    std::lock_guard<std::mutex> lock(g_plan_mutex);
    auto it = g_plans.find(key);
    if (it != g_plans.end()) {
      known = it->second;
    } else if (!measure) {
      known = g_plans.emplace(key, rule_plan(plans, kernel, g)).first->second;
    }
  }
  if (known) return run(*known);
  std::vector<T> saved;
  if (accumulated) saved.assign(accumulated, accumulated + count);
  const auto restore = [&] {
    if (accumulated) std::copy(saved.begin(), saved.end(), accumulated);
  };
  // No plan skipped in the second round, however slow its first run (which may hold its
  // GEMMs' own races).
  const double never = std::numeric_limits<double>::infinity();
  const RaceResult result = race(plans.size(), never, restore,
                                 [&](size_t i) { return seconds_of([&] { run(plans[i]); }); });
  Plan chosen;
  {
    // Another device's thread may have measured the same key meanwhile: its entry stands.
    std::lock_guard<std::mutex> lock(g_plan_mutex);
    chosen = g_plans.emplace(key, plans[result.fastest]).first->second;
  }
  if (!same_plan(chosen, plans[result.last_run])) {
    restore();
    run(chosen);
  }
}

}  // namespace

int64_t col_buffer_limit() { return g_col_buffer_limit; }

void set_col_buffer_limit(int64_t bytes) {
  if (bytes < 1) throw std::invalid_argument("col buffer limit must be positive");
  g_col_buffer_limit = bytes;
}

void set_partition_mode(int mode) {
  if (mode < 0 || mode > 2) throw std::invalid_argument("partition mode must be 0, 1 or 2");
  g_partition_mode = mode;
}

void set_conv_layout(int mode) {
  if (mode < 0 || mode > kLayouts)
    throw std::invalid_argument("conv layout must be 0 to " + std::to_string(kLayouts));
  g_layout_mode = mode;
}

std::vector<PlanChoice> partition_choices() {
  std::lock_guard<std::mutex> lock(g_plan_mutex);
  std::vector<PlanChoice> out;
  for (const auto& [key, plan] : g_plans) {
    const auto& geom = std::get<1>(key);
    out.emplace_back(std::get<0>(key), std::vector<int64_t>(geom.begin(), geom.end()), plan.parts,
                     plan.layout == kLowered ? (plan.cache_chunks ? "lowered-cache-chunks"
                                                                  : "lowered")
                                             : kLayoutNames[plan.layout]);
  }
  return out;
}

std::vector<ConvPlanEntry> conv_plan_table() {
  std::lock_guard<std::mutex> lock(g_plan_mutex);
  std::vector<ConvPlanEntry> out;
  for (const auto& [key, plan] : g_plans) {
    const auto& geom = std::get<1>(key);
    out.emplace_back(std::get<0>(key), std::vector<int64_t>(geom.begin(), geom.end()),
                     std::get<2>(key), std::get<3>(key), std::get<4>(key), plan.parts,
                     int(plan.layout), plan.cache_chunks);
  }
  return out;
}

std::vector<const char*> conv_layout_names() {
  return std::vector<const char*>(std::begin(kLayoutNames), std::end(kLayoutNames));
}

void load_conv_plans(const std::vector<ConvPlanEntry>& entries) {
  std::vector<std::pair<PlanKey, Plan>> parsed;
  for (const auto& [kernel, geom, size, threads, modes, parts, layout, chunks] : entries) {
    if (kernel < kForward || kernel > kBackwardWeight || geom.size() != 16 || threads < 1 ||
        parts < 1 || layout < kLowered || layout >= kLayouts)
      throw std::invalid_argument("not a convolution plan");
    PlanKey key{kernel, {}, size, threads, modes};
    std::copy(geom.begin(), geom.end(), std::get<1>(key).begin());
    parsed.emplace_back(key, Plan{parts, Layout(layout), chunks});
  }
  std::lock_guard<std::mutex> lock(g_plan_mutex);
  for (const auto& [key, plan] : parsed) g_plans[key] = plan;
}

void set_plan_measurement(bool measure) { g_measure = measure; }
bool plan_measurement() { return g_measure; }

int64_t plan_count() {
  int64_t conv;
  {
    std::lock_guard<std::mutex> lock(g_plan_mutex);
    conv = int64_t(g_plans.size());
  }
  return conv + gemm_choice_count();
}

void clear_plans() {
  {
    std::lock_guard<std::mutex> lock(g_plan_mutex);
    g_plans.clear();
  }
  clear_gemm_choices();
}

namespace {

// The float32 stride-1 layouts (direct, Winograd) over images [begin, end). `extent`: the taps
// of each channel that are not zero when g is a phase form (phase_tap_extents), which the
// direct layout runs alone (Winograd's tiles transform whole kernels).
void forward_stride1(Layout layout, const float* x, const float* weight, const float* bias,
                     bool relu, float* y, const ConvGeom& g, int64_t begin, int64_t end,
                     int64_t budget, const int32_t* extent = nullptr) {
  if (layout == kDirect || layout == kDirect16)
    return conv_forward_direct(x, weight, bias, relu, y, g, begin, end,
                               layout == kDirect16 ? 16 : 8, extent);
  conv_forward_winograd(x, weight, bias, relu, y, g, begin, end, budget,
                        layout == kWinograd4x4 ? 4 : 2);
}

void backward_data_stride1(Layout layout, const float* dy, const float* weight, float* dx,
                           const ConvGeom& g, int64_t begin, int64_t end, int64_t budget) {
  if (layout == kDirect || layout == kDirect16)
    return conv_backward_data_direct(dy, weight, dx, g, begin, end, layout == kDirect16 ? 16 : 8);
  conv_backward_data_winograd(dy, weight, dx, g, begin, end, budget,
                              layout == kWinograd4x4 ? 4 : 2);
}

void backward_weight_stride1(Layout layout, const float* x, const float* dy, float* dweight,
                             const ConvGeom& g, int64_t begin, int64_t end, int64_t budget,
                             bool accumulate, const int32_t* extent = nullptr) {
  if (layout == kDirect || layout == kDirect16)
    return conv_backward_weight_direct(x, dy, dweight, g, begin, end, accumulate, extent,
                                       layout == kDirect16 ? 16 : 8);
  conv_backward_weight_winograd(x, dy, dweight, g, begin, end, budget, accumulate,
                                layout == kWinograd4x4 ? 4 : 2);
}

// The phase layouts (conv_phase.h): the bottom (or its gradient) in phase form, a chunk of
// images at a time within the workspace budget, in buffers of the thread's own, apart from
// thread_workspace (which the stride-1 layouts use): grown once, then reused.
thread_local std::vector<float> t_phase_planes;
thread_local std::vector<float> t_phase_weight;       // the weights in phase form
thread_local std::vector<float> t_phase_weight_grad;  // a partition's phase-form gradient

// Images per chunk of phase planes: within the budget and at most 4 MiB (CaffeNet's conv1 at
// b256 was as fast with 4 as with 16 or 64 MiB, and 90 MB less resident), at least one.
constexpr int64_t kPhaseChunkBytes = int64_t(4) << 20;

// chunk(n0, pg, planes) for each chunk of images [begin, end): n0 its first image, pg its
// phase form, planes the thread's buffer for that form.
template <typename Chunk>
void each_phase_chunk(const ConvGeom& g, int64_t begin, int64_t end, int64_t budget,
                      Chunk&& chunk) {
  const ConvGeom one = phase_geometry(g, 1);
  const int64_t per_image = one.c * one.h * one.w;
  const int64_t step = std::max<int64_t>(
      1, std::min(budget, kPhaseChunkBytes) / int64_t(sizeof(float)) / per_image);
  for (int64_t n0 = begin; n0 < end; n0 += step) {
    const ConvGeom pg = phase_geometry(g, std::min(end, n0 + step) - n0);
    chunk(n0, pg, grown(t_phase_planes, size_t(pg.n * per_image)));
  }
}

// p (images after one another) = the phase form of x's images [n0, n1), each image's
// lowering by phase_lowering's geometry; unphase_bottom is its adjoint, dx's images from
// the phase form's gradient dp (each bottom pixel one phase pixel, or none: zero).
void phase_bottom(const float* x, const ConvGeom& g, int64_t n0, int64_t n1, float* p) {
  const ConvGeom lg = phase_lowering(g);
  const int64_t image = lg.o * lg.ho * lg.wo;
  for (int64_t n = n0; n < n1; ++n) im2col(x, lg, 0, n, n + 1, p + (n - n0) * image);
}

void unphase_bottom(const float* dp, const ConvGeom& g, int64_t n0, int64_t n1, float* dx) {
  const ConvGeom lg = phase_lowering(g);
  const int64_t image = lg.o * lg.ho * lg.wo;
  for (int64_t n = n0; n < n1; ++n) col2im(dp + (n - n0) * image, lg, 0, n, n + 1, dx);
}

// The weights in phase form, in the calling thread's buffer (a partition makes its own: 41K
// floats for CaffeNet's conv1, against the millions its planes take).
const float* phased_weight(const float* weight, const ConvGeom& g) {
  const ConvGeom pg = phase_geometry(g, 1);
  float* wp = grown(t_phase_weight, size_t(g.o * (pg.c / g.group) * pg.kh * pg.kw));
  phase_weight(weight, g, wp);
  return wp;
}

void forward_phase(Layout layout, const float* x, const float* weight, const float* bias,
                   bool relu, float* y, const ConvGeom& g, int64_t begin, int64_t end,
                   int64_t budget) {
  const float* wp = phased_weight(weight, g);
  const std::vector<int32_t> taps = phase_tap_extents(g);
  const int64_t top = g.o * g.ho * g.wo;
  each_phase_chunk(g, begin, end, budget, [&](int64_t n0, const ConvGeom& pg, float* p) {
    phase_bottom(x, g, n0, n0 + pg.n, p);
    forward_stride1(stride1_layout(layout), p, wp, bias, relu, y + n0 * top, pg, 0, pg.n,
                    budget, taps.data());
  });
}

void backward_data_phase(Layout layout, const float* dy, const float* weight, float* dx,
                         const ConvGeom& g, int64_t begin, int64_t end, int64_t budget) {
  const float* wp = phased_weight(weight, g);
  const int64_t top = g.o * g.ho * g.wo;
  each_phase_chunk(g, begin, end, budget, [&](int64_t n0, const ConvGeom& pg, float* dp) {
    backward_data_stride1(stride1_layout(layout), dy + n0 * top, wp, dp, pg, 0, pg.n, budget);
    unphase_bottom(dp, g, n0, n0 + pg.n, dx);
  });
}

void backward_weight_phase(Layout layout, const float* x, const float* dy, float* dweight,
                           const ConvGeom& g, int64_t begin, int64_t end, int64_t budget,
                           bool accumulate) {
  if (end == begin) {
    if (!accumulate) std::fill(dweight, dweight + g.o * (g.c / g.group) * g.kh * g.kw, 0.0f);
    return;
  }
  const ConvGeom pg1 = phase_geometry(g, 1);
  float* dwp = grown(t_phase_weight_grad, size_t(g.o * (pg1.c / g.group) * pg1.kh * pg1.kw));
  const std::vector<int32_t> taps = phase_tap_extents(g);
  const int64_t top = g.o * g.ho * g.wo;
  each_phase_chunk(g, begin, end, budget, [&](int64_t n0, const ConvGeom& pg, float* p) {
    phase_bottom(x, g, n0, n0 + pg.n, p);
    backward_weight_stride1(stride1_layout(layout), p, dy + n0 * top, dwp, pg, 0, pg.n, budget,
                            n0 != begin, taps.data());
  });
  unphase_weight(dwp, g, dweight, accumulate);
}

}  // namespace

template <typename T>
void conv_forward(const T* x, const T* weight, const T* bias, T* y, const ConvGeom& g,
                  bool caffe_engine, bool relu) {
  run_with_plan<T>(kForward, g, caffe_engine, [&](Plan plan) {
    const Layout layout = usable<T>(plan.layout, kForward, g);
    if constexpr (std::is_same_v<T, float>) {
      if (layout == kOnednn)
        return onednn_conv_forward(bf16_gemm_enabled(), x, weight, bias, relu, y, g);
    }
    run_partitioned(g.n, plan.parts, plan.cache_chunks, [&](int, int64_t begin, int64_t end, int64_t budget) {
      if constexpr (std::is_same_v<T, float>) {
        if (is_phase(layout))
          return forward_phase(layout, x, weight, bias, relu, y, g, begin, end, budget);
        if (is_float32_kernel(layout))
          return forward_stride1(layout, x, weight, bias, relu, y, g, begin, end, budget);
      }
      if (layout == kPointwise) {
        forward_pointwise(x, weight, bias, relu, y, g, begin, end, budget);
      } else {
        forward_range(x, weight, bias, relu, y, g, begin, end, budget);
      }
    });
  });
}

template <typename T>
void conv_backward_data(const T* dy, const T* weight, T* dx, const ConvGeom& g,
                        bool caffe_engine) {
  run_with_plan<T>(kBackwardData, g, caffe_engine, [&](Plan plan) {
    const Layout layout = usable<T>(plan.layout, kBackwardData, g);
    if constexpr (std::is_same_v<T, float>) {
      if (layout == kOnednn)
        return onednn_conv_backward_data(bf16_gemm_enabled(), dy, weight, dx, g);
    }
    run_partitioned(g.n, plan.parts, plan.cache_chunks, [&](int, int64_t begin, int64_t end, int64_t budget) {
      if constexpr (std::is_same_v<T, float>) {
        if (is_phase(layout))
          return backward_data_phase(layout, dy, weight, dx, g, begin, end, budget);
        if (is_float32_kernel(layout))
          return backward_data_stride1(layout, dy, weight, dx, g, begin, end, budget);
      }
      if (layout == kPointwise) {
        backward_data_pointwise(dy, weight, dx, g, begin, end);
      } else {
        backward_data_range(dy, weight, dx, g, begin, end, budget);
      }
    });
  });
}

template <typename T>
void conv_backward_weight(const T* x, const T* dy, T* dweight, const ConvGeom& g,
                          bool accumulate, bool caffe_engine) {
  const int64_t size = g.o * (g.c / g.group) * g.kh * g.kw;
  run_with_plan<T>(
      kBackwardWeight, g, caffe_engine,
      [&](Plan plan) {
        // Part 0 writes (or adds into) dweight; the others their own sums, added in after.
        const Layout layout = usable<T>(plan.layout, kBackwardWeight, g);
        if constexpr (std::is_same_v<T, float>) {
          if (layout == kOnednn)
            return onednn_conv_backward_weight(bf16_gemm_enabled(), x, dy, dweight, accumulate,
                                               g);
        }
        std::vector<T> partial(size_t(size * (plan.parts - 1)));
        run_partitioned(g.n, plan.parts, plan.cache_chunks,
                        [&](int part, int64_t begin, int64_t end, int64_t budget) {
                          T* out = part == 0 ? dweight : partial.data() + (part - 1) * size;
                          const bool acc = part == 0 && accumulate;
                          if constexpr (std::is_same_v<T, float>) {
                            if (is_phase(layout))
                              return backward_weight_phase(layout, x, dy, out, g, begin, end,
                                                           budget, acc);
                            if (is_float32_kernel(layout))
                              return backward_weight_stride1(layout, x, dy, out, g, begin, end,
                                                             budget, acc);
                          }
                          if (layout == kPointwise) {
                            backward_weight_pointwise(x, dy, out, g, begin, end, acc);
                          } else {
                            backward_weight_range(x, dy, out, g, begin, end, budget, acc);
                          }
                        });
        for (int part = 1; part < plan.parts; ++part) {
          const T* src = partial.data() + (part - 1) * size;
          for (int64_t i = 0; i < size; ++i) dweight[i] += src[i];
        }
      },
      accumulate ? dweight : nullptr, size);
}

template <typename T>
void bias_backward(const T* dy, T* dbias, int64_t num, int64_t channels, int64_t pixels,
                   bool accumulate) {
  // Summed in double: a channel of CaffeNet conv1's top diff at batch 256 has 774,400 terms.
  if (pixels == 1) {
    // Column sums (InnerProduct): each thread a block of columns, rows read in order.
    parallel_for(channels, num, [&](int64_t c0, int64_t c1) {
      std::vector<double> acc(size_t(c1 - c0), 0.0);
      for (int64_t n = 0; n < num; ++n) {
        const T* row = dy + n * channels + c0;
        for (int64_t c = 0; c < c1 - c0; ++c) acc[c] += row[c];
      }
      for (int64_t c = c0; c < c1; ++c)
        dbias[c] = accumulate ? dbias[c] + T(acc[c - c0]) : T(acc[c - c0]);
    });
    return;
  }
  parallel_for(channels, num * pixels, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // eight running sums, not one chain
      for (int64_t n = 0; n < num; ++n) {
        const T* row = dy + (n * channels + c) * pixels;
        int64_t q = 0;
        for (; q + 8 <= pixels; q += 8)
          for (int l = 0; l < 8; ++l) lanes[l] += row[q + l];
        for (; q < pixels; ++q) lanes[0] += row[q];
      }
      double sum = 0;
      for (double v : lanes) sum += v;
      dbias[c] = accumulate ? dbias[c] + T(sum) : T(sum);
    }
  });
}

template <typename T>
void gemm_kernel(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                 int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

#define CCT_INSTANTIATE(T)                                                                  \
  template void conv_forward<T>(const T*, const T*, const T*, T*, const ConvGeom&, bool, bool); \
  template void conv_backward_data<T>(const T*, const T*, T*, const ConvGeom&, bool);       \
  template void conv_backward_weight<T>(const T*, const T*, T*, const ConvGeom&, bool, bool); \
  template void bias_backward<T>(const T*, T*, int64_t, int64_t, int64_t, bool);            \
  template void gemm_kernel<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, \
                               const T*, int64_t, T, T*, int64_t);
CCT_INSTANTIATE(float)
CCT_INSTANTIATE(double)
#undef CCT_INSTANTIATE

}  // namespace cct
