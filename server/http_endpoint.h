// The plain-HTTP side of the server: GET /metrics (Prometheus text),
// GET /healthz and /readyz (the same: 200 "ok", 503 "draining", and 503 with
// SetStarting's word until SetServing: readiness) and GET /livez (200 "ok",
// or SetStarting's word while starting; 503 with the reason when
// HttpEndpointOptions::liveness fails: a stuck engine,
// server/engine_watchdog.h, or a stalled restore, server/restore_progress.h),
// served on a thread of its own.
// Slow clients cannot keep probes from answering (server/deadline_http_server.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/httplib_listener.h"
#include "server/metrics.h"

namespace httplib {
class Server;
struct Response;
}

namespace drt::server {

class DeadlineHttpServer;

// The readiness probe's answer: 200 "ok", or 503 "draining" once the server
// drains. GET /healthz here, and GET /health on the OpenAI API's port
// (server/openai_http_server.h), where vLLM and llama.cpp's servers answer it.
void AnswerReadiness(bool draining, httplib::Response& response);

// The endpoint's own counters (drt_http_connections_expired_total,
// drt_http_connections_rejected_total) in the format of
// Metrics::RenderPrometheus; /metrics appends them.
std::string RenderHttpMetrics(const DeadlineHttpServer& server);

struct HttpEndpointOptions {
  // Time a connection has, from being accepted, to send its request and
  // receive the answer; then it is closed. A probe or a scrape needs
  // milliseconds.
  std::chrono::milliseconds request_deadline{5000};
  // Connections served at once; more wait for one to finish (or to reach its
  // deadline). A waiting connection's deadline runs from its accept: one
  // that passes it while waiting is closed unserved
  // (drt_http_connections_expired_total).
  size_t max_connections = 64;
  // Accepted connections that may wait for a serving thread; one accepted
  // beyond that is closed at once (drt_http_connections_rejected_total), so
  // a connect flood while every thread is held cannot pile up descriptors
  // (each waiting connection holds one). 0: 4 x max_connections.
  size_t max_waiting_connections = 0;
  // What /livez answers: OK -> 200 "ok", else 503 with the status's message.
  // Called on a serving thread for each request; empty: always 200. Draining
  // does not fail it (liveness must not cut a drain).
  std::function<absl::Status()> liveness;
  // More Prometheus text /metrics appends (drt-server: the OpenAI HTTP
  // API's connection counters); called on a serving thread for each
  // scrape. Empty: none.
  std::function<std::string()> more_metrics;
};

class HttpEndpoint {
 public:
  // metrics must outlive the endpoint.
  explicit HttpEndpoint(const Metrics& metrics, HttpEndpointOptions options = {});
  ~HttpEndpoint();  // Stop()s
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  // Binds host:port (port 0: any free port) and starts serving. Fails if the
  // address cannot be bound or the endpoint was already started.
  absl::Status Start(const std::string& host, int port);
  // The bound port once Start succeeded, else 0.
  int port() const { return port_; }

  // /healthz answers 503 "draining" from now on.
  void StartDraining() { draining_.store(true); }

  // Until SetServing: /healthz and /readyz answer 503 `what` (drt-server:
  // "restoring" during the --state_dir restore, "starting" until gRPC
  // listens), and /livez, when live, 200 `what`. A new endpoint serves.
  void SetStarting(std::string what);
  void SetServing() { SetStarting(""); }

  // Stops serving and joins the thread. Safe to call more than once.
  void Stop();

 private:
  const Metrics& metrics_;
  HttpEndpointOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::atomic<bool> draining_{false};
  // SetStarting's word; empty: serving.
  std::string starting() const;
  mutable absl::Mutex starting_mutex_;
  std::string starting_ ABSL_GUARDED_BY(starting_mutex_);
  HttpListenThread listener_;
  int port_ = 0;
};

}  // namespace drt::server
