#include "kernels/cuda_check.h"

#include "absl/strings/str_format.h"

namespace drt::kernels {

absl::Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s: %s: %s", what, cudaGetErrorName(err),
                                             cudaGetErrorString(err)));
}

}  // namespace drt::kernels
