// Accepted connections waiting for a serving thread, and the threads that
// serve them, for an httplib::Server whose accept loop only queues sockets
// (InlineAcceptQueue + process_and_close_socket calling Push). Shared by
// DeadlineHttpServer (server/deadline_http_server.h) and the OpenAI API's
// server (server/openai_http_server.h).
//  - a thread is started whenever a socket would otherwise wait, up to
//    max_threads; started threads stay for later sockets until Drain;
//  - a thread that cannot be started (std::system_error from std::thread:
//    a pids limit, no memory) is counted in `thread_start_failures`; the
//    socket waits for the threads that exist, or, when there are none, is
//    refused at once (counted in `rejected`); nothing throws out of Push,
//    which runs on httplib's accept thread (an exception there would end
//    the process): a socket that cannot be queued for want of memory
//    (std::bad_alloc) is refused and counted in `rejected` too;
//  - each socket's deadline is its accept time + `deadline`; one whose
//    deadline passed while it waited is closed unserved (counted in
//    `expired`) at that deadline, by a reaper thread that waits for the
//    earliest one (started with the first socket; should it fail to start,
//    counted in `thread_start_failures` too and retried at the next Push
//    that leaves a socket waiting, the next accept or the next thread that
//    comes free closes it);
//  - at most max_waiting wait (0: 4 x max_threads); one accepted beyond that
//    is closed at once (counted in `rejected`);
//  - a socket closed unserved first gets `refusal` (a canned answer, e.g.
//    a 503 with Retry-After) when it can be written without blocking, and
//    what its client has sent so far is read and dropped, so that close()
//    sends a FIN, not a reset that could destroy the answer unread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "absl/strings/string_view.h"

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

// What a pool counts (it does not own them: the server exporting them keeps
// them, so they outlive the pool and read as 0 before it starts).
struct ConnectionPoolCounters {
  std::atomic<int64_t> expired{0};   // closed unserved: deadline passed while waiting
  std::atomic<int64_t> rejected{0};  // closed at accept unserved: queue full, no thread, no memory
  // A thread could not be started: a serving thread, or the reaper.
  std::atomic<int64_t> thread_start_failures{0};
};

// The counters as Prometheus text: <prefix>_connections_expired_total,
// <prefix>_connections_rejected_total and <prefix>_thread_start_failures_total,
// each with HELP naming `what` (e.g. "HTTP API connections").
std::string RenderConnectionPoolMetrics(absl::string_view prefix, absl::string_view what,
                                        const ConnectionPoolCounters& counters);

// Starts a thread running its argument, as std::thread's constructor does
// (and, like it, may throw std::system_error). Tests inject failures.
using StartThread = std::function<std::thread(std::function<void()>)>;
std::thread StartStdThread(std::function<void()> run);

struct ConnectionPoolOptions {
  size_t max_threads = 1;  // 0 counts as 1
  size_t max_waiting = 0;  // 0: 4 x max_threads
  std::chrono::milliseconds deadline{5000};
  StartThread start_thread = StartStdThread;
  // Written to a socket closed unserved (CannedResponse); "": none.
  std::string refusal;
};

// A whole HTTP/1.1 answer with `Connection: close`, and `Retry-After:
// <seconds>` when retry_after_seconds > 0, for ConnectionPoolOptions::refusal.
std::string CannedResponse(int status, absl::string_view reason, absl::string_view content_type,
                           absl::string_view body, int retry_after_seconds);

// The waiting sockets and the serving threads (this file's header comment).
class ConnectionPool {
 public:
  using Clock = std::chrono::steady_clock;
  using Serve = std::function<void(socket_t, Clock::time_point deadline)>;
  // `counters` must outlive the pool.
  ConnectionPool(ConnectionPoolOptions options, Serve serve, ConnectionPoolCounters& counters);
  ~ConnectionPool() { Drain(); }
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // On the accept thread, in accept order (so waiting_ is in deadline
  // order, the earliest at the front). Takes the socket: it is served or
  // closed.
  void Push(socket_t sock, Clock::time_point accepted);

  // Serves (or, past their deadlines, closes) the waiting sockets, then
  // joins every thread; the pool can take sockets again afterwards.
  void Drain();

 private:
  struct Waiting {
    socket_t sock;
    Clock::time_point deadline;  // accept time + the request deadline
  };

  void Work();
  // Closes expired waiting sockets at their deadlines, until stopping_.
  void Reap();
  // Starts a thread running `run` into `thread` (mutex_ held); false,
  // counted, when it cannot.
  bool StartLocked(std::function<void()> run, std::thread& thread);
  // Answers `refusal` if it can go at once, and closes a socket that is not
  // served.
  void Refuse(socket_t sock) const;

  const size_t max_threads_;
  const size_t max_waiting_;
  const std::chrono::milliseconds deadline_;
  const StartThread start_thread_;
  const std::string refusal_;
  const Serve serve_;
  ConnectionPoolCounters& counters_;
  std::mutex mutex_;
  std::condition_variable ready_;
  // The reaper's: a socket came to the front of an empty queue, or stopping.
  std::condition_variable front_changed_;
  std::thread reaper_;
  std::deque<Waiting> waiting_;
  std::vector<std::thread> threads_;  // grows until Drain joins them
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace drt::server
