#include "engine/cpu/thread_pool.h"

#include <algorithm>

namespace drt::cpu {

ThreadPool::ThreadPool(int num_threads, int64_t min_parallel_macs)
    : min_parallel_macs_(min_parallel_macs) {
  const int workers = std::max(1, num_threads) - 1;
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunTasks() {
  for (int64_t i = next_task_.fetch_add(1); i < num_tasks_; i = next_task_.fetch_add(1)) {
    (*fn_)(i);
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      // A worker woken after the caller closed the call (it ran out of tasks
      // first) has nothing to do: it goes back to waiting without touching
      // fn_, which may be gone.
      if (!open_) continue;
      ++joined_workers_;
    }
    RunTasks();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--joined_workers_ == 0 && !open_) work_done_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  dispatches_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    num_tasks_ = n;
    next_task_.store(0);
    open_ = true;
    ++generation_;
  }
  work_ready_.notify_all();
  RunTasks();
  // Every task has been taken. Close the call so that workers not yet awake
  // stay out, then wait only for those that joined (each finishing the task
  // it took): the caller does not wait out a wake-up it no longer needs.
  std::unique_lock<std::mutex> lock(mutex_);
  open_ = false;
  work_done_.wait(lock, [&] { return joined_workers_ == 0; });
  fn_ = nullptr;
}

}  // namespace drt::cpu
