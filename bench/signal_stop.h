// Ctrl-C and SIGTERM for a benchmark that has something to clean up
// (drt-durable-bench's scratch directory): the first signal asks the run to
// stop at its next check, so that it returns through its normal path and its
// destructors run; a default signal action would end the process with none of
// them (review-tools4 #1: the scratch directory stayed after a SIGTERM).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"

namespace drt::bench {

class SignalStop {
 public:
  // Blocks SIGINT and SIGTERM in the calling thread, and so in every thread
  // started after it, and starts a thread that takes them (sigwait). Call it
  // before any thread of the program's own starts (threads that libraries
  // started before main get a handler that forwards the signals to the
  // taking thread). Until Arm(), a signal ends the process at once with exit
  // status 128 + the signal (there is nothing to clean up yet). Once per
  // process.
  static std::shared_ptr<SignalStop> Install(std::string program);

  // From now on the first signal only sets the flag that Check() reads,
  // saying so on stderr; a second one still ends the process at once (a
  // bench must never become unkillable), leaving what the first would have
  // cleaned up.
  void Arm();

  // CANCELLED naming the signal once one came after Arm(); OK until then.
  absl::Status Check() const;

  // 128 + the signal that Check() reports (130 for SIGINT, 143 for SIGTERM,
  // as a shell reports a process the signal ended), or 0 before one.
  int ExitStatus() const;

  explicit SignalStop(std::string program) : program_(std::move(program)) {}

 private:
  void Take(int signal);

  const std::string program_;
  std::mutex mutex_;  // orders Arm() against a signal arriving meanwhile
  bool armed_ = false;
  std::atomic<int> signal_{0};
};

}  // namespace drt::bench
