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

// Ops with fewer multiply-adds than this run their tasks one after another on
// the calling thread (engine/cpu/kernels.cc, where the number is derived from
// a measurement): waking the workers costs more than splitting such an op
// saves.
inline constexpr int64_t kDefaultMinParallelMacs = int64_t{1} << 17;

class ThreadPool {
 public:
  // num_threads counts the calling thread: num_threads - 1 workers start.
  // min_parallel_macs: see kDefaultMinParallelMacs (0: every op splits;
  // tests use 0 and INT64_MAX to compare the two ways).
  explicit ThreadPool(int num_threads, int64_t min_parallel_macs = kDefaultMinParallelMacs);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  int64_t min_parallel_macs() const { return min_parallel_macs_; }

  // Calls fn(i) for every i in [0, n), spread over the pool and the caller;
  // returns when all calls have returned. fn must not call ParallelFor.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

  // How many ParallelFor calls so far woke the workers (n >= 2 and a pool of
  // two or more threads); the calls that ran on the caller alone do not count.
  // For measurements and tests of which ops split their work.
  int64_t dispatches() const { return dispatches_.load(std::memory_order_relaxed); }

 private:
  void WorkerLoop();
  void RunTasks();

  const int64_t min_parallel_macs_;
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
  std::atomic<int64_t> dispatches_{0};
};

}  // namespace drt::cpu
