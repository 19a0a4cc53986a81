// Declarations of cct's CPU kernels; bound to Python in module.cpp.
#pragma once
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

namespace cct {

// Geometry of a 2-D convolution on NCHW arrays: the bottom (n, c, h, w), the top (n, o, ho, wo)
// and the kernel (o, c / group, kh, kw) with its stride, pad and dilation.
struct ConvGeom {
  int64_t n, c, h, w, o, ho, wo;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw, group;
};

// Caffe's ReLU of one value (relu_layer.cpp), written once for the ReLU kernel and for the
// convolutions that apply it as they write their top. Both terms stay, as in Caffe: with a
// slope of 0 the second still makes -0 of -0 and NaN of -inf.
template <typename T>
inline T caffe_relu(T x, T negative_slope) {
  return std::max(x, T(0)) + negative_slope * std::min(x, T(0));
}

// caffe_engine: Caffe's own arithmetic (convolution_param { engine: CAFFE }), the lowered GEMM
// (or for a 1x1 stride-1 unpadded layer the GEMM on the bottom itself), never direct or
// Winograd: the same sums as Caffe's up to the BLAS's blocking. relu: the top is
// caffe_relu(sum + bias, 0), applied as each layout writes it (the net fuses a Convolution with
// the in-place ReLU after it, cct/net.py): the bits of the two layers run one after the other,
// without the ReLU's pass over the top.
template <typename T>
void conv_forward(const T* x, const T* weight, const T* bias, T* y, const ConvGeom& g,
                  bool caffe_engine = false, bool relu = false);
template <typename T>
void conv_backward_data(const T* dy, const T* weight, T* dx, const ConvGeom& g,
                        bool caffe_engine = false);
// dweight = the weight gradient summed over the batch, or dweight += it with accumulate.
template <typename T>
void conv_backward_weight(const T* x, const T* dy, T* dweight, const ConvGeom& g,
                          bool accumulate, bool caffe_engine = false);
// dbias[c] = (or += with accumulate) the sum of dy[n, c, q] over n and q, dy being
// (num, channels, pixels): the bias gradient of Convolution and InnerProduct.
template <typename T>
void bias_backward(const T* dy, T* dbias, int64_t num, int64_t channels, int64_t pixels,
                   bool accumulate);
// The bytes of lowered matrices a convolution may hold at once (it takes the batch in chunks).
int64_t col_buffer_limit();
void set_col_buffer_limit(int64_t bytes);
// Batch partitioning: 0 measures per kernel and geometry (the default), 1 always one
// partition with threaded BLAS, 2 always one partition per thread with single-threaded BLAS.
void set_partition_mode(int mode);
// Convolution layout: 0 measures per kernel and geometry among those that apply (the default),
// 1 always lowered, 2 pointwise where it applies (1x1, stride 1, pad 0: no lowering), 3 direct
// where it applies (stride-1 float on AVX2/FMA, conv_direct.h), 4 Winograd where it applies
// (3x3 or 5x5 stride-1 undilated float, conv_winograd.h), 5 Winograd F(4x4, 3x3), 6-8 direct,
// Winograd F(2x2) and F(4x4) on a strided layer's phase form (conv_phase.h) where they apply
// to it, 9 direct with 16-pixel vectors (AVX-512), 10 that on the phase form; the others
// lowered.
void set_conv_layout(int mode);
// The plans measured so far: (kernel 0 forward / 1 backward data / 2 backward weight,
// geometry n c h w o ho wo kh kw sh sw ph pw dh dw group, partitions,
// "lowered"/"lowered-cache-chunks"/"pointwise"/"direct"/"winograd"/"winograd4x4"/
// "phase-direct"/"phase-winograd"/"phase-winograd4x4"/"direct16"/"phase-direct16"/"onednn").
using PlanChoice = std::tuple<int, std::vector<int64_t>, int, const char*>;
std::vector<PlanChoice> partition_choices();
// Every convolution plan in the table, key and plan, so that it can be saved and installed in
// another process: (kernel, geometry, element size, threads, modes, partitions, layout
// 0 lowered / 1 pointwise / 2 direct / 3 Winograd / 4 Winograd F(4x4) / 5-7 their phase forms
// / 8 direct's 16-pixel tile / 9 its phase form / 10 oneDNN's, cache-sized chunks).
using ConvPlanEntry =
    std::tuple<int, std::vector<int64_t>, int64_t, int, int, int, int, bool>;
std::vector<ConvPlanEntry> conv_plan_table();
// The layouts' names by number (a plan's layout; the modes' radix is their count plus one).
std::vector<const char*> conv_layout_names();
// Installs plans (replacing any with the same key); a later call with that key runs them
// without measuring.
void load_conv_plans(const std::vector<ConvPlanEntry>& entries);
// Whether a shape met for the first time is timed (the default) or given the fixed plan of
// the rule in conv.cpp / the direct GEMM order, so that nothing depends on the machine's load.
void set_plan_measurement(bool measure);
bool plan_measurement();
// Number of entries in the plan and GEMM-order tables, and emptying both (tests).
int64_t plan_count();
void clear_plans();

// Row-major C = alpha op(A) op(B) + beta C through the linked BLAS.
template <typename T>
void gemm_kernel(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                 int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);
// The same, computed either directly or as C^T = op(B)^T op(A)^T plus a transpose, whichever
// was faster the first time this shape came (gemm.cpp).
template <typename T>
void gemm_measured(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);
// The choice gemm_measured would run for this call (the forced order, or the table's), -1
// before the shape's first call has raced the candidates.
template <typename T>
int gemm_known_choice(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T beta);
// The choices a float32 call of this shape would race now (precision, CPU, MKL offered), either
// form of op(A), B stored n x k (tb) or k x n.
std::vector<int> gemm_candidates(int64_t m, int64_t n, int64_t k, bool tb);
// The orders chosen so far: (ta, tb, m, n, k, element size, BLAS threads, accumulate (beta !=
// 0), choice): 0 the direct order, 1 transposed; under bf16 also 2 and 3, the same in float32;
// 4 the skinny engine, 5 MKL's sgemm, 6 the skinny engine's 16-lane tile, 10 the thin engine;
// under bf16 also 8 and 9, the direct order in bf16 on MKL's whole-GEMM threads and on cct's
// kernel.
using GemmChoice =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int, bool, int>;
std::vector<GemmChoice> gemm_choices();
void load_gemm_choices(const std::vector<GemmChoice>& entries);
// Strided batched GEMMs (gemm.h's gemm_batch_strided), MKL's batched sgemm raced against the
// BLAS's per shape where MKL is offered, and under bf16 (float32_only false) the items in bf16
// against both; the choices so far: (ta, tb, m, n, k, count, element size (2 under bf16, else
// 4), BLAS threads, accumulate, choice): 0 the BLAS's float32 call, 5 MKL's, 7 bf16 items, 8
// and 9 bf16 items on MKL's whole-GEMM threads and on cct's kernel.
template <typename T>
void gemm_batch_measured(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                         int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b,
                         T beta, T* c, int64_t ldc, int64_t stride_c, int64_t count,
                         bool float32_only = false);
using GemmBatchChoice =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, int>;
std::vector<GemmBatchChoice> gemm_batch_choices();
void load_gemm_batch_choices(const std::vector<GemmBatchChoice>& entries);
// Entries in both GEMM tables; clear_gemm_choices empties both.
int64_t gemm_choice_count();
void clear_gemm_choices();
// 0: measure and cache (the default); 1: always direct; 2: always transposed.
void set_gemm_order(int order);

template <typename T>
void max_pool_forward(const T* x, T* y, int32_t* mask, int64_t planes, int h, int w,
                      int kh, int kw, int sh, int sw, int ph, int pw, int ho, int wo);
// With relu_src (laid out as dx), each plane of dx then goes through relu_backward, while in
// cache: the backward of a ReLU in place on the bottom, run inside the pooling's
// (Net._find_relu_backward_fusions).
template <typename T>
void max_pool_backward(const T* dy, const int32_t* mask, T* dx, int64_t planes, int h, int w,
                       int ho, int wo, const T* relu_src = nullptr, T negative_slope = T(0));
template <typename T>
void ave_pool_forward(const T* x, T* y, int64_t planes, int h, int w, int kh, int kw, int sh,
                      int sw, int ph, int pw, int ho, int wo);
template <typename T>
void ave_pool_backward(const T* dy, T* dx, int64_t planes, int h, int w, int kh, int kw, int sh,
                       int sw, int ph, int pw, int ho, int wo);

// Element-by-element (elementwise.cpp). Outputs may be inputs (in place).
template <typename T>
void relu_forward(const T* x, T* y, int64_t count, T negative_slope);
// dx = dy * ([src > 0] + negative_slope [src <= 0]); src is the bottom (or, with a slope >= 0,
// the top) data.
template <typename T>
void relu_backward(const T* src, const T* dy, T* dx, int64_t count, T negative_slope);
// relu_backward on the calling thread (vectorised for the CPU): the fused forms' ReLU, on a
// span another kernel has just written (Concat's copies, a pooling plane, an LRN row).
template <typename T>
void relu_backward_span(const T* src, const T* dy, T* dx, int64_t count, T negative_slope);
// SGD with momentum and L2 weight decay, fused: g = local_rate (diff + local_decay data);
// history = momentum history + g; diff = history; data -= history. With clear_diff the diff is
// left zero instead: the next iteration's ClearParamDiffs done in the same pass, where the
// solver knows nothing reads the update value before that clear (cct/solver's step loop).
template <typename T>
void sgd_update(T* data, T* diff, T* history, int64_t count, T local_rate, T momentum,
                T local_decay, bool clear_diff);
// out = coeffs[0] arrays[0] + coeffs[1] arrays[1] + ... (n >= 2 arrays of count elements),
// left to right, each product rounded before it is added (Eltwise SUM; Split's backward with
// every coefficient 1), in one threaded pass. out may be arrays[0] or arrays[1], no later one.
template <typename T>
void eltwise_sum(const T* const* arrays, const T* coeffs, int64_t n, T* out, int64_t count);

// Concat's forward and backward (and Slice's): `runs` runs of `run` elements, run r read from
// src + r src_pitch and written to dst + r dst_pitch (one bottom's share of the top, each image's
// block of its channels, or back). With relu_src, a copy into a bottom passes each element
// through relu_backward on the way (relu_src laid out as dst): the backward of a ReLU in place
// on that bottom, run inside Concat's (Net._find_relu_backward_fusions).
template <typename T>
void concat_copy(const T* src, int64_t src_pitch, T* dst, int64_t dst_pitch, int64_t runs,
                 int64_t run, const T* relu_src, T negative_slope);

// LRN across channels on (num, channels, pixels) arrays (lrn.cpp). y must not be x.
template <typename T>
void lrn_across_forward(const T* x, T* y, T* scale, int64_t num, int64_t channels, int64_t pixels,
                        int size, T alpha, T beta, T k);
// With relu_src (laid out as x), each dx then goes through relu_backward as it is stored: the
// backward of a ReLU in place on the bottom, run inside LRN's (Net._find_relu_backward_fusions).
template <typename T>
void lrn_across_backward(const T* x, const T* y, const T* scale, const T* dy, T* dx, int64_t num,
                         int64_t channels, int64_t pixels, int size, T alpha, T beta,
                         const T* relu_src = nullptr, T negative_slope = T(0));

// Softmax over axis 1 of (outer, channels, inner) arrays and SoftmaxWithLoss (softmax.cpp).
template <typename T>
void softmax_forward(const T* x, T* y, int64_t outer, int64_t channels, int64_t inner);
template <typename T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t outer, int64_t channels,
                      int64_t inner);
// The summed loss -log(max(p[label], FLT_MIN)) over the counted positions, their count, and
// the first label (in memory order) outside [0, channels) that is not ignore_label, if any.
template <typename T>
struct SoftmaxLossResult {
  T loss;
  int64_t count;
  bool bad;
  int64_t bad_label;
};
template <typename T>
SoftmaxLossResult<T> softmax_loss_forward(const T* x, const T* label, T* prob, int64_t outer,
                                          int64_t channels, int64_t inner, bool has_ignore,
                                          int64_t ignore_label);
template <typename T>
void softmax_loss_backward(const T* prob, const T* label, T* dx, int64_t outer, int64_t channels,
                           int64_t inner, bool has_ignore, int64_t ignore_label, T scale);

}  // namespace cct
