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

absl::StatusOr<CudaChunkStore> ParseCudaChunkStore(absl::string_view name) {
  if (name == "kv") return CudaChunkStore::kKeysValues;
  if (name == "encoder_rows") return CudaChunkStore::kEncoderRows;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown CUDA chunk store '", name, "': expected kv or encoder_rows"));
}

const char* CudaChunkStoreName(CudaChunkStore store) {
  switch (store) {
    case CudaChunkStore::kKeysValues: return "kv";
    case CudaChunkStore::kEncoderRows: return "encoder_rows";
  }
  return "unknown";
}

absl::StatusOr<CudaChunkTier> ParseCudaChunkTier(absl::string_view name) {
  if (name == "host") return CudaChunkTier::kHost;
  if (name == "device") return CudaChunkTier::kDevice;
  if (name == "auto") return CudaChunkTier::kAuto;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown CUDA chunk tier '", name, "': expected host, device or auto"));
}

const char* CudaChunkTierName(CudaChunkTier tier) {
  switch (tier) {
    case CudaChunkTier::kHost: return "host";
    case CudaChunkTier::kDevice: return "device";
    case CudaChunkTier::kAuto: return "auto";
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

absl::StatusOr<DeviceChoice> ChooseDevice(Device requested, int device_index,
                                          const CudaAvailability& cuda) {
  if (requested == Device::kCpu) return DeviceChoice{Device::kCpu, ""};
  const bool is_auto = requested == Device::kAuto;
  // Why CUDA cannot be used; empty when it can.
  absl::Status unusable;
  if (!cuda.built) {
    unusable = absl::FailedPreconditionError(
        "this build has no CUDA backend (no CUDA toolkit at build time, or DRT_ENABLE_CUDA=OFF)");
  } else if (!cuda.device_count.ok()) {
    unusable = absl::UnavailableError(cuda.device_count.status().message());
  } else if (device_index < 0 || device_index >= *cuda.device_count) {
    unusable = absl::UnavailableError(absl::StrCat("device index ", device_index, " requested, ",
                                                   *cuda.device_count, " CUDA device(s) found"));
  }
  if (is_auto) {
    if (!unusable.ok()) {
      return DeviceChoice{Device::kCpu,
                          absl::StrCat("device auto: using cpu (", unusable.message(), ")")};
    }
    return DeviceChoice{Device::kCuda,
                        absl::StrCat("device auto: using cuda (device ", device_index, " of ",
                                     *cuda.device_count, " visible CUDA device(s))")};
  }
  if (!unusable.ok()) {
    const bool not_built = unusable.code() == absl::StatusCode::kFailedPrecondition;
    return absl::Status(unusable.code(),
                        absl::StrCat("device cuda: ", unusable.message(),
                                     not_built ? "; use cpu" : ""));
  }
  return DeviceChoice{Device::kCuda, ""};
}

CudaAvailability ProbeCuda() {
  CudaAvailability cuda;
#ifdef DRT_WITH_CUDA
  cuda.built = true;
  cuda.device_count = cuda::CudaDeviceCount();
#endif
  return cuda;
}

absl::StatusOr<DeviceChoice> ResolveDevice(Device requested, int device_index) {
  if (requested == Device::kCpu) return DeviceChoice{Device::kCpu, ""};
  return ChooseDevice(requested, device_index, ProbeCuda());
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const ModelConfig& config,
                                                     const ModelWeights& weights,
                                                     const BackendOptions& options) {
  absl::StatusOr<DeviceChoice> choice = ResolveDevice(options.device, options.cuda.device_index);
  if (!choice.ok()) return choice.status();
  if (choice->device == Device::kCpu) return MakeCpuBackend(config, weights, options.cpu);
#ifdef DRT_WITH_CUDA
  absl::StatusOr<std::unique_ptr<Backend>> cuda = MakeCudaBackend(config, weights, options.cuda);
  if (!cuda.ok() && options.device == Device::kAuto) {
    return absl::Status(cuda.status().code(),
                        absl::StrCat(choice->note, ", but the CUDA backend cannot be made: ",
                                     cuda.status().message(), "; --device=cpu uses the CPU"));
  }
  return cuda;
#else
  return absl::InternalError("unreachable: cuda resolved in a build without CUDA");
#endif
}

}  // namespace drt
