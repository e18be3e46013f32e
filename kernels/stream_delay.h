// A kernel that only waits: one thread spins for `ns` nanoseconds of the
// GPU's global timer. Test-only: the CUDA backend's stream delay
// (CudaStreamDelay, engine/cuda/cuda_options.h) queues it on a stream to
// make the work after it late on purpose.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace drt::kernels {

// ns > 0; cudaErrorInvalidValue otherwise. Returns the launch's error.
cudaError_t LaunchStreamDelay(int64_t ns, cudaStream_t stream);

}  // namespace drt::kernels
