// Binding an httplib server and running its accept loop on a thread of its
// own: the part the probe endpoint (http_endpoint.cc) and the OpenAI HTTP API
// (openai_http_server.cc) share.
#pragma once

#include <atomic>
#include <string>
#include <thread>

#include <httplib.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace drt::server {

// Sets SO_REUSEADDR alone on the server's listening socket. httplib's default
// also sets SO_REUSEPORT, which lets a second server share a busy port
// silently; SO_REUSEADDR alone still allows a quick restart.
void UseReuseAddressOnly(httplib::Server& server);

// Binds `server` to host:port (port 0: any free port) and returns the bound
// port, or UNAVAILABLE "cannot listen for <what> on host:port (...)".
absl::StatusOr<int> BindHttpServer(httplib::Server& server, const std::string& host, int port,
                                   absl::string_view what);

// The thread running a bound server's accept loop.
class HttpListenThread {
 public:
  ~HttpListenThread() { Join(); }

  // Runs server.listen_after_bind() on a new thread. The socket is bound
  // already, so connections made before the thread runs wait in the listen
  // backlog instead of being refused.
  void Start(httplib::Server& server);
  // Waits until the accept loop runs or has returned: httplib's stop() is a
  // no-op before the loop runs, so a Stop() right after Start() would be lost.
  void WaitUntilLoopStarted(const httplib::Server& server) const;
  void Join();

 private:
  std::thread thread_;
  std::atomic<bool> serving_done_{false};  // the serving thread has returned
};

}  // namespace drt::server
