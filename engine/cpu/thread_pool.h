// A fixed pool of worker threads for the CPU kernels. Idle workers block on a
// condition variable (no spinning), so an engine sharing the machine with
// other work — a server's I/O threads, other sessions — does not burn cores
// waiting. One ParallelFor runs at a time; concurrent callers take turns.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace drt::cpu {

class ThreadPool {
 public:
  // num_threads counts the calling thread: num_threads - 1 workers start.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) for every i in [0, n), spread over the pool and the caller;
  // returns when all calls have returned. fn must not call ParallelFor.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunTasks();

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one ParallelFor at a time

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  int active_workers_ = 0;
};

}  // namespace drt::cpu
