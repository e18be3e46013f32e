#include "bench/signal_stop.h"

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"

namespace drt::bench {
namespace {

// The two signals taken.
const char* Name(int signal) { return signal == SIGINT ? "SIGINT" : "SIGTERM"; }

// The thread that takes the signals, for ForwardToTaker. Written once in
// Install, before the handler is installed, and only read afterwards (a
// signal handler can reach nothing but a global).
pthread_t g_taker;

// Runs only in a thread that has the signals unblocked: one a library
// started before main (OpenBLAS starts its pool from a constructor), which
// the mask set in Install cannot reach. Without it the signal's default
// action ends the process whenever the kernel picks such a thread (seen:
// SIGTERM during a run ended drt-durable-bench with the scratch directory
// left). pthread_kill is async-signal-safe (signal-safety(7)); the signal
// then waits, pending, for the taker's sigwait. As server/main.cc does.
void ForwardToTaker(int signal) { pthread_kill(g_taker, signal); }

}  // namespace

std::shared_ptr<SignalStop> SignalStop::Install(std::string program) {
  auto stop = std::make_shared<SignalStop>(std::move(program));
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Detached: it waits for a signal for the life of the process, and holds
  // its own reference to the state, so that it may outlive main's.
  std::thread taker([stop, signals] {
    while (true) {
      int signal = 0;
      if (sigwait(&signals, &signal) == 0) stop->Take(signal);
    }
  });
  g_taker = taker.native_handle();
  taker.detach();
  struct sigaction action = {};
  action.sa_handler = ForwardToTaker;
  action.sa_mask = signals;
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGINT, SIGTERM}) {
    // A signal ignored from the start (SIGINT for a job a shell ran in the
    // background) stays ignored.
    struct sigaction was = {};
    if (sigaction(signal, nullptr, &was) == 0 && was.sa_handler == SIG_IGN) continue;
    sigaction(signal, &action, nullptr);
  }
  return stop;
}

void SignalStop::Take(int signal) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Before Arm() nothing is made yet; a second signal means "now". Holding
  // the mutex, so that Arm() cannot return (and the caller make what it
  // would clean up) while this exits.
  if (!armed_ || signal_.load() != 0) std::_Exit(128 + signal);
  std::fprintf(stderr, "%s: %s: stopping at the next step and cleaning up (again to exit at once)\n",
               program_.c_str(), Name(signal));
  signal_.store(signal);
}

void SignalStop::Arm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
}

absl::Status SignalStop::Check() const {
  const int signal = signal_.load();
  if (signal == 0) return absl::OkStatus();
  return absl::CancelledError(absl::StrCat("stopped by ", Name(signal)));
}

int SignalStop::ExitStatus() const {
  const int signal = signal_.load();
  return signal == 0 ? 0 : 128 + signal;
}

}  // namespace drt::bench
