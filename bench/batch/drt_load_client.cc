#include "bench/batch/drt_load_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace drt::bench {
namespace {

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return absl::OkStatus();
  // gRPC's and absl's status codes have the same numbers.
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

absl::StatusOr<std::unique_ptr<DrtLoadClient>> DrtLoadClient::Connect(
    const ClientOptions& options, double connect_timeout_seconds) {
  grpc::ChannelArguments args;
  // Channels with equal arguments share one connection through gRPC's global
  // subchannel pool; a local pool gives each client its own.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(-1);
  auto channel =
      grpc::CreateCustomChannel(options.server, grpc::InsecureChannelCredentials(), args);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(1000 * connect_timeout_seconds));
  if (!channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(absl::StrFormat("cannot reach drt-server at %s within %g s",
                                                  options.server, connect_timeout_seconds));
  }
  return std::unique_ptr<DrtLoadClient>(new DrtLoadClient(options, std::move(channel)));
}

DrtLoadClient::DrtLoadClient(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(drt::v1::Drt::NewStub(channel_)) {}

std::unique_ptr<grpc::ClientContext> DrtLoadClient::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!options_.bearer_token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options_.bearer_token);
  }
  context->set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(1000 * options_.call_timeout_seconds)));
  return context;
}

absl::StatusOr<drt::v1::ModelInfo> DrtLoadClient::GetModelInfo() {
  auto context = NewContext();
  drt::v1::ModelInfo info;
  if (auto s = FromGrpc(stub_->GetModelInfo(context.get(), {}, &info), "GetModelInfo"); !s.ok()) {
    return s;
  }
  return info;
}

absl::StatusOr<std::string> DrtLoadClient::CreateSession() {
  auto context = NewContext();
  drt::v1::CreateSessionResponse response;
  if (auto s = FromGrpc(stub_->CreateSession(context.get(), {}, &response), "CreateSession");
      !s.ok()) {
    return s;
  }
  return response.session_id();
}

absl::Status DrtLoadClient::DeleteSession(const std::string& id) {
  auto context = NewContext();
  drt::v1::DeleteSessionRequest request;
  request.set_session_id(id);
  drt::v1::DeleteSessionResponse response;
  return FromGrpc(stub_->DeleteSession(context.get(), request, &response),
                  absl::StrCat("DeleteSession ", id));
}

absl::StatusOr<drt::v1::SessionInfo> DrtLoadClient::GetSession(const std::string& id) {
  auto context = NewContext();
  drt::v1::GetSessionRequest request;
  request.set_session_id(id);
  drt::v1::SessionInfo info;
  if (auto s = FromGrpc(stub_->GetSession(context.get(), request, &info),
                        absl::StrCat("GetSession ", id));
      !s.ok()) {
    return s;
  }
  return info;
}

absl::StatusOr<drt::v1::AppendSummary> DrtLoadClient::Append(const std::string& id,
                                                             absl::Span<const int32_t> tokens,
                                                             int64_t piece_tokens) {
  auto context = NewContext();
  auto stream = stub_->Append(context.get());
  // Writes first, then reads: the server answers an Append with a few
  // progress messages only, which gRPC buffers while the client writes.
  drt::v1::AppendRequest request;
  request.set_session_id(id);
  for (size_t i = 0; i < tokens.size(); i += piece_tokens) {
    const size_t n = std::min<size_t>(piece_tokens, tokens.size() - i);
    request.mutable_tokens()->mutable_ids()->Assign(tokens.begin() + i, tokens.begin() + i + n);
    if (!stream->Write(request)) break;  // the server ended the call; Finish says why
  }
  stream->WritesDone();
  drt::v1::AppendResponse response;
  drt::v1::AppendSummary summary;
  bool summarised = false;
  while (stream->Read(&response)) {
    if (response.has_summary()) {
      summary = response.summary();
      summarised = true;
    }
  }
  const std::string what = absl::StrCat("Append to session ", id);
  if (auto s = FromGrpc(stream->Finish(), what); !s.ok()) return s;
  if (!summarised || summary.tokens_ingested() != static_cast<int64_t>(tokens.size())) {
    return absl::InternalError(absl::StrFormat("%s: sent %d tokens, the server ingested %d", what,
                                               tokens.size(), summary.tokens_ingested()));
  }
  return summary;
}

absl::StatusOr<GenerateRecord> DrtLoadClient::Generate(const std::string& id, int32_t max_tokens) {
  drt::v1::GenerateRequest request;
  request.set_session_id(id);
  request.set_max_tokens(max_tokens);
  request.mutable_sampling()->set_temperature(0);
  request.set_ignore_eos(true);
  request.set_pad_to_chunk_boundary(false);
  auto context = NewContext();
  GenerateRecord record;
  bool finished = false;
  record.start = Clock::now();
  auto stream = stub_->Generate(context.get(), request);
  drt::v1::GenerateResponse response;
  while (stream->Read(&response)) {
    const auto now = Clock::now();
    if (response.has_piece()) {
      const int64_t n = response.piece().token_ids_size();
      record.arrivals.push_back({SecondsBetween(record.start, now), n});
      record.tokens += n;
    } else if (response.has_done()) {
      record.done = response.done();
      finished = true;
    }
  }
  const grpc::Status status = stream->Finish();
  record.end = Clock::now();
  const std::string what = absl::StrCat("Generate on session ", id);
  if (auto s = FromGrpc(status, what); !s.ok()) return s;
  if (!finished) return absl::InternalError(absl::StrCat(what, ": the stream ended without done"));
  if (record.tokens != max_tokens || record.done.timings().generated_tokens() != max_tokens) {
    return absl::InternalError(absl::StrFormat(
        "%s: asked for %d tokens with ignore_eos, received %d, the server reports %d (finish "
        "reason %s)",
        what, max_tokens, record.tokens, record.done.timings().generated_tokens(),
        drt::v1::FinishReason_Name(record.done.finish_reason())));
  }
  return record;
}

}  // namespace drt::bench
