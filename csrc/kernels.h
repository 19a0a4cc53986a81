// Declarations of cct's CPU kernels; bound to Python in module.cpp.
#pragma once
#include <cstdint>

namespace cct {

template <typename T>
void max_pool_forward(const T* x, T* y, int64_t* mask, int64_t planes, int h, int w,
                      int kh, int kw, int sh, int sw, int ph, int pw, int ho, int wo);
template <typename T>
void max_pool_backward(const T* dy, const int64_t* mask, T* dx, int64_t planes, int h, int w,
                       int ho, int wo);
template <typename T>
void ave_pool_forward(const T* x, T* y, int64_t planes, int h, int w, int kh, int kw, int sh,
                      int sw, int ph, int pw, int ho, int wo);
template <typename T>
void ave_pool_backward(const T* dy, T* dx, int64_t planes, int h, int w, int kh, int kw, int sh,
                       int sw, int ph, int pw, int ho, int wo);

}  // namespace cct
