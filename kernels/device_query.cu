#include "kernels/device_query.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda_driver_probe.h"

namespace drt::cuda {

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Without any driver the runtime's own message is
    // cudaErrorInsufficientDriver's, which reads as "upgrade the driver".
    return absl::UnavailableError(absl::StrFormat(
        "no usable CUDA device: %s",
        NoCudaDeviceReason(cudaGetErrorString(err), NvidiaDriverLoadable())));
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

namespace {

absl::Status Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s: %s", what, cudaGetErrorString(err)));
}

// Owns what MeasureCopyBandwidth allocates, so every exit frees it.
struct CopyBench {
  void* src = nullptr;
  void* dst = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~CopyBench() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (src != nullptr) cudaFree(src);
    if (dst != nullptr) cudaFree(dst);
  }
};

}  // namespace

absl::StatusOr<double> MeasureCopyBandwidth(int index, size_t bytes, int repeats) {
  if (bytes == 0 || repeats < 1) return absl::InvalidArgumentError("bytes and repeats must be positive");
  if (absl::Status s = Check(cudaSetDevice(index), "cudaSetDevice"); !s.ok()) return s;
  CopyBench b;
  for (auto [ptr, what] : {std::pair{&b.src, "cudaMalloc(source)"}, std::pair{&b.dst, "cudaMalloc(dest)"}}) {
    if (absl::Status s = Check(cudaMalloc(ptr, bytes), what); !s.ok()) return s;
  }
  if (absl::Status s = Check(cudaMemset(b.src, 1, bytes), "cudaMemset"); !s.ok()) return s;
  if (absl::Status s = Check(cudaEventCreate(&b.start), "cudaEventCreate"); !s.ok()) return s;
  if (absl::Status s = Check(cudaEventCreate(&b.stop), "cudaEventCreate"); !s.ok()) return s;
  // One untimed copy first: page mapping and clocks.
  if (absl::Status s = Check(cudaMemcpy(b.dst, b.src, bytes, cudaMemcpyDeviceToDevice), "warm-up copy");
      !s.ok()) {
    return s;
  }
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    cudaEventRecord(b.start);
    cudaMemcpyAsync(b.dst, b.src, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(b.stop);
    if (absl::Status s = Check(cudaEventSynchronize(b.stop), "timed copy"); !s.ok()) return s;
    float ms = 0;
    if (absl::Status s = Check(cudaEventElapsedTime(&ms, b.start, b.stop), "cudaEventElapsedTime");
        !s.ok()) {
      return s;
    }
    rates.push_back(2.0 * static_cast<double>(bytes) / (ms * 1e-3));
  }
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  return rates[rates.size() / 2];
}

}  // namespace drt::cuda
