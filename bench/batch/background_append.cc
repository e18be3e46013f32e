#include "bench/batch/background_append.h"

#include <algorithm>
#include <vector>

namespace drt::bench {

BackgroundAppend::BackgroundAppend(DrtLoadClient& client, std::string id, int64_t total_tokens,
                                   int64_t piece_tokens, TokenRange range, uint64_t seed)
    : id_(std::move(id)), context_(client.NewContext()) {
  stream_ = client.stub().Append(context_.get());
  // gRPC's synchronous streams allow one writer and one reader at a time.
  writer_ = std::thread([=, this] { Write(total_tokens, piece_tokens, range, seed); });
  reader_ = std::thread([this] { Read(); });
}

BackgroundAppend::~BackgroundAppend() { Stop().IgnoreError(); }

void BackgroundAppend::Write(int64_t total_tokens, int64_t piece_tokens, TokenRange range,
                             uint64_t seed) {
  drt::v1::AppendRequest request;
  request.set_session_id(id_);
  for (int64_t sent = 0; sent < total_tokens && !stopping_.load(); sent += piece_tokens) {
    // Drawn piece by piece: a million-token load needs no million-token buffer.
    const std::vector<int32_t> piece =
        RandomTokens(std::min(piece_tokens, total_tokens - sent), range, seed + sent);
    request.mutable_tokens()->mutable_ids()->Assign(piece.begin(), piece.end());
    if (!stream_->Write(request)) return;  // ended or cancelled; the reader gets the status
  }
  if (!stopping_.load()) stream_->WritesDone();
}

void BackgroundAppend::Read() {
  drt::v1::AppendResponse response;
  while (stream_->Read(&response)) {
  }
  // The server has ended the call: by itself unless Stop cancelled it.
  ended_.store(!stopping_.load());
}

absl::Status BackgroundAppend::Stop() {
  if (stopped_) return absl::OkStatus();
  stopped_ = true;
  stopping_.store(true);
  context_->TryCancel();
  writer_.join();
  reader_.join();
  // Finish after both threads: gRPC wants no Read or Write running beside it.
  const grpc::Status status = stream_->Finish();
  if (status.error_code() == grpc::StatusCode::CANCELLED && !ended_.load()) {
    return absl::OkStatus();
  }
  return FromGrpc(status, "Append (load) to session " + id_);
}

}  // namespace drt::bench
