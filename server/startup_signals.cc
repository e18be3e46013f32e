#include "server/startup_signals.h"

#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <thread>

#include "absl/strings/str_format.h"

namespace drt::server {

std::string StartupSignalMessage(int signal, const std::string& phase) {
  return absl::StrFormat("drt-server: %s during start-up (%s): exiting with status %d before serving",
                         strsignal(signal), phase, StartupSignalExitStatus(signal));
}

void RunStartUpUnlessSignalled(const std::function<void()>& start_up, const sigset_t& signals,
                               const StartupPhase& phase) {
  std::atomic<bool> done{false};
  std::thread thread([&] {
    start_up();
    done.store(true);
  });
  // Polled: the start-up thread cannot wake a sigtimedwait without sending
  // a signal. 20 ms is nothing beside a start-up.
  const timespec poll = {0, 20'000'000};
  while (!done.load()) {
    const int signal = sigtimedwait(&signals, nullptr, &poll);
    if (signal > 0) {
      const std::string line = StartupSignalMessage(signal, phase.Get()) + "\n";
      std::fputs(line.c_str(), stderr);
      std::fflush(stderr);
      _exit(StartupSignalExitStatus(signal));
    }
  }
  thread.join();
}

}  // namespace drt::server
