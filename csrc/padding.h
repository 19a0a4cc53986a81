// A plane copied into a zeroed buffer with its pad: what the direct and Winograd convolutions
// and the AVE pooling kernels read in place of the bottom (MAX pooling's is filled with
// -FLT_MAX instead). Built whole before it is read: a row read by vector loads straight
// after its copy waits on store forwarding.
#pragma once
#include <algorithm>
#include <cstdint>

namespace cct {

// dst (rows x width floats) = `fill` (zeros unless said), with the h x w plane src at row
// `top`, column `left`. A negative offset cuts the plane's first rows or columns; what falls
// past the buffer is cut.
inline void pad_plane(const float* src, int64_t h, int64_t w, int64_t top, int64_t left,
                      float* dst, int64_t rows, int64_t width, float fill = 0.0f) {
  std::fill(dst, dst + rows * width, fill);
  const int64_t r0 = std::max<int64_t>(0, -top), r1 = std::min(h, rows - top);
  const int64_t c0 = std::max<int64_t>(0, -left), c1 = std::min(w, width - left);
  if (r1 <= r0 || c1 <= c0) return;
  for (int64_t r = r0; r < r1; ++r)
    std::copy(src + r * w + c0, src + r * w + c1, dst + (r + top) * width + c0 + left);
}

}  // namespace cct
