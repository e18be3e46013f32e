// Benchmarks refuse a run that would measure nothing, instead of printing
// 0.0 % cells or nothing at all and exiting 0 (review-tools 2026-11-24 #21).
#include <string>

#include <catch2/catch.hpp>

#include "tests/server/test_util/run_program.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

const std::string kModel = std::string(drt::testing::SourceDir()) + "/models/drt-passkey-byte";
const std::string kText =
    std::string(drt::testing::SourceDir()) + "/tests/fixtures/heldout-text/debian_handbook_excerpt.txt";

TEST_CASE("drt-niah and drt-niah-text refuse --trials 0, and drt-tokenizer-bench needs --text",
          "[server][process][bench]") {
  for (const char* trials : {"--trials=0", "--trials=-3"}) {
    INFO(trials);
    const ProgramRun niah = RunProgram(drt::testing::NiahBinary(), {"--model", kModel, trials}, 60);
    CHECK(niah.exit_status != 0);
    CHECK_THAT(niah.errors, Contains("--trials must be at least 1"));
    const ProgramRun text =
        RunProgram(drt::testing::NiahTextBinary(), {"--model", kModel, "--text", kText, trials}, 60);
    CHECK(text.exit_status != 0);
    CHECK_THAT(text.errors, Contains("--trials must be at least 1"));
  }
  const ProgramRun tokenizer = RunProgram(drt::testing::TokenizerBenchBinary(), {}, 60);
  CHECK(tokenizer.exit_status != 0);
  CHECK_THAT(tokenizer.errors, Contains("--text is required"));
}

TEST_CASE("drt-niah checks every length, not only the largest", "[server][process][bench]") {
  // 50 tokens cannot hold the question and a needle; only the largest length
  // was checked, so the "50" row ran on a haystack longer than its label.
  const ProgramRun run =
      RunProgram(drt::testing::NiahBinary(), {"--model", kModel, "--lengths", "4K,50", "--trials", "1"}, 60);
  CHECK(run.exit_status != 0);
  CHECK_THAT(run.errors, Contains("--lengths: 50 tokens cannot hold the question and a needle"));
}

}  // namespace
}  // namespace drt::server
