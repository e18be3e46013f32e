// drt-server's OpenAI-compatible HTTP API (--openai_listen; docs/api.md,
// "OpenAI-compatible HTTP API"): POST /v1/completions (streamed or not),
// GET /v1/models and vLLM's POST /tokenize and /detokenize, answered by
// calling the server's own drt.v1 service over an in-process gRPC channel
// (Complete, GetModelInfo, Tokenize, Detokenize), so its scheduling,
// limits, metrics and bearer-token check apply unchanged. The JSON lives in
// server/openai_api.h and server/openai_tokenize.h; this file is the HTTP
// wiring.
//
// Apart from the probe endpoint (server/http_endpoint.h), whose 5 s per
// connection suits probes and not long streams: here the request must
// arrive within `request_read_timeout` of the accept (its headers within
// `request_header_timeout`), the answer has no deadline (a write waits at
// most `write_timeout` for the client to read), and `threads` connections
// are served at once (a bounded number more wait for a thread).
// A client that closes its connection before the answer ends cancels the
// Complete call, so the engine stops working for it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "server/httplib_listener.h"

namespace grpc {
class Channel;
}

namespace drt::server {

struct ConnectionPoolCounters;  // server/connection_pool.h
class RequestBytesAdmission;    // server/request_bytes_admission.h
class OpenAiAuthRefusals;       // server/openai_auth_refusals.h

struct OpenAiHttpOptions {
  // The served model's name: what GetModelInfo reports, which a request's
  // `model` must equal when given.
  std::string model_name;
  // --bearer_token: when set, every request needs "Authorization: Bearer
  // <token>" and gets 401 before anything else is checked (the service
  // checks the forwarded header again).
  std::string bearer_token;
  // Connections served at once (one thread each, started as needed); more
  // wait in a queue (server/connection_pool.h). drt-server passes
  // --max_sessions + 4, at most 1024: a completion holds a session, so more
  // running at once would be refused anyway, and the 4 keep /v1/models and
  // refusals answering while every session is held.
  size_t threads = 68;
  // Connections that may wait for a thread (0: 4 x threads); one accepted
  // beyond that is closed at once.
  size_t max_waiting_connections = 0;
  // Request bodies above this get 413. A prompt of 1M bytes (or 1M token ids
  // as JSON, about 7 MB) fits with room. The parsed JSON takes up to ~33x
  // the body in memory (measured; nesting is capped at kMaxJsonDepth,
  // docs/api.md), so the bound also bounds that.
  // drt-server: --openai_max_request_bytes.
  size_t max_request_bytes = size_t{64} << 20;
  // Bytes of request bodies being parsed at once, at least
  // max_request_bytes (server/request_bytes_admission.h): a request whose
  // body, once read, does not fit beside those gets 503 with Retry-After
  // at once. drt-server:
  // --openai_max_inflight_request_bytes.
  size_t max_inflight_request_bytes = size_t{128} << 20;
  // Time from the accept until the request line and headers have arrived;
  // then the connection is closed. Short, so that silent or slow clients
  // hold the threads only briefly (a waiting connection whose time passed
  // is closed unserved).
  std::chrono::milliseconds request_header_timeout{10'000};
  // Time from the accept until the whole request (the body too) has
  // arrived; then the connection is closed (a client sending a byte at a
  // time, or stalling its body, cannot hold a thread longer). drt-server:
  // --openai_request_timeout_seconds (30 s). The header time is at most
  // this.
  std::chrono::milliseconds request_read_timeout{30'000};
  // How long one write of the answer may wait for the client to read; a
  // client that stops reading for longer is cut off and its call
  // cancelled. There is no limit on the answer as a whole.
  std::chrono::milliseconds write_timeout{60'000};
  // How serving threads are started (tests inject failures); empty:
  // std::thread.
  std::function<std::thread(std::function<void()>)> start_thread;
};

class OpenAiHttpServer {
 public:
  // `channel` reaches the drt.v1 service (grpc::Server::InProcessChannel).
  OpenAiHttpServer(std::shared_ptr<grpc::Channel> channel, OpenAiHttpOptions options);
  ~OpenAiHttpServer();  // Stop()s
  OpenAiHttpServer(const OpenAiHttpServer&) = delete;
  OpenAiHttpServer& operator=(const OpenAiHttpServer&) = delete;

  // Binds host:port (0: any free port) and serves on threads of its own.
  absl::Status Start(const std::string& host, int port);
  int port() const { return port_; }
  // The connection counters (drt_openai_connections_expired_total,
  // drt_openai_connections_rejected_total,
  // drt_openai_thread_start_failures_total, and
  // drt_openai_requests_overloaded_total: refused for the in-flight body
  // bytes, drt_openai_unauthenticated_total: the 401s) as Prometheus text, for the
  // probe endpoint's /metrics. Safe from any thread, before Start and after
  // Stop too.
  std::string RenderMetrics() const;
  // The bound on bodies parsed at once (--openai_max_inflight_request_bytes);
  // tests admit bytes in it to stand for parses under way.
  RequestBytesAdmission& request_bytes_admission() { return *admission_; }
  // Waits until every Complete call the API made has ended and its handler
  // has its status, or `deadline` passes; true when none is left. drt-server
  // waits for this after ending the running calls and before gRPC's
  // Shutdown, which would close the in-process transport under them (the
  // clients then read "Transport closed", not the service's message).
  bool WaitForCalls(std::chrono::steady_clock::time_point deadline);
  // GET /health answers 503 "draining" from now on (as the probe endpoint's
  // /healthz; new completions are refused by the service's drain).
  void StartDraining() { draining_->store(true); }
  // Stops accepting, waits for the running requests (whose gRPC calls end
  // when the gRPC server shuts down; a connection still sending its request
  // is given up within 100 ms, one not reading its answer within 1 s of a
  // write, while the end of an answer still reaches a client that reads)
  // and joins the threads. Idempotent.
  void Stop();

  class Server;  // the httplib server (in the .cc)

 private:
  std::shared_ptr<grpc::Channel> channel_;
  OpenAiHttpOptions options_;
  // Outlive the server (and its pool), so RenderMetrics can always read them.
  std::unique_ptr<ConnectionPoolCounters> counters_;
  std::unique_ptr<RequestBytesAdmission> admission_;  // options_.max_inflight_request_bytes
  std::unique_ptr<OpenAiAuthRefusals> auth_refusals_;  // the 401s
  // StartDraining's; outlives the server, which reads it.
  std::unique_ptr<std::atomic<bool>> draining_ = std::make_unique<std::atomic<bool>>(false);
  std::unique_ptr<Server> server_;
  HttpListenThread listener_;
  int port_ = 0;
};

}  // namespace drt::server
