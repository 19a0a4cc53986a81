// oneDNN's convolutions and matmul loaded at run time (see onednn.h).
#include "onednn.h"
#include "parallel.h"
#include "workspace.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <vector>

// oneDNN 3.x's C API (oneapi/dnnl/dnnl.h, dnnl_types.h, dnnl_common_types.h of 3.2): the
// opaque handles under their own struct names, the enumerations as the ints they are.
struct dnnl_engine;
struct dnnl_stream;
struct dnnl_memory_desc;
struct dnnl_memory;
struct dnnl_primitive_desc;
struct dnnl_primitive;
struct dnnl_primitive_attr;
struct dnnl_post_ops;

namespace cct {

namespace {

using Status = int;
using Dims = int64_t[12];  // dnnl_dims_t: DNNL_MAX_NDIMS dnnl_dim_t
using Md = dnnl_memory_desc*;
using ConstMd = const dnnl_memory_desc*;
using Pd = dnnl_primitive_desc*;
using Prim = dnnl_primitive*;
using Mem = dnnl_memory*;
struct ExecArg {  // dnnl_exec_arg_t
  int arg;
  Mem memory;
};
struct Version {  // dnnl_version_t
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};

constexpr Status kSuccess = 0;
constexpr int kBf16 = 2, kF32 = 3;                           // dnnl_data_type_t
constexpr int kTagAny = 1, kTagA = 2, kTagAbcd = 5, kTagAbcde = 6;  // dnnl_format_tag_t
constexpr int kCpu = 1;                                      // dnnl_engine_kind_t
constexpr unsigned kInOrder = 1;                             // dnnl_stream_in_order
constexpr int kForwardTraining = 64;                         // dnnl_prop_kind_t
constexpr int kConvDirect = 1, kEltwiseRelu = 32, kEltwiseLinear = 38;  // dnnl_alg_kind_t
constexpr int kQueryImplInfo = 8, kQuerySrc = 129, kQueryDiffSrc = 130, kQueryWeights = 131,
              kQueryDiffWeights = 132, kQueryDst = 133, kQueryDiffDst = 134;  // dnnl_query_t
constexpr int kArgSrc = 1, kArgDst = 17, kArgWeights = 33, kArgBias = 41, kArgDiffSrc = 129,
              kArgDiffDst = 145, kArgDiffWeights = 161;  // DNNL_ARG_*
constexpr int kScratchpadUser = 1;                           // dnnl_scratchpad_mode_user
constexpr int kQueryScratchpad = 136;                         // dnnl_query_scratchpad_md
constexpr int kArgScratchpad = 80;                            // DNNL_ARG_SCRATCHPAD
constexpr size_t kAlign = 64;  // oneDNN's kernels read and write whole cache lines

struct Api {
  Status (*engine_create)(dnnl_engine**, int, size_t);
  Status (*stream_create)(dnnl_stream**, dnnl_engine*, unsigned);
  Status (*stream_wait)(dnnl_stream*);
  Status (*stream_destroy)(dnnl_stream*);
  Status (*md_create)(Md*, int, const Dims, int, int);
  Status (*md_create_strided)(Md*, int, const Dims, int, const Dims);
  Status (*md_destroy)(Md);
  size_t (*md_size)(ConstMd);
  int (*md_equal)(ConstMd, ConstMd);
  Status (*memory_create)(Mem*, ConstMd, dnnl_engine*, void*);
  Status (*memory_set_handle)(Mem, void*);
  Status (*memory_destroy)(Mem);
  Status (*attr_create)(dnnl_primitive_attr**);
  Status (*attr_destroy)(dnnl_primitive_attr*);
  Status (*attr_set_post_ops)(dnnl_primitive_attr*, const dnnl_post_ops*);
  Status (*attr_set_scratchpad_mode)(dnnl_primitive_attr*, int);
  Status (*post_ops_create)(dnnl_post_ops**);
  Status (*post_ops_destroy)(dnnl_post_ops*);
  Status (*post_ops_append_eltwise)(dnnl_post_ops*, int, float, float);
  Status (*post_ops_append_sum)(dnnl_post_ops*, float, int32_t, int);
  Status (*conv_forward_pd)(Pd*, dnnl_engine*, int, int, ConstMd, ConstMd, ConstMd, ConstMd,
                            const Dims, const Dims, const Dims, const Dims,
                            const dnnl_primitive_attr*);
  Status (*conv_backward_data_pd)(Pd*, dnnl_engine*, int, ConstMd, ConstMd, ConstMd,
                                  const Dims, const Dims, const Dims, const Dims,
                                  const dnnl_primitive_desc*, const dnnl_primitive_attr*);
  Status (*conv_backward_weights_pd)(Pd*, dnnl_engine*, int, ConstMd, ConstMd, ConstMd,
                                     ConstMd, const Dims, const Dims, const Dims, const Dims,
                                     const dnnl_primitive_desc*, const dnnl_primitive_attr*);
  Status (*reorder_pd)(Pd*, ConstMd, dnnl_engine*, ConstMd, dnnl_engine*,
                       const dnnl_primitive_attr*);
  Status (*matmul_pd)(Pd*, dnnl_engine*, ConstMd, ConstMd, ConstMd, ConstMd,
                      const dnnl_primitive_attr*);
  ConstMd (*pd_query_md)(const dnnl_primitive_desc*, int, int);
  Status (*pd_query)(const dnnl_primitive_desc*, int, int, void*);
  Status (*pd_destroy)(Pd);
  Status (*primitive_create)(Prim*, const dnnl_primitive_desc*);
  Status (*primitive_execute)(const dnnl_primitive*, dnnl_stream*, int, const ExecArg*);
  Status (*primitive_destroy)(Prim);
  const Version* (*version)();
  // GNU OpenMP, which this oneDNN runs on: the calling thread's team size.
  void (*omp_set_num_threads)(int);
  int (*omp_get_max_threads)();
};

std::mutex g_load_mutex;
Api g_api;
std::atomic<bool> g_loaded{false};  // g_api, g_engine and g_version complete
std::atomic<bool> g_offered_float32{false}, g_offered_bf16{false};
dnnl_engine* g_engine = nullptr;
std::string g_version;

template <typename F>
bool bind(void* lib, const char* name, F* slot) {
  *slot = reinterpret_cast<F>(dlsym(lib, name));
  return *slot != nullptr;
}

void check(Status status, const char* what) {
  if (status != kSuccess)
    throw std::runtime_error(std::string("oneDNN's ") + what + " failed (dnnl_status_t " +
                             std::to_string(status) + ")");
}

// An owned handle, destroyed through the API's destroy function.
template <typename H, Status (*Api::*Destroy)(H)>
struct Owned {
  H h = nullptr;
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (h != nullptr) (g_api.*Destroy)(h);
  }
};
using OwnedMd = Owned<Md, &Api::md_destroy>;
using OwnedPd = Owned<Pd, &Api::pd_destroy>;
using OwnedPrim = Owned<Prim, &Api::primitive_destroy>;
using OwnedMem = Owned<Mem, &Api::memory_destroy>;
using OwnedAttr = Owned<dnnl_primitive_attr*, &Api::attr_destroy>;
using OwnedPostOps = Owned<dnnl_post_ops*, &Api::post_ops_destroy>;
using OwnedStream = Owned<dnnl_stream*, &Api::stream_destroy>;

void make_md(OwnedMd* md, std::vector<int64_t> dims, int data_type, int tag) {
  Dims d = {};
  std::copy(dims.begin(), dims.end(), d);
  check(g_api.md_create(&md->h, int(dims.size()), d, data_type, tag), "memory descriptor");
}

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// One tensor of a convolution: cct's float32 blob (user) and the layout the primitive wants
// (inner). Where the two differ, the inner tensor lives in the calling thread's convolution
// workspace (workspace.h: one buffer, grown to the largest layer's, not one per layer) at
// `offset`, and a reorder moves the data across (into it for an operand, out of it for a
// result); else the primitive works on the blob itself.
struct Operand {
  OwnedMd user;
  ConstMd inner = nullptr;  // the primitive descriptor's
  OwnedMem user_mem, inner_mem;
  OwnedPd reorder_pd, sum_pd;
  OwnedPrim reorder, reorder_sum;  // reorder_sum: the result added into the blob
  bool direct = false;
  size_t offset = 0;  // in the workspace; the bytes after it are the inner tensor's

  // into: the reorder runs user -> inner (an operand) or inner -> user (a result); with_sum
  // (results only): a second reorder that adds into the blob, for the weight diff's
  // accumulate. Result operands never work on the blob directly where with_sum is asked.
  // Returns the workspace bytes it takes after `offset`.
  size_t init(ConstMd wanted, bool into, bool with_sum, size_t at) {
    inner = wanted;
    offset = at;
    check(g_api.memory_create(&user_mem.h, user.h, g_engine, nullptr), "memory");
    direct = !with_sum && g_api.md_equal(user.h, inner);
    if (direct) return 0;
    check(g_api.memory_create(&inner_mem.h, inner, g_engine, nullptr), "memory");
    ConstMd src = into ? ConstMd(user.h) : inner, dst = into ? inner : ConstMd(user.h);
    check(g_api.reorder_pd(&reorder_pd.h, src, g_engine, dst, g_engine, nullptr), "reorder");
    check(g_api.primitive_create(&reorder.h, reorder_pd.h), "reorder");
    const size_t bytes = aligned(g_api.md_size(inner));
    if (!with_sum) return bytes;
    OwnedPostOps ops;
    OwnedAttr attr;
    check(g_api.post_ops_create(&ops.h), "post-ops");
    check(g_api.post_ops_append_sum(ops.h, 1.0f, 0, 0), "sum post-op");
    check(g_api.attr_create(&attr.h), "attributes");
    check(g_api.attr_set_post_ops(attr.h, ops.h), "attributes");
    check(g_api.reorder_pd(&sum_pd.h, src, g_engine, dst, g_engine, attr.h), "reorder");
    check(g_api.primitive_create(&reorder_sum.h, sum_pd.h), "reorder");
    return bytes;
  }

  // The memory the primitive reads or writes for `blob` (the inner tensor in `workspace`); an
  // operand's data moved in first.
  Mem bind(const float* blob, bool into, char* workspace, dnnl_stream* stream) {
    check(g_api.memory_set_handle(user_mem.h, const_cast<float*>(blob)), "memory handle");
    if (direct) return user_mem.h;
    check(g_api.memory_set_handle(inner_mem.h, workspace + offset), "memory handle");
    if (into) {
      const ExecArg args[] = {{kArgSrc, user_mem.h}, {kArgDst, inner_mem.h}};
      check(g_api.primitive_execute(reorder.h, stream, 2, args), "reorder");
    }
    return inner_mem.h;
  }

  // A result's data moved out into the blob bound last (added into it with sum).
  void finish(bool sum, dnnl_stream* stream) {
    if (direct) return;
    const ExecArg args[] = {{kArgSrc, inner_mem.h}, {kArgDst, user_mem.h}};
    check(g_api.primitive_execute(sum ? reorder_sum.h : reorder.h, stream, 2, args), "reorder");
  }
};

// One convolution kernel on one geometry, precision, thread count (and for the forward kernel,
// bias and fused ReLU): the primitive, its operands, a stream, and a lock, since threads of
// different devices (cct/devices.py) may run the same geometry at once.
struct Conv {
  bool supported = false;
  bool ready = false;       // operands and primitive made (at the first call, not by a query)
  bool relu_fused = false;  // forward: the primitive applies the ReLU itself
  std::string impl;
  OwnedPd pd;
  OwnedPrim prim;
  Operand a, b, out;  // forward: src, weights, dst; backward data: diff_dst, weights,
                      // diff_src; backward weight: src, diff_dst, diff_weights
  OwnedMd bias_md;
  OwnedMem bias_mem, scratchpad;  // the scratchpad: oneDNN's own scratch, in the workspace too
  size_t scratchpad_offset = 0, workspace_bytes = 0;
  dnnl_stream* stream = nullptr;  // like the primitives, kept as long as the process
  std::mutex mutex;
};

using ConvKey = std::tuple<int, std::array<int64_t, 16>, bool, bool, bool, int>;
std::mutex g_conv_mutex;
std::map<ConvKey, std::unique_ptr<Conv>> g_convs;

struct ConvDims {
  std::vector<int64_t> src, weights, dst;
  Dims strides = {}, dilates = {}, pad_l = {}, pad_r = {};
  bool valid = true;
};

// Caffe's geometry in oneDNN's terms: dilation counts the gaps (d - 1), and the right/bottom
// pad is what makes oneDNN's output size Caffe's floor (possibly less than Caffe's pad).
ConvDims conv_dims(const ConvGeom& g) {
  ConvDims d;
  d.src = {g.n, g.c, g.h, g.w};
  d.dst = {g.n, g.o, g.ho, g.wo};
  d.weights = g.group == 1 ? std::vector<int64_t>{g.o, g.c, g.kh, g.kw}
                           : std::vector<int64_t>{g.group, g.o / g.group, g.c / g.group, g.kh,
                                                  g.kw};
  const int64_t size[2] = {g.h, g.w}, out[2] = {g.ho, g.wo}, k[2] = {g.kh, g.kw},
                s[2] = {g.sh, g.sw}, p[2] = {g.ph, g.pw}, dil[2] = {g.dh, g.dw};
  for (int i = 0; i < 2; ++i) {
    d.strides[i] = s[i];
    d.dilates[i] = dil[i] - 1;
    d.pad_l[i] = p[i];
    d.pad_r[i] = (out[i] - 1) * s[i] + (k[i] - 1) * dil[i] + 1 - size[i] - p[i];
    if (d.pad_r[i] < 0) d.valid = false;  // oneDNN takes no negative pad
  }
  return d;
}

bool is_reference(const std::string& impl) { return impl.rfind("ref", 0) == 0; }

// Makes the primitive descriptor for a key; supported stays false where oneDNN has no kernel
// of its own.
void build(Conv* conv, int kernel, const ConvGeom& g, bool bf16, bool bias, bool relu) {
  const ConvDims d = conv_dims(g);
  if (!d.valid) return;
  const int low = bf16 ? kBf16 : kF32;
  OwnedMd src_any, weights_any, dst_any, bias_f32, src_f32, dst_f32;
  make_md(&src_any, d.src, low, kTagAny);
  make_md(&weights_any, d.weights, low, kTagAny);
  make_md(&dst_any, d.dst, low, kTagAny);
  make_md(&src_f32, d.src, kF32, kTagAny);
  make_md(&dst_f32, d.dst, kF32, kTagAny);
  make_md(&bias_f32, {g.o}, kF32, kTagA);
  OwnedMd weights_f32;
  make_md(&weights_f32, d.weights, kF32, kTagAny);

  // The forward descriptor: the forward kernel itself (its top float32), or the backward
  // kernels' hint (its top in the precision of their top diff).
  OwnedPd forward;
  const auto forward_pd = [&](OwnedPd* pd, bool fuse_relu) {
    OwnedPostOps ops;
    OwnedAttr attr;
    check(g_api.attr_create(&attr.h), "attributes");
    check(g_api.attr_set_scratchpad_mode(attr.h, kScratchpadUser), "attributes");
    if (fuse_relu) {
      check(g_api.post_ops_create(&ops.h), "post-ops");
      // oneDNN's ReLU writes 0 * x, -0 for a negative x, where Caffe's writes +0
      // (kernels.h's caffe_relu); adding +0 after makes those +0, so the top has Caffe's
      // bits (but for a sum of exactly -0, which Caffe's keeps).
      check(g_api.post_ops_append_eltwise(ops.h, kEltwiseRelu, 0.0f, 0.0f), "ReLU post-op");
      check(g_api.post_ops_append_eltwise(ops.h, kEltwiseLinear, 1.0f, 0.0f), "+0 post-op");
      check(g_api.attr_set_post_ops(attr.h, ops.h), "attributes");
    }
    const ConstMd top = kernel == 0 ? dst_f32.h : dst_any.h;
    return g_api.conv_forward_pd(&pd->h, g_engine, kForwardTraining, kConvDirect, src_any.h,
                                 weights_any.h, bias && kernel == 0 ? bias_f32.h : nullptr, top,
                                 d.strides, d.dilates, d.pad_l, d.pad_r, attr.h) == kSuccess;
  };
  if (kernel == 0) {
    conv->relu_fused = relu && forward_pd(&conv->pd, true);
    if (!conv->relu_fused && !forward_pd(&conv->pd, false)) return;
  } else {
    if (!forward_pd(&forward, false)) return;
    OwnedAttr attr;
    check(g_api.attr_create(&attr.h), "attributes");
    check(g_api.attr_set_scratchpad_mode(attr.h, kScratchpadUser), "attributes");
    Status status;
    if (kernel == 1) {
      status = g_api.conv_backward_data_pd(&conv->pd.h, g_engine, kConvDirect, src_f32.h,
                                           weights_any.h, dst_any.h, d.strides, d.dilates,
                                           d.pad_l, d.pad_r, forward.h, attr.h);
    } else {
      status = g_api.conv_backward_weights_pd(&conv->pd.h, g_engine, kConvDirect, src_any.h,
                                              weights_f32.h, nullptr, dst_any.h, d.strides,
                                              d.dilates, d.pad_l, d.pad_r, forward.h, attr.h);
    }
    if (status != kSuccess) return;
  }
  const char* impl = nullptr;
  check(g_api.pd_query(conv->pd.h, kQueryImplInfo, 0, &impl), "query");
  conv->impl = impl != nullptr ? impl : "";
  conv->supported = !is_reference(conv->impl);  // correct, but slower than any of cct's
}

// Makes a supported Conv's operands, primitive and stream: the buffers of the reordered
// operands (about one copy of the layer's bottom, top and weights in their precision) are
// made only for the convolutions that run, not for those the races merely ask about.
void prepare(Conv* conv, int kernel, const ConvGeom& g, bool bias) {
  const ConvDims d = conv_dims(g);
  make_md(&conv->a.user, kernel == 1 ? d.dst : d.src, kF32, kTagAbcd);
  make_md(&conv->b.user, kernel == 2 ? d.dst : d.weights, kF32,
          kernel != 2 && g.group > 1 ? kTagAbcde : kTagAbcd);
  make_md(&conv->out.user, kernel == 0 ? d.dst : kernel == 1 ? d.src : d.weights, kF32,
          kernel == 2 && g.group > 1 ? kTagAbcde : kTagAbcd);
  const auto md = [&](int what) { return g_api.pd_query_md(conv->pd.h, what, 0); };
  size_t at = 0;
  switch (kernel) {
    case 0:
      at += conv->a.init(md(kQuerySrc), true, false, at);
      at += conv->b.init(md(kQueryWeights), true, false, at);
      at += conv->out.init(md(kQueryDst), false, false, at);
      if (bias) {
        make_md(&conv->bias_md, {g.o}, kF32, kTagA);
        check(g_api.memory_create(&conv->bias_mem.h, conv->bias_md.h, g_engine, nullptr),
              "memory");
      }
      break;
    case 1:
      at += conv->a.init(md(kQueryDiffDst), true, false, at);
      at += conv->b.init(md(kQueryWeights), true, false, at);
      at += conv->out.init(md(kQueryDiffSrc), false, false, at);
      break;
    default:
      at += conv->a.init(md(kQuerySrc), true, false, at);
      at += conv->b.init(md(kQueryDiffDst), true, false, at);
      at += conv->out.init(md(kQueryDiffWeights), false, true, at);
  }
  const ConstMd scratchpad = md(kQueryScratchpad);
  conv->scratchpad_offset = at;
  at += aligned(g_api.md_size(scratchpad));
  check(g_api.memory_create(&conv->scratchpad.h, scratchpad, g_engine, nullptr), "memory");
  conv->workspace_bytes = at;
  check(g_api.primitive_create(&conv->prim.h, conv->pd.h), "primitive");
  dnnl_stream* stream = nullptr;
  check(g_api.stream_create(&stream, g_engine, kInOrder), "stream");
  conv->stream = stream;
  conv->ready = true;
}

// The threads a call runs on: cct's count (kept in the key: oneDNN's blocking follows it).
int call_threads() { return std::max(1, num_threads()); }

// While it lives, the calling thread's OpenMP team is call_threads() strong: primitive
// descriptors are made for the thread count they will run on, and run on it.
struct Team {
  const int before = g_api.omp_get_max_threads();
  Team() { g_api.omp_set_num_threads(call_threads()); }
  ~Team() { g_api.omp_set_num_threads(before); }
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;
};

Conv* conv_for(int kernel, const ConvGeom& g, bool bf16, bool bias, bool relu,
               bool run = false) {
  if (!g_loaded.load()) return nullptr;
  const ConvKey key{kernel,
                    {g.n, g.c, g.h, g.w, g.o, g.ho, g.wo, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw,
                     g.dh, g.dw, g.group},
                    bf16, bias && kernel == 0, relu && kernel == 0, call_threads()};
  std::lock_guard<std::mutex> lock(g_conv_mutex);
  auto it = g_convs.find(key);
  Conv* conv = it != g_convs.end() ? it->second.get() : nullptr;
  if (conv != nullptr && (!run || conv->ready || !conv->supported)) return conv;
  const Team team;
  if (conv == nullptr) {
    auto made = std::make_unique<Conv>();
    build(made.get(), kernel, g, bf16, bias, relu);
    conv = g_convs.emplace(key, std::move(made)).first->second.get();
  }
  if (run && conv->supported) prepare(conv, kernel, g, bias);
  return conv;
}

Conv* supported_conv(int kernel, const ConvGeom& g, bool bf16, bool bias, bool relu) {
  Conv* conv = conv_for(kernel, g, bf16, bias, relu, true);
  if (conv == nullptr || !conv->supported)
    throw std::runtime_error("oneDNN has no convolution kernel for this layer");
  return conv;
}

// Runs a prepared convolution on the call's OpenMP team, cct's workers parked: its two
// operands (a, b: blobs, with their DNNL_ARG numbers) moved into the workspace where their
// layouts differ from the blobs', the primitive (with the bias where given), and its result
// moved out into `out` (added into it with accumulate). The workspace holds the inner tensors
// and oneDNN's scratchpad.
void execute(Conv* conv, int arg_a, const float* a, int arg_b, const float* b, int arg_out,
             float* out, bool accumulate, const float* bias = nullptr) {
  std::lock_guard<std::mutex> lock(conv->mutex);
  const uintptr_t raw =
      reinterpret_cast<uintptr_t>(thread_workspace(conv->workspace_bytes + kAlign));
  char* ws = reinterpret_cast<char*>((raw + kAlign - 1) / kAlign * kAlign);
  check(g_api.memory_set_handle(conv->scratchpad.h, ws + conv->scratchpad_offset),
        "memory handle");
  park_workers();
  const Team team;
  std::vector<ExecArg> args = {{arg_a, conv->a.bind(a, true, ws, conv->stream)},
                               {arg_b, conv->b.bind(b, true, ws, conv->stream)},
                               {arg_out, conv->out.bind(out, false, ws, conv->stream)},
                               {kArgScratchpad, conv->scratchpad.h}};
  if (bias != nullptr) {
    check(g_api.memory_set_handle(conv->bias_mem.h, const_cast<float*>(bias)), "memory");
    args.push_back({kArgBias, conv->bias_mem.h});
  }
  check(g_api.primitive_execute(conv->prim.h, conv->stream, int(args.size()), args.data()),
        "convolution");
  conv->out.finish(accumulate, conv->stream);
  check(g_api.stream_wait(conv->stream), "stream");
}

// -- Matmul -------------------------------------------------------------------------------
// One product's shape (the thread count of its calls included: oneDNN's blocking, and so its
// sums, follow it): the primitive, the reorders that round its float32 operands into the bf16
// layouts the primitive asked for, and their sizes. Nothing in it changes once built, so the
// threads of several batch partitions run one at once, each with its own memory objects,
// stream and buffers.
struct Matmul {
  bool supported = false;
  std::string impl;
  OwnedMd a_user, b_user, c_user;  // float32, the caller's strides
  ConstMd a_inner = nullptr, b_inner = nullptr, scratchpad = nullptr;  // the descriptor's
  OwnedPd pd, a_reorder_pd, b_reorder_pd;
  OwnedPrim prim, a_reorder, b_reorder;
  size_t b_offset = 0, scratchpad_offset = 0, bytes = 0;  // in the calling thread's buffer
};

using MatmulKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int64_t, int64_t, bool, int>;
std::mutex g_matmul_mutex;
std::map<MatmulKey, std::unique_ptr<Matmul>> g_matmuls;

// A float32 matrix operand of `items` (1: shared by every item) as oneDNN's 3-D descriptor of
// op(X) (rows x cols): stored rows x cols with row stride ld, or transposed (stored cols x
// rows) where `trans`.
void make_matrix_md(OwnedMd* md, int64_t items, int64_t rows, int64_t cols, bool trans,
                    int64_t ld, int64_t stride) {
  const Dims dims = {items, rows, cols};
  const int64_t span = trans ? cols * ld : rows * ld;  // an unused batch stride must be valid
  const Dims strides = {items > 1 ? stride : span, trans ? 1 : ld, trans ? ld : 1};
  check(g_api.md_create_strided(&md->h, 3, dims, kF32, strides), "memory descriptor");
}

void build_matmul(Matmul* mm, const MatmulShape& s) {
  const int64_t a_items = s.stride_a == 0 ? 1 : s.count, b_items = s.stride_b == 0 ? 1 : s.count;
  make_matrix_md(&mm->a_user, a_items, s.m, s.k, s.ta, s.lda, s.stride_a);
  make_matrix_md(&mm->b_user, b_items, s.k, s.n, s.tb, s.ldb, s.stride_b);
  make_matrix_md(&mm->c_user, s.count, s.m, s.n, false, s.ldc, s.stride_c);
  OwnedMd a_any, b_any;
  make_md(&a_any, {a_items, s.m, s.k}, kBf16, kTagAny);
  make_md(&b_any, {b_items, s.k, s.n}, kBf16, kTagAny);
  OwnedPostOps ops;
  OwnedAttr attr;
  check(g_api.attr_create(&attr.h), "attributes");
  check(g_api.attr_set_scratchpad_mode(attr.h, kScratchpadUser), "attributes");
  if (s.accumulate) {  // C + the product, one rounding: as cct's bf16 GEMMs add into C
    check(g_api.post_ops_create(&ops.h), "post-ops");
    check(g_api.post_ops_append_sum(ops.h, 1.0f, 0, 0), "sum post-op");
    check(g_api.attr_set_post_ops(attr.h, ops.h), "attributes");
  }
  // The result is written where C lies, with C's strides; a oneDNN without a kernel for that
  // (or for these operands) has none here.
  if (g_api.matmul_pd(&mm->pd.h, g_engine, a_any.h, b_any.h, nullptr, mm->c_user.h, attr.h) !=
      kSuccess)
    return;
  const char* impl = nullptr;
  check(g_api.pd_query(mm->pd.h, kQueryImplInfo, 0, &impl), "query");
  mm->impl = impl != nullptr ? impl : "";
  if (is_reference(mm->impl)) return;
  const auto md = [&](int what) { return g_api.pd_query_md(mm->pd.h, what, 0); };
  mm->a_inner = md(kQuerySrc);
  mm->b_inner = md(kQueryWeights);
  mm->scratchpad = md(kQueryScratchpad);
  check(g_api.reorder_pd(&mm->a_reorder_pd.h, mm->a_user.h, g_engine, mm->a_inner, g_engine,
                         nullptr),
        "reorder");
  check(g_api.reorder_pd(&mm->b_reorder_pd.h, mm->b_user.h, g_engine, mm->b_inner, g_engine,
                         nullptr),
        "reorder");
  check(g_api.primitive_create(&mm->a_reorder.h, mm->a_reorder_pd.h), "reorder");
  check(g_api.primitive_create(&mm->b_reorder.h, mm->b_reorder_pd.h), "reorder");
  check(g_api.primitive_create(&mm->prim.h, mm->pd.h), "matmul");
  mm->b_offset = aligned(g_api.md_size(mm->a_inner));
  mm->scratchpad_offset = mm->b_offset + aligned(g_api.md_size(mm->b_inner));
  mm->bytes = mm->scratchpad_offset + aligned(g_api.md_size(mm->scratchpad));
  mm->supported = true;
}

const Matmul* matmul_for(const MatmulShape& s) {
  if (!g_loaded.load()) return nullptr;
  const MatmulKey key{s.ta,       s.tb,  s.m,        s.n,   s.k,        s.lda,
                      s.stride_a, s.ldb, s.stride_b, s.ldc, s.stride_c, s.count,
                      s.accumulate, call_threads()};
  std::lock_guard<std::mutex> lock(g_matmul_mutex);
  auto it = g_matmuls.find(key);
  if (it != g_matmuls.end()) return it->second.get();
  const Team team;
  auto made = std::make_unique<Matmul>();
  build_matmul(made.get(), s);
  return g_matmuls.emplace(key, std::move(made)).first->second.get();
}

// The calling thread's rounded operands and scratchpad: not the convolution workspace, since a
// Winograd layout calls the matmul with its tiles in that one.
std::vector<char>& matmul_buffer() {
  thread_local std::vector<char> buffer;
  return buffer;
}

// A memory object over `handle`, for one call.
void make_memory(OwnedMem* mem, ConstMd md, void* handle) {
  check(g_api.memory_create(&mem->h, md, g_engine, handle), "memory");
}

}  // namespace

std::string load_onednn(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_load_mutex);
  if (g_loaded.load()) return "";
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return std::string(dlerror());
  Api api{};
  bool ok = bind(lib, "dnnl_engine_create", &api.engine_create) &&
            bind(lib, "dnnl_stream_create", &api.stream_create) &&
            bind(lib, "dnnl_stream_wait", &api.stream_wait) &&
            bind(lib, "dnnl_stream_destroy", &api.stream_destroy) &&
            bind(lib, "dnnl_memory_desc_create_with_strides", &api.md_create_strided) &&
            bind(lib, "dnnl_matmul_primitive_desc_create", &api.matmul_pd) &&
            bind(lib, "dnnl_memory_desc_create_with_tag", &api.md_create) &&
            bind(lib, "dnnl_memory_desc_destroy", &api.md_destroy) &&
            bind(lib, "dnnl_memory_desc_get_size", &api.md_size) &&
            bind(lib, "dnnl_memory_desc_equal", &api.md_equal) &&
            bind(lib, "dnnl_memory_create", &api.memory_create) &&
            bind(lib, "dnnl_memory_set_data_handle", &api.memory_set_handle) &&
            bind(lib, "dnnl_memory_destroy", &api.memory_destroy) &&
            bind(lib, "dnnl_primitive_attr_create", &api.attr_create) &&
            bind(lib, "dnnl_primitive_attr_destroy", &api.attr_destroy) &&
            bind(lib, "dnnl_primitive_attr_set_post_ops", &api.attr_set_post_ops) &&
            bind(lib, "dnnl_primitive_attr_set_scratchpad_mode", &api.attr_set_scratchpad_mode) &&
            bind(lib, "dnnl_post_ops_create", &api.post_ops_create) &&
            bind(lib, "dnnl_post_ops_destroy", &api.post_ops_destroy) &&
            bind(lib, "dnnl_post_ops_append_eltwise", &api.post_ops_append_eltwise) &&
            bind(lib, "dnnl_post_ops_append_sum", &api.post_ops_append_sum) &&
            bind(lib, "dnnl_convolution_forward_primitive_desc_create", &api.conv_forward_pd) &&
            bind(lib, "dnnl_convolution_backward_data_primitive_desc_create",
                 &api.conv_backward_data_pd) &&
            bind(lib, "dnnl_convolution_backward_weights_primitive_desc_create",
                 &api.conv_backward_weights_pd) &&
            bind(lib, "dnnl_reorder_primitive_desc_create", &api.reorder_pd) &&
            bind(lib, "dnnl_primitive_desc_query_md", &api.pd_query_md) &&
            bind(lib, "dnnl_primitive_desc_query", &api.pd_query) &&
            bind(lib, "dnnl_primitive_desc_destroy", &api.pd_destroy) &&
            bind(lib, "dnnl_primitive_create", &api.primitive_create) &&
            bind(lib, "dnnl_primitive_execute", &api.primitive_execute) &&
            bind(lib, "dnnl_primitive_destroy", &api.primitive_destroy) &&
            bind(lib, "dnnl_version", &api.version);
  if (!ok) {
    const char* error = dlerror();
    const std::string why = path + " lacks oneDNN 3's C API" +
                            (error != nullptr ? " (" + std::string(error) + ")" : "");
    dlclose(lib);
    return why;
  }
  const Version* v = api.version();
  // cpu_runtime 2 is DNNL_RUNTIME_OMP: the team size is GNU OpenMP's, set below per call.
  if (v->major != 3 || v->cpu_runtime != 2) {
    dlclose(lib);
    return path + " is oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) +
           " with CPU runtime " + std::to_string(v->cpu_runtime) +
           "; cct calls oneDNN 3 built with OpenMP (the onednn-cpu-gomp wheel)";
  }
  // libdnnl's own libgomp, loaded with it.
  void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (gomp == nullptr || !bind(gomp, "omp_set_num_threads", &api.omp_set_num_threads) ||
      !bind(gomp, "omp_get_max_threads", &api.omp_get_max_threads)) {
    dlclose(lib);
    return path + " did not bring GNU OpenMP (libgomp.so.1) with it";
  }
  g_api = api;
  if (g_api.engine_create(&g_engine, kCpu, 0) != kSuccess) {
    return path + " opened no CPU engine";
  }
  g_version = std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
              std::to_string(v->patch) + " (commit " + (v->hash ? v->hash : "?") + ")";
  g_loaded = true;
  return "";
}

bool onednn_loaded() { return g_loaded.load(); }

std::string onednn_version() {
  std::lock_guard<std::mutex> lock(g_load_mutex);
  return g_version;
}

void set_onednn_offered(bool float32, bool bf16) {
  if ((float32 || bf16) && !g_loaded.load()) throw std::runtime_error("oneDNN is not loaded");
  g_offered_float32 = float32;
  g_offered_bf16 = bf16;
}
bool onednn_offered(bool bf16) { return bf16 ? g_offered_bf16.load() : g_offered_float32.load(); }

bool onednn_conv_applies(int kernel, const ConvGeom& g, bool bf16) {
  const Conv* conv = conv_for(kernel, g, bf16, false, false);
  return conv != nullptr && conv->supported;
}

std::string onednn_conv_impl(int kernel, const ConvGeom& g, bool bf16) {
  const Conv* conv = conv_for(kernel, g, bf16, false, false);
  return conv != nullptr && conv->supported ? conv->impl : "";
}

void onednn_conv_forward(bool bf16, const float* x, const float* weight, const float* bias,
                         bool relu, float* y, const ConvGeom& g) {
  Conv* conv = supported_conv(0, g, bf16, bias != nullptr, relu);
  execute(conv, kArgSrc, x, kArgWeights, weight, kArgDst, y, false, bias);
  if (relu && !conv->relu_fused) {
    const int64_t count = g.n * g.o * g.ho * g.wo;
    parallel_for(count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = caffe_relu(y[i], 0.0f);
    });
  }
}

void onednn_conv_backward_data(bool bf16, const float* dy, const float* weight, float* dx,
                               const ConvGeom& g) {
  execute(supported_conv(1, g, bf16, false, false), kArgDiffDst, dy, kArgWeights, weight,
          kArgDiffSrc, dx, false);
}

void onednn_conv_backward_weight(bool bf16, const float* x, const float* dy, float* dweight,
                                 bool accumulate, const ConvGeom& g) {
  execute(supported_conv(2, g, bf16, false, false), kArgSrc, x, kArgDiffDst, dy,
          kArgDiffWeights, dweight, accumulate);
}

bool onednn_matmul_applies(const MatmulShape& s) {
  const Matmul* mm = matmul_for(s);
  return mm != nullptr && mm->supported;
}

std::string onednn_matmul_impl(const MatmulShape& s) {
  const Matmul* mm = matmul_for(s);
  return mm != nullptr && mm->supported ? mm->impl : "";
}

bool onednn_matmul_bf16(const MatmulShape& s, const float* a, const float* b, float* c) {
  const Matmul* mm = matmul_for(s);
  if (mm == nullptr || !mm->supported) return false;
  const uintptr_t raw =
      reinterpret_cast<uintptr_t>(grown(matmul_buffer(), mm->bytes + kAlign));
  char* ws = reinterpret_cast<char*>((raw + kAlign - 1) / kAlign * kAlign);
  OwnedMem a_user, b_user, c_user, a_inner, b_inner, scratchpad;
  make_memory(&a_user, mm->a_user.h, const_cast<float*>(a));
  make_memory(&b_user, mm->b_user.h, const_cast<float*>(b));
  make_memory(&c_user, mm->c_user.h, c);
  make_memory(&a_inner, mm->a_inner, ws);
  make_memory(&b_inner, mm->b_inner, ws + mm->b_offset);
  make_memory(&scratchpad, mm->scratchpad, ws + mm->scratchpad_offset);
  if (call_threads() > 1) park_workers();  // inside a partition the call is this thread's
  const Team team;
  OwnedStream stream;
  check(g_api.stream_create(&stream.h, g_engine, kInOrder), "stream");
  const ExecArg round_a[] = {{kArgSrc, a_user.h}, {kArgDst, a_inner.h}};
  const ExecArg round_b[] = {{kArgSrc, b_user.h}, {kArgDst, b_inner.h}};
  const ExecArg product[] = {{kArgSrc, a_inner.h}, {kArgWeights, b_inner.h},
                             {kArgDst, c_user.h}, {kArgScratchpad, scratchpad.h}};
  check(g_api.primitive_execute(mm->a_reorder.h, stream.h, 2, round_a), "reorder");
  check(g_api.primitive_execute(mm->b_reorder.h, stream.h, 2, round_b), "reorder");
  check(g_api.primitive_execute(mm->prim.h, stream.h, 4, product), "matmul");
  check(g_api.stream_wait(stream.h), "stream");
  return true;
}

void onednn_release_matmul_buffer() { std::vector<char>().swap(matmul_buffer()); }

}  // namespace cct
