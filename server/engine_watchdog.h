// Liveness that sees a stuck engine (review-deploy #5): a hung kernel, a
// deadlocked scheduler or a wedged engine thread leaves every call hanging
// while the drain-driven health status still says SERVING. The engine is
// called stuck when work it can run is queued and no engine step has finished
// (and no such work arrived at an engine that had none) for longer than a
// limit (--engine_stall_seconds); a scored item parked until its client
// reads its scores is not such work (Scheduler::engine_progress). Liveness only: readiness keeps following the
// drain, so that one slow step does not take the pod, and with it its
// sessions' keys, out of the gateway's ring; a stuck engine is restarted by
// the liveness probe instead (docs/deploy.md, "Probes").
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "server/scheduler.h"

namespace drt::server {

// The grpc.health.v1 service name that reports the engine's liveness (the
// Kubernetes liveness probe's `grpc.service`); "" and drt.v1.Drt report
// the drain (readiness).
inline constexpr char kEngineHealthService[] = "drt.v1.Drt.engine";

// Seconds the engine has gone without progress while work is queued; 0 when
// none is queued.
double EngineStalledSeconds(const Scheduler::EngineProgress& progress,
                            std::chrono::steady_clock::time_point now);

// OK, or UNAVAILABLE naming the queued items and the seconds without
// progress, when they exceed `limit`. A limit of zero or less: always OK.
absl::Status EngineLiveness(const Scheduler::EngineProgress& progress,
                            std::chrono::steady_clock::time_point now,
                            std::chrono::milliseconds limit);

// Polls `progress` every `poll` on a thread of its own and calls `on_change`
// with the new liveness (true: live) each time it changes; the engine counts
// as live when the watchdog starts. For the gRPC health status, which holds
// a value rather than asking. The destructor stops and joins the thread.
class EngineWatchdog {
 public:
  EngineWatchdog(std::function<Scheduler::EngineProgress()> progress,
                 std::chrono::milliseconds limit, std::chrono::milliseconds poll,
                 std::function<void(bool live)> on_change);
  ~EngineWatchdog();
  EngineWatchdog(const EngineWatchdog&) = delete;
  EngineWatchdog& operator=(const EngineWatchdog&) = delete;

 private:
  void Loop();

  const std::function<Scheduler::EngineProgress()> progress_;
  const std::chrono::milliseconds limit_;
  const std::chrono::milliseconds poll_;
  const std::function<void(bool)> on_change_;
  std::mutex mutex_;
  std::condition_variable stop_changed_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace drt::server
