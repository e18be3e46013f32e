// The worker pool that runs engine work. Handlers submit bounded steps (one
// prompt piece, one generated token) and wait for them; steps of different
// sessions are taken first come, first served, so sessions interleave and
// none starves. The engine has no multi-session batch step yet, so decode
// steps of sessions ready at the same time run one after another.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace drt::server {

class Scheduler {
 public:
  explicit Scheduler(int workers);
  ~Scheduler();  // finishes queued steps, then joins the workers
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Runs step on a worker and returns its status once it has run; once
  // Refuse() was called, returns Refuse's status without running it.
  absl::Status Run(std::function<absl::Status()> step);

  // From now on Run() returns `status` (not OK) instead of running steps:
  // every call that runs engine steps ends at its next step with it. Used at
  // the end of a drain's grace period. Steps already queued still run.
  void Refuse(absl::Status status);

  int queued() const;

 private:
  struct Task;
  void WorkerLoop();

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Task*> queue_;
  bool stopping_ = false;
  absl::Status refusal_;  // OK until Refuse()
  std::vector<std::thread> workers_;
};

}  // namespace drt::server
