// The test-only stream delay at its sites (CudaStreamDelay, engine/cuda/
// cuda_options.h; review-cuda F1). Each site is the head of a piece of work
// on one stream, after the event waits that order it: the store copies,
// the chunk copies (fetch), the batched step's work after each session
// hand-off (step), the encoder, a group's GCA and a decode graph's launch
// (compute).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "engine/cuda/cuda_options.h"
#include "kernels/cuda_check.h"
#include "kernels/stream_delay.h"

namespace drt::cuda {

// Off (ns 0, the default), one comparison and nothing queued. Each delay
// queued adds one to `queued` (the session's BackendSessionStats::
// stream_delays) and to *delay.tally where set; a launch that fails counts
// nowhere.
inline absl::Status DelayStreamForTest(const CudaStreamDelay& delay, CudaDelayedStream which,
                                       cudaStream_t stream, int64_t& queued) {
  if (delay.ns == 0 || delay.stream != which) return absl::OkStatus();
  DRT_CUDA_RETURN_IF_ERROR(kernels::LaunchStreamDelay(delay.ns, stream),
                           "launching the test-only stream delay");
  ++queued;
  if (delay.tally != nullptr) delay.tally->fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace drt::cuda
