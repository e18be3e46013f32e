// Picks and builds a backend by device name ("cpu", "cuda", "auto"). Includes
// no CUDA header, so the server and tools can use it in every build.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
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

// "kv" or "encoder_rows" (the CUDA backend's CudaChunkStore, drt-server
// --cuda_chunk_store); INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<CudaChunkStore> ParseCudaChunkStore(absl::string_view name);
const char* CudaChunkStoreName(CudaChunkStore store);

// "host", "device" or "auto" (the CUDA backend's CudaChunkTier, drt-server
// --cuda_chunk_tier); INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<CudaChunkTier> ParseCudaChunkTier(absl::string_view name);
const char* CudaChunkTierName(CudaChunkTier tier);

struct BackendOptions {
  Device device = Device::kCpu;
  CpuBackendOptions cpu;
  CudaBackendOptions cuda;
};

// Whether this build contains the CUDA backend (DRT_WITH_CUDA).
bool CudaBackendBuilt();

// The backend a request resolves to, with a note saying why when the request
// was auto or the device asked for is not the one used.
struct DeviceChoice {
  Device device = Device::kCpu;
  std::string note;  // empty for an explicit cpu or cuda that is used as asked
};

// What this build and machine offer the CUDA backend: whether it is built,
// and cuda::CudaDeviceCount() (an error when no driver or device is usable;
// not looked at when not built).
struct CudaAvailability {
  bool built = false;
  absl::StatusOr<int> device_count = absl::UnavailableError("not probed");
};

// The decision alone, so that it can be tested without a GPU:
// - kCpu: the CPU.
// - kAuto: CUDA when it is built and GPU `device_index` is among the
//   device_count visible ones; the CPU otherwise. The note says which and
//   why (the runtime's error when the probe failed).
// - kCuda: CUDA under the same conditions, else an error, never the CPU:
//   FAILED_PRECONDITION when not built, UNAVAILABLE (with the runtime's
//   reason, or the index and the count) when the GPU is not there.
absl::StatusOr<DeviceChoice> ChooseDevice(Device requested, int device_index,
                                          const CudaAvailability& cuda);

// This build and machine's CudaAvailability (probes the CUDA runtime only
// when the backend is built).
CudaAvailability ProbeCuda();

// ChooseDevice(requested, device_index, ProbeCuda()); does not probe for cpu.
absl::StatusOr<DeviceChoice> ResolveDevice(Device requested, int device_index = 0);

// GPU `device_index`'s memory bandwidth in bytes/s (timed device-to-device
// copies): what benchmarks divide the weight bytes by for the decode step's
// weight-read floor. FAILED_PRECONDITION in a build without CUDA.
absl::StatusOr<double> MeasureGpuMemoryBandwidth(int device_index);

// ResolveDevice, then that backend. When auto resolved to CUDA and the CUDA
// backend cannot be made (say, a model it does not support or a GPU too
// small for it), that error is returned with a note that auto chose CUDA:
// there is no silent fall back to a far slower CPU. The model must outlive
// the backend.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const ModelConfig& config,
                                                     const ModelWeights& weights,
                                                     const BackendOptions& options);

}  // namespace drt
