// Device names, the choice auto makes (by hand-written machines: no GPU, one,
// two, an index out of range, a failed probe), and that asking for cuda never
// falls back to the CPU.
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

TEST_CASE("ParseCudaChunkStore accepts kv and encoder_rows and names them on error",
          "[backend_factory]") {
  CHECK(*ParseCudaChunkStore("kv") == CudaChunkStore::kKeysValues);
  CHECK(*ParseCudaChunkStore("encoder_rows") == CudaChunkStore::kEncoderRows);
  for (const char* bad : {"", "KV", "c", "rows", "encoder-rows", "kv "}) {
    auto parsed = ParseCudaChunkStore(bad);
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(parsed.status().message().find("expected kv or encoder_rows") != std::string::npos);
  }
  CHECK(std::string(CudaChunkStoreName(CudaChunkStore::kKeysValues)) == "kv");
  CHECK(std::string(CudaChunkStoreName(CudaChunkStore::kEncoderRows)) == "encoder_rows");
  // K/V stays the default: it is the one verified on a GPU.
  CHECK(BackendOptions{}.cuda.chunk_store == CudaChunkStore::kKeysValues);
}

TEST_CASE("ParseCudaChunkTier accepts host, device and auto and names them on error",
          "[backend_factory]") {
  CHECK(*ParseCudaChunkTier("host") == CudaChunkTier::kHost);
  CHECK(*ParseCudaChunkTier("device") == CudaChunkTier::kDevice);
  CHECK(*ParseCudaChunkTier("auto") == CudaChunkTier::kAuto);
  for (const char* bad : {"", "Host", "gpu", "dev", "device "}) {
    auto parsed = ParseCudaChunkTier(bad);
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(parsed.status().message().find("expected host, device or auto") != std::string::npos);
  }
  for (CudaChunkTier tier : {CudaChunkTier::kHost, CudaChunkTier::kDevice, CudaChunkTier::kAuto}) {
    CHECK(*ParseCudaChunkTier(CudaChunkTierName(tier)) == tier);
  }
  // The host tier stays the default: the device tier has not run on a GPU.
  CHECK(BackendOptions{}.cuda.chunk_tier == CudaChunkTier::kHost);
}

TEST_CASE("the CUDA state export selects the chunk store of encoder rows", "[backend_factory]") {
  // The state format holds a chunk's encoder rows; K/V cannot give them back.
  CudaBackendOptions options;
  CHECK(EffectiveChunkStore(options) == CudaChunkStore::kKeysValues);
  options.chunk_store = CudaChunkStore::kEncoderRows;
  CHECK(EffectiveChunkStore(options) == CudaChunkStore::kEncoderRows);
  options.chunk_store = CudaChunkStore::kKeysValues;
  options.state_export = true;
  CHECK(EffectiveChunkStore(options) == CudaChunkStore::kEncoderRows);
}

// Hand-written machines for ChooseDevice, the decision without the probe.
CudaAvailability NotBuilt() { return CudaAvailability{false, absl::UnavailableError("unused")}; }
CudaAvailability Gpus(int count) { return CudaAvailability{true, count}; }
CudaAvailability ProbeFailed() {
  return CudaAvailability{
      true, absl::UnavailableError("no usable CUDA device: CUDA driver version is insufficient")};
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("ChooseDevice: auto picks cuda only when built and the GPU is visible",
          "[backend_factory]") {
  SECTION("one GPU, device 0: cuda, and the note says so") {
    auto choice = ChooseDevice(Device::kAuto, 0, Gpus(1));
    REQUIRE(choice.ok());
    CHECK(choice->device == Device::kCuda);
    CHECK(choice->note == "device auto: using cuda (device 0 of 1 visible CUDA device(s))");
  }
  SECTION("two GPUs, device 1: cuda") {
    auto choice = ChooseDevice(Device::kAuto, 1, Gpus(2));
    REQUIRE(choice.ok());
    CHECK(choice->device == Device::kCuda);
    CHECK(Has(choice->note, "device 1 of 2"));
  }
  SECTION("no CUDA backend in the build: cpu, whatever the count says") {
    for (const CudaAvailability& cuda : {NotBuilt(), CudaAvailability{false, 4}}) {
      auto choice = ChooseDevice(Device::kAuto, 0, cuda);
      REQUIRE(choice.ok());
      CHECK(choice->device == Device::kCpu);
      CHECK(Has(choice->note, "device auto: using cpu (this build has no CUDA backend"));
    }
  }
  SECTION("the probe failed (no driver, no GPU): cpu, with the runtime's error") {
    auto choice = ChooseDevice(Device::kAuto, 0, ProbeFailed());
    REQUIRE(choice.ok());
    CHECK(choice->device == Device::kCpu);
    CHECK(choice->note ==
          "device auto: using cpu (no usable CUDA device: CUDA driver version is insufficient)");
  }
  SECTION("zero devices: cpu") {
    auto choice = ChooseDevice(Device::kAuto, 0, Gpus(0));
    REQUIRE(choice.ok());
    CHECK(choice->device == Device::kCpu);
    CHECK(Has(choice->note, "device index 0 requested, 0 CUDA device(s) found"));
  }
  SECTION("device index out of range (or negative): cpu, naming the index and the count") {
    for (int index : {2, 7, -1}) {
      auto choice = ChooseDevice(Device::kAuto, index, Gpus(2));
      REQUIRE(choice.ok());
      CHECK(choice->device == Device::kCpu);
      CHECK(Has(choice->note,
                "device auto: using cpu (device index " + std::to_string(index) + " requested"));
    }
  }
  SECTION("cpu is cpu on every machine, with no note") {
    for (const CudaAvailability& cuda : {NotBuilt(), Gpus(1), ProbeFailed()}) {
      auto choice = ChooseDevice(Device::kCpu, 0, cuda);
      REQUIRE(choice.ok());
      CHECK(choice->device == Device::kCpu);
      CHECK(choice->note.empty());
    }
  }
}

TEST_CASE("ChooseDevice: cuda is cuda or an error naming why, never the cpu",
          "[backend_factory]") {
  auto used = ChooseDevice(Device::kCuda, 0, Gpus(1));
  REQUIRE(used.ok());
  CHECK(used->device == Device::kCuda);
  CHECK(used->note.empty());

  auto not_built = ChooseDevice(Device::kCuda, 0, NotBuilt());
  CHECK(not_built.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Has(std::string(not_built.status().message()),
            "device cuda: this build has no CUDA backend"));
  CHECK(Has(std::string(not_built.status().message()), "use cpu"));

  auto no_driver = ChooseDevice(Device::kCuda, 0, ProbeFailed());
  CHECK(no_driver.status().code() == absl::StatusCode::kUnavailable);
  CHECK(no_driver.status().message() ==
        "device cuda: no usable CUDA device: CUDA driver version is insufficient");

  auto out_of_range = ChooseDevice(Device::kCuda, 3, Gpus(2));
  CHECK(out_of_range.status().code() == absl::StatusCode::kUnavailable);
  CHECK(out_of_range.status().message() ==
        "device cuda: device index 3 requested, 2 CUDA device(s) found");
}

TEST_CASE("ResolveDevice: auto follows this machine's probe, cpu needs none",
          "[backend_factory]") {
  const CudaAvailability here = ProbeCuda();
  CHECK(here.built == CudaBackendBuilt());
  auto choice = ResolveDevice(Device::kAuto);
  REQUIRE(choice.ok());
  const bool gpu_here = here.built && here.device_count.ok() && *here.device_count > 0;
  CHECK(choice->device == (gpu_here ? Device::kCuda : Device::kCpu));
  CHECK(Has(choice->note, gpu_here ? "device auto: using cuda" : "device auto: using cpu ("));
  if (!gpu_here) WARN("auto resolves to cpu here: " << choice->note);
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

TEST_CASE("MakeBackend builds the backend cpu and auto resolve to", "[backend_factory]") {
  const ModelConfig config = testing::TinyConfig();
  const ModelWeights weights = testing::RandomWeights(config, 3);
  BackendOptions cpu;
  cpu.device = Device::kCpu;
  cpu.cpu.num_threads = 1;
  auto cpu_backend = MakeBackend(config, weights, cpu);
  REQUIRE(cpu_backend.ok());
  CHECK((*cpu_backend)->name() == "cpu");
  CHECK((*cpu_backend)->NewSession().ok());

  BackendOptions automatic = cpu;
  automatic.device = Device::kAuto;
  auto auto_backend = MakeBackend(config, weights, automatic);
  if (ResolveDevice(Device::kAuto)->device == Device::kCpu) {
    REQUIRE(auto_backend.ok());
    CHECK((*auto_backend)->name() == "cpu");
    CHECK((*auto_backend)->NewSession().ok());
  } else {
    // auto chose the GPU, and the tiny config's 8-position chunks are not
    // supported by the CUDA kernels: the error says auto chose cuda and how
    // to get the CPU, instead of quietly serving on the CPU.
    REQUIRE_FALSE(auto_backend.ok());
    const std::string message(auto_backend.status().message());
    CHECK(Has(message, "device auto: using cuda"));
    CHECK(Has(message, "--device=cpu uses the CPU"));
  }
  // The same 8-position chunks make an explicit cuda fail whether or not a
  // GPU is present.
  BackendOptions cuda;
  cuda.device = Device::kCuda;
  auto refused = MakeBackend(config, weights, cuda);
  CHECK_FALSE(refused.ok());
}

}  // namespace
}  // namespace drt
