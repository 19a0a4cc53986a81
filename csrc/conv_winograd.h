// The Winograd F(2x2, 3x3) and F(2x2, 5x5) convolutions (conv_winograd.cpp): 3x3 and 5x5,
// stride-1, undilated float layers, one of the layouts conv.cpp's plans choose among by
// measurement.
#pragma once
#include <cstdint>

#include "kernels.h"

namespace cct {

// Whether a geometry can use it with output tiles of m x m: a square 3x3 or 5x5 kernel for
// m = 2, 3x3 for m = 4; stride 1, dilation 1, and for backward data a pad of at most k - 1.
bool winograd_applies(const ConvGeom& g, bool backward_data, int m);

// The three kernels over images [begin, end), in chunks of at most `budget` bytes of
// transformed tiles, with m x m output tiles (where winograd_applies); the transforms are
// threaded with parallel_for, the GEMMs by the BLAS.
// relu: the forward's top through caffe_relu (kernels.h's conv_forward).
void conv_forward_winograd(const float* x, const float* weight, const float* bias, bool relu,
                           float* y, const ConvGeom& g, int64_t begin, int64_t end,
                           int64_t budget, int m);
void conv_backward_data_winograd(const float* dy, const float* weight, float* dx,
                                 const ConvGeom& g, int64_t begin, int64_t end, int64_t budget,
                                 int m);
// dweight = (or += with accumulate) the weight gradient over images [begin, end):
// G^T [sum over tiles of (A dy A^T) (.) (B^T d B)] G, the adjoint of the forward transforms.
void conv_backward_weight_winograd(const float* x, const float* dy, float* dweight,
                                   const ConvGeom& g, int64_t begin, int64_t end,
                                   int64_t budget, bool accumulate, int m);

}  // namespace cct
