#include "server/http_endpoint.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "server/connection_pool.h"
#include "server/deadline_http_server.h"
#include "server/httplib_listener.h"

namespace drt::server {
namespace {

constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace

std::string RenderHttpMetrics(const DeadlineHttpServer& server) {
  return RenderConnectionPoolMetrics("drt_http", "HTTP connections", server.counters());
}

HttpEndpoint::HttpEndpoint(const Metrics& metrics, HttpEndpointOptions options)
    : metrics_(metrics), options_(options) {}

HttpEndpoint::~HttpEndpoint() { Stop(); }

void HttpEndpoint::SetStarting(std::string what) {
  absl::MutexLock lock(&starting_mutex_);
  starting_ = std::move(what);
}

std::string HttpEndpoint::starting() const {
  absl::MutexLock lock(&starting_mutex_);
  return starting_;
}

void AnswerReadiness(bool draining, httplib::Response& response) {
  if (draining) {
    response.status = 503;
    response.set_content("draining", "text/plain");
  } else {
    response.set_content("ok", "text/plain");
  }
}

absl::Status HttpEndpoint::Start(const std::string& host, int port) {
  if (server_ != nullptr) return absl::FailedPreconditionError("HTTP endpoint already started");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("HTTP port out of range: ", port));
  }
  auto server = std::make_unique<DeadlineHttpServer>(
      DeadlineHttpOptions{options_.request_deadline, options_.max_connections,
                          options_.max_waiting_connections, {}});
  UseReuseAddressOnly(*server);
  server->Get("/metrics", [this, http = server.get()](const httplib::Request&,
                                                      httplib::Response& response) {
    response.set_content(metrics_.RenderPrometheus() + RenderHttpMetrics(*http) +
                             (options_.more_metrics ? options_.more_metrics() : std::string()),
                         kPrometheusContentType);
  });
  // /readyz is /healthz under the name Kubernetes' own components use.
  const auto readiness = [this](const httplib::Request&, httplib::Response& response) {
    if (const std::string starting = this->starting(); !starting.empty() && !draining_.load()) {
      response.status = 503;
      response.set_content(starting, "text/plain");
      return;
    }
    AnswerReadiness(draining_.load(), response);
  };
  server->Get("/healthz", readiness);
  server->Get("/readyz", readiness);

  server->Get("/livez", [this](const httplib::Request&, httplib::Response& response) {
    const absl::Status live = options_.liveness ? options_.liveness() : absl::OkStatus();
    if (live.ok()) {
      const std::string starting = this->starting();
      response.set_content(starting.empty() ? "ok" : starting, "text/plain");
    } else {
      response.status = 503;
      response.set_content(std::string(live.message()), "text/plain");
    }
  });

  absl::StatusOr<int> bound_port = BindHttpServer(*server, host, port, "HTTP");
  if (!bound_port.ok()) return bound_port.status();

  port_ = *bound_port;
  server_ = std::move(server);
  listener_.Start(*server_);
  return absl::OkStatus();
}

void HttpEndpoint::Stop() {
  if (server_ == nullptr) return;
  listener_.WaitUntilLoopStarted(*server_);
  server_->stop();
  listener_.Join();
  server_.reset();
  port_ = 0;
}

}  // namespace drt::server
