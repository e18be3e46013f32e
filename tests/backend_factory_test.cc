// Device names, the choice auto makes, and that asking for cuda never falls
// back to the CPU silently.
#include <string>

#include <catch2/catch.hpp>

#include "engine/backend_factory.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

TEST_CASE("ParseDevice accepts cpu, cuda, auto and names them on error", "[backend_factory]") {
  CHECK(*ParseDevice("cpu") == Device::kCpu);
  CHECK(*ParseDevice("cuda") == Device::kCuda);
  CHECK(*ParseDevice("auto") == Device::kAuto);
  for (const char* bad : {"", "gpu", "CUDA", "cpu "}) {
    auto parsed = ParseDevice(bad);
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(parsed.status().message().find("expected cpu, cuda or auto") != std::string::npos);
  }
  CHECK(std::string(DeviceName(Device::kCuda)) == "cuda");
}

TEST_CASE("ParseCudaPrecision accepts bf16 and fp32 and names them on error",
          "[backend_factory]") {
  CHECK(*ParseCudaPrecision("bf16") == CudaPrecision::kBf16);
  CHECK(*ParseCudaPrecision("fp32") == CudaPrecision::kFp32);
  for (const char* bad : {"", "float32", "FP32", "bf16 ", "fp16", "tf32"}) {
    auto parsed = ParseCudaPrecision(bad);
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(parsed.status().message().find("expected bf16 or fp32") != std::string::npos);
  }
  CHECK(std::string(CudaPrecisionName(CudaPrecision::kFp32)) == "fp32");
  CHECK(std::string(CudaPrecisionName(CudaPrecision::kBf16)) == "bf16");
  // bf16 stays the default: it is the fast one.
  CHECK(BackendOptions{}.cuda.precision == CudaPrecision::kBf16);
}

TEST_CASE("auto resolves to cpu and says why", "[backend_factory]") {
  auto choice = ResolveDevice(Device::kAuto);
  REQUIRE(choice.ok());
  CHECK(choice->device == Device::kCpu);
  CHECK(choice->note.find("verified on a GPU") != std::string::npos);
  auto cpu = ResolveDevice(Device::kCpu);
  REQUIRE(cpu.ok());
  CHECK(cpu->device == Device::kCpu);
  CHECK(cpu->note.empty());
}

TEST_CASE("cuda resolves to cuda or to a clear error, never to cpu", "[backend_factory]") {
  auto choice = ResolveDevice(Device::kCuda);
  if (choice.ok()) {
    CHECK(CudaBackendBuilt());
    CHECK(choice->device == Device::kCuda);
  } else if (!CudaBackendBuilt()) {
    CHECK(choice.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(choice.status().message().find("no CUDA backend") != std::string::npos);
  } else {
    WARN("no GPU here: " << choice.status().message());
    CHECK(choice.status().code() == absl::StatusCode::kUnavailable);
    CHECK(choice.status().message().find("device cuda") != std::string::npos);
  }
  auto bad_index = ResolveDevice(Device::kCuda, 1 << 20);
  CHECK_FALSE(bad_index.ok());
}

TEST_CASE("MakeBackend builds the cpu backend for cpu and auto", "[backend_factory]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 3);
  for (Device device : {Device::kCpu, Device::kAuto}) {
    BackendOptions options;
    options.device = device;
    options.cpu.num_threads = 1;
    auto backend = MakeBackend(config, weights, options);
    REQUIRE(backend.ok());
    CHECK((*backend)->name() == "cpu");
    CHECK((*backend)->NewSession().ok());
  }
  // The tiny config's 8-position chunks are not supported by the CUDA
  // kernels, so cuda is refused whether or not a GPU is present.
  BackendOptions cuda;
  cuda.device = Device::kCuda;
  auto refused = MakeBackend(config, weights, cuda);
  CHECK_FALSE(refused.ok());
}

}  // namespace
}  // namespace drt
