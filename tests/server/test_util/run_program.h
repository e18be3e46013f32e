// Runs a program to its end with stdout and stderr captured, for tests that
// run the project's binaries (cli_help_test.cc, batch_bench_smoke_test.cc).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace drt::server::testing {

struct ProgramRun {
  int exit_status = -1;  // -1: did not exit normally
  std::string output;    // stdout
  std::string errors;    // stderr
};

// Reads both pipes to their end into `out` and `err` (drained in turn so
// that neither fills up); false when `timeout_seconds` passed first, the
// pipes still open (the caller closes them).
inline bool DrainPipes(int out_fd, int err_fd, std::string& out, std::string& err,
                       double timeout_seconds) {
  std::vector<pollfd> fds = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[] = {&out, &err};
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(1000 * timeout_seconds));
  int open = 2;
  while (open > 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      for (const pollfd& p : fds) {
        if (p.fd >= 0) close(p.fd);
      }
      return false;
    }
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
  return true;
}

inline ProgramRun RunProgram(const std::string& binary, const std::vector<std::string>& args,
                             double timeout_seconds = 30) {
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
  if (!DrainPipes(out[0], err[0], run.output, run.errors, timeout_seconds)) {
    // Killed and reaped before the test goes on, so that a hung program
    // does not outlive it (only the program itself: a child it started and
    // left keeps running).
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    throw std::runtime_error(binary + " hangs: no end within " + std::to_string(timeout_seconds) +
                             " s; killed");
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) run.exit_status = WEXITSTATUS(status);
  return run;
}

}  // namespace drt::server::testing
