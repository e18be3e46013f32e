// Turns CUDA runtime error codes into absl::Status (cuBLAS's: CublasLibrary::Check,
// kernels/cublas_library.h).
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>

#include "absl/status/status.h"

namespace drt::kernels {

// OK for cudaSuccess, else INTERNAL "what: <cudaGetErrorName>: <cudaGetErrorString>".
absl::Status CudaStatus(cudaError_t err, std::string_view what);

}  // namespace drt::kernels

// Returns CudaStatus(expr, what) from the enclosing function when `expr` is
// not cudaSuccess. `expr` is evaluated exactly once.
#define DRT_CUDA_RETURN_IF_ERROR(expr, what)                            \
  do {                                                                  \
    const cudaError_t drt_cuda_err_ = (expr);                           \
    if (drt_cuda_err_ != cudaSuccess) {                                 \
      return ::drt::kernels::CudaStatus(drt_cuda_err_, (what));         \
    }                                                                   \
  } while (0)
