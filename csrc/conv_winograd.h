// The Winograd F(2x2, 3x3) convolution (conv_winograd.cpp): 3x3, stride-1, undilated float
// layers, one of the layouts conv.cpp's plans choose among by measurement.
#pragma once
#include <cstdint>

#include "kernels.h"

namespace cct {

// Whether a geometry can use it: a 3x3 kernel, stride 1, dilation 1, and for backward data a
// pad of at most 2.
bool winograd_applies(const ConvGeom& g, bool backward_data);

// The three kernels over images [begin, end), in chunks of at most `budget` bytes of
// transformed tiles; the transforms are threaded with parallel_for, the GEMMs by the BLAS.
void conv_forward_winograd(const float* x, const float* weight, const float* bias, float* y,
                           const ConvGeom& g, int64_t begin, int64_t end, int64_t budget);
void conv_backward_data_winograd(const float* dy, const float* weight, float* dx,
                                 const ConvGeom& g, int64_t begin, int64_t end,
                                 int64_t budget);
// dweight = (or += with accumulate) the weight gradient over images [begin, end):
// G^T [sum over tiles of (A dy A^T) (.) (B^T d B)] G, the adjoint of the forward transforms.
void conv_backward_weight_winograd(const float* x, const float* dy, float* dweight,
                                   const ConvGeom& g, int64_t begin, int64_t end,
                                   int64_t budget, bool accumulate);

}  // namespace cct
