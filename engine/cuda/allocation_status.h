// The Status of a failed CUDA allocation (cudaMalloc, cudaHostAlloc), for
// DeviceArray, PinnedArray and PinnedHostAllocator.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace drt::cuda {

// `err`, returned by `call` (e.g. "cudaMalloc") asked for `bytes` bytes for
// `what`, as a Status: RESOURCE_EXHAUSTED for cudaErrorMemoryAllocation (the
// caller fails one session, or falls back, as for any full memory), INTERNAL
// with the runtime's error otherwise; the message names the call, the bytes
// and `what`.
//
// Either way the runtime's per-thread "last error", which the failed call
// set, is cleared (cudaGetLastError). The error is reported here; left set,
// it would be reported again by the next kernel launch on this thread,
// since every launcher returns cudaGetLastError(): e.g. another session's
// forward on the scheduler thread would fail on a stale out-of-memory and
// mark all of its sessions failed (review of the CUDA host side, finding
// 1). A sticky error (a corrupted context) is not hidden by clearing: every
// later runtime call returns it again.
absl::Status AllocationFailure(cudaError_t err, absl::string_view call, size_t bytes,
                               absl::string_view what);

}  // namespace drt::cuda
