// The direct convolution (conv_direct.cpp): stride-1 float layers on CPUs with AVX2 and FMA,
// one of the layouts conv.cpp's plans choose among by measurement.
#pragma once
#include <cstdint>

#include "kernels.h"

namespace cct {

// Whether this CPU runs the direct kernels (AVX2 and FMA), and their 16-pixel tile (AVX-512).
bool cpu_has_direct_conv();
bool cpu_has_avx512();
// Whether a geometry can use them: stride 1, and for backward data a pad of at most
// (kernel - 1) * dilation.
bool direct_conv_applies(const ConvGeom& g, bool backward_data);

// The three kernels over images [begin, end), threaded with parallel_for (serial inside a
// partition). Forward and backward data take vectors of `lanes` pixels, 8 or (where the CPU has
// AVX-512) 16, with the same bits. Backward weight writes dweight, or adds into it with accumulate;
// its `lanes` 16 (where the CPU has AVX-512) puts two output channels' 8 pixels in a vector, again
// with the same bits. `extent`: for each input channel of a group, (rows, columns) of its taps to
// run, the first ones of the kernel (a strided layer's phase form pads the rest with zeros:
// conv_phase.h's phase_tap_extents); forward and backward weight skip the others (backward weight
// leaves their gradients unwritten). Null: every channel's kh x kw taps. relu: the forward's top
// through caffe_relu (kernels.h's conv_forward).
void conv_forward_direct(const float* x, const float* weight, const float* bias, bool relu,
                         float* y, const ConvGeom& g, int64_t begin, int64_t end, int lanes = 8,
                         const int32_t* extent = nullptr);
void conv_backward_data_direct(const float* dy, const float* weight, float* dx,
                               const ConvGeom& g, int64_t begin, int64_t end, int lanes = 8);
void conv_backward_weight_direct(const float* x, const float* dy, float* dweight,
                                 const ConvGeom& g, int64_t begin, int64_t end,
                                 bool accumulate, const int32_t* extent = nullptr,
                                 int lanes = 8);

}  // namespace cct
