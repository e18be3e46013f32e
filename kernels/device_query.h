// Plain C++ view of the CUDA devices; includes no CUDA header so that callers
// outside kernels/ never see one (design.md, "Rules").
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace drt::cuda {

// Number of usable CUDA devices. Any runtime error (no driver, driver too old,
// no device) is returned as UNAVAILABLE with the runtime's message, which
// callers treat as "no GPU".
absl::StatusOr<int> CudaDeviceCount();
// "name (sm_XY, N MiB)" of device `index`.
absl::StatusOr<std::string> CudaDeviceDescription(int index);
// Device memory bandwidth in bytes per second, measured by timing
// device-to-device copies of `bytes` (read + write counted): the figure the
// decode step's weight-read floor is computed from. Median of `repeats`.
absl::StatusOr<double> MeasureCopyBandwidth(int index, size_t bytes = size_t{1} << 30,
                                            int repeats = 9);

}  // namespace drt::cuda
