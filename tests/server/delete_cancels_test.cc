// DeleteSession while an Append or a Generate runs on the session: the
// running call ends at its next engine step with ABORTED naming the
// deletion, and the engine session's memory is freed at once (or when the
// step running on it returns), not when the client ends its stream.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/waiting.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

std::vector<drt::v1::SessionInfo> ListSessions(drt::v1::Drt::Stub& stub) {
  grpc::ClientContext context;
  SetDeadline(context, 30);
  drt::v1::ListSessionsResponse response;
  if (!stub.ListSessions(&context, {}, &response).ok()) throw std::runtime_error("ListSessions");
  return {response.sessions().begin(), response.sessions().end()};
}

TEST_CASE("DeleteSession ends a running Generate at its next token", "[server][delete]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::string id = NewSession(stub);
  REQUIRE(AppendTokens(stub, id, RandomTokens(300, 1), {300}).status.ok());

  grpc::ClientContext context;
  // Without the fix the stream runs until this deadline (DEADLINE_EXCEEDED).
  SetDeadline(context, 15);
  drt::v1::GenerateRequest request = GreedyRequest(id, 1 << 20);
  request.set_ignore_eos(true);
  auto reader = stub.Generate(&context, request);
  drt::v1::GenerateResponse response;
  int received = 0;
  bool done_seen = false;
  Clock::time_point deleted_at;
  while (reader->Read(&response)) {
    if (response.has_done()) done_seen = true;
    received += response.piece().token_ids_size();
    if (received >= 10 && deleted_at == Clock::time_point()) {
      REQUIRE(DeleteSession(stub, id).ok());
      deleted_at = Clock::now();
    }
  }
  const grpc::Status status = reader->Finish();
  const double after_delete = SecondsSince(deleted_at);
  INFO("status " << status.error_code() << " '" << status.error_message() << "' "
                 << after_delete << " s after the delete, " << received << " tokens");
  REQUIRE(deleted_at != Clock::time_point());
  CHECK(status.error_code() == grpc::StatusCode::ABORTED);
  CHECK_THAT(status.error_message(),
             Contains("session " + id + " was deleted while a Generate was running on it"));
  CHECK_FALSE(done_seen);
  // Tokens already in flight may still arrive; the engine stops at once.
  CHECK(after_delete < 5.0);
  CHECK(GetSession(stub, id).status.error_code() == grpc::StatusCode::NOT_FOUND);
  // The server keeps serving.
  const std::string other = NewSession(stub);
  REQUIRE(AppendTokens(stub, other, RandomTokens(70, 2), {70}).status.ok());
  CHECK(GenerateGreedy(stub, other, 4).tokens.size() == 4);
}

TEST_CASE("DeleteSession ends a running Append at its next message", "[server][delete]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::string id = NewSession(stub);
  const auto tokens = RandomTokens(4000, 3);

  grpc::ClientContext context;
  SetDeadline(context, 60);
  auto stream = stub.Append(&context);
  REQUIRE(stream->Write(TokensMessage(id, tokens.data(), 2000)));
  // The progress message sent after message 0 is ingested.
  drt::v1::AppendResponse response;
  int64_t ingested = 0;
  while (ingested < 2000 && stream->Read(&response)) {
    if (response.has_progress()) ingested = response.progress().tokens_ingested();
  }
  REQUIRE(ingested == 2000);
  REQUIRE(DeleteSession(stub, id).ok());
  CHECK(ListSessions(stub).empty());

  stream->Write(TokensMessage(id, tokens.data() + 2000, 2000));
  stream->WritesDone();
  bool summary_seen = false;
  while (stream->Read(&response)) summary_seen = summary_seen || response.has_summary();
  const grpc::Status status = stream->Finish();
  INFO("status " << status.error_code() << " '" << status.error_message() << "'");
  CHECK(status.error_code() == grpc::StatusCode::ABORTED);
  CHECK_THAT(status.error_message(),
             Contains("session " + id + " was deleted while an Append was running on it"));
  CHECK_FALSE(summary_seen);
  CHECK(GetSession(stub, id).status.error_code() == grpc::StatusCode::NOT_FOUND);
}

TEST_CASE("DeleteSession ends one large Append message within a step", "[server][delete]") {
  InProcessServer server;
  auto& stub = server.stub();
  const std::string id = NewSession(stub);
  // One message of 600,000 ids (1.2 MB on the wire): many engine steps.
  constexpr size_t kTotal = 600'000;
  const auto tokens = RandomTokens(kTotal, 4);

  grpc::ClientContext context;
  SetDeadline(context, 300);
  auto stream = stub.Append(&context);
  REQUIRE(stream->Write(TokensMessage(id, tokens.data(), kTotal)));
  stream->WritesDone();
  // Progress comes at most every 0.1 s while the message is ingested.
  drt::v1::AppendResponse response;
  int64_t at_delete = -1, last_seen = 0;
  bool summary_seen = false;
  Clock::time_point deleted_at;
  while (stream->Read(&response)) {
    summary_seen = summary_seen || response.has_summary();
    if (!response.has_progress()) continue;
    last_seen = response.progress().tokens_ingested();
    if (at_delete < 0) {
      at_delete = last_seen;
      REQUIRE(DeleteSession(stub, id).ok());
      deleted_at = Clock::now();
    }
  }
  const grpc::Status status = stream->Finish();
  const double after_delete = SecondsSince(deleted_at);
  INFO("status " << status.error_code() << " '" << status.error_message() << "'; progress "
                 << at_delete << " at the delete, " << last_seen << " last, ended "
                 << after_delete << " s after the delete");
  REQUIRE(at_delete >= 0);
  CHECK(at_delete < static_cast<int64_t>(kTotal));
  CHECK(status.error_code() == grpc::StatusCode::ABORTED);
  CHECK_THAT(status.error_message(), Contains("was deleted while an Append was running"));
  CHECK_FALSE(summary_seen);
  // At most the step running at the delete finished (4032 tokens a step).
  CHECK(last_seen <= at_delete + 2 * 4032);
}

}  // namespace
}  // namespace drt::server
