// The prefill load of drt-batch-bench: one session's Append streaming up to
// a given number of random tokens on threads of its own, until it is
// stopped (the call is cancelled; the server keeps what it had processed)
// or has sent everything.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "bench/batch/drt_load_client.h"
#include "bench/batch/random_tokens.h"

namespace drt::bench {

class BackgroundAppend {
 public:
  // Starts streaming `total_tokens` ids (drawn from `range` with `seed`) in
  // messages of `piece_tokens` into session `id` through `client`, which
  // must outlive this object.
  BackgroundAppend(DrtLoadClient& client, std::string id, int64_t total_tokens,
                   int64_t piece_tokens, TokenRange range, uint64_t seed);
  // Stops if still running.
  ~BackgroundAppend();
  BackgroundAppend(const BackgroundAppend&) = delete;
  BackgroundAppend& operator=(const BackgroundAppend&) = delete;

  // True once the Append has ended by itself (all tokens ingested, or an
  // error) before Stop.
  bool ended() const { return ended_.load(); }

  // Cancels the call if it is still running and waits for its threads. The
  // Append's status: OK when it was cancelled here or completed, the
  // server's error otherwise.
  absl::Status Stop();

  const std::string& session_id() const { return id_; }

 private:
  void Write(int64_t total_tokens, int64_t piece_tokens, TokenRange range, uint64_t seed);
  void Read();

  std::string id_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<drt::v1::AppendRequest, drt::v1::AppendResponse>>
      stream_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> ended_{false};
  bool stopped_ = false;
  std::thread writer_, reader_;
};

}  // namespace drt::bench
