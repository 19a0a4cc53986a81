// Strided convolutions in phase form (conv_phase.cpp): a stride-s layer as a stride-1 one over
// the bottom's s x s phase planes, so that the stride-1 layouts (direct, Winograd) compute it.
#pragma once
#include <cstdint>

#include "kernels.h"

namespace cct {

// Whether a geometry has a phase form worth the name: a stride above 1 in some axis, no
// dilation, and a kernel at least as large as the stride in both axes (a smaller one would
// leave whole phases of zero taps).
bool phase_applies(const ConvGeom& g);

// The phase form of `images` images: C * sh * sw channels (channel c's phase (r, q) is channel
// (c * sh + r) * sw + q, so a group's channels stay contiguous) of Ho + kh' - 1 by
// Wo + kw' - 1 pixels, kernel kh' x kw' = ceil(kh / sh) x ceil(kw / sw), stride 1, no pad.
ConvGeom phase_geometry(const ConvGeom& g, int64_t images);

// p (images n1 - n0 in phase form) = the phase planes of x's images [n0, n1): plane (c, r, q)
// holds the padded bottom's pixels (sh * m + r, sw * j + q), zero outside the bottom.
void phase_bottom(const float* x, const ConvGeom& g, int64_t n0, int64_t n1, float* p);
// The adjoint, which is a gather: dx's images [n0, n1) from the phase form's gradient dp
// (every bottom pixel is one phase pixel, or none when no tap reads it: zero).
void unphase_bottom(const float* dp, const ConvGeom& g, int64_t n0, int64_t n1, float* dx);
// wp = the weights in phase form: tap (a, b) of channel (c, r, q) is tap (sh * a + r,
// sw * b + q) of channel c, zero past the kernel.
void phase_weight(const float* weight, const ConvGeom& g, float* wp);
// dweight = (or += with accumulate) the phase form's weight gradient dwp on the real taps
// (the zero taps' gradients are dropped).
void unphase_weight(const float* dwp, const ConvGeom& g, float* dweight, bool accumulate);

}  // namespace cct
