#include "engine/backend_factory.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#ifdef DRT_WITH_CUDA
#include "engine/cuda/cuda_backend.h"
#include "kernels/device_query.h"
#endif

namespace drt {

absl::StatusOr<Device> ParseDevice(absl::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  if (name == "auto") return Device::kAuto;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", name, "': expected cpu, cuda or auto"));
}

const char* DeviceName(Device device) {
  switch (device) {
    case Device::kCpu: return "cpu";
    case Device::kCuda: return "cuda";
    case Device::kAuto: return "auto";
  }
  return "unknown";
}

absl::StatusOr<CudaPrecision> ParseCudaPrecision(absl::string_view name) {
  if (name == "bf16") return CudaPrecision::kBf16;
  if (name == "fp32") return CudaPrecision::kFp32;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown CUDA precision '", name, "': expected bf16 or fp32"));
}

const char* CudaPrecisionName(CudaPrecision precision) {
  switch (precision) {
    case CudaPrecision::kBf16: return "bf16";
    case CudaPrecision::kFp32: return "fp32";
  }
  return "unknown";
}

bool CudaBackendBuilt() {
#ifdef DRT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<double> MeasureGpuMemoryBandwidth(int device_index) {
#ifdef DRT_WITH_CUDA
  return cuda::MeasureCopyBandwidth(device_index);
#else
  return absl::FailedPreconditionError("this build has no CUDA backend");
#endif
}

absl::StatusOr<DeviceChoice> ResolveDevice(Device requested, int device_index) {
  switch (requested) {
    case Device::kCpu:
      return DeviceChoice{Device::kCpu, ""};
    case Device::kAuto:
      // Deliberately never CUDA: that backend has not run on a GPU yet.
      return DeviceChoice{Device::kCpu,
                          "device auto: using cpu (the CUDA backend is used only with "
                          "--device=cuda until it has been verified on a GPU)"};
    case Device::kCuda:
      break;
  }
#ifdef DRT_WITH_CUDA
  absl::StatusOr<int> count = cuda::CudaDeviceCount();
  if (!count.ok()) {
    return absl::UnavailableError(
        absl::StrCat("device cuda: ", count.status().message()));
  }
  if (device_index < 0 || device_index >= *count) {
    return absl::UnavailableError(absl::StrCat("device cuda: device index ", device_index,
                                               " requested, ", *count, " CUDA device(s) found"));
  }
  return DeviceChoice{Device::kCuda, ""};
#else
  (void)device_index;
  return absl::FailedPreconditionError(
      "device cuda: this build has no CUDA backend (no CUDA toolkit at build time, or "
      "DRT_ENABLE_CUDA=OFF); use cpu");
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const ModelConfig& config,
                                                     const ModelWeights& weights,
                                                     const BackendOptions& options) {
  absl::StatusOr<DeviceChoice> choice = ResolveDevice(options.device, options.cuda.device_index);
  if (!choice.ok()) return choice.status();
  if (choice->device == Device::kCpu) return MakeCpuBackend(config, weights, options.cpu);
#ifdef DRT_WITH_CUDA
  return MakeCudaBackend(config, weights, options.cuda);
#else
  return absl::InternalError("unreachable: cuda resolved in a build without CUDA");
#endif
}

}  // namespace drt
