// Pooling kernels with Caffe's exact window rules (pooling_layer.cpp), over the whole batch.
//
// Windows start at ph*stride - pad. MAX scans the window clipped to the bottom and keeps the
// first strict maximum (Caffe's `>`), recording its flat index within the H*W plane. AVE divides
// by the window size clipped to the padded bottom (padding counts, what lies beyond it does not).
// Planes (image, channel) are split between cct's threads.
#include "kernels.h"
#include "parallel.h"

#include <algorithm>
#include <limits>

namespace cct {

template <typename T>
void max_pool_forward(const T* x, T* y, int64_t* mask, int64_t planes, int h, int w,
                      int kh, int kw, int sh, int sw, int ph, int pw, int ho, int wo) {
  parallel_for(planes, int64_t(ho) * wo * kh * kw, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* xp = x + p * h * w;
      T* yp = y + p * ho * wo;
      int64_t* mp = mask + p * ho * wo;
      for (int oh = 0; oh < ho; ++oh) {
        int hs = oh * sh - ph;
        int he = std::min(hs + kh, h);
        hs = std::max(hs, 0);
        for (int ow = 0; ow < wo; ++ow) {
          int ws = ow * sw - pw;
          int we = std::min(ws + kw, w);
          ws = std::max(ws, 0);
          T best = -std::numeric_limits<T>::max();
          int64_t arg = -1;
          for (int i = hs; i < he; ++i)
            for (int j = ws; j < we; ++j)
              if (xp[i * w + j] > best) { best = xp[i * w + j]; arg = i * w + j; }
          yp[oh * wo + ow] = best;
          mp[oh * wo + ow] = arg;
        }
      }
    }
  });
}

template <typename T>
void max_pool_backward(const T* dy, const int64_t* mask, T* dx, int64_t planes, int h, int w,
                       int ho, int wo) {
  parallel_for(planes, int64_t(h) * w + int64_t(ho) * wo, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* dyp = dy + p * ho * wo;
      const int64_t* mp = mask + p * ho * wo;
      T* dxp = dx + p * h * w;
      std::fill(dxp, dxp + int64_t(h) * w, T(0));
      for (int k = 0; k < ho * wo; ++k)
        if (mp[k] >= 0) dxp[mp[k]] += dyp[k];
    }
  });
}

template <typename T>
void ave_pool_forward(const T* x, T* y, int64_t planes, int h, int w, int kh, int kw, int sh,
                      int sw, int ph, int pw, int ho, int wo) {
  parallel_for(planes, int64_t(ho) * wo * kh * kw, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* xp = x + p * h * w;
      T* yp = y + p * ho * wo;
      for (int oh = 0; oh < ho; ++oh) {
        int hs = oh * sh - ph;
        int he = std::min(hs + kh, h + ph);
        for (int ow = 0; ow < wo; ++ow) {
          int ws = ow * sw - pw;
          int we = std::min(ws + kw, w + pw);
          const T size = T((he - hs) * (we - ws));
          T sum = 0;
          for (int i = std::max(hs, 0); i < std::min(he, h); ++i)
            for (int j = std::max(ws, 0); j < std::min(we, w); ++j) sum += xp[i * w + j];
          yp[oh * wo + ow] = sum / size;
        }
      }
    }
  });
}

template <typename T>
void ave_pool_backward(const T* dy, T* dx, int64_t planes, int h, int w, int kh, int kw, int sh,
                       int sw, int ph, int pw, int ho, int wo) {
  parallel_for(planes, int64_t(ho) * wo * kh * kw, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* dyp = dy + p * ho * wo;
      T* dxp = dx + p * h * w;
      std::fill(dxp, dxp + int64_t(h) * w, T(0));
      for (int oh = 0; oh < ho; ++oh) {
        int hs = oh * sh - ph;
        int he = std::min(hs + kh, h + ph);
        for (int ow = 0; ow < wo; ++ow) {
          int ws = ow * sw - pw;
          int we = std::min(ws + kw, w + pw);
          const T g = dyp[oh * wo + ow] / T((he - hs) * (we - ws));
          for (int i = std::max(hs, 0); i < std::min(he, h); ++i)
            for (int j = std::max(ws, 0); j < std::min(we, w); ++j) dxp[i * w + j] += g;
        }
      }
    }
  });
}

#define CCT_INSTANTIATE(T)                                                                    \
  template void max_pool_forward<T>(const T*, T*, int64_t*, int64_t, int, int, int, int, int, \
                                    int, int, int, int, int);                                 \
  template void max_pool_backward<T>(const T*, const int64_t*, T*, int64_t, int, int, int,    \
                                     int);                                                    \
  template void ave_pool_forward<T>(const T*, T*, int64_t, int, int, int, int, int, int, int, \
                                    int, int, int);                                           \
  template void ave_pool_backward<T>(const T*, T*, int64_t, int, int, int, int, int, int, int,\
                                     int, int, int);
CCT_INSTANTIATE(float)
CCT_INSTANTIATE(double)
#undef CCT_INSTANTIATE

}  // namespace cct
