#include "server/engine_watchdog.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace drt::server {

double EngineStalledSeconds(const Scheduler::EngineProgress& progress,
                            std::chrono::steady_clock::time_point now) {
  if (progress.queued <= 0 || now <= progress.since) return 0.0;
  return std::chrono::duration<double>(now - progress.since).count();
}

absl::Status EngineLiveness(const Scheduler::EngineProgress& progress,
                            std::chrono::steady_clock::time_point now,
                            std::chrono::milliseconds limit) {
  if (limit.count() <= 0) return absl::OkStatus();
  const double stalled = EngineStalledSeconds(progress, now);
  if (stalled * 1000.0 <= static_cast<double>(limit.count())) return absl::OkStatus();
  return absl::UnavailableError(absl::StrFormat(
      "engine stuck: %d work items queued and no engine step finished for %.1f s (limit %.1f s, "
      "--engine_stall_seconds)",
      progress.queued, stalled, static_cast<double>(limit.count()) / 1000.0));
}

EngineWatchdog::EngineWatchdog(std::function<Scheduler::EngineProgress()> progress,
                               std::chrono::milliseconds limit, std::chrono::milliseconds poll,
                               std::function<void(bool live)> on_change)
    : progress_(std::move(progress)),
      limit_(limit),
      poll_(std::max(poll, std::chrono::milliseconds(1))),
      on_change_(std::move(on_change)),
      thread_([this] { Loop(); }) {}

EngineWatchdog::~EngineWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_changed_.notify_all();
  thread_.join();
}

void EngineWatchdog::Loop() {
  bool live = true;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_changed_.wait_for(lock, poll_, [&] { return stop_; })) {
    lock.unlock();
    const bool now_live =
        EngineLiveness(progress_(), std::chrono::steady_clock::now(), limit_).ok();
    if (now_live != live) {
      live = now_live;
      on_change_(live);
    }
    lock.lock();
  }
}

}  // namespace drt::server
