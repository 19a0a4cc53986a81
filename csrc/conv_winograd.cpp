// Winograd F(2x2, 3x3) convolution (Lavin and Gray, 2016) for 3x3, stride-1, undilated float
// layers: the wide 3x3 layers of CaffeNet, AlexNet and GoogLeNet, where the lowered GEMM is
// already compute-bound and the only way to go faster is to multiply less.
//
// Each 2x2 block of output pixels (a tile) comes from a 4x4 block of the bottom d, through
//   Y = A^T [ (G g G^T) (.) (B^T d B) ] A
// with g the 3x3 filter, so 16 multiplications per (filter, channel, tile) where the direct
// convolution makes 36. Summed over the input channels, position e of the 4x4 transformed
// tile is one GEMM:
//   M[e] (O x T) = U[e] (O x C) * V[e] (C x T),   U = G g G^T, V = B^T d B, T = tiles,
// 16 GEMMs in one strided batch over a chunk of images, between an input transform (which
// writes V) and an output transform (which reads M, adds the bias and writes the top). The
// chunk is as many images as keep V and M within the convolution's workspace budget.
//
// Backward data of a stride-1 3x3 convolution with pad p is the 3x3 convolution of the top
// diff with the filters flipped and channels swapped, pad 2 - p: the same code.
//
// The weight gradient is the adjoint of the forward transforms: per position e,
// W[e] (O x C) = D[e] (O x T) * V[e]^T with D = A dy A^T the top diff's 2x2 tiles transformed,
// summed over the chunks, then dW = G^T W G once.
//
// The transforms add and subtract, except G's halves: the result differs from the lowered
// GEMM's by a few float32 roundings per output (the kernel tests' tolerance), and like every
// plan is the same on every call of a geometry.
#include "conv_winograd.h"

#include <algorithm>
#include <vector>

#include "gemm.h"
#include "parallel.h"
#include "workspace.h"

namespace cct {

namespace {

constexpr int kTile = 16;  // positions in a transformed 4x4 tile

// A 3x3 stride-1 convolution as the transforms see it: c channels of h x w in, pad (ph, pw),
// o channels of ho x wo out.
struct Shape {
  int64_t c, h, w, o, ho, wo, ph, pw;
  int64_t tiles_h() const { return (ho + 1) / 2; }
  int64_t tiles_w() const { return (wo + 1) / 2; }
  int64_t tiles() const { return tiles_h() * tiles_w(); }
};

thread_local std::vector<float> t_filters;

// U[e][o][c] = (G g G^T)[e] for filter g = weight(o, c, ., .).
template <typename Weight>
void transform_filters(const Shape& s, Weight&& weight, float* u) {
  parallel_for(s.o, s.c * 64, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t c = 0; c < s.c; ++c) {
        float g[3][3], r[4][3];
        for (int i = 0; i < 3; ++i)
          for (int j = 0; j < 3; ++j) g[i][j] = weight(o, c, i, j);
        for (int j = 0; j < 3; ++j) {  // rows: G g
          r[0][j] = g[0][j];
          r[1][j] = 0.5f * (g[0][j] + g[1][j] + g[2][j]);
          r[2][j] = 0.5f * (g[0][j] - g[1][j] + g[2][j]);
          r[3][j] = g[2][j];
        }
        for (int i = 0; i < 4; ++i) {  // columns: (G g) G^T
          float* out = u + (i * 4 * s.o + o) * s.c + c;
          const int64_t step = s.o * s.c;
          out[0] = r[i][0];
          out[step] = 0.5f * (r[i][0] + r[i][1] + r[i][2]);
          out[2 * step] = 0.5f * (r[i][0] - r[i][1] + r[i][2]);
          out[3 * step] = r[i][2];
        }
      }
  });
}

// The transforms are separable (a 4x4 transform is one along rows, then one along columns) and
// are computed that way, a whole row of tiles at a time: every inner loop then runs over the
// tiles of a row, contiguous in V, M and D, which the compiler vectorizes (built for AVX2 as
// well as the baseline where the CPU is x86, chosen at load time).
#if defined(__x86_64__)
#define CCT_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CCT_VECTOR_CLONES
#endif

// One channel of one image: out[e * step + ty * tw + tx] = (B^T d B)[e] of tile (ty, tx).
// `rows` (4 x (2 * th + 2) x tw floats) holds each bottom row's transform along columns.
CCT_VECTOR_CLONES
void transform_input_plane(const float* plane, const Shape& s, float* rows, float* padded,
                           float* out, int64_t step) {
  const int64_t th = s.tiles_h(), tw = s.tiles_w(), width = 2 * tw + 2;
  for (int64_t r = 0; r < 2 * th + 2; ++r) {
    const int64_t row = r - s.ph;
    // The bottom row with its pad as zeros, 2 * tw + 2 columns from column -pw.
    for (int64_t q = 0; q < width; ++q) {
      const int64_t col = q - s.pw;
      padded[q] = row >= 0 && row < s.h && col >= 0 && col < s.w ? plane[row * s.w + col] : 0.0f;
    }
    float* h = rows + r * 4 * tw;
    for (int64_t tx = 0; tx < tw; ++tx) {  // d B, along the row
      const float d0 = padded[2 * tx], d1 = padded[2 * tx + 1], d2 = padded[2 * tx + 2],
                  d3 = padded[2 * tx + 3];
      h[tx] = d0 - d2;
      h[tw + tx] = d1 + d2;
      h[2 * tw + tx] = d2 - d1;
      h[3 * tw + tx] = d1 - d3;
    }
  }
  for (int64_t ty = 0; ty < th; ++ty) {  // B^T (d B), across four rows
    const float* h0 = rows + 2 * ty * 4 * tw;
    const float *h1 = h0 + 4 * tw, *h2 = h1 + 4 * tw, *h3 = h2 + 4 * tw;
    float* o = out + ty * tw;
    for (int j = 0; j < 4; ++j) {
      float* o0 = o + j * step;
      float* o1 = o + (4 + j) * step;
      float* o2 = o + (8 + j) * step;
      float* o3 = o + (12 + j) * step;
      for (int64_t tx = 0; tx < tw; ++tx) {
        const int64_t k = j * tw + tx;
        o0[tx] = h0[k] - h2[k];
        o1[tx] = h1[k] + h2[k];
        o2[tx] = h2[k] - h1[k];
        o3[tx] = h1[k] - h3[k];
      }
    }
  }
}

thread_local std::vector<float> t_rows, t_padded_row;

// Runs plane(channel, image, rows, padded) for each of `channels` channels of nb images, the
// channels split across threads, each thread with row buffers sized for the largest need
// (transform_input's: a row of tile transforms for every bottom row).
template <typename Plane>
void each_plane(int64_t channels, int64_t nb, const Shape& s, Plane&& plane) {
  parallel_for(channels, nb * s.tiles() * kTile, [&](int64_t c0, int64_t c1) {
    float* rows = grown(t_rows, size_t(4 * (2 * s.tiles_h() + 2) * s.tiles_w()));
    float* padded = grown(t_padded_row, size_t(2 * s.tiles_w() + 2));
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t m = 0; m < nb; ++m) plane(c, m, rows, padded);
  });
}

// Images per chunk: as many as keep one chunk's transformed tiles (16 x (c + o) x tiles per
// image) within `budget` bytes, at least one.
int64_t chunk_images(const Shape& s, int64_t images, int64_t budget) {
  const int64_t per_image = kTile * (s.c + s.o) * s.tiles();
  return std::max<int64_t>(
      1, std::min<int64_t>(images, budget / int64_t(sizeof(float)) / per_image));
}

// V[e][c][t] = (B^T d B)[e] for the bottom's tiles of nb images (image m's channel c at
// x + m * x_image + c * h * w), t = m * tiles + ty * tiles_w + tx.
void transform_input(const float* x, int64_t x_image, const Shape& s, int64_t nb, float* v) {
  const int64_t tpi = s.tiles(), count = nb * tpi, step = s.c * count;
  each_plane(s.c, nb, s, [&](int64_t c, int64_t m, float* rows, float* padded) {
    transform_input_plane(x + m * x_image + c * s.h * s.w, s, rows, padded,
                          v + c * count + m * tpi, step);
  });
}

// One channel of one image: plane (ho x wo) = (A^T M A) of each tile + b, cut at the edge.
// `rows` holds 2 x 4 x tw floats (one row of tiles transformed along columns), `padded` a top
// row of 2 * tw pixels.
CCT_VECTOR_CLONES
void transform_output_plane(const float* in, int64_t step, float b, const Shape& s, float* rows,
                            float* padded, float* plane) {
  const int64_t th = s.tiles_h(), tw = s.tiles_w();
  for (int64_t ty = 0; ty < th; ++ty) {
    const float* m = in + ty * tw;
    for (int j = 0; j < 4; ++j) {  // A^T m, across the tile's rows
      const float *m0 = m + j * step, *m1 = m + (4 + j) * step, *m2 = m + (8 + j) * step,
                  *m3 = m + (12 + j) * step;
      float* r0 = rows + j * tw;
      float* r1 = rows + (4 + j) * tw;
      for (int64_t tx = 0; tx < tw; ++tx) {
        r0[tx] = m0[tx] + m1[tx] + m2[tx];
        r1[tx] = m1[tx] - m2[tx] - m3[tx];
      }
    }
    for (int i = 0; i < 2 && 2 * ty + i < s.ho; ++i) {  // (A^T m) A, along the row
      const float* r = rows + i * 4 * tw;
      for (int64_t tx = 0; tx < tw; ++tx) {
        padded[2 * tx] = r[tx] + r[tw + tx] + r[2 * tw + tx] + b;
        padded[2 * tx + 1] = r[tw + tx] - r[2 * tw + tx] - r[3 * tw + tx] + b;
      }
      std::copy(padded, padded + s.wo, plane + (2 * ty + i) * s.wo);
    }
  }
}

// The top of nb images (image m's channel o at y + m * y_image + o * ho * wo) =
// (A^T M A) + bias, the 2x2 tiles cut at the top's edge.
void transform_output(const float* mm, const float* bias, const Shape& s, int64_t nb, float* y,
                      int64_t y_image) {
  const int64_t tpi = s.tiles(), count = nb * tpi, step = s.o * count;
  each_plane(s.o, nb, s, [&](int64_t o, int64_t m, float* rows, float* padded) {
    transform_output_plane(mm + o * count + m * tpi, step, bias ? bias[o] : 0.0f, s, rows,
                           padded, y + m * y_image + o * s.ho * s.wo);
  });
}

// Images [begin, end), a group at a time, in chunks whose V and M fit `budget` bytes.
template <typename Weight>
void winograd(const float* x, int64_t x_image, int64_t x_group, const float* bias, float* y,
              int64_t y_image, int64_t y_group, int64_t groups, const Shape& s, int64_t begin,
              int64_t end, int64_t budget, Weight&& weight_of_group) {
  const int64_t chunk = chunk_images(s, end - begin, budget);
  float* u = grown(t_filters, size_t(kTile * s.o * s.c));
  for (int64_t grp = 0; grp < groups; ++grp) {
    transform_filters(s, [&](int64_t o, int64_t c, int i, int j) {
      return weight_of_group(grp, o, c, i, j);
    }, u);
    for (int64_t n0 = begin; n0 < end; n0 += chunk) {
      const int64_t nb = std::min(chunk, end - n0), count = nb * s.tiles();
      float* v = static_cast<float*>(
          thread_workspace(size_t(kTile * (s.c + s.o) * count) * sizeof(float)));
      float* mm = v + kTile * s.c * count;
      transform_input(x + n0 * x_image + grp * x_group, x_image, s, nb, v);
      gemm_batch_strided(false, false, s.o, count, s.c, 1.0f, u, s.c, s.o * s.c, v, count,
                         s.c * count, 0.0f, mm, count, s.o * count, kTile, true);
      transform_output(mm, bias ? bias + grp * s.o : nullptr, s, nb,
                       y + n0 * y_image + grp * y_group, y_image);
    }
  }
}

// One channel of one image's top diff: out[e * step + ty * tw + tx] = (A g A^T)[e] of its
// 2x2 tile (ty, tx), zero past the edge. `rows` holds 2 x 4 x tw floats, `padded` 2 * tw.
CCT_VECTOR_CLONES
void transform_top_diff_plane(const float* plane, const Shape& s, float* rows, float* padded,
                              float* out, int64_t step) {
  const int64_t th = s.tiles_h(), tw = s.tiles_w();
  for (int64_t ty = 0; ty < th; ++ty) {
    for (int i = 0; i < 2; ++i) {  // g A^T, along each of the tile's two rows
      const int64_t oh = 2 * ty + i;
      for (int64_t q = 0; q < 2 * tw; ++q)
        padded[q] = oh < s.ho && q < s.wo ? plane[oh * s.wo + q] : 0.0f;
      float* r = rows + i * 4 * tw;
      for (int64_t tx = 0; tx < tw; ++tx) {
        const float g0 = padded[2 * tx], g1 = padded[2 * tx + 1];
        r[tx] = g0;
        r[tw + tx] = g0 + g1;
        r[2 * tw + tx] = g0 - g1;
        r[3 * tw + tx] = -g1;
      }
    }
    float* o = out + ty * tw;
    for (int j = 0; j < 4; ++j) {  // A (g A^T), across the two rows
      const float* r0 = rows + j * tw;
      const float* r1 = rows + (4 + j) * tw;
      float *o0 = o + j * step, *o1 = o + (4 + j) * step, *o2 = o + (8 + j) * step,
            *o3 = o + (12 + j) * step;
      for (int64_t tx = 0; tx < tw; ++tx) {
        o0[tx] = r0[tx];
        o1[tx] = r0[tx] + r1[tx];
        o2[tx] = r0[tx] - r1[tx];
        o3[tx] = -r1[tx];
      }
    }
  }
}

// D[e][o][t] = (A dy_t A^T)[e] for the top diff's 2x2 tiles of nb images (zero past the top's
// edge): the weight gradient's transform of dy, the adjoint of transform_output.
void transform_top_diff(const float* dy, int64_t dy_image, const Shape& s, int64_t nb,
                        float* d) {
  const int64_t tpi = s.tiles(), count = nb * tpi, step = s.o * count;
  each_plane(s.o, nb, s, [&](int64_t o, int64_t m, float* rows, float* padded) {
    transform_top_diff_plane(dy + m * dy_image + o * s.ho * s.wo, s, rows, padded,
                             d + o * count + m * tpi, step);
  });
}

// dw[o][c] (3x3, or += with accumulate) = G^T W[.][o][c] G: the weight gradient's output
// transform, the adjoint of transform_filters.
void transform_filter_gradient(const float* w, const Shape& s, float* dw, bool accumulate) {
  const int64_t step = s.o * s.c;
  parallel_for(s.o, s.c * 64, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t c = 0; c < s.c; ++c) {
        float a[4][4], r[3][4];
        for (int e = 0; e < kTile; ++e) a[e / 4][e % 4] = w[e * step + o * s.c + c];
        for (int j = 0; j < 4; ++j) {  // rows: G^T a
          r[0][j] = a[0][j] + 0.5f * (a[1][j] + a[2][j]);
          r[1][j] = 0.5f * (a[1][j] - a[2][j]);
          r[2][j] = 0.5f * (a[1][j] + a[2][j]) + a[3][j];
        }
        float* out = dw + (o * s.c + c) * 9;
        for (int i = 0; i < 3; ++i) {  // columns: (G^T a) G
          const float v[3] = {r[i][0] + 0.5f * (r[i][1] + r[i][2]), 0.5f * (r[i][1] - r[i][2]),
                              0.5f * (r[i][1] + r[i][2]) + r[i][3]};
          for (int j = 0; j < 3; ++j) out[i * 3 + j] = accumulate ? out[i * 3 + j] + v[j] : v[j];
        }
      }
  });
}

}  // namespace

bool winograd_applies(const ConvGeom& g, bool backward_data) {
  if (g.kh != 3 || g.kw != 3 || g.sh != 1 || g.sw != 1 || g.dh != 1 || g.dw != 1) return false;
  // Backward data's pad 2 - p must not be negative.
  return !backward_data || (g.ph <= 2 && g.pw <= 2);
}

void conv_forward_winograd(const float* x, const float* weight, const float* bias, float* y,
                           const ConvGeom& g, int64_t begin, int64_t end, int64_t budget) {
  const int64_t cg = g.c / g.group, og = g.o / g.group;
  const Shape s{cg, g.h, g.w, og, g.ho, g.wo, g.ph, g.pw};
  winograd(x, g.c * g.h * g.w, cg * g.h * g.w, bias, y, g.o * g.ho * g.wo, og * g.ho * g.wo,
           g.group, s, begin, end, budget, [&](int64_t grp, int64_t o, int64_t c, int i, int j) {
             return weight[(((grp * og + o) * cg + c) * 3 + i) * 3 + j];
           });
}

void conv_backward_data_winograd(const float* dy, const float* weight, float* dx,
                                 const ConvGeom& g, int64_t begin, int64_t end,
                                 int64_t budget) {
  const int64_t cg = g.c / g.group, og = g.o / g.group;
  // The flipped convolution: dy's og channels in, the bottom's cg out, pad 2 - p.
  const Shape s{og, g.ho, g.wo, cg, g.h, g.w, 2 - g.ph, 2 - g.pw};
  winograd(dy, g.o * g.ho * g.wo, og * g.ho * g.wo, nullptr, dx, g.c * g.h * g.w,
           cg * g.h * g.w, g.group, s, begin, end, budget,
           [&](int64_t grp, int64_t c_out, int64_t o_in, int i, int j) {
             return weight[(((grp * og + o_in) * cg + c_out) * 3 + (2 - i)) * 3 + (2 - j)];
           });
}

void conv_backward_weight_winograd(const float* x, const float* dy, float* dweight,
                                   const ConvGeom& g, int64_t begin, int64_t end,
                                   int64_t budget, bool accumulate) {
  const int64_t cg = g.c / g.group, og = g.o / g.group;
  const Shape s{cg, g.h, g.w, og, g.ho, g.wo, g.ph, g.pw};
  const int64_t chunk = chunk_images(s, end - begin, budget);
  // The transformed gradient, summed over the chunks before its one output transform.
  float* w = grown(t_filters, size_t(kTile * s.o * s.c));
  for (int64_t grp = 0; grp < g.group; ++grp) {
    std::fill(w, w + kTile * s.o * s.c, 0.0f);
    for (int64_t n0 = begin; n0 < end; n0 += chunk) {
      const int64_t nb = std::min(chunk, end - n0), count = nb * s.tiles();
      float* v = static_cast<float*>(
          thread_workspace(size_t(kTile * (s.c + s.o) * count) * sizeof(float)));
      float* d = v + kTile * s.c * count;
      transform_input(x + n0 * g.c * g.h * g.w + grp * cg * g.h * g.w, g.c * g.h * g.w, s, nb,
                      v);
      transform_top_diff(dy + n0 * g.o * g.ho * g.wo + grp * og * g.ho * g.wo,
                         g.o * g.ho * g.wo, s, nb, d);
      gemm_batch_strided(false, true, s.o, s.c, count, 1.0f, d, count, s.o * count, v, count,
                         s.c * count, 1.0f, w, s.c, s.o * s.c, kTile, true);
    }
    transform_filter_gradient(w, s, dweight + grp * og * cg * 9, accumulate);
  }
}

}  // namespace cct
