#include "engine/cuda/pinned_allocator.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"

namespace drt::cuda {

absl::StatusOr<void*> PinnedHostAllocator::Allocate(size_t bytes) {
  void* p = nullptr;
  // Portable: usable by every device/context, whichever device is current.
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    return kernels::CudaStatus(err, absl::StrCat("cudaHostAlloc of ", bytes, " bytes"));
  }
  return p;
}

void PinnedHostAllocator::Free(void* p, size_t) { cudaFreeHost(p); }

}  // namespace drt::cuda
