// cct's thread count, shared by the BLAS and cct's own parallel loops.
#include <atomic>

#include "gemm.h"
#include "parallel.h"

#if defined(__linux__)
#include <sched.h>
#endif

namespace cct {

namespace {
std::atomic<int> g_num_threads{1};
thread_local bool t_serial = false;
}  // namespace

SerialScope::SerialScope() : saved_(t_serial) { t_serial = true; }
SerialScope::~SerialScope() { t_serial = saved_; }

int available_cores() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

int num_threads() { return t_serial ? 1 : g_num_threads.load(std::memory_order_relaxed); }

void set_num_threads(int n) {
  if (n < 1) n = available_cores();
  g_num_threads.store(n, std::memory_order_relaxed);
  blas_set_num_threads(n);
}

}  // namespace cct
