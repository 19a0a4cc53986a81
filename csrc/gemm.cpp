// GEMM with the operand order chosen by measurement.
//
// C = op(A) op(B) can also be computed as C^T = op(B)^T op(A)^T followed by a transpose of the
// m x n result. On shapes with a long inner dimension and a small result (the weight gradients
// of convolution and inner product layers) OpenBLAS's speed depends strongly on that order:
// measured here, up to 4x either way, with no simple rule. The first call with a given shape
// times both orders (the transposed one where C is at most 4 MiB) and caches the faster;
// later calls just run it. The two orders round differently, so the choice is part of what
// makes a run reproducible: the table can be saved and installed in another process
// (cct/backend/plans.py).
//
// Under bf16 GEMMs (bf16.h) each order is also timed in float32: where the GEMM is bound by
// memory rather than arithmetic (fc6's backward data at batch 32: 0.66x float32's speed in
// bf16 on a Zen 4, whose operands are rounded and packed on every call) float32 runs it. Calls
// of the skinny form with B^T (a fully connected layer's forward) also race cct's bf16 kernel
// in that form (bf16.h's gemm_bf16_skinny), which rounds B as it streams instead.
//
// Float32 calls of the skinny engine's form (gemm_skinny.h: C with at most 64 rows times a
// B or B^T streamed along the summed dimension: a fully connected layer's forward and backward
// data at batch 32, a thin convolution's weight gradient, a lowered convolution's GEMMs where
// it has at most 64 filters) also race that engine; those of the thin engine's (gemm_thin.h: a
// summed dimension of at most 256, B stored k x n: a fully connected layer's weight gradient at
// a small batch, its backward data where num_output <= 256, a lowered convolution's backward
// data with at most 256 filters per group) race that one, on CPUs with AVX2 and FMA (its
// 16-lane tile where they have AVX-512F; the same bits).
//
// Where MKL is loaded and offered (mkl.h; cct/backend/mkl.py offers it where MKL is installed),
// float32 calls also race MKL's cblas_sgemm, whole on as many MKL threads as OpenBLAS runs (one
// inside a batch partition). Its AVX-512 kernels are the small-GEMM engine OpenBLAS lacks on
// Intel's CPUs (OpenBLAS's SkylakeX kernels ran 32-row GEMMs at 45-70% of a Xeon core's peak);
// on AMD's the races seldom pick it.
//
// Strided batched GEMMs (gemm_batch_measured: Winograd's 16 or 36 products per chunk of
// images, the pointwise layout's one per image) run one BLAS call, OpenBLAS's
// cblas_sgemm_batch_strided; where MKL is offered, float32 ones race MKL's too, per shape and
// count, in a table of their own, whose choices (a cache's, a resumed run's) run wherever MKL
// is loaded. Their matrices are small (32 x 64 by 32 on CIFAR10-quick's conv2), where OpenBLAS's
// small-matrix kernels ran at half a Xeon core's peak (its `sgemm_small_kernel_tn` under
// Winograd's weight gradient, bench/RESULTS.md). Under bf16 GEMMs a batch that may multiply in
// bf16 (not float32_only: the pointwise layout's, Winograd F(2x2, 3x3)'s) races the items one
// by one in bf16 against the float32 calls, in the same table with element size 2, as the plain
// GEMMs race float32 under bf16: bf16 where it is faster (Winograd's large products on a Zen 4's
// AVX512-BF16: 1.5-1.85x), float32 where the items are too small to repay bf16's packing.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gemm.h"
#include "gemm_skinny.h"
#include "gemm_thin.h"
#include "kernels.h"
#include "mkl.h"
#include "onednn.h"
#include "parallel.h"
#include "race.h"

namespace cct {

namespace {

// ta tb m n k element-size BLAS-threads accumulate (beta != 0)
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int, bool>;
std::mutex g_mutex;
// 0 direct, 1 transposed; under bf16 also 2 and 3: the same orders in float32; 4 the skinny
// engine, 5 MKL's sgemm, 6 the skinny engine's 16-lane tile (AVX-512; the same bits as 4): all
// float32 whatever the precision; under bf16 also 8 and 9: the direct order in bf16 on MKL's
// whole-GEMM threads and on cct's kernel, where bf16.h offers them shape by shape; 10 the thin
// engine (float32 whatever the precision); under bf16 also 11 and 12: cct's kernel in the
// skinny and the thin forms (bf16.h's gemm_bf16_skinny, gemm_bf16_thin; the bits of 9), and 13:
// oneDNN's matmul with bf16 operands where oneDNN is offered to bf16's races (onednn.h; its own
// bits).
constexpr int kSkinnyChoice = 4, kMklChoice = 5, kSkinny16Choice = 6;
constexpr int kBf16MklThreadedChoice = 8, kBf16KernelChoice = 9, kThinChoice = 10;
constexpr int kBf16SkinnyChoice = 11, kBf16ThinChoice = 12, kOnednnChoice = 13;
std::map<Key, int> g_transposed;
std::atomic<int> g_order{0};  // 0 measure, 1 direct, 2 transposed
// Batched GEMMs: ta tb m n k count element-size BLAS-threads accumulate -> 0 the BLAS's
// float32 call, 5 MKL's, 7 the items one by one in bf16 (element size 2, under bf16 only), 8
// and 9 the same on MKL's whole-GEMM threads and on cct's kernel (offered as for a GEMM), 13
// the whole batch in one call of oneDNN's matmul (element size 2, as for a GEMM).
using BatchKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool>;
constexpr int kBf16ItemsChoice = 7;
std::map<BatchKey, int> g_batched;

// The bf16 engine of choice 8 or 9 (in both tables), else -1.
int bf16_engine_of(int choice) {
  return choice == kBf16MklThreadedChoice ? kBf16MklThreaded
         : choice == kBf16KernelChoice    ? kBf16Kernel
                                          : -1;
}

// The per-shape engines' choices the races offer now (bf16.h's bf16_shape_engine_offered).
void push_offered_engines(std::vector<int>& choices) {
  for (int choice : {kBf16MklThreadedChoice, kBf16KernelChoice})
    if (bf16_shape_engine_offered(bf16_engine_of(choice))) choices.push_back(choice);
}

// Whether oneDNN's matmul may take a call: under bf16, oneDNN offered to bf16's races, alpha 1
// and beta 0 or 1 (what its sum post-op adds); onednn.h then says whether it has a kernel of
// its own for the shape.
bool onednn_matmul_allowed(float alpha, float beta) {
  return bf16_gemm_enabled() && onednn_offered(true) && alpha == 1.0f &&
         (beta == 0.0f || beta == 1.0f);
}

// The race's question: allowed, and a kernel of oneDNN's own for the shape.
bool onednn_matmul_takes(const MatmulShape& s, float alpha, float beta) {
  return onednn_matmul_allowed(alpha, beta) && onednn_matmul_applies(s);
}

MatmulShape matmul_shape(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda,
                         int64_t stride_a, int64_t ldb, int64_t stride_b, float beta,
                         int64_t ldc, int64_t stride_c, int64_t count) {
  return {ta, tb, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, count, beta != 0.0f};
}

// A table's rows: each key's fields, then its choice (kernels.h's GemmChoice, GemmBatchChoice).
template <typename Row, typename Key_>
std::vector<Row> rows_of(const std::map<Key_, int>& table) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<Row> out;
  for (const auto& [key, choice] : table) out.push_back(std::tuple_cat(key, std::tuple(choice)));
  return out;
}

// The fastest of `choices` (race.h's race, a candidate over twice the best's first time not
// run again). Ties go to the earlier.
template <typename Reset, typename Run>
int fastest_of(const std::vector<int>& choices, Reset&& reset, Run&& run) {
  const RaceResult result = race(choices.size(), 2.0, reset, [&](size_t at) {
    return seconds_of([&] { run(choices[at]); });
  });
  return choices[result.fastest];
}

// C (m x n, ldc) = beta C + T^T, T being n x m (contiguous).
template <typename T>
void add_transposed(const T* t, int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  parallel_for(m, n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T* row = c + i * ldc;
      if (beta == T(0)) {
        for (int64_t j = 0; j < n; ++j) row[j] = t[j * m + i];
      } else {
        for (int64_t j = 0; j < n; ++j) row[j] = beta * row[j] + t[j * m + i];
      }
    }
  });
}

template <typename T>
void gemm_transposed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                     int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc,
                     std::vector<T>& scratch, bool float32_only = false) {
  scratch.resize(size_t(m * n));
  gemm(!tb, !ta, n, m, k, alpha, b, ldb, a, lda, T(0), scratch.data(), m, float32_only);
  add_transposed(scratch.data(), m, n, beta, c, ldc);
}

// Whether the skinny engine can take the call: float32 (or float32 under bf16), its form.
template <typename T>
bool skinny_applies(int64_t m, int64_t n, int64_t k, T alpha) {
  if constexpr (std::is_same_v<T, float>) return gemm_skinny_applies(m, n, k, alpha);
  return false;
}

// The same for the thin engine.
template <typename T>
bool thin_applies(bool tb, int64_t m, int64_t n, int64_t k, T alpha) {
  if constexpr (std::is_same_v<T, float>) return gemm_thin_applies(tb, m, n, k, alpha);
  return false;
}

// MKL's sgemm runs on as many threads as OpenBLAS would (one inside a batch partition): the
// count the table's key holds, so that a choice of MKL replays the same split of the work.
int mkl_threads() { return std::max(1, blas_get_num_threads()); }

// Whether MKL's sgemm races the call: float32, MKL loaded and offered, and able to run on that
// many threads (its threading layer, or one thread).
template <typename T>
bool mkl_applies() {
  return std::is_same_v<T, float> && mkl_sgemm_offered() &&
         (mkl_threaded() || mkl_threads() == 1);
}

// Runs the call as `choice` says. A choice that cannot run here (a plan made on a CPU with
// AVX2 installed on one without; MKL's, where MKL is not loaded) runs the direct order; plans.py
// warns when it installs such a plan.
template <typename T>
void run_choice(int choice, bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha,
                const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc,
                std::vector<T>& scratch) {
  if (choice == kSkinnyChoice || choice == kSkinny16Choice) {
    if constexpr (std::is_same_v<T, float>) {
      if (skinny_applies(m, n, k, alpha)) {
        gemm_skinny(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc,
                    choice == kSkinny16Choice ? 16 : 8);
        return;
      }
    }
    choice = 0;
  }
  if (choice == kThinChoice) {
    if constexpr (std::is_same_v<T, float>) {
      if (thin_applies(tb, m, n, k, alpha)) {
        gemm_thin(ta, m, n, k, a, lda, b, ldb, beta, c, ldc);
        return;
      }
    }
    choice = 0;
  }
  if (choice == kBf16SkinnyChoice) {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16_gemm_enabled() && gemm_bf16_skinny_applies(tb, m, n, k, alpha)) {
        gemm_bf16_skinny(ta, m, n, k, a, lda, b, ldb, beta, c, ldc);
        return;
      }
    }
    choice = 0;  // the chosen engine's direct order (in float32 when bf16 is off)
  }
  if (choice == kBf16ThinChoice) {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16_gemm_enabled() && gemm_bf16_thin_applies(tb, m, n, k, alpha)) {
        gemm_bf16_thin(ta, m, n, k, a, lda, b, ldb, beta, c, ldc);
        return;
      }
    }
    choice = 0;  // as for 11
  }
  if (choice == kOnednnChoice) {
    if constexpr (std::is_same_v<T, float>) {
      if (onednn_matmul_allowed(alpha, beta) &&
          onednn_matmul_bf16(matmul_shape(ta, tb, m, n, k, lda, 0, ldb, 0, beta, ldc, 0, 1), a,
                             b, c))
        return;
    }
    choice = 0;  // the chosen bf16 engine's direct order (plans.py warns)
  }
  if (choice == kMklChoice) {
    if constexpr (std::is_same_v<T, float>) {
      if (mkl_loaded()) {
        mkl_sgemm(mkl_threads(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
      }
    }
    choice = 0;
  }
  if (const int engine = bf16_engine_of(choice); engine >= 0) {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16_engine_runs(engine)) {
        gemm_bf16_on(engine, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
      }
    }
    choice = 0;  // the chosen engine's direct order
  }
  const bool float32_only = choice >= 2;
  if (choice & 1) {
    gemm_transposed(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, scratch,
                    float32_only);
  } else {
    gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, float32_only);
  }
}

// The transposed orders race only where C is at most this large: they write C^T to a scratch
// as large and pass over both again, which on a large C costs more than OpenBLAS's order
// gains (no C over 4 MiB chose them in CIFAR10-quick's or CaffeNet's races on a Zen 3), and
// the scratch would double the memory of the lowered convolutions' races (their backward
// data's C is the whole column buffer: 82 MB for CIFAR10-quick's conv2).
constexpr int64_t kTransposedMaxBytes = int64_t(4) << 20;

// `s`: the call's shape for oneDNN's matmul, whose kernels depend on the strides too.
template <typename T>
std::vector<int> candidates(bool tb, int64_t m, int64_t n, int64_t k, const MatmulShape& s) {
  const bool bf16 = std::is_same_v<T, float> && bf16_gemm_enabled();
  const bool transposable = m * n * int64_t(sizeof(T)) <= kTransposedMaxBytes;
  std::vector<int> choices{0};
  if (transposable) choices.push_back(1);
  if (bf16) choices.push_back(2);
  if (bf16 && transposable) choices.push_back(3);
  if (skinny_applies(m, n, k, T(1))) {
    choices.push_back(kSkinnyChoice);
    if (gemm_skinny16_available()) choices.push_back(kSkinny16Choice);
  }
  if (thin_applies(tb, m, n, k, T(1))) choices.push_back(kThinChoice);
  if (mkl_applies<T>()) choices.push_back(kMklChoice);
  if (bf16) push_offered_engines(choices);
  if (bf16 && gemm_bf16_skinny_applies(tb, m, n, k, 1.0f)) choices.push_back(kBf16SkinnyChoice);
  if (bf16 && gemm_bf16_thin_applies(tb, m, n, k, 1.0f)) choices.push_back(kBf16ThinChoice);
  if (bf16 && onednn_matmul_takes(s, 1.0f, s.accumulate ? 1.0f : 0.0f))
    choices.push_back(kOnednnChoice);
  return choices;
}

// The table's key of a call: bf16 GEMMs (bf16.h) take their own orders (element size 2).
template <typename T>
Key key_of(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T beta) {
  const bool bf16 = std::is_same_v<T, float> && bf16_gemm_enabled();
  return Key{ta, tb, m, n, k, bf16 ? 2 : int64_t(sizeof(T)), blas_get_num_threads(),
             beta != T(0)};
}

template <typename T>
int choose_order(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                 const T* b, int64_t ldb, T beta, T* c, int64_t ldc, std::vector<T>& scratch) {
  if (g_order != 0) return g_order == 2 ? 1 : 0;
  // bf16 GEMMs (bf16.h) take their own orders: element size 2. Adding into C and overwriting
  // it are timed apart: OpenBLAS overwrites in two passes (C scaled by beta = 0, then added
  // to) and bf16 kernels add in one that reads C, so a weight gradient of fc6's shape at batch
  // 32 (4096 x 9216 by 32, 151 MB of C) is 1.3x faster overwritten in bf16 than in float32 and
  // 1.8x slower added to (Zen 5): one race for both picked the wrong one for the call layers
  // make.
  const bool accumulate = beta != T(0);
  const Key key = key_of(ta, tb, m, n, k, beta);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_transposed.find(key);
    if (it != g_transposed.end()) return it->second;
    if (!plan_measurement()) return g_transposed.emplace(key, 0).first->second;
  }
  // A call that adds into C races on a copy of it; one that overwrites C races in C itself,
  // which the chosen plan then writes again (no second C: the lowered convolutions' tops are
  // tens of MB).
  std::vector<T> out(accumulate ? size_t(m * n) : 0);
  T* target = accumulate ? out.data() : c;
  const int64_t ld_target = accumulate ? n : ldc;
  const int fastest = fastest_of(
      candidates<T>(tb, m, n, k,
                    matmul_shape(ta, tb, m, n, k, lda, 0, ldb, 0, float(beta), ldc, 0, 1)),
      [&] {
        if (accumulate)
          for (int64_t i = 0; i < m; ++i) std::copy(c + i * ldc, c + i * ldc + n, &out[i * n]);
      },
      [&](int choice) {
        run_choice(choice, ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, target, ld_target,
                   scratch);
      });
  // The transposed orders' product stays in this thread's scratch between calls; a race it
  // lost gives that memory back (a shape that chose it grows it again at its next call).
  if (fastest != 1 && fastest != 3) std::vector<T>().swap(scratch);
  if (fastest != kOnednnChoice) onednn_release_matmul_buffer();  // likewise oneDNN's copies
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_transposed.emplace(key, fastest).first->second;
}

// Whether MKL's batched sgemm can run a batched call: MKL loaded with the batched form, and
// every item's offset fits MKL's 32-bit integers.
bool mkl_batch_runs(int64_t count, int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  const int64_t limit = int64_t(1) << 31;
  return mkl_loaded() && mkl_has_sgemm_batch() && count > 1 && stride_a * count < limit &&
         stride_b * count < limit && stride_c * count < limit;
}

// Whether it races the call too: MKL's sgemm offered (gemm.cpp's rule above).
bool mkl_batch_applies(int64_t count, int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  return mkl_applies<float>() && mkl_batch_runs(count, stride_a, stride_b, stride_c);
}

// A batched call's choice without a race: the precision's own (bf16 items under bf16).
int default_batch_choice(const BatchKey& key) {
  return std::get<6>(key) == 2 ? kBf16ItemsChoice : 0;
}

// The table's choice for a batched call (the default when an order is forced), -1 before it
// has one.
int known_batch_choice(const BatchKey& key) {
  if (g_order != 0) return default_batch_choice(key);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_batched.find(key);
  return it == g_batched.end() ? -1 : it->second;
}

// Runs the call as `choice` says; MKL's where it cannot run here (a plan from a run with MKL,
// MKL not loaded now; plans.py warns) runs the BLAS's, and a per-shape bf16 engine that cannot
// runs the items on the chosen one. The bf16 items go through gemm(), which rounds the
// operands while bf16 GEMMs are on (its key holds that they are).
void run_batch_choice(int choice, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                      float alpha, const float* a, int64_t lda, int64_t stride_a,
                      const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                      int64_t ldc, int64_t stride_c, int64_t count) {
  if (choice == kMklChoice && mkl_batch_runs(count, stride_a, stride_b, stride_c)) {
    mkl_sgemm_batch_strided(mkl_threads(), ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb,
                            stride_b, beta, c, ldc, stride_c, count);
    return;
  }
  if (choice == kOnednnChoice) {
    if (onednn_matmul_allowed(alpha, beta) &&
        onednn_matmul_bf16(matmul_shape(ta, tb, m, n, k, lda, stride_a, ldb, stride_b, beta,
                                        ldc, stride_c, count),
                           a, b, c))
      return;
    choice = kBf16ItemsChoice;  // the items on the chosen bf16 engine (plans.py warns)
  }
  if (const int engine = bf16_engine_of(choice); engine >= 0) {
    if (bf16_engine_runs(engine)) {
      for (int64_t i = 0; i < count; ++i)
        gemm_bf16_on(engine, ta, tb, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b,
                     ldb, beta, c + i * stride_c, ldc);
      return;
    }
    choice = kBf16ItemsChoice;
  }
  gemm_batch_strided(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                     stride_c, count, choice != kBf16ItemsChoice);
}

// A batched call's choice among `choices` when the table has none: raced as choose_order races
// (a call that adds into C on a copy of C's span), or the default without timing when plans
// are not measured.
int choose_batch(const BatchKey& key, const std::vector<int>& choices, bool ta, bool tb,
                 int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                 int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta,
                 float* c, int64_t ldc, int64_t stride_c, int64_t count) {
  const bool accumulate = beta != 0.0f;
  if (!plan_measurement()) {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_batched.emplace(key, default_batch_choice(key)).first->second;
  }
  const int64_t span = (count - 1) * stride_c + (m - 1) * ldc + n;
  std::vector<float> out(accumulate ? size_t(span) : 0);
  float* target = accumulate ? out.data() : c;
  const int fastest = fastest_of(
      choices, [&] { if (accumulate) std::copy(c, c + span, out.begin()); },
      [&](int choice) {
        run_batch_choice(choice, ta, tb, m, n, k, 1.0f, a, lda, stride_a, b, ldb, stride_b,
                         beta, target, ldc, stride_c, count);
      });
  if (fastest != kOnednnChoice) onednn_release_matmul_buffer();  // as choose_order does
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_batched.emplace(key, fastest).first->second;
}

}  // namespace

template <typename T>
void gemm_batch_measured(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                         int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b,
                         T beta, T* c, int64_t ldc, int64_t stride_c, int64_t count,
                         bool float32_only) {
  // With neither MKL loaded nor bf16 on, every choice runs the BLAS's call: no table to read
  // on this path.
  if constexpr (std::is_same_v<T, float>) {
    const bool bf16 = !float32_only && bf16_gemm_enabled();
    if (mkl_loaded() || bf16) {
      const BatchKey key{ta, tb, m, n, k, count, bf16 ? 2 : 4, blas_get_num_threads(),
                         beta != 0.0f};
      int choice = known_batch_choice(key);
      if (choice < 0) {
        // bf16's items first: ties, and plans not measured, go to the precision asked for.
        std::vector<int> choices;
        if (bf16) choices.push_back(kBf16ItemsChoice);
        choices.push_back(0);
        if (mkl_batch_applies(count, stride_a, stride_b, stride_c))
          choices.push_back(kMklChoice);
        if (bf16) push_offered_engines(choices);
        if (bf16 && onednn_matmul_takes(matmul_shape(ta, tb, m, n, k, lda, stride_a, ldb,
                                                     stride_b, beta, ldc, stride_c, count),
                                        1.0f, beta))
          choices.push_back(kOnednnChoice);
        if (choices.size() > 1)
          choice = choose_batch(key, choices, ta, tb, m, n, k, a, lda, stride_a, b, ldb,
                                stride_b, beta, c, ldc, stride_c, count);
      }
      if (choice >= 0) {
        run_batch_choice(choice, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                         beta, c, ldc, stride_c, count);
        return;
      }
    }
  }
  gemm_batch_strided(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                     stride_c, count, float32_only);
}

std::vector<GemmBatchChoice> gemm_batch_choices() { return rows_of<GemmBatchChoice>(g_batched); }

void load_gemm_batch_choices(const std::vector<GemmBatchChoice>& entries) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& [ta, tb, m, n, k, count, size, threads, accumulate, choice] : entries) {
    const bool bf16_choice = choice == kBf16ItemsChoice || bf16_engine_of(choice) >= 0 ||
                             choice == kOnednnChoice;
    if ((size != 4 && size != 2) ||
        (choice != 0 && choice != kMklChoice && (!bf16_choice || size != 2)))
      throw std::invalid_argument(
          "a batched GEMM's element size must be 4 (float32) or 2 (bf16), its choice 0 (the "
          "BLAS's) or 5 (MKL's), or 7, 8, 9 (bf16 items) or 13 (oneDNN's) with element size 2");
    g_batched[BatchKey{ta, tb, m, n, k, count, size, threads, accumulate}] = choice;
  }
}

template <typename T>
void gemm_measured(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  thread_local std::vector<T> scratch;
  const int choice = choose_order(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, scratch);
  run_choice(choice, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, scratch);
}

template <typename T>
int gemm_known_choice(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T beta) {
  if (g_order != 0) return g_order == 2 ? 1 : 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_transposed.find(key_of(ta, tb, m, n, k, beta));
  return it == g_transposed.end() ? -1 : it->second;
}

std::vector<int> gemm_candidates(int64_t m, int64_t n, int64_t k, bool tb) {
  // oneDNN's kernels as for compact operands, overwriting C
  return candidates<float>(tb, m, n, k,
                           matmul_shape(false, tb, m, n, k, k, 0, tb ? k : n, 0, 0.0f, n, 0, 1));
}

std::vector<GemmChoice> gemm_choices() { return rows_of<GemmChoice>(g_transposed); }

void load_gemm_choices(const std::vector<GemmChoice>& entries) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& [ta, tb, m, n, k, size, threads, accumulate, choice] : entries) {
    const bool bf16_only = (choice >= 2 && choice <= 3) || bf16_engine_of(choice) >= 0 ||
                           choice == kBf16SkinnyChoice || choice == kBf16ThinChoice ||
                           choice == kOnednnChoice;
    if (choice < 0 || choice == kBf16ItemsChoice || choice > kOnednnChoice ||
        (bf16_only && size != 2) || (choice >= kSkinnyChoice && size == 8))
      throw std::invalid_argument(
          "a GEMM choice must be 0 or 1 (2, 3, 8, 9, 11, 12 or 13 under bf16), or 4, 5, 6 or 10 "
          "in float32 or bf16");
    g_transposed[Key{ta, tb, m, n, k, size, threads, accumulate}] = choice;
  }
}

int64_t gemm_choice_count() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return int64_t(g_transposed.size() + g_batched.size());
}

void clear_gemm_choices() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_transposed.clear();
  g_batched.clear();
}

void set_gemm_order(int order) {
  if (order < 0 || order > 2) throw std::invalid_argument("gemm order must be 0, 1 or 2");
  g_order = order;
}

template int gemm_known_choice<float>(bool, bool, int64_t, int64_t, int64_t, float);
template void gemm_measured<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                   int64_t, const float*, int64_t, float, float*, int64_t);
template void gemm_batch_measured<float>(bool, bool, int64_t, int64_t, int64_t, float,
                                         const float*, int64_t, int64_t, const float*, int64_t,
                                         int64_t, float, float*, int64_t, int64_t, int64_t,
                                         bool);
template void gemm_batch_measured<double>(bool, bool, int64_t, int64_t, int64_t, double,
                                          const double*, int64_t, int64_t, const double*,
                                          int64_t, int64_t, double, double*, int64_t, int64_t,
                                          int64_t, bool);
template void gemm_measured<double>(bool, bool, int64_t, int64_t, int64_t, double,
                                    const double*, int64_t, const double*, int64_t, double,
                                    double*, int64_t);

}  // namespace cct
