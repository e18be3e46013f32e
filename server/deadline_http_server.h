// An httplib::Server that slow clients cannot starve.
//
// httplib's read timeout restarts with every byte received, so a client that
// sends one byte every few seconds keeps its connection, and the worker
// serving it, for hours; with a fixed pool a handful of such clients stop
// /healthz from answering. Here:
//  - each connection gets one total deadline, counted from when it was
//    accepted, for reading its request and writing the answer, after which
//    it is closed;
//  - connections are served by a pool that grows on demand to
//    max_connections threads, so slow clients do not hold up others until
//    that many are open at once (and then only until their deadlines pass);
//  - a connection that waited for a thread past its deadline is closed
//    unserved (counted: connections_expired_in_queue) at that deadline, with
//    a canned 503 "overloaded" when it can be written without blocking, so
//    a backlog of slow clients is gone within one deadline and a probe that
//    arrives after it is served with the time it has left;
//  - at most max_waiting connections wait; one accepted beyond that is
//    closed at once with the same 503 (counted: connections_rejected), so a connect flood
//    while every thread is held holds at most that many descriptors;
//  - one request per connection: an idle kept-alive connection would hold a
//    worker.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include <httplib.h>

namespace drt::server {

class ConnectionPool;  // server/connection_pool.h
struct ConnectionPoolCounters;

struct DeadlineHttpOptions {
  std::chrono::milliseconds request_deadline{5000};
  size_t max_connections = 64;
  size_t max_waiting = 0;  // 0: 4 x max_connections
  // How serving threads are started (tests inject failures); empty:
  // std::thread.
  std::function<std::thread(std::function<void()>)> start_thread;
};

class DeadlineHttpServer : public httplib::Server {
 public:
  explicit DeadlineHttpServer(DeadlineHttpOptions options);
  ~DeadlineHttpServer() override;

  // Connections closed without being served: their deadline passed while
  // they waited for a serving thread.
  int64_t connections_expired_in_queue() const;
  // Connections closed at accept without being served: max_waiting were
  // already waiting.
  int64_t connections_rejected() const;
  // Serving threads that could not be started (server/connection_pool.h).
  int64_t thread_start_failures() const;
  const ConnectionPoolCounters& counters() const { return *counters_; }

 private:
  // Overrides httplib's per-connection entry point (a private virtual that
  // httplib's accept loop calls for every accepted socket). The accept loop
  // calls it on its own thread, right after accept (new_task_queue runs it
  // inline): it notes the accept time and queues the socket for the pool.
  bool process_and_close_socket(socket_t sock) override;
  // On a pool thread: serves one request on `sock` until `deadline`, then
  // closes it.
  void Serve(socket_t sock, std::chrono::steady_clock::time_point deadline);

  DeadlineHttpOptions options_;
  std::unique_ptr<ConnectionPoolCounters> counters_;
  // Last: destroyed first, its destructor draining the pool while the
  // members and the base its threads use are still alive.
  std::unique_ptr<ConnectionPool> pool_;
};

}  // namespace drt::server
