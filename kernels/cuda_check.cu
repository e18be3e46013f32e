#include "kernels/cuda_check.h"

#include <cublas_api.h>

#include "absl/strings/str_format.h"

namespace drt::kernels {

absl::Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s: %s: %s", what, cudaGetErrorName(err),
                                             cudaGetErrorString(err)));
}

absl::Status CublasStatus(cublasStatus_t st, std::string_view what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s: %s: %s", what, cublasGetStatusName(st),
                                             cublasGetStatusString(st)));
}

}  // namespace drt::kernels
