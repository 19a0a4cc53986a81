// The plans' races: which of n candidates (a GEMM's operand orders and engines, gemm.cpp; a
// convolution kernel's layouts and partitions, conv.cpp) runs fastest, from timed runs of each.
//
// Every candidate runs twice, in turn, and keeps the better of its two times: one sample is at
// the mercy of a busy machine. That is not enough where a disturbance outlasts a round: on a
// 2-vCPU VM, 6 processes of 52 chose the direct layout for LeNet's conv2 forward or weight
// gradient, though Winograd ran it 25% faster (in one race caught, both of Winograd's runs were
// slowed and direct came out 1% ahead; bench/RESULTS.md). A measured plan is cached for the
// machine, so one such race slows every later run. So the near-ties are timed again: while
// others lie within kRaceClose of the best time, every candidate within it runs once more, up
// to kRaceExtraRounds rounds (then 0 processes of 50). A true tie costs those few runs; a
// candidate that lost by more is not run again.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace cct {

constexpr double kRaceClose = 1.15;
constexpr int kRaceExtraRounds = 2;

template <typename F>
double seconds_of(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct RaceResult {
  size_t fastest;   // the candidate with the best time (ties: the earlier)
  size_t last_run;  // the candidate run last: its output is what the caller's buffers hold
};

// time(i) runs candidate i and returns its seconds; reset() comes before every run and puts
// back what a run changes (a copy of C for a GEMM that adds into it). The second round skips a
// candidate over `skip_over` times the best first time (fc6's weight gradient in the slow
// order: 150 ms a call).
template <typename Reset, typename Time>
RaceResult race(size_t n, double skip_over, Reset&& reset, Time&& time) {
  std::vector<double> best(n, 1e300);
  size_t last = 0;
  const auto sample = [&](size_t i) {
    reset();
    best[i] = std::min(best[i], time(i));
    last = i;
  };
  const auto fastest = [&] {
    return size_t(std::min_element(best.begin(), best.end()) - best.begin());
  };
  for (int round = 0; round < 2; ++round) {
    const double first = best[fastest()];
    for (size_t i = 0; i < n; ++i) {
      if (round == 0 || best[i] <= skip_over * first) sample(i);
    }
  }
  for (int round = 0; round < kRaceExtraRounds; ++round) {
    const double lead = best[fastest()];
    std::vector<size_t> close;
    for (size_t i = 0; i < n; ++i) {
      if (best[i] <= kRaceClose * lead) close.push_back(i);
    }
    if (close.size() < 2) break;
    for (size_t i : close) sample(i);
  }
  return {fastest(), last};
}

}  // namespace cct
