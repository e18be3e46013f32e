// kernels/cuda_driver_probe.h: the reason drt-server gives for having no CUDA
// device. Needs no GPU and no driver: the choice of message is a function of
// the runtime's message and whether libcuda.so.1 loads.
#include "kernels/cuda_driver_probe.h"

#include <string>

#include <catch2/catch.hpp>

namespace drt::cuda_test {
namespace {

TEST_CASE("device query: without an NVIDIA driver the reason says so, not the runtime's text",
          "[device_query]") {
  // The runtime's message on a host without libcuda (cudaErrorInsufficientDriver).
  const std::string insufficient = "CUDA driver version is insufficient for CUDA runtime version";
  CHECK(cuda::NoCudaDeviceReason(insufficient, false) ==
        "no NVIDIA driver found (libcuda.so.1 cannot be loaded)");
  // With a driver, the runtime's own words (an old driver, no device, ...).
  CHECK(cuda::NoCudaDeviceReason(insufficient, true) == insufficient);
  CHECK(cuda::NoCudaDeviceReason("no CUDA-capable device is detected", true) ==
        "no CUDA-capable device is detected");
}

}  // namespace
}  // namespace drt::cuda_test
