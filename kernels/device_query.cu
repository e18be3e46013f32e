#include "kernels/device_query.h"

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace drt::cuda {

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrFormat("no usable CUDA device: %s", cudaGetErrorString(err)));
  }
  if (count == 0) return absl::UnavailableError("no usable CUDA device: none found");
  return count;
}

absl::StatusOr<std::string> CudaDeviceDescription(int index) {
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, index);
  if (err != cudaSuccess) {
    return absl::UnavailableError(absl::StrFormat("cudaGetDeviceProperties(%d): %s", index,
                                                  cudaGetErrorString(err)));
  }
  return absl::StrFormat("%s (sm_%d%d, %d MiB)", prop.name, prop.major, prop.minor,
                         static_cast<int>(prop.totalGlobalMem >> 20));
}

}  // namespace drt::cuda
