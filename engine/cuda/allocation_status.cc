#include "engine/cuda/allocation_status.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"

namespace drt::cuda {

absl::Status AllocationFailure(cudaError_t err, absl::string_view call, size_t bytes,
                               absl::string_view what) {
  (void)cudaGetLastError();  // reported below, not by the next launch
  const absl::Status status =
      kernels::CudaStatus(err, absl::StrCat(call, " of ", bytes, " bytes for ", what));
  if (err != cudaErrorMemoryAllocation) return status;
  return absl::ResourceExhaustedError(status.message());
}

}  // namespace drt::cuda
