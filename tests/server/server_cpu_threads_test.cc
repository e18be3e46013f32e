// drt-server's CPU thread count as it says at start (review-deploy #11):
// --threads=0 takes the CPUs the process may use, not
// std::thread::hardware_concurrency's host count. Here the affinity mask
// stands for a container's limit (no cgroup quota can be set in a test):
// a server started with a one-CPU mask runs one thread, where
// hardware_concurrency still counts every CPU of the machine.
#include <sched.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/build_paths.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

std::string StartAndReadStderr(const std::vector<std::string>& args, const std::string& path) {
  {
    ServerProcess server(drt::testing::ServerBinary(), args, 60, path);
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_CASE("drt-server with --threads=0 runs as many CPU threads as its affinity mask allows",
          "[server][process][cpu_threads]") {
  // With one CPU the mask changes nothing: the host's count is 1 already
  // and is the reason named (ChooseCpuThreads keeps the first of a tie), so
  // there is nothing to tell apart. Said as a skip, which ctest reports as
  // skipped (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt), not passed.
  if (std::thread::hardware_concurrency() < 2) {
    WARN("hardware_concurrency is " << std::thread::hardware_concurrency()
                                    << ": one CPU only, skipping");
    return;
  }
  drt::testing::TempDir temp;
  std::vector<std::string> args = ServerProcessArgs(1);
  args.push_back("--threads=0");

  // The child inherits the mask of the thread that spawns it: this one,
  // narrowed to its first allowed CPU while the server starts.
  cpu_set_t saved;
  REQUIRE(sched_getaffinity(0, sizeof(saved), &saved) == 0);
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  REQUIRE(sched_setaffinity(0, sizeof(one), &one) == 0);
  std::string err;
  try {
    err = StartAndReadStderr(args, temp.File("one.err"));
  } catch (...) {
    sched_setaffinity(0, sizeof(saved), &saved);
    throw;
  }
  REQUIRE(sched_setaffinity(0, sizeof(saved), &saved) == 0);
  INFO("stderr:\n" << err);
  CHECK(err.find("drt-server: 1 CPU threads (--threads=0: the CPUs in the affinity mask; CPUs: ") !=
        std::string::npos);
  CHECK(err.find(" 1 in the affinity mask") != std::string::npos);
}

TEST_CASE("drt-server with --threads=N runs N CPU threads and says it was given",
          "[server][process][cpu_threads]") {
  drt::testing::TempDir temp;
  std::vector<std::string> args = ServerProcessArgs(1);
  args.push_back("--threads=3");
  const std::string explicit_err = StartAndReadStderr(args, temp.File("three.err"));
  INFO("stderr:\n" << explicit_err);
  CHECK(explicit_err.find("drt-server: 3 CPU threads (--threads)") != std::string::npos);
}

}  // namespace
}  // namespace drt::server
