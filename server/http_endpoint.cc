#include "server/http_endpoint.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "server/deadline_http_server.h"

namespace drt::server {
namespace {

constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace

std::string RenderHttpMetrics(const DeadlineHttpServer& server) {
  return absl::StrCat(
      "# HELP drt_http_connections_expired_total HTTP connections closed unserved: their "
      "deadline (counted from accept) passed while they waited for a serving thread.\n"
      "# TYPE drt_http_connections_expired_total counter\n"
      "drt_http_connections_expired_total ",
      server.connections_expired_in_queue(), "\n",
      "# HELP drt_http_connections_rejected_total HTTP connections closed at accept, unserved: "
      "as many were already waiting for a serving thread as may wait.\n"
      "# TYPE drt_http_connections_rejected_total counter\n"
      "drt_http_connections_rejected_total ",
      server.connections_rejected(), "\n");
}

HttpEndpoint::HttpEndpoint(const Metrics& metrics, HttpEndpointOptions options)
    : metrics_(metrics), options_(options) {}

HttpEndpoint::~HttpEndpoint() { Stop(); }

absl::Status HttpEndpoint::Start(const std::string& host, int port) {
  if (server_ != nullptr) return absl::FailedPreconditionError("HTTP endpoint already started");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("HTTP port out of range: ", port));
  }
  auto server = std::make_unique<DeadlineHttpServer>(
      DeadlineHttpOptions{options_.request_deadline, options_.max_connections,
                          options_.max_waiting_connections});
  // httplib's default sets SO_REUSEPORT, which lets a second server share a
  // busy port silently; SO_REUSEADDR alone still allows a quick restart.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->Get("/metrics", [this, http = server.get()](const httplib::Request&,
                                                      httplib::Response& response) {
    response.set_content(metrics_.RenderPrometheus() + RenderHttpMetrics(*http),
                         kPrometheusContentType);
  });
  server->Get("/healthz", [this](const httplib::Request&, httplib::Response& response) {
    if (draining_.load()) {
      response.status = 503;
      response.set_content("draining", "text/plain");
    } else {
      response.set_content("ok", "text/plain");
    }
  });

  server->Get("/livez", [this](const httplib::Request&, httplib::Response& response) {
    const absl::Status live = options_.liveness ? options_.liveness() : absl::OkStatus();
    if (live.ok()) {
      response.set_content("ok", "text/plain");
    } else {
      response.status = 503;
      response.set_content(std::string(live.message()), "text/plain");
    }
  });

  int bound_port = port;
  if (port == 0) {
    bound_port = server->bind_to_any_port(host);
    if (bound_port < 0) bound_port = 0;
  } else if (!server->bind_to_port(host, port)) {
    bound_port = 0;
  }
  if (bound_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ", host, ":", port,
                                               " (address in use or not local?)"));
  }

  port_ = bound_port;
  server_ = std::move(server);
  // The socket is bound already, so connections made before the thread runs
  // wait in the listen backlog instead of being refused.
  serving_done_.store(false);
  thread_ = std::thread([this, server = server_.get()] {
    server->listen_after_bind();
    serving_done_.store(true);
  });
  return absl::OkStatus();
}

void HttpEndpoint::Stop() {
  if (server_ == nullptr) return;
  // httplib's stop() is a no-op until the accept loop runs; wait for the loop
  // so that a Stop() right after Start() is not lost.
  while (!server_->is_running() && !serving_done_.load()) std::this_thread::yield();
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
  port_ = 0;
}

}  // namespace drt::server
