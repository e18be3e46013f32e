// Every drt binary, run for real: --help and --helpfull print the flags and
// exit 0, --version prints "<name> <project version>" and exits 0, and an
// unknown flag still exits 1. (Debian's Abseil exits 1 after --help by
// itself; cli/command_line.h.)

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/server/test_util/run_program.h"

#ifndef DRT_SERVER_BINARY
#error "tests/CMakeLists.txt defines the paths of the binaries under test"
#endif

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

const Binary kBinaries[] = {
    {"drt-server", DRT_SERVER_BINARY, "--model"},
    {"drt-bench", DRT_BENCH_BINARY, "--prompt_tokens"},
    {"drt-niah", DRT_NIAH_BINARY, "--lengths"},
    {"drt-client", DRT_CLIENT_BINARY, "--haystack_tokens"},
    {"drt-tokenizer-bench", DRT_TOKENIZER_BENCH_BINARY, "--runs"},
    {"drt-niah-text", DRT_NIAH_TEXT_BINARY, "--tasks"},
    {"drt-batch-bench", DRT_BATCH_BENCH_BINARY, "--sessions"},
    {"drt-step-bench", DRT_STEP_BENCH_BINARY, "--sessions"},
    {"drt-durable-bench", DRT_DURABLE_BENCH_BINARY, "--tokens"},
#ifdef DRT_WINDOW_BENCH_BINARY  // built only with the CUDA kernels
    {"drt-window-bench", DRT_WINDOW_BENCH_BINARY, "--splits"},
#endif
};

TEST_CASE("every binary: --help and --helpfull print the flags and exit 0", "[cli]") {
  for (const Binary& binary : kBinaries) {
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
  for (const Binary& binary : kBinaries) {
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
  for (const Binary& binary : kBinaries) {
    INFO(binary.name);
    const ProgramRun run = RunProgram(binary.path, {"--no_such_flag_anywhere=1"});
    CHECK(run.exit_status == 1);
    CHECK_THAT(run.errors, Contains("no_such_flag_anywhere"));
  }
}

TEST_CASE("drt-server --help says that sessions live in memory", "[cli]") {
  const ProgramRun run = RunProgram(DRT_SERVER_BINARY, {"--help"});
  CHECK_THAT(run.output, Contains("Sessions are held in memory"));
  CHECK_THAT(run.output, Contains("a restart loses them"));
}

}  // namespace
}  // namespace drt::server
