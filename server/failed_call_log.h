// One log line for each gRPC call that ends with a fault of the server
// (INTERNAL, DATA_LOSS, UNKNOWN): the method, the code and the message. The
// client that got the status was the only one to see it; an operator had
// only drt_errors_total{code} (review-newuser N5). Calls refused for their
// input or for load (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED,
// UNAVAILABLE, CANCELLED, ...) are the clients' business and stay out of
// the log.
//
// Installed as a gRPC server interceptor (MakeFailedCallLogInterceptor), so
// it sees every method's final status in one place, the OpenAI API's calls
// into the service included. The same interceptor writes the optional
// access log (--log_requests, below).
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace drt::server {

class FailedCallLog {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  using Sink = std::function<void(const std::string& line)>;

  // At most this many lines a window: a fault that hits every call (a full
  // disk under --state_dir) must not flood the log at the call rate.
  static constexpr int kMaxLinesPerWindow = 10;
  static constexpr std::chrono::seconds kWindow{60};
  // Longer messages are cut (with "..."): one line each.
  static constexpr size_t kMaxMessageBytes = 1000;

  FailedCallLog(Sink sink, Clock clock);

  // Whether a call ending with `code` is logged.
  static bool Logs(grpc::StatusCode code);

  // Logs the call when Logs(status) and the window has room; otherwise
  // counts it as suppressed, which the next logged line reports.
  // Thread-safe.
  void Record(const std::string& method, const grpc::Status& status);

 private:
  const Sink sink_;
  const Clock clock_;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point window_start_;  // guarded by mutex_
  int lines_in_window_ = 0;                              // guarded by mutex_
  int64_t suppressed_ = 0;                               // guarded by mutex_
};

// With drt-server --log_requests, one more line for every call as it ends,
// whatever its status (vLLM and llama.cpp's server log each request):
// `drt-server: call METHOD from PEER: CODE in SECONDS s`. Not rate-limited:
// the operator asked for every call. A call that ends with a fault gets
// both lines.
using AccessLogSink = std::function<void(const std::string& line)>;

// The interceptor factory for grpc::ServerBuilder::experimental()
// .SetInterceptorCreators. `log` must outlive the server; `access` empty:
// no access log. `clock` times each call (its creation to its status).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeFailedCallLogInterceptor(FailedCallLog* log, AccessLogSink access = {},
                             FailedCallLog::Clock clock = {});

}  // namespace drt::server
