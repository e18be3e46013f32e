// drt-bench reports the chunk tier a session actually got beside the one it
// asked for (bench_result's chunk_tier_used), so that a "without offload"
// row run with --chunk_tier auto cannot silently measure the host tier
// (scripts/gpu_bench.sh, Table 3). Run for real on the CPU with the bundled
// model at a tiny size; the CPU backend keeps chunks in host memory.
#include <string>

#include <catch2/catch.hpp>

#include "tests/server/test_util/run_program.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

const std::string kModel = std::string(drt::testing::SourceDir()) + "/models/drt-passkey-byte";

TEST_CASE("drt-bench's bench_result names the chunk tier asked for and the one used",
          "[server][process][bench]") {
  const ProgramRun run =
      RunProgram(drt::testing::BenchBinary(), {"--model", kModel, "--prompt_tokens", "300", "--generate",
                                    "2", "--device", "cpu", "--threads", "1"},
                 120);
  INFO("stdout:\n" << run.output << "\nstderr:\n" << run.errors);
  REQUIRE(run.exit_status == 0);
  CHECK_THAT(run.output, Contains("bench_result "));
  CHECK_THAT(run.output, Contains(" chunk_tier=host chunk_tier_used=host "));

  // The device and auto tiers are the CUDA backend's: refused on the CPU.
  const ProgramRun refused =
      RunProgram(drt::testing::BenchBinary(), {"--model", kModel, "--prompt_tokens", "300", "--device",
                                    "cpu", "--chunk_tier", "auto"},
                 120);
  CHECK(refused.exit_status != 0);
  CHECK_THAT(refused.errors, Contains("--chunk_tier=auto needs --device=cuda"));
}

}  // namespace
}  // namespace drt::server
