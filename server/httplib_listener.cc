#include "server/httplib_listener.h"

#include <sys/socket.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace drt::server {

void UseReuseAddressOnly(httplib::Server& server) {
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

absl::StatusOr<int> BindHttpServer(httplib::Server& server, const std::string& host, int port,
                                   absl::string_view what) {
  int bound_port = port;
  if (port == 0) {
    bound_port = server.bind_to_any_port(host);
    if (bound_port < 0) bound_port = 0;
  } else if (!server.bind_to_port(host, port)) {
    bound_port = 0;
  }
  if (bound_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for ", what, " on ", host, ":", port,
                                               " (address in use or not local?)"));
  }
  return bound_port;
}

void HttpListenThread::Start(httplib::Server& server) {
  serving_done_.store(false);
  thread_ = std::thread([this, &server] {
    server.listen_after_bind();
    serving_done_.store(true);
  });
}

void HttpListenThread::WaitUntilLoopStarted(const httplib::Server& server) const {
  while (!server.is_running() && !serving_done_.load()) std::this_thread::yield();
}

void HttpListenThread::Join() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace drt::server
