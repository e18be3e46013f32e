// When a CUDA session captures its decode graphs again after a failed
// capture (engine/cuda/host/graph_capture_retry.h), counted by hand.
#include <catch2/catch.hpp>

#include "engine/cuda/host/graph_capture_retry.h"

namespace drt::cuda {
namespace {

constexpr int64_t kPause = GraphCaptureRetry::kEagerStepsAfterFailure;

// Steps asking MayCapture until one may; how many were refused.
int64_t RefusedUntilAllowed(GraphCaptureRetry& retry, int64_t limit) {
  int64_t refused = 0;
  while (refused < limit && !retry.MayCapture()) ++refused;
  return refused;
}

TEST_CASE("graph capture retry: captures at once until a capture fails", "[cuda_host]") {
  GraphCaptureRetry retry;
  for (int i = 0; i < 1000; ++i) REQUIRE(retry.MayCapture());
  CHECK_FALSE(retry.off_for_good());
}

TEST_CASE("graph capture retry: a failure pauses for kEagerStepsAfterFailure steps",
          "[cuda_host]") {
  GraphCaptureRetry retry;
  retry.CaptureFailed();
  CHECK_FALSE(retry.off_for_good());
  // Exactly kPause eligible steps run eagerly, then the next may capture.
  CHECK(RefusedUntilAllowed(retry, 10 * kPause) == kPause);
  CHECK(retry.MayCapture());
}

TEST_CASE("graph capture retry: off for good after kMaxConsecutiveFailures in a row",
          "[cuda_host]") {
  GraphCaptureRetry retry;
  for (int f = 1; f < GraphCaptureRetry::kMaxConsecutiveFailures; ++f) {
    retry.CaptureFailed();
    CHECK_FALSE(retry.off_for_good());
    CHECK(RefusedUntilAllowed(retry, 10 * kPause) == kPause);
  }
  retry.CaptureFailed();
  CHECK(retry.off_for_good());
  CHECK(RefusedUntilAllowed(retry, 10 * kPause) == 10 * kPause);  // never again
}

TEST_CASE("graph capture retry: a successful capture resets the count", "[cuda_host]") {
  GraphCaptureRetry retry;
  for (int round = 0; round < 5; ++round) {
    for (int f = 1; f < GraphCaptureRetry::kMaxConsecutiveFailures; ++f) {
      retry.CaptureFailed();
      REQUIRE(RefusedUntilAllowed(retry, 10 * kPause) == kPause);
    }
    retry.CaptureSucceeded();
    CHECK(retry.consecutive_failures() == 0);
  }
  CHECK_FALSE(retry.off_for_good());
  CHECK(retry.MayCapture());
}

}  // namespace
}  // namespace drt::cuda
