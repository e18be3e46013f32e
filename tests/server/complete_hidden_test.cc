// Complete's temporary session is the call's own: ListSessions does not show
// it and GetSession, DeleteSession, ForkSession and Generate do not find it
// (it still holds a slot of --max_sessions); a Complete without a prompt is
// refused in Complete's terms (review-api F8).
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "server/session_manager.h"
#include "tests/server/test_util/check_status.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/waiting.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

TEST_CASE("other calls cannot see or touch a Complete's temporary session", "[server][complete]") {
  InProcessServer server;
  auto& stub = server.stub();
  SessionManager& sessions = server.service().session_manager();
  const auto prompt = RandomTokens(200, 61);
  grpc::ClientContext context;
  SetDeadline(context, 60);
  auto stream = stub.Complete(&context);
  drt::v1::CompleteRequest first;
  first.mutable_generate()->set_max_tokens(6);
  first.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.begin() + 100);
  REQUIRE(stream->Write(first));
  // The call is open (more prompt may come): its session exists.
  WaitFor([&] { return sessions.count() == 1; }, 10, "the Complete's session");
  const auto all = sessions.List(/*hidden_too=*/true);
  REQUIRE(all.size() == 1);
  const std::string id = all[0]->id();

  grpc::ClientContext list_context;
  drt::v1::ListSessionsResponse list;
  REQUIRE(stub.ListSessions(&list_context, {}, &list).ok());
  CHECK(list.sessions_size() == 0);
  CHECK(GetSession(stub, id).status.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(DeleteSession(stub, id).error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(ForkSession(stub, id).status.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(GenerateGreedy(stub, id, 2).status.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(sessions.count() == 1);  // still there

  // The Complete is unharmed.
  drt::v1::CompleteRequest rest;
  rest.mutable_tokens()->mutable_ids()->Add(prompt.begin() + 100, prompt.end());
  REQUIRE(stream->Write(rest));
  stream->WritesDone();
  std::vector<int32_t> tokens;
  std::optional<drt::v1::GenerateDone> done;
  drt::v1::GenerateResponse response;
  while (stream->Read(&response)) {
    for (int32_t t : response.piece().token_ids()) tokens.push_back(t);
    if (response.has_done()) done = response.done();
  }
  grpc::Status status = stream->Finish();
  INFO(status.error_message());
  REQUIRE(status.ok());
  CHECK(tokens == EngineGreedy(prompt, 6));
  CHECK(sessions.count() == 0);
  // Its done names no session: none a client could use (review-grpc
  // finding 11; it named the temporary one before).
  REQUIRE(done.has_value());
  CHECK(done->session_id().empty());
  CHECK(done->session_tokens() == 206);
}

TEST_CASE("a Complete without a prompt is refused in Complete's terms", "[server][complete]") {
  InProcessServer server;
  grpc::ClientContext context;
  SetDeadline(context, 30);
  auto stream = server.stub().Complete(&context);
  drt::v1::CompleteRequest first;
  first.mutable_generate()->set_max_tokens(4);
  REQUIRE(stream->Write(first));
  stream->WritesDone();
  drt::v1::GenerateResponse response;
  while (stream->Read(&response)) {
  }
  grpc::Status status = stream->Finish();
  CHECK_STATUS(status, grpc::StatusCode::INVALID_ARGUMENT,
               "Complete needs a prompt: its messages brought no tokens");
  CHECK_THAT(status.error_message(), !Contains("s-"));  // no id the caller never saw
}

}  // namespace
}  // namespace drt::server
