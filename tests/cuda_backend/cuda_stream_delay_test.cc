// The test-only stream delay (CudaBackendOptions::debug_stream_delay,
// review-cuda F1): off by default, its "STREAM:NS" form, and
// MakeCudaBackend's refusals. MakeCudaBackend checks the options before it
// looks for a GPU, so these run (and must pass) without one. What the delay
// is for (the bit-identity cases with each stream delayed) runs on a GPU:
// scripts/gpu_bench.sh STREAM_DELAY_RUNS.
#include <string>

#include <catch2/catch.hpp>

#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/host/stream_delay.h"
#include "tests/cuda_backend/cuda_test_support.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("cuda stream delay: off by default", "[cuda][stream_delay]") {
  const CudaBackendOptions options;
  CHECK(options.debug_stream_delay.stream == CudaDelayedStream::kNone);
  CHECK(options.debug_stream_delay.ns == 0);
  CHECK(CheckCudaStreamDelay(options.debug_stream_delay).ok());
  auto none = ParseCudaStreamDelay("");
  REQUIRE(none.ok());
  CHECK(none->stream == CudaDelayedStream::kNone);
  CHECK(none->ns == 0);
}

TEST_CASE("cuda stream delay: STREAM:NS names each stream", "[cuda][stream_delay]") {
  struct Case {
    const char* spec;
    CudaDelayedStream stream;
    int64_t ns;
  };
  for (const Case& c : {Case{"store:1000000", CudaDelayedStream::kStore, 1000000},
                        Case{"fetch:5", CudaDelayedStream::kFetch, 5},
                        Case{"step:2000000", CudaDelayedStream::kStep, 2000000},
                        Case{"compute:100000000", CudaDelayedStream::kCompute, 100000000}}) {
    INFO(c.spec);
    auto parsed = ParseCudaStreamDelay(c.spec);
    REQUIRE(parsed.ok());
    CHECK(parsed->stream == c.stream);
    CHECK(parsed->ns == c.ns);
    CHECK(CheckCudaStreamDelay(*parsed).ok());
    CHECK(std::string(c.spec).rfind(CudaDelayedStreamName(c.stream), 0) == 0);
  }
}

TEST_CASE("cuda stream delay: a bad form is refused by name", "[cuda][stream_delay]") {
  struct Case {
    const char* spec;
    const char* message;  // a part of the error's
  };
  for (const Case& c : {Case{"graph:1000", "unknown stream 'graph'"},
                        Case{"fetch", "expected STREAM:NS"},
                        Case{"fetch:", "not a whole number"},
                        Case{"fetch:1ms", "not a whole number"},
                        Case{":1000", "unknown stream ''"}}) {
    INFO(c.spec);
    auto parsed = ParseCudaStreamDelay(c.spec);
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(parsed.status().message()), Contains(c.message));
  }
}

TEST_CASE("cuda stream delay: MakeCudaBackend refuses a bad delay before any GPU work",
          "[cuda][stream_delay]") {
  const ModelConfig config = testing::Chunk64Config();
  const ModelWeights weights = testing::RandomWeights(config, 95);
  struct Case {
    const char* name;
    CudaStreamDelay delay;
    const char* message;
  };
  for (const Case& c :
       {Case{"a delay without a stream", {CudaDelayedStream::kNone, 1000}, "without a stream"},
        Case{"a stream without a delay", {CudaDelayedStream::kFetch, 0}, "expected 1 to"},
        Case{"a negative delay", {CudaDelayedStream::kStore, -5}, "expected 1 to"},
        Case{"more than 0.1 s", {CudaDelayedStream::kCompute, kMaxCudaStreamDelayNs + 1},
             "expected 1 to"},
        Case{"an unknown stream", {static_cast<CudaDelayedStream>(42), 1000},
             "unknown stream 42"}}) {
    INFO(c.name);
    CudaBackendOptions options;
    options.debug_stream_delay = c.delay;
    auto made = MakeCudaBackend(config, weights, options);
    REQUIRE_FALSE(made.ok());
    CHECK(made.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(made.status().message()), Contains("debug_stream_delay"));
    CHECK_THAT(std::string(made.status().message()), Contains(c.message));
  }
}

}  // namespace
}  // namespace drt
