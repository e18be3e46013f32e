// Start-up that a shutdown signal ends promptly (review-deploy #10). The
// shutdown signals are blocked in every thread and reach the main thread
// only when it waits for them (server/main.cc); while the main thread itself
// loaded the model and restored --state_dir sessions, a SIGTERM waited until
// the server listened (a pod deleted during a 20-minute restore was
// SIGKILLed at the end of its grace period; Ctrl-C did nothing). Start-up
// now runs on a thread of its own while the main thread waits for it or for
// a signal.
#pragma once

#include <signal.h>

#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace drt::server {

// What start-up is doing, for the line a signal prints: set by the start-up
// thread, read by the waiting one.
class StartupPhase {
 public:
  void Set(std::string what) {
    absl::MutexLock lock(&mutex_);
    what_ = std::move(what);
  }
  std::string Get() const {
    absl::MutexLock lock(&mutex_);
    return what_;
  }

 private:
  mutable absl::Mutex mutex_;
  std::string what_ ABSL_GUARDED_BY(mutex_) = "starting";
};

// The exit status of a process that a shutdown signal ended before it
// served: 128 + the signal, the status a shell reports for a process the
// signal killed (143 for SIGTERM, 130 for SIGINT), which is also what a
// signal that arrives before main sees. Not 0: start-up was cut, nothing
// was served.
constexpr int StartupSignalExitStatus(int signal) { return 128 + signal; }

// The line printed (to stderr) when `signal` ends start-up during `phase`.
std::string StartupSignalMessage(int signal, const std::string& phase);

// Runs `start_up` on a thread of its own while the calling thread waits for
// it or for one of `signals`, which must be blocked in the calling thread
// and in the threads it starts (server/main.cc blocks them before any
// thread starts). Returns when `start_up` has returned (its thread joined).
// When a signal comes first, prints StartupSignalMessage and ends the
// process at once with _exit(StartupSignalExitStatus(signal)), `start_up`
// still running: no destructors run under its threads, and the files it was
// writing are left as a kill -9 leaves them, which the state directory is
// built to restore (tests/server/crash_restart_test.cc).
void RunStartUpUnlessSignalled(const std::function<void()>& start_up, const sigset_t& signals,
                               const StartupPhase& phase);

}  // namespace drt::server
