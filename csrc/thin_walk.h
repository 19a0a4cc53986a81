// The walk over C that the thin GEMM engines share: gemm_thin.cpp's float32 engine and
// bf16_kernel.cpp's thin form, both for C (m x n) = op(A) B + beta C with a short k.
//
// B's columns run in blocks of equal width, whole tiles of kThinWalkColumns, each about
// `block_bytes` of B as the engine reads it (floats, or bf16 pairs), so that a block stays in L2
// while a thread walks its rows of C over it. A thread's share is a run of (block, group of
// kThinWalkRows rows) items in that order, so it visits C row by row within a block, in runs
// the hardware prefetchers follow too; each tile is told where the next one starts, so that it
// can prefetch that tile's C while it multiplies.
#pragma once
#include <algorithm>
#include <cstdint>

#include "parallel.h"

namespace cct {

constexpr int kThinWalkRows = 6;        // rows of C per tile
constexpr int64_t kThinWalkColumns = 64;  // columns of C per tile: four vectors of 16

// The width of the blocks: about `block_bytes` of B at `column_bytes` a column, in whole tiles,
// the blocks of equal width (what an engine sizes its per-thread copy of a block by).
inline int64_t thin_walk_width(int64_t n, int64_t column_bytes, int64_t block_bytes) {
  const int64_t budget = std::max<int64_t>(
      kThinWalkColumns, block_bytes / column_bytes / kThinWalkColumns * kThinWalkColumns);
  const int64_t blocks = (n + budget - 1) / budget;
  return ((n + blocks - 1) / blocks + kThinWalkColumns - 1) / kThinWalkColumns *
         kThinWalkColumns;
}

// Runs the tiles of C across cct's threads. Each thread's run starts with item = make_run()
// (its own buffers); for each (block, group) item of the run, tile = item(i0, rows, entered,
// j0, j1), `entered` true where the run enters block [j0, j1) with it (its first item, or the
// first of the next block); then for each tile of the item's rows tile(j, columns, next):
// C[i0, i0 + rows) x [j, j + columns), `next` where the tile after it in this run starts.
// Blocks are `width` columns (thin_walk_width); `cost` is parallel_for's cost of one item.
template <typename MakeRun>
void thin_walk(int64_t m, int64_t n, int64_t width, float* c, int64_t ldc, int64_t cost,
               MakeRun&& make_run) {
  const int64_t blocks = (n + width - 1) / width;
  const int64_t groups = (m + kThinWalkRows - 1) / kThinWalkRows;
  parallel_for(blocks * groups, cost, [&](int64_t begin, int64_t end) {
    auto item = make_run();
    const auto tile_start = [&](int64_t at) {
      return c + (at % groups) * kThinWalkRows * ldc + (at / groups) * width;
    };
    for (int64_t at = begin; at < end; ++at) {
      const int64_t i0 = (at % groups) * kThinWalkRows, j0 = (at / groups) * width;
      const int64_t j1 = std::min(n, j0 + width);
      const auto tile = item(i0, int(std::min<int64_t>(kThinWalkRows, m - i0)),
                             at == begin || i0 == 0, j0, j1);
      const float* row = c + i0 * ldc;
      for (int64_t j = j0; j < j1; j += kThinWalkColumns) {
        const float* next = j + kThinWalkColumns < j1 ? row + j + kThinWalkColumns
                            : at + 1 < end            ? tile_start(at + 1)
                                                      : row + j;
        tile(j, std::min(kThinWalkColumns, j1 - j), next);
      }
    }
  });
}

}  // namespace cct
