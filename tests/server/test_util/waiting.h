// Timing helpers for tests that wait on another thread or process: seconds
// since a steady-clock instant, and a poll that fails the test (Catch2
// REQUIRE) when a condition does not come true in time.
#pragma once

#include <chrono>
#include <thread>

#include <catch2/catch.hpp>

namespace drt::server::testing {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Waits until `condition` holds, polling every 5 ms; fails the test after
// `seconds`, naming `what` was awaited.
template <typename F>
void WaitFor(F condition, double seconds, const char* what) {
  const auto start = Clock::now();
  while (!condition()) {
    INFO("waiting for " << what);
    REQUIRE(SecondsSince(start) < seconds);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace drt::server::testing
