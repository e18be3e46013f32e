// Picks and builds a backend by device name ("cpu", "cuda", "auto"). Includes
// no CUDA header, so the server and tools can use it in every build.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_options.h"

namespace drt {

enum class Device { kCpu, kCuda, kAuto };

// "cpu", "cuda" or "auto"; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<Device> ParseDevice(absl::string_view name);
const char* DeviceName(Device device);

// "bf16" or "fp32" (the CUDA backend's CudaPrecision); INVALID_ARGUMENT
// naming the choices otherwise.
absl::StatusOr<CudaPrecision> ParseCudaPrecision(absl::string_view name);
const char* CudaPrecisionName(CudaPrecision precision);

struct BackendOptions {
  Device device = Device::kCpu;
  CpuBackendOptions cpu;
  CudaBackendOptions cuda;
};

// Whether this build contains the CUDA backend (DRT_WITH_CUDA).
bool CudaBackendBuilt();

// The backend `requested` resolves to here, with a note saying why when it is
// not the one asked for. kAuto resolves to kCpu: the CUDA backend has not been
// verified on a GPU yet (docs/cuda.md), so it is used only when asked for by
// name. kCuda resolves to kCuda only when the CUDA backend is built
// (FAILED_PRECONDITION otherwise) and device `device_index` exists
// (UNAVAILABLE otherwise, with the runtime's reason).
struct DeviceChoice {
  Device device = Device::kCpu;
  std::string note;  // empty when the device asked for is used
};
absl::StatusOr<DeviceChoice> ResolveDevice(Device requested, int device_index = 0);

// GPU `device_index`'s memory bandwidth in bytes/s (timed device-to-device
// copies): what benchmarks divide the weight bytes by for the decode step's
// weight-read floor. FAILED_PRECONDITION in a build without CUDA.
absl::StatusOr<double> MeasureGpuMemoryBandwidth(int device_index);

// ResolveDevice, then the backend. The model must outlive the backend.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const ModelConfig& config,
                                                     const ModelWeights& weights,
                                                     const BackendOptions& options);

}  // namespace drt
