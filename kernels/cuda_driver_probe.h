// Why no CUDA device can be used, in words for a host that has no NVIDIA
// driver at all: the CUDA runtime then says "CUDA driver version is
// insufficient for CUDA runtime version" (cudaErrorInsufficientDriver),
// which reads as "upgrade your driver" on a CPU-only machine.
#pragma once

#include <string>
#include <string_view>

namespace drt::cuda {

// Whether the NVIDIA driver's user-space library (libcuda.so.1) can be
// loaded by this process (dlopen; closed again at once).
bool NvidiaDriverLoadable();

// The reason in "no usable CUDA device: <reason>" for a failed
// cudaGetDeviceCount whose runtime message is `runtime_message`: "no NVIDIA
// driver found (libcuda.so.1 cannot be loaded)" when `driver_loadable` is
// false, whatever the runtime said; the runtime's message otherwise.
std::string NoCudaDeviceReason(std::string_view runtime_message, bool driver_loadable);

}  // namespace drt::cuda
