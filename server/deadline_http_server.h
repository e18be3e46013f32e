// An httplib::Server that slow clients cannot starve.
//
// httplib's read timeout restarts with every byte received, so a client that
// sends one byte every few seconds keeps its connection, and the worker
// serving it, for hours; with a fixed pool a handful of such clients stop
// /healthz from answering. Here:
//  - each connection gets one total deadline for reading its request and
//    writing the answer, after which it is closed;
//  - connections are served by a pool that grows on demand to
//    max_connections threads, so slow clients do not hold up others until
//    that many are open at once (and then only until their deadlines pass);
//  - one request per connection: an idle kept-alive connection would hold a
//    worker.
#pragma once

#include <chrono>
#include <cstddef>

#include <httplib.h>

namespace drt::server {

struct DeadlineHttpOptions {
  std::chrono::milliseconds request_deadline{5000};
  size_t max_connections = 64;
};

class DeadlineHttpServer : public httplib::Server {
 public:
  explicit DeadlineHttpServer(DeadlineHttpOptions options);

 private:
  // Overrides httplib's per-connection entry point (a private virtual that
  // httplib's accept loop calls for every accepted socket).
  bool process_and_close_socket(socket_t sock) override;

  DeadlineHttpOptions options_;
};

}  // namespace drt::server
