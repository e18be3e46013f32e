// Accepted connections waiting for a serving thread, and the threads that
// serve them, for an httplib::Server whose accept loop only queues sockets
// (InlineAcceptQueue + process_and_close_socket calling Push). Shared by
// DeadlineHttpServer (server/deadline_http_server.h) and the OpenAI API's
// server (server/openai_http_server.h).
//  - a thread is started whenever a socket would otherwise wait, up to
//    max_threads; started threads stay for later sockets until Drain;
//  - each socket's deadline is its accept time + `deadline`; one whose
//    deadline passed while it waited is closed unserved (counted in
//    `expired`), by the next thread that comes free or the next accept;
//  - at most max_waiting wait (0: 4 x max_threads); one accepted beyond that
//    is closed at once (counted in `rejected`).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <unistd.h>

#include <httplib.h>

namespace drt::server {

// httplib's TaskQueue for the accept loop: runs each task at once on the
// accept thread (the task is process_and_close_socket, which only queues
// the socket with its accept time), and on shutdown drains the pool.
class InlineAcceptQueue : public httplib::TaskQueue {
 public:
  explicit InlineAcceptQueue(std::function<void()> on_shutdown)
      : on_shutdown_(std::move(on_shutdown)) {}
  void enqueue(std::function<void()> task) override { task(); }
  void shutdown() override { on_shutdown_(); }

 private:
  std::function<void()> on_shutdown_;
};

// The waiting sockets and the serving threads (this file's header comment).
class ConnectionPool {
 public:
  using Clock = std::chrono::steady_clock;
  using Serve = std::function<void(socket_t, Clock::time_point deadline)>;
  ConnectionPool(size_t max_threads, size_t max_waiting, std::chrono::milliseconds deadline,
                 Serve serve, std::atomic<int64_t>& expired, std::atomic<int64_t>& rejected)
      : max_threads_(max_threads > 0 ? max_threads : 1),
        max_waiting_(max_waiting > 0 ? max_waiting : 4 * max_threads_),
        deadline_(deadline),
        serve_(std::move(serve)),
        expired_(expired),
        rejected_(rejected) {}
  ~ConnectionPool() { Drain(); }

  // On the accept thread, in accept order (so waiting_ is in deadline
  // order, the earliest at the front).
  void Push(socket_t sock, Clock::time_point accepted) {
    std::lock_guard<std::mutex> lock(mutex_);
    // Expired ones go now, not when a thread comes free (which may be a
    // whole deadline away when slow clients hold them all).
    while (!waiting_.empty() && accepted >= waiting_.front().deadline) {
      ::close(waiting_.front().sock);
      waiting_.pop_front();
      expired_.fetch_add(1);
    }
    // (Sockets that idle threads are about to take do not count.)
    if (waiting_.size() >= max_waiting_ + idle_) {
      ::close(sock);
      rejected_.fetch_add(1);
      return;
    }
    waiting_.push_back({sock, accepted + deadline_});
    if (waiting_.size() > idle_ && threads_.size() < max_threads_) {
      threads_.emplace_back([this] { Work(); });
    }
    ready_.notify_one();
  }

  // Serves (or, past their deadlines, closes) the waiting sockets, then
  // joins every thread; the pool can take sockets again afterwards.
  void Drain() {
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
    stopping_ = false;
    idle_ = 0;
  }

 private:
  struct Waiting {
    socket_t sock;
    Clock::time_point deadline;  // accept time + the request deadline
  };

  void Work() {
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
        ::close(next.sock);
        expired_.fetch_add(1);
      } else {
        serve_(next.sock, next.deadline);
      }
      lock.lock();
    }
  }

  const size_t max_threads_;
  const size_t max_waiting_;
  const std::chrono::milliseconds deadline_;
  const Serve serve_;
  std::atomic<int64_t>& expired_;
  std::atomic<int64_t>& rejected_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Waiting> waiting_;
  std::vector<std::thread> threads_;  // grows until Drain joins them
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace drt::server
