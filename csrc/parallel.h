// cct's CPU threads: one count for the BLAS and for cct's own loops (lowering, pooling), so the
// two never run more threads than that together. Kernels run the BLAS and their own loops one
// after the other, never at once.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>

namespace cct {

// cct's thread count; 1 inside a SerialScope.
int num_threads();
// Sets cct's thread count and the BLAS's; n < 1 means the cores available to the process.
void set_num_threads(int n);
// Sets the calling thread's own count for cct's loops (0: the process-wide count again). The
// BLAS's count stays process-wide: a caller running several such threads at once sets it to
// the smallest of their counts.
void set_thread_num_threads(int n);
int available_cores();

// While one lives, parallel_for on this thread runs inline: the thread is one of several
// partitions of a kernel, each already on its own core.
class SerialScope {
 public:
  SerialScope();
  ~SerialScope();
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  bool saved_;
};

// Runs job(i) for every i in [0, parts): i = 0 on the calling thread, the others on cct's
// persistent worker threads (started at first use and then kept waiting, spinning a little and
// then on a condition variable: starting a thread costs tens of microseconds), or on
// fresh threads when the workers are already serving another call (a second Python thread, or
// a job that itself runs in parallel). Returns when every job has returned.
void run_parallel(int parts, const std::function<void(int)>& job);
// The workers, and a caller waiting for them, spin a little before they block (threads.cpp),
// so that the next loop finds them awake. A caller about to run the BLAS's or MKL's own threads
// parks them first: until the next loop they block at once, and leave the cores to those.
void park_workers();

// Below this much work (elements touched) a loop runs on the calling thread.
constexpr int64_t kParallelGrain = 1 << 16;

// Calls f(begin, end) on contiguous slices of [0, items), one slice per thread.
template <typename F>
void parallel_for(int64_t items, int64_t cost_per_item, F&& f) {
  int64_t t = std::min<int64_t>(num_threads(), items);
  if (t <= 1 || items * cost_per_item < kParallelGrain) {
    if (items > 0) f(int64_t(0), items);
    return;
  }
  run_parallel(int(t), [&f, items, t](int i) { f(items * i / t, items * (i + 1) / t); });
}

}  // namespace cct
