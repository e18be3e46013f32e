#include "server/scheduler.h"

#include <algorithm>

namespace drt::server {

struct Scheduler::Task {
  std::function<absl::Status()> step;
  absl::Status result;
  bool done = false;
  std::condition_variable finished;
};

Scheduler::Scheduler(int workers) {
  for (int i = 0; i < std::max(1, workers); ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (std::thread& t : workers_) t.join();
}

absl::Status Scheduler::Run(std::function<absl::Status()> step) {
  Task task;
  task.step = std::move(step);
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_) return absl::UnavailableError("the server is shutting down");
  if (!refusal_.ok()) return refusal_;
  queue_.push_back(&task);
  ready_.notify_one();
  task.finished.wait(lock, [&] { return task.done; });
  return task.result;
}

void Scheduler::Refuse(absl::Status status) {
  std::lock_guard<std::mutex> lock(mutex_);
  refusal_ = std::move(status);
}

int Scheduler::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(queue_.size());
}

void Scheduler::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    Task* task = queue_.front();
    queue_.pop_front();
    lock.unlock();
    absl::Status result = task->step();
    lock.lock();
    task->result = std::move(result);
    task->done = true;
    task->finished.notify_one();
  }
}

}  // namespace drt::server
