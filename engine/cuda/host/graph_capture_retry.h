// Whether a CUDA session whose decode graph capture failed captures again
// (CudaBackendOptions::decode_graphs; docs/cuda.md, "Decode graphs"). Plain
// C++, tested without a GPU (tests/graph_capture_retry_test.cc).
//
// A failed capture may be transient (an instantiation the device refuses
// under momentary memory pressure), and a long-lived session that turned
// its graphs off for good at the first failure would decode eagerly for
// the rest of its life (review of the CUDA host side, finding 9). So a
// failure pauses capturing for kEagerStepsAfterFailure steps that would
// have replayed (they run eagerly, as without graphs), then the session
// warms up and captures again; kMaxConsecutiveFailures failures with no
// successful capture between them turn the graphs off for the session's
// life (a capture that cannot work is not retried forever: each try costs
// one eager warm-up step and the capture itself).
#pragma once

#include <cstdint>

namespace drt::cuda {

class GraphCaptureRetry {
 public:
  // A choice, not a measurement: about one chunk of decode (64 positions)
  // eagerly before trying again; three tries in a row.
  static constexpr int64_t kEagerStepsAfterFailure = 64;
  static constexpr int kMaxConsecutiveFailures = 3;

  // Asked by each step that could replay or capture a graph: true when it
  // may; false while paused (the step, run eagerly, counts toward the
  // pause) or once off for good.
  bool MayCapture() {
    if (off_for_good()) return false;
    if (eager_steps_left_ > 0) {
      --eager_steps_left_;
      return false;
    }
    return true;
  }
  void CaptureFailed() {
    ++consecutive_failures_;
    eager_steps_left_ = kEagerStepsAfterFailure;
  }
  void CaptureSucceeded() { consecutive_failures_ = 0; }
  bool off_for_good() const { return consecutive_failures_ >= kMaxConsecutiveFailures; }
  int consecutive_failures() const { return consecutive_failures_; }

 private:
  int consecutive_failures_ = 0;
  int64_t eager_steps_left_ = 0;
};

}  // namespace drt::cuda
