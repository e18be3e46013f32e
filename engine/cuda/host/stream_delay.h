// The test-only stream delay of the CUDA backend (CudaStreamDelay,
// engine/cuda/cuda_options.h): its stream names, the "STREAM:NS" form the
// CUDA backend tests read from DRT_TEST_CUDA_STREAM_DELAY, and the check
// MakeCudaBackend makes. Plain C++, tested without a GPU
// (tests/cuda_backend/cuda_stream_delay_test.cc).
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cuda/cuda_options.h"

namespace drt {

// "none", "store", "fetch", "step", "compute"; "unknown" for another value.
const char* CudaDelayedStreamName(CudaDelayedStream stream);

// "STREAM:NS" (say "fetch:2000000"), or "" for no delay. INVALID_ARGUMENT
// naming what is wrong: an unknown stream (the known ones listed), a
// missing or non-numeric NS. The result is then checked as any options are
// (CheckCudaStreamDelay).
absl::StatusOr<CudaStreamDelay> ParseCudaStreamDelay(std::string_view spec);

// OK for no delay (kNone, 0) or a known stream with 0 < ns <=
// kMaxCudaStreamDelayNs; INVALID_ARGUMENT naming debug_stream_delay
// otherwise.
absl::Status CheckCudaStreamDelay(const CudaStreamDelay& delay);

}  // namespace drt
