#include "engine/cuda/pinned_allocator.h"

#include <cuda_runtime_api.h>

#include "engine/cuda/allocation_status.h"

namespace drt::cuda {

absl::StatusOr<void*> PinnedHostAllocator::Allocate(size_t bytes) {
  void* p = nullptr;
  // Portable: usable by every device/context, whichever device is current.
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    return AllocationFailure(err, "cudaHostAlloc", bytes, "pinned host memory");
  }
  return p;
}

void PinnedHostAllocator::Free(void* p, size_t) { cudaFreeHost(p); }

}  // namespace drt::cuda
