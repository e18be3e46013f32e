// Every drt binary, run for real: --help and --helpfull print the flags and
// exit 0, --version prints "<name> <project version>" and exits 0, and an
// unknown flag still exits 1. (Debian's Abseil exits 1 after --help by
// itself; cli/command_line.h.)

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/server/test_util/run_program.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using testing::ProgramRun;
using testing::RunProgram;

struct Binary {
  const char* name;
  const char* path;
  const char* a_flag;  // one of its own flags, which --help must list
};

// Every binary the build made (drt-window-bench only with the CUDA kernels).
std::vector<Binary> Binaries() {
  std::vector<Binary> binaries = {
      {"drt-server", drt::testing::ServerBinary(), "--model"},
      {"drt-bench", drt::testing::BenchBinary(), "--prompt_tokens"},
      {"drt-niah", drt::testing::NiahBinary(), "--lengths"},
      {"drt-client", drt::testing::ClientBinary(), "--haystack_tokens"},
      {"drt-tokenizer-bench", drt::testing::TokenizerBenchBinary(), "--runs"},
      {"drt-niah-text", drt::testing::NiahTextBinary(), "--tasks"},
      {"drt-batch-bench", drt::testing::BatchBenchBinary(), "--sessions"},
      {"drt-step-bench", drt::testing::StepBenchBinary(), "--sessions"},
      {"drt-durable-bench", drt::testing::DurableBenchBinary(), "--tokens"},
      {"drt-ppl", drt::testing::PplBinary(), "--piece"},
  };
  if (const char* window_bench = drt::testing::WindowBenchBinary()) {
    binaries.push_back({"drt-window-bench", window_bench, "--splits"});
  }
  return binaries;
}

TEST_CASE("every binary: --help and --helpfull print the flags and exit 0", "[cli]") {
  for (const Binary& binary : Binaries()) {
    for (const char* help : {"--help", "--helpfull", "--helpshort"}) {
      INFO(binary.name << " " << help);
      const ProgramRun run = RunProgram(binary.path, {help});
      INFO("stdout: " << run.output << "\nstderr: " << run.errors);
      CHECK(run.exit_status == 0);
      // absl's help lists a flag as "--name (help text)".
      CHECK_THAT(run.output, Contains(std::string(binary.a_flag) + " ("));
    }
  }
}

TEST_CASE("every binary: --version prints the project version and exits 0", "[cli]") {
  for (const Binary& binary : Binaries()) {
    INFO(binary.name);
    const ProgramRun run = RunProgram(binary.path, {"--version"});
    INFO("stdout: " << run.output << "\nstderr: " << run.errors);
    CHECK(run.exit_status == 0);
    // DRT_PROJECT_VERSION is CMake's project(VERSION), independent of the code
    // under test.
    CHECK(run.output == std::string(binary.name) + " " + DRT_PROJECT_VERSION + "\n");
  }
}

TEST_CASE("every binary: an unknown flag still fails with status 1", "[cli]") {
  for (const Binary& binary : Binaries()) {
    INFO(binary.name);
    const ProgramRun run = RunProgram(binary.path, {"--no_such_flag_anywhere=1"});
    CHECK(run.exit_status == 1);
    CHECK_THAT(run.errors, Contains("no_such_flag_anywhere"));
  }
}

TEST_CASE("drt-client refuses --prompt_logprobs outside [0, 20] before it contacts a server",
          "[cli][client][score]") {
  // No server listens on port 1: a client that got as far as CreateSession
  // (where it used to learn of the range, from the server's refusal, after
  // making a session) would fail on the connection instead.
  for (const char* top : {"21", "-2"}) {
    INFO(top);
    const ProgramRun run =
        RunProgram(drt::testing::ClientBinary(),
                   {"--server=127.0.0.1:1", "--retry_seconds=0",
                    std::string("--prompt_logprobs=") + top});
    CHECK(run.exit_status == 1);
    CHECK_THAT(run.errors, Contains("--prompt_logprobs must be in [0, 20] or -1 (off), got " +
                                    std::string(top)));
  }
}

TEST_CASE("drt-server --help says that sessions live in memory", "[cli]") {
  const ProgramRun run = RunProgram(drt::testing::ServerBinary(), {"--help"});
  CHECK_THAT(run.output, Contains("Sessions are held in memory"));
  CHECK_THAT(run.output, Contains("a restart loses them"));
}

}  // namespace
}  // namespace drt::server
