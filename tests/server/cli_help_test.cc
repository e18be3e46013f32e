// Every drt binary, run for real: --help and --helpfull print the flags and
// exit 0, --version prints "<name> <project version>" and exits 0, and an
// unknown flag still exits 1. (Debian's Abseil exits 1 after --help by
// itself; cli/command_line.h.)
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#ifndef DRT_SERVER_BINARY
#error "tests/CMakeLists.txt defines the paths of the binaries under test"
#endif

extern char** environ;

namespace drt::server {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

struct ProgramRun {
  int exit_status = -1;  // -1: did not exit normally
  std::string output;    // stdout
  std::string errors;    // stderr
};

// Reads `fd` to the end into `out` (both pipes are drained in turn so that
// neither fills up).
void DrainPipes(int out_fd, int err_fd, std::string& out, std::string& err) {
  std::vector<pollfd> fds = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[] = {&out, &err};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int open = 2;
  while (open > 0) {
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("program hangs");
    if (poll(fds.data(), fds.size(), 1000) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      } else {
        sinks[i]->append(buffer, n);
      }
    }
  }
}

ProgramRun RunProgram(const std::string& binary, const std::vector<std::string>& args) {
  int out[2], err[2];
  if (pipe(out) != 0 || pipe(err) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  for (int fd : {out[0], out[1], err[0], err[1]}) posix_spawn_file_actions_addclose(&actions, fd);
  std::vector<std::string> strings = {binary};
  strings.insert(strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(out[0]);
    close(err[0]);
    throw std::runtime_error("cannot start " + binary);
  }
  ProgramRun run;
  DrainPipes(out[0], err[0], run.output, run.errors);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) run.exit_status = WEXITSTATUS(status);
  return run;
}

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
