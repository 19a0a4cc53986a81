// Strided convolutions in phase form (conv_phase.cpp): a stride-s layer as a stride-1 one over
// the bottom's s x s phase planes, so that the stride-1 layouts (direct, Winograd) compute it.
#pragma once
#include <cstdint>
#include <vector>

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

// The geometry whose lowering (conv.cpp's im2col) of one image is that image's phase form:
// an sh x sw kernel of stride (sh, sw) and the layer's pad, the phase planes as its output.
// Plane (c, r, q) is then row (c, r, q) of the lowered matrix, pixel (m, j) the padded
// bottom's (sh * m + r, sw * j + q), zero outside the bottom.
ConvGeom phase_lowering(const ConvGeom& g);

// The layer's own taps in each phase channel of one group, as (rows, columns) pairs in the
// phase form's channel order: channel (c, r, q) holds ceil((kh - r) / sh) x ceil((kw - q) / sw)
// of them, the first ones in each direction; the rest of its kh' x kw' kernel is zero.
std::vector<int32_t> phase_tap_extents(const ConvGeom& g);

// wp = the weights in phase form: tap (a, b) of channel (c, r, q) is tap (sh * a + r,
// sw * b + q) of channel c, zero past the kernel.
void phase_weight(const float* weight, const ConvGeom& g, float* wp);
// dweight = (or += with accumulate) the phase form's weight gradient dwp on the real taps
// (the zero taps' gradients are dropped).
void unphase_weight(const float* dwp, const ConvGeom& g, float* dweight, bool accumulate);

}  // namespace cct
