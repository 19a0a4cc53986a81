// Strided convolutions in phase form.
//
// Why: a stride-s layer reads its padded bottom at s * (output pixel) + tap. Split each tap
// as u = s * a + r (phase r, 0 <= r < s) and it reads phase plane r (every s-th row from row r)
// at output pixel + a: a stride-1 convolution over s x s times as many channels, with a
// kernel of ceil(k / s) taps a side whose taps past k are zero. The stride-1 layouts then
// apply: CaffeNet's and AlexNet's conv1 (11x11, stride 4, 3 channels: lowered only, its
// im2col of 121 taps a pixel as costly as the GEMM) become a 3x3 convolution over 48 channels
// that Winograd computes with 4x fewer multiplications, GoogLeNet's 7x7 stride-2 conv1 a 4x4
// one over 12 channels for the direct kernel. Winograd's tiles compute the zero taps (19%,
// 11 -> 12, and 31%, 7 -> 8, more multiplications than the layer has); the direct kernel
// runs only the taps phase_tap_extents names (GoogLeNet's conv1: 49 products a channel, not
// 64). A zero tap's term is +-0 and each sum keeps its other terms in their order, so that
// changes no sum (but one that is exactly -0), save where the bottom holds an infinity or a
// NaN: 0 * x made outputs NaN whose window does not hold it, which Caffe's own arithmetic
// (no zero taps) does not. Measurement (conv.cpp) decides whether a layout pays on a layer,
// against the lowered one.
//
// The phase planes are as large as the padded bottom; the weights' phase form is small. Each
// bottom pixel is in exactly one phase plane, so backward data is a gather (no sums) and the
// weight gradient of a real tap is its phase tap's gradient.
//
// Rounding: each output is the stride-1 layout's sum, in its own order (not Caffe's): a layer
// asking for Caffe's engine never gets a phase layout (conv.cpp).
#include "conv_phase.h"

namespace cct {

namespace {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

bool phase_applies(const ConvGeom& g) {
  return (g.sh > 1 || g.sw > 1) && g.dh == 1 && g.dw == 1 && g.kh >= g.sh && g.kw >= g.sw;
}

ConvGeom phase_geometry(const ConvGeom& g, int64_t images) {
  const int64_t kh = ceil_div(g.kh, g.sh), kw = ceil_div(g.kw, g.sw);
  return {images, g.c * g.sh * g.sw, g.ho + kh - 1, g.wo + kw - 1, g.o, g.ho, g.wo,
          kh, kw, 1, 1, 0, 0, 1, 1, g.group};
}

ConvGeom phase_lowering(const ConvGeom& g) {
  const ConvGeom pg = phase_geometry(g, g.n);
  return {g.n, g.c, g.h, g.w, pg.c, pg.h, pg.w, g.sh, g.sw, g.sh, g.sw, g.ph, g.pw, 1, 1, 1};
}

std::vector<int32_t> phase_tap_extents(const ConvGeom& g) {
  std::vector<int32_t> extent;
  extent.reserve(std::size_t(2 * (g.c / g.group) * g.sh * g.sw));
  for (int64_t c = 0; c < g.c / g.group; ++c)
    for (int64_t r = 0; r < g.sh; ++r)
      for (int64_t q = 0; q < g.sw; ++q) {
        extent.push_back(int32_t(ceil_div(g.kh - r, g.sh)));
        extent.push_back(int32_t(ceil_div(g.kw - q, g.sw)));
      }
  return extent;
}

void phase_weight(const float* weight, const ConvGeom& g, float* wp) {
  const ConvGeom pg = phase_geometry(g, 1);
  const int64_t filters = g.o * (g.c / g.group);  // (output, input channel) pairs
  for (int64_t f = 0; f < filters; ++f) {
    const float* src = weight + f * g.kh * g.kw;
    for (int64_t r = 0; r < g.sh; ++r) {
      for (int64_t q = 0; q < g.sw; ++q) {
        float* dst = wp + ((f * g.sh + r) * g.sw + q) * pg.kh * pg.kw;
        for (int64_t a = 0; a < pg.kh; ++a) {
          for (int64_t b = 0; b < pg.kw; ++b) {
            const int64_t u = g.sh * a + r, v = g.sw * b + q;
            dst[a * pg.kw + b] = u < g.kh && v < g.kw ? src[u * g.kw + v] : 0.0f;
          }
        }
      }
    }
  }
}

void unphase_weight(const float* dwp, const ConvGeom& g, float* dweight, bool accumulate) {
  const ConvGeom pg = phase_geometry(g, 1);
  const int64_t filters = g.o * (g.c / g.group);
  for (int64_t f = 0; f < filters; ++f) {
    float* dst = dweight + f * g.kh * g.kw;
    for (int64_t u = 0; u < g.kh; ++u) {
      for (int64_t v = 0; v < g.kw; ++v) {
        const int64_t r = u % g.sh, q = v % g.sw;
        const float d = dwp[((f * g.sh + r) * g.sw + q) * pg.kh * pg.kw +
                            (u / g.sh) * pg.kw + v / g.sw];
        dst[u * g.kw + v] = accumulate ? dst[u * g.kw + v] + d : d;
      }
    }
  }
}

}  // namespace cct
