// A Complete call's temporary session lives exactly as long as its call
// (review-server F4): idle between the prompt and the generation while the
// prompt's scores are written to a client slow to read them, it was
// expired by the idle reaper under a short --idle_ttl_seconds, and the
// call failed NOT_FOUND naming a session its client never saw.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "server/session_manager.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

TEST_CASE("the idle reaper never expires a Complete's temporary session", "[server][complete][expiry]") {
  SessionManager manager(*FixtureModel::Get().backend, SessionLimits{});
  SessionSettings settings;
  settings.idle_ttl_seconds = 1;
  auto hidden = manager.CreateEphemeral(settings);
  REQUIRE(hidden.ok());
  auto visible = manager.Create(settings);
  REQUIRE(visible.ok());
  // Both idle past their TTL of 1 s (the reaper looks every second).
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  manager.EvictIdle();
  CHECK(manager.count() == 1);  // the visible one expired
  CHECK_FALSE(manager.Find((*visible)->id()).ok());
  // The hidden one is still there for its call to use, and to delete.
  CHECK((*hidden)->Begin(Activity::kGenerating).ok());
  (*hidden)->End();
  CHECK(manager.Delete((*hidden)->id(), /*hidden_too=*/true).ok());
  CHECK(manager.count() == 0);
}

// The reviewer's scenario, shortened: --idle_ttl_seconds 1, a Complete with
// prompt_logprobs (top 20: the held scores fill the transport) and n = 2,
// and a client that sends its prompt and starts reading only after 4 s.
// The handler is blocked writing the scores meanwhile, the session idle.
TEST_CASE("a Complete whose client is slow to read its prompt scores outlives a short idle TTL",
          "[server][complete][expiry]") {
  ServiceOptions options = SmallOptions();
  options.idle_ttl_seconds = 1;
  InProcessServer server(options);
  const std::vector<int32_t> prompt = RandomTokens(20000, 95);
  grpc::ClientContext context;
  SetDeadline(context, 300);
  auto stream = server.stub().Complete(&context);
  drt::v1::CompleteRequest request;
  request.mutable_generate()->set_max_tokens(3);
  request.set_n(2);
  request.set_prompt_logprobs(20);
  request.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
  REQUIRE(stream->Write(request));
  REQUIRE(stream->WritesDone());
  std::this_thread::sleep_for(std::chrono::seconds(4));
  int64_t scored = 0;
  int done = 0;
  drt::v1::GenerateResponse response;
  while (stream->Read(&response)) {
    if (response.has_prompt_logprobs()) scored += response.prompt_logprobs().token_ids_size();
    if (response.has_done()) ++done;
  }
  const grpc::Status status = stream->Finish();
  INFO("Complete: " << status.error_code() << " " << status.error_message());
  CHECK(status.ok());
  CHECK(scored == static_cast<int64_t>(prompt.size()));
  CHECK(done == 2);
  CHECK(server.service().session_manager().count() == 0);  // gone with its call
}

}  // namespace
}  // namespace drt::server
