#include "server/connection_pool.h"

#include <unistd.h>

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"

namespace drt::server {

std::thread StartStdThread(std::function<void()> run) { return std::thread(std::move(run)); }

std::string RenderConnectionPoolMetrics(absl::string_view prefix, absl::string_view what,
                                        const ConnectionPoolCounters& counters) {
  return absl::StrCat(
      "# HELP ", prefix, "_connections_expired_total ", what,
      " closed unserved: their deadline (counted from accept) passed while they waited for a "
      "serving thread.\n"
      "# TYPE ", prefix, "_connections_expired_total counter\n",
      prefix, "_connections_expired_total ", counters.expired.load(), "\n",
      "# HELP ", prefix, "_connections_rejected_total ", what,
      " closed at accept, unserved: as many were already waiting for a serving thread as may "
      "wait, or no serving thread could be started.\n"
      "# TYPE ", prefix, "_connections_rejected_total counter\n",
      prefix, "_connections_rejected_total ", counters.rejected.load(), "\n",
      "# HELP ", prefix, "_thread_start_failures_total Serving threads for ", what,
      " that could not be started (a pids or memory limit); the connection waited for the "
      "threads that exist, or was rejected when there were none.\n"
      "# TYPE ", prefix, "_thread_start_failures_total counter\n",
      prefix, "_thread_start_failures_total ", counters.thread_start_failures.load(), "\n");
}

ConnectionPool::ConnectionPool(ConnectionPoolOptions options, Serve serve,
                               ConnectionPoolCounters& counters)
    : max_threads_(options.max_threads > 0 ? options.max_threads : 1),
      max_waiting_(options.max_waiting > 0 ? options.max_waiting : 4 * max_threads_),
      deadline_(options.deadline),
      start_thread_(options.start_thread ? std::move(options.start_thread) : StartStdThread),
      serve_(std::move(serve)),
      counters_(counters) {}

void ConnectionPool::Push(socket_t sock, Clock::time_point accepted) {
  std::vector<socket_t> refused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Expired ones go now, not when a thread comes free (which may be a
    // whole deadline away when slow clients hold them all).
    while (!waiting_.empty() && accepted >= waiting_.front().deadline) {
      refused.push_back(waiting_.front().sock);
      waiting_.pop_front();
      counters_.expired.fetch_add(1);
    }
    // (Sockets that idle threads are about to take do not count.)
    if (waiting_.size() >= max_waiting_ + idle_) {
      refused.push_back(sock);
      counters_.rejected.fetch_add(1);
    } else {
      waiting_.push_back({sock, accepted + deadline_});
      if (waiting_.size() > idle_ && threads_.size() < max_threads_ && !StartWorkerLocked() &&
          threads_.empty()) {
        // No thread exists to serve it, ever: refuse it now.
        waiting_.pop_back();
        refused.push_back(sock);
        counters_.rejected.fetch_add(1);
      }
      ready_.notify_one();
    }
  }
  for (const socket_t s : refused) Refuse(s);
}

bool ConnectionPool::StartWorkerLocked() {
  try {
    threads_.reserve(threads_.size() + 1);  // so that the push_back cannot throw
    std::thread thread = start_thread_([this] { Work(); });
    if (!thread.joinable()) {
      counters_.thread_start_failures.fetch_add(1);
      return false;
    }
    threads_.push_back(std::move(thread));
    return true;
  } catch (const std::exception&) {  // std::system_error, std::bad_alloc
    counters_.thread_start_failures.fetch_add(1);
    return false;
  }
}

void ConnectionPool::Drain() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    threads.swap(threads_);
  }
  for (std::thread& thread : threads) thread.join();
  std::lock_guard<std::mutex> lock(mutex_);
  // (With no thread left, e.g. none could be started, what still waits is
  // closed here.)
  while (!waiting_.empty()) {
    Refuse(waiting_.front().sock);
    waiting_.pop_front();
  }
  stopping_ = false;
  idle_ = 0;
}

void ConnectionPool::Work() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    ++idle_;
    ready_.wait(lock, [this] { return !waiting_.empty() || stopping_; });
    --idle_;
    if (waiting_.empty()) return;  // stopping
    const Waiting next = waiting_.front();
    waiting_.pop_front();
    lock.unlock();
    if (Clock::now() >= next.deadline) {
      // Its time went by in the queue: serving it now could only overrun.
      Refuse(next.sock);
      counters_.expired.fetch_add(1);
    } else {
      serve_(next.sock, next.deadline);
    }
    lock.lock();
  }
}

void ConnectionPool::Refuse(socket_t sock) { ::close(sock); }

}  // namespace drt::server
