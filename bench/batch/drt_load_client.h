// One simulated user of drt-server for drt-batch-bench: its own gRPC
// connection, and the calls the benchmark makes (sessions, a token Append,
// a greedy Generate timed per piece). Errors come back as absl::Status
// naming the call and the session.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bench/batch/latency_stats.h"
#include "drt/v1/drt.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace drt::bench {

using Clock = std::chrono::steady_clock;

struct ClientOptions {
  std::string server;        // host:port
  std::string bearer_token;  // empty: none
  double call_timeout_seconds = 3600;
};

// What one Generate streamed back, timed on the client.
struct GenerateRecord {
  Clock::time_point start;  // just before the call was made
  Clock::time_point end;    // when the stream finished
  std::vector<PieceArrival> arrivals;
  int64_t tokens = 0;  // token ids received
  drt::v1::GenerateDone done;
};

absl::Status FromGrpc(const grpc::Status& status, const std::string& what);

class DrtLoadClient {
 public:
  // A client with a connection of its own (not shared with other clients of
  // this process, as separate users' would not be); UNAVAILABLE when the
  // server is not reachable within `connect_timeout_seconds`.
  static absl::StatusOr<std::unique_ptr<DrtLoadClient>> Connect(const ClientOptions& options,
                                                               double connect_timeout_seconds);

  absl::StatusOr<drt::v1::ModelInfo> GetModelInfo();
  absl::StatusOr<std::string> CreateSession();
  absl::Status DeleteSession(const std::string& id);
  absl::StatusOr<drt::v1::SessionInfo> GetSession(const std::string& id);

  // Streams `tokens` in messages of `piece_tokens` ids and waits for the
  // summary.
  absl::StatusOr<drt::v1::AppendSummary> Append(const std::string& id,
                                                absl::Span<const int32_t> tokens,
                                                int64_t piece_tokens);

  // Generates exactly `max_tokens` tokens, greedy, ignoring end-of-text and
  // without padding to the chunk boundary (padding is prefill work; this
  // measures decode). A stream that ends early, or a server that reports a
  // different count than the client received, is an error.
  absl::StatusOr<GenerateRecord> Generate(const std::string& id, int32_t max_tokens);

  drt::v1::Drt::Stub& stub() { return *stub_; }
  // A context with the bearer token and the call deadline.
  std::unique_ptr<grpc::ClientContext> NewContext() const;

 private:
  DrtLoadClient(ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<drt::v1::Drt::Stub> stub_;
};

}  // namespace drt::bench
