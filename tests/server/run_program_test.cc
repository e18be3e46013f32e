// RunProgram (test_util/run_program.h), the helper the process tests run
// the project's binaries with: a program that outlives the timeout is
// killed and reaped before RunProgram throws, so that it does not outlive
// the test (review-tools4: it threw and left the program running).
#include <errno.h>
#include <signal.h>
#include <stdlib.h>  // mkdtemp
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "tests/server/test_util/run_program.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

TEST_CASE("RunProgram kills and reaps a program that outlives its timeout", "[server][process]") {
  std::string pattern = (std::filesystem::temp_directory_path() / "drt-run-program-test.XXXXXX");
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  const std::filesystem::path dir = pattern;
  const std::string pid_file = (dir / "pid").string();
  // The shell writes its pid, which `exec` keeps for sleep: the program
  // RunProgram started. 60 s of sleep against a 2 s timeout.
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(RunProgram("/bin/sh", {"-c", "echo $$ > '" + pid_file + "'; exec sleep 60"}, 2),
                    Catch::Matchers::Contains("hangs"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 20);  // the timeout, not the program's 60 s

  pid_t pid = 0;
  std::ifstream(pid_file) >> pid;
  std::filesystem::remove_all(dir);
  REQUIRE(pid > 0);  // the shell got as far as writing it
  // Gone and reaped: no longer a child of this process (a running or an
  // unreaped one still is, and waitpid would return 0 for it).
  errno = 0;
  const pid_t waited = waitpid(pid, nullptr, WNOHANG);
  const int error = errno;
  if (waited == 0) {  // the program outlived RunProgram: end it here
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  CHECK(waited == -1);
  CHECK(error == ECHILD);
}

}  // namespace
}  // namespace drt::server
