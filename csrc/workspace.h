// Scratch memory that lives across calls, so that a training step allocates (and page-faults
// in) nothing once its shapes have been seen.
#pragma once
#include <cstddef>
#include <vector>

namespace cct {

// The calling thread's convolution workspace (grow-only, at least `bytes`): the lowered
// matrices of conv.cpp and the transformed tiles of conv_winograd.cpp share it, since a
// thread runs one convolution kernel at a time. Valid until the thread's next call.
void* thread_workspace(size_t bytes);

// v's storage, grown to at least n elements (released first: never both buffers at once).
template <typename T>
T* grown(std::vector<T>& v, size_t n) {
  if (v.size() < n) {
    v.clear();
    v.shrink_to_fit();
    v.resize(n);
  }
  return v.data();
}

}  // namespace cct
