// drt-step-bench refuses its CUDA-only options unless the backend in force
// is CUDA, --device=auto included: on a machine without a GPU auto chooses
// the CPU, and a run that ignored the options there while its header named
// them read as "the option changed nothing" (review-tools 2026-11-24 #7).
#include <string>

#include <catch2/catch.hpp>

#include "engine/backend_factory.h"
#include "tests/server/test_util/run_program.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

const std::string kModel = std::string(drt::testing::SourceDir()) + "/models/drt-passkey-byte";

TEST_CASE("drt-step-bench refuses CUDA-only options on the CPU backend, auto included",
          "[server][process][bench]") {
  const char* const kCudaOnly[] = {"--decode_graphs", "--batched_step_rows",
                                   "--decode_fused_gemv"};
  for (const char* option : kCudaOnly) {
    INFO(option);
    const ProgramRun cpu = RunProgram(
        drt::testing::StepBenchBinary(),
        {"--model", kModel, "--device", "cpu", option, "--sessions", "1", "--prompt_tokens", "8",
         "--generate", "1", "--repeats", "1", "--threads", "1"},
        60);
    CHECK(cpu.exit_status != 0);
    CHECK_THAT(cpu.errors, Contains(std::string(option) + " needs the CUDA backend"));
  }
  const ProgramRun store = RunProgram(
      drt::testing::StepBenchBinary(),
      {"--model", kModel, "--device", "cpu", "--cuda_chunk_store", "encoder_rows"}, 60);
  CHECK(store.exit_status != 0);
  CHECK_THAT(store.errors, Contains("--cuda_chunk_store=encoder_rows needs the CUDA backend"));

  // auto: what it resolves to on this machine decides what is expected.
  auto choice = drt::ResolveDevice(drt::Device::kAuto);
  REQUIRE(choice.ok());
  if (choice->device == drt::Device::kCuda) {
    WARN("auto resolves to CUDA on this machine: the auto case is the CUDA backend's; skipped");
    return;
  }
  const ProgramRun run = RunProgram(
      drt::testing::StepBenchBinary(),
      {"--model", kModel, "--device", "auto", "--decode_graphs", "--sessions", "1",
       "--prompt_tokens", "8", "--generate", "1", "--repeats", "1", "--threads", "1"},
      60);
  INFO("stdout:\n" << run.output << "\nstderr:\n" << run.errors);
  CHECK(run.exit_status != 0);
  CHECK_THAT(run.errors,
             Contains("--decode_graphs needs the CUDA backend (--device=auto chose the CPU"));
  // Nothing measured, so no result header naming the option.
  CHECK_FALSE(Contains("(decode_graphs)").match(run.output));
}

TEST_CASE("drt-step-bench refuses the options of the mode it is not in", "[server][process][bench]") {
  const ProgramRun mixed = RunProgram(
      drt::testing::StepBenchBinary(),
      {"--model", kModel, "--mixed_prefill_tokens", "0,63", "--sessions", "1,4"}, 60);
  CHECK(mixed.exit_status != 0);
  CHECK_THAT(mixed.errors, Contains("--sessions does not apply with --mixed_prefill_tokens"));
  const ProgramRun sequential = RunProgram(
      drt::testing::StepBenchBinary(),
      {"--model", kModel, "--mixed_prefill_tokens", "0,63", "--sequential=false"}, 60);
  CHECK(sequential.exit_status != 0);
  CHECK_THAT(sequential.errors, Contains("--sequential does not apply with --mixed_prefill_tokens"));
  const ProgramRun load = RunProgram(
      drt::testing::StepBenchBinary(), {"--model", kModel, "--sessions", "1", "--load_sessions", "4"}, 60);
  CHECK(load.exit_status != 0);
  CHECK_THAT(load.errors, Contains("--load_sessions applies only with --mixed_prefill_tokens"));
}

}  // namespace
}  // namespace drt::server
