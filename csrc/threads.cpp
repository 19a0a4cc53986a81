// cct's thread count, shared by the BLAS and cct's own parallel loops.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "gemm.h"
#include "parallel.h"

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace cct {

namespace {
std::atomic<int> g_num_threads{1};
thread_local bool t_serial = false;
// A device (cct/devices.py) that owns some of the cores runs its replica on its own Python
// thread with its own count; 0 means the process-wide count.
thread_local int t_num_threads = 0;

// How long an idle worker, and the caller waiting for its workers, spin before they block on
// the condition variable. A net's layers run one parallel loop after another, most a few to a
// few hundred microseconds apart (Python between them); a worker blocked on the condition
// variable took 30-60 us to wake on a 2-vCPU KVM guest (Zen 4), so a 128K-element ReLU on two
// threads took 46-87 us where one thread took 19 us, and 10 us with spinning workers. A
// training step measured 9% faster spinning on LeNet, 2-3% on CIFAR10-quick, CaffeNet b32 and
// GoogLeNet b32 (bench/RESULTS.md). A BLAS call parks the spinners first (park_workers): its
// own threads need the cores.
constexpr double kSpinSeconds = 200e-6;
// Set by park_workers, cleared by the next parallel loop: while set, idle workers block at once.
std::atomic<bool> g_parked{false};

// Waits up to kSpinSeconds for done() to hold, pausing between looks and giving the core away
// now and then (sched_yield: a thread that needs it runs); whether it held.
template <typename Done>
bool spin_until(Done&& done) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
    if (i % 64 == 0) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >
          kSpinSeconds)
        return done();
      std::this_thread::yield();
    }
  }
}

// The persistent workers. One call at a time owns them (busy); a call that finds them owned
// starts its own threads. Each call bumps the generation; worker w (1-based) runs job(w) of
// the calls that have at least w + 1 parts. The pool is never destroyed (its threads are
// blocked when the process exits), and a forked child starts a new one: the parent's
// threads do not exist there.
class Pool {
 public:
  void run(int parts, const std::function<void(int)>& job) {
    std::unique_lock<std::mutex> owner(busy_, std::try_to_lock);
    if (!owner.owns_lock()) {
      run_on_new_threads(parts, job);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (int(workers_.size()) < parts - 1) {
        const int w = int(workers_.size()) + 1;
        workers_.emplace_back([this, w] { work(w); });
      }
      job_ = &job;
      parts_ = parts;
      g_parked.store(false, std::memory_order_relaxed);
      pending_ = parts - 1;
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr error;
    try {
      job(0);
    } catch (...) {
      error = std::current_exception();  // the workers still hold `job`: wait for them first
    }
    spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; });
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
    if (error) std::rethrow_exception(error);
  }

 private:
  static void run_on_new_threads(int parts, const std::function<void(int)>& job) {
    std::vector<std::thread> threads;
    threads.reserve(size_t(parts - 1));
    for (int i = 1; i < parts; ++i) threads.emplace_back([&job, i] { job(i); });
    job(0);
    for (auto& t : threads) t.join();
  }

  void work(int w) {
    int64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      lock.unlock();
      spin_until([this, seen] {
        return generation_.load(std::memory_order_acquire) != seen ||
               g_parked.load(std::memory_order_relaxed);
      });
      lock.lock();
      wake_.wait(lock, [this, seen] { return generation_ != seen; });
      seen = generation_;
      if (w >= parts_) continue;
      const std::function<void(int)>* job = job_;
      lock.unlock();
      (*job)(w);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex busy_;
  std::mutex mutex_;  // guards what follows
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  int parts_ = 0;
  std::atomic<int> pending_{0};
  std::atomic<int64_t> generation_{0};
};

Pool* g_pool = nullptr;
std::once_flag g_pool_once;

void new_pool_in_child() { g_pool = new Pool(); }

Pool& pool() {
  std::call_once(g_pool_once, [] {
    g_pool = new Pool();
#if defined(__linux__)
    pthread_atfork(nullptr, nullptr, new_pool_in_child);
#endif
  });
  return *g_pool;
}

}  // namespace

void park_workers() {
  // Inside a partition the BLAS runs on one thread, and the other workers are busy.
  if (!t_serial && !g_parked.load(std::memory_order_relaxed))
    g_parked.store(true, std::memory_order_relaxed);
}

SerialScope::SerialScope() : saved_(t_serial) { t_serial = true; }
SerialScope::~SerialScope() { t_serial = saved_; }

int available_cores() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

void run_parallel(int parts, const std::function<void(int)>& job) {
  if (parts <= 1) {
    if (parts == 1) job(0);
    return;
  }
  pool().run(parts, job);
}

int num_threads() {
  if (t_serial) return 1;
  return t_num_threads > 0 ? t_num_threads : g_num_threads.load(std::memory_order_relaxed);
}

void set_thread_num_threads(int n) { t_num_threads = n < 0 ? 0 : n; }

void set_num_threads(int n) {
  if (n < 1) n = available_cores();
  g_num_threads.store(n, std::memory_order_relaxed);
  blas_set_num_threads(n);
}

}  // namespace cct
