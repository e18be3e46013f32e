#include "kernels/cuda_driver_probe.h"

#include <dlfcn.h>

namespace drt::cuda {

bool NvidiaDriverLoadable() {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) return false;
  dlclose(driver);
  return true;
}

std::string NoCudaDeviceReason(std::string_view runtime_message, bool driver_loadable) {
  if (!driver_loadable) return "no NVIDIA driver found (libcuda.so.1 cannot be loaded)";
  return std::string(runtime_message);
}

}  // namespace drt::cuda
