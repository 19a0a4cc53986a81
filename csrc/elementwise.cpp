// Element-by-element kernels: ReLU forward and backward, and SGD's fused update.
//
// Each works on flat arrays split between cct's threads in contiguous slices. Every output may
// be the same array as an input (in place): element i of an output depends only on element i of
// the inputs. The arithmetic is written in the order of Caffe's (relu_layer.cpp,
// sgd_solver.cpp), one rounding per step, so the results equal NumPy's on the same steps.
#include "kernels.h"
#include "parallel.h"

#include <algorithm>

namespace cct {

template <typename T>
void relu_forward(const T* x, T* y, int64_t count, T negative_slope) {
  parallel_for(count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      y[i] = std::max(x[i], T(0)) + negative_slope * std::min(x[i], T(0));
  });
}

template <typename T>
void relu_backward(const T* src, const T* dy, T* dx, int64_t count, T negative_slope) {
  parallel_for(count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      dx[i] = dy[i] * (T(src[i] > T(0)) + negative_slope * T(src[i] <= T(0)));
  });
}

namespace {

// One pass over the four arrays; the decay test is hoisted out of the loop so that it vectorizes.
template <typename T, bool kDecay>
void sgd_pass(T* data, T* diff, T* history, int64_t begin, int64_t end, T local_rate,
              T momentum, T local_decay) {
  for (int64_t i = begin; i < end; ++i) {
    T g = diff[i];
    if (kDecay) {
      const T decay = data[i] * local_decay;
      g += decay;
    }
    g *= local_rate;
    T h = history[i] * momentum;
    h += g;
    history[i] = h;
    diff[i] = h;
    data[i] -= h;
  }
}

}  // namespace

template <typename T>
void sgd_update(T* data, T* diff, T* history, int64_t count, T local_rate, T momentum,
                T local_decay) {
  parallel_for(count, 1, [&](int64_t begin, int64_t end) {
    if (local_decay != T(0))
      sgd_pass<T, true>(data, diff, history, begin, end, local_rate, momentum, local_decay);
    else
      sgd_pass<T, false>(data, diff, history, begin, end, local_rate, momentum, local_decay);
  });
}

#define CCT_INSTANTIATE(T)                                                          \
  template void relu_forward<T>(const T*, T*, int64_t, T);                          \
  template void relu_backward<T>(const T*, const T*, T*, int64_t, T);               \
  template void sgd_update<T>(T*, T*, T*, int64_t, T, T, T);
CCT_INSTANTIATE(float)
CCT_INSTANTIATE(double)
#undef CCT_INSTANTIATE

}  // namespace cct
