// Winograd F(2x2, 3x3), F(4x4, 3x3) and F(2x2, 5x5) convolution (Lavin and Gray, 2016) for
// 3x3 and 5x5, stride-1, undilated float layers: the wide 3x3 layers of CaffeNet, AlexNet and
// GoogLeNet and the 5x5 layers of CaffeNet, CIFAR10-quick and GoogLeNet, where the lowered GEMM
// is already compute-bound and the only way to go faster is to multiply less.
//
// Each m x m block of output pixels (a tile) comes from an a x a block of the bottom d
// (a = m + r - 1 for an r x r filter), through
//   Y = A^T [ (G g G^T) (.) (B^T d B) ] A
// with g the filter, so a^2 multiplications per (filter, channel, tile) where the direct
// convolution makes m^2 r^2: F(2x2, 3x3) 16 against 36 (2.25x fewer), F(4x4, 3x3) 36 against
// 144 (4x), F(2x2, 5x5) 36 against 100 (2.78x). Summed over the input channels, position e of
// the a x a transformed tile is one GEMM:
//   M[e] (O x T) = U[e] (O x C) * V[e] (C x T),   U = G g G^T, V = B^T d B, T = tiles,
// a^2 GEMMs in one strided batch over a chunk of images, between an input transform (which
// writes V) and an output transform (which reads M, adds the bias and writes the top). The
// chunk is as many images as keep V and M within the convolution's workspace budget.
//
// Backward data of a stride-1 r x r convolution with pad p is the r x r convolution of the top
// diff with the filters flipped and channels swapped, pad r - 1 - p: the same code.
//
// The weight gradient is the adjoint of the forward transforms: per position e,
// W[e] (O x C) = D[e] (O x T) * V[e]^T with D = A dy A^T the top diff's m x m tiles transformed,
// summed over the chunks, then dW = G^T W G once.
//
// The transforms' error grows with the tile: F(2x2, 3x3)'s add and subtract (and halve), the
// 6x6 tiles' interpolation points 0, +-1, +-2 scale by up to 16 and divide by 24. On random
// data the result differs from the lowered GEMM's by about 4e-7 (F(2x2, 3x3)) and 2e-6 (6x6
// tiles) of the largest output (within the kernel tests' float32 tolerance), and like every
// plan is the same on every call of a geometry.
//
// Under bf16 GEMMs (bf16.h) F(2x2, 3x3)'s products may multiply U and V (or D and V) rounded
// to bf16, where the batched race (gemm.cpp) finds that faster than float32: the transforms
// stay float32. Rounding the transformed operands costs F(2x2, 3x3) about 1.7x the error of the
// lowered bf16 GEMM (0.39% against 0.23% rms on random data); the 6x6 tiles' points would
// cost 11x (2.5%), so their products stay float32.
#include "conv_winograd.h"

#include <algorithm>
#include <vector>

#include "gemm.h"
#include "kernels.h"
#include "padding.h"
#include "parallel.h"
#include "vector_clones.h"
#include "workspace.h"

namespace cct {

namespace {

// The 1-D transforms of F(m, r), applied along rows and then columns (all are separable):
// input B^T d (a from a), output A^T t (m from a), filter G g (a from r), and the weight
// gradient's two adjoints, top_diff A g (a from m) and filter_gradient G^T w (r from a).
struct F2x3 {
  static constexpr int m = 2, r = 3, a = 4;
  static constexpr bool float32_products = false;  // bf16 where faster, under bf16
  static void input(const float* d, float* o) {
    o[0] = d[0] - d[2];
    o[1] = d[1] + d[2];
    o[2] = d[2] - d[1];
    o[3] = d[1] - d[3];
  }
  static void output(const float* t, float* y) {
    y[0] = t[0] + t[1] + t[2];
    y[1] = t[1] - t[2] - t[3];
  }
  static void filter(const float* g, float* u) {
    u[0] = g[0];
    u[1] = 0.5f * (g[0] + g[1] + g[2]);
    u[2] = 0.5f * (g[0] - g[1] + g[2]);
    u[3] = g[2];
  }
  static void top_diff(const float* g, float* t) {
    t[0] = g[0];
    t[1] = g[0] + g[1];
    t[2] = g[0] - g[1];
    t[3] = -g[1];
  }
  static void filter_gradient(const float* w, float* f) {
    f[0] = w[0] + 0.5f * (w[1] + w[2]);
    f[1] = 0.5f * (w[1] - w[2]);
    f[2] = 0.5f * (w[1] + w[2]) + w[3];
  }
};

// The 6x6 tiles' interpolation points: 0, 1, -1, 2, -2 and infinity. Among the point sets
// tried for F(2, 5) (0, +-1 with +-2, 1/2 or -1/2) the error differs by less than 1.5x; these
// keep B^T, which F(2, 5) and F(4, 3) share, in small integers. (A member, so inline: called
// out of line, it kept the transforms' loops from vectorizing.)
struct Points6 {
  static void input(const float* d, float* o) {
    o[0] = 4.0f * d[0] - 5.0f * d[2] + d[4];
    o[1] = (d[3] + d[4]) - 4.0f * (d[1] + d[2]);
    o[2] = (d[4] - d[3]) + 4.0f * (d[1] - d[2]);
    o[3] = (d[4] - d[2]) + 2.0f * (d[3] - d[1]);
    o[4] = (d[4] - d[2]) - 2.0f * (d[3] - d[1]);
    o[5] = 4.0f * d[1] - 5.0f * d[3] + d[5];
  }
};

struct F2x5 : Points6 {
  static constexpr int m = 2, r = 5, a = 6;
  static constexpr bool float32_products = true;
  static void output(const float* t, float* y) {
    y[0] = t[0] + t[1] + t[2] + t[3] + t[4];
    y[1] = (t[1] - t[2]) + 2.0f * (t[3] - t[4]) + t[5];
  }
  static void filter(const float* g, float* u) {
    const float even = g[0] + g[2] + g[4], odd = g[1] + g[3];
    const float even2 = g[0] + 4.0f * g[2] + 16.0f * g[4], odd2 = 2.0f * g[1] + 8.0f * g[3];
    u[0] = 0.25f * g[0];
    u[1] = -(even + odd) * (1.0f / 6);
    u[2] = -(even - odd) * (1.0f / 6);
    u[3] = (even2 + odd2) * (1.0f / 24);
    u[4] = (even2 - odd2) * (1.0f / 24);
    u[5] = g[4];
  }
  static void top_diff(const float* g, float* t) {
    t[0] = g[0];
    t[1] = g[0] + g[1];
    t[2] = g[0] - g[1];
    t[3] = g[0] + 2.0f * g[1];
    t[4] = g[0] - 2.0f * g[1];
    t[5] = g[1];
  }
  static void filter_gradient(const float* w, float* f) {
    const float sum12 = w[1] + w[2], diff12 = w[2] - w[1];
    const float sum34 = w[3] + w[4], diff34 = w[3] - w[4];
    f[0] = 0.25f * w[0] - sum12 * (1.0f / 6) + sum34 * (1.0f / 24);
    f[1] = diff12 * (1.0f / 6) + diff34 * (1.0f / 12);
    f[2] = (sum34 - sum12) * (1.0f / 6);
    f[3] = diff12 * (1.0f / 6) + diff34 * (1.0f / 3);
    f[4] = -sum12 * (1.0f / 6) + sum34 * (2.0f / 3) + w[5];
  }
};

// F(4, 3): 36 multiplications per 4x4 outputs of a 3x3 filter where F(2, 3) makes 64, at
// 6x6 tiles (a larger error, as 5x5's, and more of the tile past the edge of a small top).
struct F4x3 : Points6 {
  static constexpr int m = 4, r = 3, a = 6;
  static constexpr bool float32_products = true;
  static void output(const float* t, float* y) {
    const float sum12 = t[1] + t[2], diff12 = t[1] - t[2];
    const float sum34 = t[3] + t[4], diff34 = t[3] - t[4];
    y[0] = t[0] + sum12 + sum34;
    y[1] = diff12 + 2.0f * diff34;
    y[2] = sum12 + 4.0f * sum34;
    y[3] = diff12 + 8.0f * diff34 + t[5];
  }
  static void filter(const float* g, float* u) {
    const float even = g[0] + g[2], even2 = g[0] + 4.0f * g[2];
    u[0] = 0.25f * g[0];
    u[1] = -(even + g[1]) * (1.0f / 6);
    u[2] = -(even - g[1]) * (1.0f / 6);
    u[3] = (even2 + 2.0f * g[1]) * (1.0f / 24);
    u[4] = (even2 - 2.0f * g[1]) * (1.0f / 24);
    u[5] = g[2];
  }
  static void top_diff(const float* g, float* t) {
    const float even = g[0] + g[2], odd = g[1] + g[3];
    const float even2 = g[0] + 4.0f * g[2], odd2 = 2.0f * g[1] + 8.0f * g[3];
    t[0] = g[0];
    t[1] = even + odd;
    t[2] = even - odd;
    t[3] = even2 + odd2;
    t[4] = even2 - odd2;
    t[5] = g[3];
  }
  static void filter_gradient(const float* w, float* f) {
    const float sum12 = w[1] + w[2], diff12 = w[2] - w[1];
    const float sum34 = w[3] + w[4], diff34 = w[3] - w[4];
    f[0] = 0.25f * w[0] - sum12 * (1.0f / 6) + sum34 * (1.0f / 24);
    f[1] = diff12 * (1.0f / 6) + diff34 * (1.0f / 12);
    f[2] = (sum34 - sum12) * (1.0f / 6) + w[5];
  }
};

// An r x r stride-1 convolution as the transforms see it: c channels of h x w in, pad (ph, pw),
// o channels of ho x wo out, in tiles of m x m outputs.
struct Shape {
  int64_t c, h, w, o, ho, wo, ph, pw, m;
  int64_t tiles_h() const { return (ho + m - 1) / m; }
  int64_t tiles_w() const { return (wo + m - 1) / m; }
  int64_t tiles() const { return tiles_h() * tiles_w(); }
};

thread_local std::vector<float> t_filters;

// The stride between the a^2 matrices of a transformed chunk (V, M, D) or of the transformed
// filters (U, W): its n floats and one cache line more. The transforms read or write all a^2
// of them at once; at a stride that is a multiple of 4 KiB (32 channels x 64 tiles of
// CIFAR10-quick's conv2, 384 x 256 filters of CaffeNet's conv3) they would all fall in one L1
// set, which holds 8 lines, and the transforms ran up to 3x slower.
int64_t skewed(int64_t n) { return (n + 15) / 16 * 16 + 16; }

// U[e][o][c] = (G g G^T)[e] for filter g = weight(o, c, ., .), U[e] skewed(o * c) apart.
template <typename T, typename Weight>
void transform_filters(const Shape& s, Weight&& weight, float* u) {
  constexpr int r = T::r, a = T::a;
  const int64_t step = skewed(s.o * s.c);
  parallel_for(s.o, s.c * 16 * a, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t c = 0; c < s.c; ++c) {
        float g[r][r], col[r], rows[a][r], out[a];
        for (int i = 0; i < r; ++i)
          for (int j = 0; j < r; ++j) g[i][j] = weight(o, c, i, j);
        for (int j = 0; j < r; ++j) {  // rows: G g
          for (int i = 0; i < r; ++i) col[i] = g[i][j];
          T::filter(col, out);
          for (int i = 0; i < a; ++i) rows[i][j] = out[i];
        }
        for (int i = 0; i < a; ++i) {  // columns: (G g) G^T
          T::filter(rows[i], out);
          for (int j = 0; j < a; ++j) u[(i * a + j) * step + o * s.c + c] = out[j];
        }
      }
  });
}

// The transforms are separable (an a x a transform is one along rows, then one along columns)
// and are computed that way: the pass along each row of the plane over the tiles of that row,
// and the pass across rows over every tile of the plane at once. That second loop is the long
// one the compiler vectorizes well (CCT_VECTOR_CLONES: for AVX2 too): a plane's tiles are
// contiguous in V, M and D, so it reads and writes whole runs of th x tw floats. Looping over
// a row of tiles instead (8 on CIFAR10-quick's conv2, 4 on its conv3) left the loop mostly
// overhead: the input transform took more time than the GEMMs on an Intel Xeon (2 MiB L2),
// bench/RESULTS.md. For that, `rows` keeps the along-row results by plane row in "phases":
// row r of the row pass at phase r % m, place r / m, so the a rows m * ty + k that tile row ty
// reads are, for one k, at one phase and consecutive places for consecutive ty. The a rows a
// loop reads and writes never overlap: ivdep says so where the compiler cannot see it. Each
// output is the same expression of the same inputs as before: the same bits.

// Floats of the `rows` buffer of the transforms of one plane (the input's, the larger).
template <typename T>
int64_t rows_floats(const Shape& s) {
  constexpr int a = T::a, m = T::m;
  const int64_t per_phase = (m * s.tiles_h() + a - m + m - 1) / m;
  return a * m * per_phase * s.tiles_w();
}

// One channel of one image: out[e * step + ty * tw + tx] = (B^T d B)[e] of tile (ty, tx).
// `rows` (rows_floats) holds each bottom row's transform along columns by phase;
// `padded` the bottom with its pad, (m * th + a - m) x (m * tw + a - m) floats.
template <typename T>
CCT_VECTOR_CLONES void transform_input_plane(const float* plane, const Shape& s, float* rows,
                                             float* padded, float* out, int64_t step) {
  constexpr int a = T::a, m = T::m;
  const int64_t th = s.tiles_h(), tw = s.tiles_w(), width = m * tw + a - m;
  const int64_t height = m * th + a - m, phase = (height + m - 1) / m * tw, column = m * phase;
  // The bottom with its pad as zeros, from (-ph, -pw), copied whole before the row pass reads
  // it (copied row by row, one load took 20% of this function's samples: store forwarding).
  pad_plane(plane, s.h, s.w, s.ph, s.pw, padded, height, width);
  for (int64_t r = 0; r < height; ++r) {
    const float* d = padded + r * width;
    float* h = rows + (r % m) * phase + (r / m) * tw;
#pragma GCC ivdep
    for (int64_t tx = 0; tx < tw; ++tx) {  // d B, along the row
      float v[a];
      T::input(d + m * tx, v);
      for (int k = 0; k < a; ++k) h[k * column + tx] = v[k];
    }
  }
  const int64_t n = th * tw;
  for (int j = 0; j < a; ++j) {  // B^T (d B), across a rows, every tile of the plane
    const float* h = rows + j * column;
    float* o = out + j * step;
#pragma GCC ivdep
    for (int64_t t = 0; t < n; ++t) {
      float d[a], v[a];
      for (int k = 0; k < a; ++k) d[k] = h[(k % m) * phase + (k / m) * tw + t];
      T::input(d, v);
      for (int k = 0; k < a; ++k) o[k * a * step + t] = v[k];
    }
  }
}

thread_local std::vector<float> t_rows, t_padded;

// Runs plane(channel, image, rows, padded) for each of `channels` channels of nb images, the
// channels split across threads, each thread with buffers sized for the largest need
// (transform_input's: a row of tile transforms for every bottom row, the padded bottom).
template <typename T, typename Plane>
void each_plane(int64_t channels, int64_t nb, const Shape& s, Plane&& plane) {
  constexpr int a = T::a, m = T::m;
  parallel_for(channels, nb * s.tiles() * a * a, [&](int64_t c0, int64_t c1) {
    float* rows = grown(t_rows, size_t(rows_floats<T>(s)));
    float* padded = grown(t_padded, size_t((m * s.tiles_h() + a - m) *
                                               (m * s.tiles_w() + a - m)));
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t image = 0; image < nb; ++image) plane(c, image, rows, padded);
  });
}

// Images per chunk: as many as keep one chunk's transformed tiles (a^2 x (c + o) x tiles per
// image) within `budget` bytes, at least one.
template <typename T>
int64_t chunk_images(const Shape& s, int64_t images, int64_t budget) {
  const int64_t per_image = T::a * T::a * (s.c + s.o) * s.tiles();
  const int64_t skew = 2 * T::a * T::a * 32;  // skewed()'s most per matrix, V's and M's
  return std::max<int64_t>(
      1, std::min<int64_t>(images, (budget / int64_t(sizeof(float)) - skew) / per_image));
}

// V[e][c][t] = (B^T d B)[e] for the bottom's tiles of nb images (image m's channel c at
// x + m * x_image + c * h * w), t = m * tiles + ty * tiles_w + tx.
template <typename T>
void transform_input(const float* x, int64_t x_image, const Shape& s, int64_t nb, float* v) {
  const int64_t tpi = s.tiles(), count = nb * tpi, step = skewed(s.c * count);
  each_plane<T>(s.c, nb, s, [&](int64_t c, int64_t m, float* rows, float* padded) {
    transform_input_plane<T>(x + m * x_image + c * s.h * s.w, s, rows, padded,
                             v + c * count + m * tpi, step);
  });
}

// One channel of one image: plane (ho x wo) = (A^T M A) of each tile + b, cut at the edge,
// through caffe_relu with `relu`. `rows` holds m x a x th x tw floats (every tile transformed
// across its rows), `padded` the top's m * th x m * tw pixels.
template <typename T>
CCT_VECTOR_CLONES void transform_output_plane(const float* in, int64_t step, float b, bool relu,
                                              const Shape& s, float* rows, float* padded,
                                              float* plane) {
  constexpr int a = T::a, m = T::m;
  const int64_t th = s.tiles_h(), tw = s.tiles_w(), n = th * tw;
  const bool whole = m * tw == s.wo;
  for (int j = 0; j < a; ++j) {  // A^T t, across the tile's rows, every tile of the plane
    const float* t = in + j * step;
    float* r = rows + j * n;
#pragma GCC ivdep
    for (int64_t q = 0; q < n; ++q) {
      float d[a], y[m];
      for (int k = 0; k < a; ++k) d[k] = t[k * a * step + q];
      T::output(d, y);
      for (int i = 0; i < m; ++i) r[i * a * n + q] = y[i];
    }
  }
  for (int64_t ty = 0; ty < th; ++ty) {
    for (int i = 0; i < m && m * ty + i < s.ho; ++i) {  // (A^T t) A, along the row
      const float* r = rows + i * a * n + ty * tw;
      // a row of whole tiles goes straight to the top
      float* out = whole ? plane + (m * ty + i) * s.wo : padded + (m * ty + i) * m * tw;
#pragma GCC ivdep
      for (int64_t tx = 0; tx < tw; ++tx) {
        float d[a], y[m];
        for (int k = 0; k < a; ++k) d[k] = r[k * n + tx];
        T::output(d, y);
        for (int q = 0; q < m; ++q) out[m * tx + q] = y[q] + b;
      }
    }
  }
  // Cut to the top's width once the whole plane is written (as transform_input_plane pads
  // first: copying each row straight after its stores stalled on store forwarding).
  for (int64_t oh = 0; oh < s.ho && !whole; ++oh)
    std::copy(padded + oh * m * tw, padded + oh * m * tw + s.wo, plane + oh * s.wo);
  // The ReLU over the plane while it is in L1: in the tile loop above it kept that loop from
  // vectorizing (F(4x4, 3x3) on GoogLeNet's inception_3a/3x3: 15.3 -> 20.0 ms).
  if (relu)
    for (int64_t i = 0; i < s.ho * s.wo; ++i) plane[i] = caffe_relu(plane[i], 0.0f);
}

// The top of nb images (image m's channel o at y + m * y_image + o * ho * wo) =
// (A^T M A) + bias, the m x m tiles cut at the top's edge, through caffe_relu with `relu`.
template <typename T>
void transform_output(const float* mm, const float* bias, bool relu, const Shape& s, int64_t nb,
                      float* y, int64_t y_image) {
  const int64_t tpi = s.tiles(), count = nb * tpi, step = skewed(s.o * count);
  each_plane<T>(s.o, nb, s, [&](int64_t o, int64_t m, float* rows, float* padded) {
    transform_output_plane<T>(mm + o * count + m * tpi, step, bias ? bias[o] : 0.0f, relu, s,
                              rows, padded, y + m * y_image + o * s.ho * s.wo);
  });
}

// Images [begin, end), a group at a time, in chunks whose V and M fit `budget` bytes.
template <typename T, typename Weight>
void winograd(const float* x, int64_t x_image, int64_t x_group, const float* bias, bool relu,
              float* y, int64_t y_image, int64_t y_group, int64_t groups, const Shape& s,
              int64_t begin, int64_t end, int64_t budget, Weight&& weight_of_group) {
  constexpr int64_t tile = T::a * T::a;
  const int64_t chunk = chunk_images<T>(s, end - begin, budget);
  const int64_t u_step = skewed(s.o * s.c);
  float* u = grown(t_filters, size_t(tile * u_step));
  for (int64_t grp = 0; grp < groups; ++grp) {
    transform_filters<T>(s, [&](int64_t o, int64_t c, int i, int j) {
      return weight_of_group(grp, o, c, i, j);
    }, u);
    for (int64_t n0 = begin; n0 < end; n0 += chunk) {
      const int64_t nb = std::min(chunk, end - n0), count = nb * s.tiles();
      const int64_t v_step = skewed(s.c * count), m_step = skewed(s.o * count);
      float* v = static_cast<float*>(
          thread_workspace(size_t(tile * (v_step + m_step)) * sizeof(float)));
      float* mm = v + tile * v_step;
      transform_input<T>(x + n0 * x_image + grp * x_group, x_image, s, nb, v);
      gemm_batch_measured(false, false, s.o, count, s.c, 1.0f, u, s.c, u_step, v, count,
                          v_step, 0.0f, mm, count, m_step, tile, T::float32_products);
      transform_output<T>(mm, bias ? bias + grp * s.o : nullptr, relu, s, nb,
                          y + n0 * y_image + grp * y_group, y_image);
    }
  }
}

// One channel of one image's top diff: out[e * step + ty * tw + tx] = (A g A^T)[e] of its
// m x m tile (ty, tx), zero past the edge. `rows` holds m x a x th x tw floats (each tile
// row's transform along the row), `padded` m * th x m * tw (the plane with zeros past its
// edge, copied whole first, as transform_input_plane does).
template <typename T>
CCT_VECTOR_CLONES void transform_top_diff_plane(const float* plane, const Shape& s, float* rows,
                                                float* padded, float* out, int64_t step) {
  constexpr int a = T::a, m = T::m;
  const int64_t th = s.tiles_h(), tw = s.tiles_w(), n = th * tw;
  // A top diff of whole tiles is read in place; else from its copy with zeros past the edge.
  const bool whole = m * tw == s.wo && m * th == s.ho;
  if (!whole) pad_plane(plane, s.ho, s.wo, 0, 0, padded, m * th, m * tw);
  const float* top = whole ? plane : padded;
  for (int64_t ty = 0; ty < th; ++ty) {
    for (int i = 0; i < m; ++i) {  // g A^T, along each of the tile's m rows
      const float* g = top + (m * ty + i) * m * tw;
      float* r = rows + i * a * n + ty * tw;
#pragma GCC ivdep
      for (int64_t tx = 0; tx < tw; ++tx) {
        float t[a];
        T::top_diff(g + m * tx, t);
        for (int k = 0; k < a; ++k) r[k * n + tx] = t[k];
      }
    }
  }
  for (int j = 0; j < a; ++j) {  // A (g A^T), across the m rows, every tile of the plane
    const float* r = rows + j * n;
    float* o = out + j * step;
#pragma GCC ivdep
    for (int64_t q = 0; q < n; ++q) {
      float g[m], t[a];
      for (int i = 0; i < m; ++i) g[i] = r[i * a * n + q];
      T::top_diff(g, t);
      for (int k = 0; k < a; ++k) o[k * a * step + q] = t[k];
    }
  }
}

// D[e][o][t] = (A dy_t A^T)[e] for the top diff's m x m tiles of nb images (zero past the top's
// edge): the weight gradient's transform of dy, the adjoint of transform_output.
template <typename T>
void transform_top_diff(const float* dy, int64_t dy_image, const Shape& s, int64_t nb,
                        float* d) {
  const int64_t tpi = s.tiles(), count = nb * tpi, step = skewed(s.o * count);
  each_plane<T>(s.o, nb, s, [&](int64_t o, int64_t m, float* rows, float* padded) {
    transform_top_diff_plane<T>(dy + m * dy_image + o * s.ho * s.wo, s, rows, padded,
                                d + o * count + m * tpi, step);
  });
}

// dw[o][c] (r x r, or += with accumulate) = G^T W[.][o][c] G: the weight gradient's output
// transform, the adjoint of transform_filters (W[e] skewed(o * c) apart).
template <typename T>
void transform_filter_gradient(const float* w, const Shape& s, float* dw, bool accumulate) {
  constexpr int r = T::r, a = T::a;
  const int64_t step = skewed(s.o * s.c);
  parallel_for(s.o, s.c * 16 * a, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t c = 0; c < s.c; ++c) {
        float t[a][a], col[a], rows[r][a], f[r];
        for (int e = 0; e < a * a; ++e) t[e / a][e % a] = w[e * step + o * s.c + c];
        for (int j = 0; j < a; ++j) {  // rows: G^T t
          for (int i = 0; i < a; ++i) col[i] = t[i][j];
          T::filter_gradient(col, f);
          for (int i = 0; i < r; ++i) rows[i][j] = f[i];
        }
        float* out = dw + (o * s.c + c) * r * r;
        for (int i = 0; i < r; ++i) {  // columns: (G^T t) G
          T::filter_gradient(rows[i], f);
          for (int j = 0; j < r; ++j) out[i * r + j] = accumulate ? out[i * r + j] + f[j] : f[j];
        }
      }
  });
}

template <typename T>
void forward(const float* x, const float* weight, const float* bias, bool relu, float* y,
             const ConvGeom& g, int64_t begin, int64_t end, int64_t budget) {
  constexpr int r = T::r;
  const int64_t cg = g.c / g.group, og = g.o / g.group;
  const Shape s{cg, g.h, g.w, og, g.ho, g.wo, g.ph, g.pw, T::m};
  winograd<T>(x, g.c * g.h * g.w, cg * g.h * g.w, bias, relu, y, g.o * g.ho * g.wo,
              og * g.ho * g.wo, g.group, s, begin, end, budget,
              [&](int64_t grp, int64_t o, int64_t c, int i, int j) {
                return weight[(((grp * og + o) * cg + c) * r + i) * r + j];
              });
}

template <typename T>
void backward_data(const float* dy, const float* weight, float* dx, const ConvGeom& g,
                   int64_t begin, int64_t end, int64_t budget) {
  constexpr int r = T::r;
  const int64_t cg = g.c / g.group, og = g.o / g.group;
  // The flipped convolution: dy's og channels in, the bottom's cg out, pad r - 1 - p.
  const Shape s{og, g.ho, g.wo, cg, g.h, g.w, r - 1 - g.ph, r - 1 - g.pw, T::m};
  winograd<T>(dy, g.o * g.ho * g.wo, og * g.ho * g.wo, nullptr, false, dx, g.c * g.h * g.w,
              cg * g.h * g.w, g.group, s, begin, end, budget,
              [&](int64_t grp, int64_t c_out, int64_t o_in, int i, int j) {
                return weight[(((grp * og + o_in) * cg + c_out) * r + (r - 1 - i)) * r +
                              (r - 1 - j)];
              });
}

template <typename T>
void backward_weight(const float* x, const float* dy, float* dweight, const ConvGeom& g,
                     int64_t begin, int64_t end, int64_t budget, bool accumulate) {
  constexpr int64_t tile = T::a * T::a;
  const int64_t cg = g.c / g.group, og = g.o / g.group;
  const Shape s{cg, g.h, g.w, og, g.ho, g.wo, g.ph, g.pw, T::m};
  const int64_t chunk = chunk_images<T>(s, end - begin, budget);
  // The transformed gradient, summed over the chunks before its one output transform.
  const int64_t w_step = skewed(s.o * s.c);
  float* w = grown(t_filters, size_t(tile * w_step));
  for (int64_t grp = 0; grp < g.group; ++grp) {
    std::fill(w, w + tile * w_step, 0.0f);
    for (int64_t n0 = begin; n0 < end; n0 += chunk) {
      const int64_t nb = std::min(chunk, end - n0), count = nb * s.tiles();
      const int64_t v_step = skewed(s.c * count), d_step = skewed(s.o * count);
      float* v = static_cast<float*>(
          thread_workspace(size_t(tile * (v_step + d_step)) * sizeof(float)));
      float* d = v + tile * v_step;
      transform_input<T>(x + n0 * g.c * g.h * g.w + grp * cg * g.h * g.w, g.c * g.h * g.w, s,
                         nb, v);
      transform_top_diff<T>(dy + n0 * g.o * g.ho * g.wo + grp * og * g.ho * g.wo,
                            g.o * g.ho * g.wo, s, nb, d);
      gemm_batch_measured(false, true, s.o, s.c, count, 1.0f, d, count, d_step, v, count,
                          v_step, 1.0f, w, s.c, w_step, tile, T::float32_products);
    }
    transform_filter_gradient<T>(w, s, dweight + grp * og * cg * T::r * T::r, accumulate);
  }
}

}  // namespace

bool winograd_applies(const ConvGeom& g, bool backward_data, int m) {
  const bool tile = m == 2 ? g.kh == 3 || g.kh == 5 : m == 4 && g.kh == 3;
  if (!tile || g.kh != g.kw || g.sh != 1 || g.sw != 1 || g.dh != 1 || g.dw != 1) return false;
  // Backward data's pad k - 1 - p must not be negative.
  return !backward_data || (g.ph <= g.kh - 1 && g.pw <= g.kw - 1);
}

void conv_forward_winograd(const float* x, const float* weight, const float* bias, bool relu,
                           float* y, const ConvGeom& g, int64_t begin, int64_t end,
                           int64_t budget, int m) {
  if (m == 4) return forward<F4x3>(x, weight, bias, relu, y, g, begin, end, budget);
  if (g.kh == 5) return forward<F2x5>(x, weight, bias, relu, y, g, begin, end, budget);
  forward<F2x3>(x, weight, bias, relu, y, g, begin, end, budget);
}

void conv_backward_data_winograd(const float* dy, const float* weight, float* dx,
                                 const ConvGeom& g, int64_t begin, int64_t end, int64_t budget,
                                 int m) {
  if (m == 4) return backward_data<F4x3>(dy, weight, dx, g, begin, end, budget);
  if (g.kh == 5) return backward_data<F2x5>(dy, weight, dx, g, begin, end, budget);
  backward_data<F2x3>(dy, weight, dx, g, begin, end, budget);
}

void conv_backward_weight_winograd(const float* x, const float* dy, float* dweight,
                                   const ConvGeom& g, int64_t begin, int64_t end,
                                   int64_t budget, bool accumulate, int m) {
  if (m == 4) return backward_weight<F4x3>(x, dy, dweight, g, begin, end, budget, accumulate);
  if (g.kh == 5)
    return backward_weight<F2x5>(x, dy, dweight, g, begin, end, budget, accumulate);
  backward_weight<F2x3>(x, dy, dweight, g, begin, end, budget, accumulate);
}

}  // namespace cct
