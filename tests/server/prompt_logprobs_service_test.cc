// AppendRequest.prompt_logprobs through the drt.v1 service: the scores of
// the appended tokens (PromptLogprobs events) against the engine's own
// scored Session::Append of the same tokens (engine/token_scores.h, checked
// there against a brute-force log-softmax), each event before the progress
// covering it, the summary's count and sum, and refusal by name.
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/session.h"
#include "server/prompt_logprobs.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

struct ScoredAppend {
  grpc::Status status;
  std::vector<drt::v1::PromptLogprobs> events;
  std::optional<drt::v1::AppendSummary> summary;
  bool progress_ahead_of_scores = false;
};

// Appends `messages` (token pieces) with prompt_logprobs = top.
ScoredAppend Append(drt::v1::Drt::Stub& stub, const std::string& id,
                    const std::vector<std::vector<int32_t>>& messages, int32_t top) {
  grpc::ClientContext context;
  auto stream = stub.Append(&context);
  for (size_t i = 0; i < messages.size(); ++i) {
    drt::v1::AppendRequest request;
    if (i == 0) {
      request.set_session_id(id);
      request.set_prompt_logprobs(top);
    }
    *request.mutable_tokens()->mutable_ids() = {messages[i].begin(), messages[i].end()};
    stream->Write(request);
  }
  stream->WritesDone();
  ScoredAppend out;
  int64_t scored_so_far = 0;
  drt::v1::AppendResponse response;
  while (stream->Read(&response)) {
    if (response.has_prompt_logprobs()) {
      CHECK(response.prompt_logprobs().first_token_index() == scored_so_far);
      scored_so_far += response.prompt_logprobs().token_ids_size();
      out.events.push_back(response.prompt_logprobs());
    } else if (response.has_progress()) {
      if (response.progress().tokens_ingested() > scored_so_far) out.progress_ahead_of_scores = true;
    } else if (response.has_summary()) {
      out.summary = response.summary();
    }
  }
  out.status = stream->Finish();
  return out;
}

TEST_CASE("Append with prompt_logprobs streams each token's score before its progress",
          "[server][score]") {
  InProcessServer server;
  const std::string id = NewSession(server.stub());
  const std::vector<int32_t> first = RandomTokens(700, 81), second = RandomTokens(1300, 82);
  std::vector<int32_t> all = first;
  all.insert(all.end(), second.begin(), second.end());

  // The reference: the engine's scores of the same tokens, in one append.
  auto session = Session::Create(*FixtureModel::Get().backend);
  REQUIRE(session.ok());
  AppendOptions options;
  options.score = true;
  options.score_top_logprobs = 3;
  auto want = (*session)->Append(all, options);
  REQUIRE(want.ok());

  const ScoredAppend got = Append(server.stub(), id, {first, second}, 3);
  INFO(got.status.error_message());
  REQUIRE(got.status.ok());
  CHECK_FALSE(got.progress_ahead_of_scores);
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<drt::v1::TokenTopLogprobs> tops;
  for (const auto& event : got.events) {
    ids.insert(ids.end(), event.token_ids().begin(), event.token_ids().end());
    logprobs.insert(logprobs.end(), event.logprobs().begin(), event.logprobs().end());
    tops.insert(tops.end(), event.top_logprobs().begin(), event.top_logprobs().end());
  }
  REQUIRE(ids == all);
  REQUIRE(logprobs.size() == all.size());
  REQUIRE(tops.size() == all.size());
  CHECK(std::isnan(logprobs[0]));  // the first token of an empty session
  CHECK(tops[0].alternatives().empty());
  for (size_t i = 1; i < all.size(); ++i) {
    INFO("token " << i);
    // Other step cuts than the engine's one append (tests/server/
    // scheduler_scores_test.cc measured 2.4e-5 at most): 1e-4.
    CHECK(logprobs[i] == Approx(want->scores[i].logprob).margin(1e-4));
    REQUIRE(tops[i].alternatives_size() == 3);
    CHECK(tops[i].alternatives(0).token_id() == want->scores[i].top[0].token);
  }
  REQUIRE(got.summary.has_value());
  CHECK(got.summary->scored_tokens() == static_cast<int64_t>(all.size()) - 1);
  CHECK(got.summary->logprob_sum() == Approx(want->logprob_sum).epsilon(1e-5));

  // A second Append scores its first token from the session's last logits.
  const std::vector<int32_t> more = RandomTokens(40, 83);
  AppendOptions more_options;
  more_options.score = true;
  auto want_more = (*session)->Append(more, more_options);
  REQUIRE(want_more.ok());
  const ScoredAppend next = Append(server.stub(), id, {more}, 0);
  REQUIRE(next.status.ok());
  REQUIRE(next.events.size() >= 1);
  CHECK(next.events[0].top_logprobs().empty());  // prompt_logprobs 0: no alternatives
  CHECK_FALSE(std::isnan(next.events[0].logprobs(0)));
  CHECK(next.events[0].logprobs(0) == Approx(want_more->scores[0].logprob).margin(1e-4));
  CHECK(next.summary->scored_tokens() == 40);
}

TEST_CASE("Append refuses prompt_logprobs outside [0, 20] by name, appending nothing",
          "[server][score]") {
  InProcessServer server;
  const std::string id = NewSession(server.stub());
  for (int32_t top : {-1, 21}) {
    const ScoredAppend got = Append(server.stub(), id, {RandomTokens(50, 84)}, top);
    CHECK(got.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(got.status.error_message(), Contains("prompt_logprobs"));
  }
  grpc::ClientContext context;
  drt::v1::GetSessionRequest request;
  request.set_session_id(id);
  drt::v1::SessionInfo info;
  REQUIRE(server.stub().GetSession(&context, request, &info).ok());
  CHECK(info.tokens() == 0);
}

TEST_CASE("a scored Append read late: every event within the bound, all scored in order",
          "[server][score]") {
  // A client that reads nothing until the engine has run well ahead: its
  // handler blocks writing, the scores made meanwhile reach it as one batch
  // (at most SchedulerOptions::max_undelivered_scores plus a step), which
  // must go out as events of at most kMaxPromptLogprobsEventTokens tokens.
  // Before the split a batch was one event: over 4 MiB at top 20 past about
  // 15K tokens (RESOURCE_EXHAUSTED on the client).
  ServiceOptions options = SmallOptions();
  options.step_tokens = 630;
  // The handler's first progress write blocks 2 s (as a write to a client
  // that does not read, which gRPC's buffering hides for a few MB): the
  // engine runs ahead meanwhile, and the next batch holds its scores.
  std::atomic<int> progress_calls{0};
  options.before_progress_for_test = [&] {
    if (progress_calls++ == 0) std::this_thread::sleep_for(std::chrono::seconds(2));
  };
  InProcessServer server(options);
  const std::string id = NewSession(server.stub());
  const std::vector<int32_t> tokens = RandomTokens(20000, 85);
  grpc::ClientContext context;
  auto stream = server.stub().Append(&context);
  drt::v1::AppendRequest request;
  request.set_session_id(id);
  request.set_prompt_logprobs(20);
  *request.mutable_tokens()->mutable_ids() = {tokens.begin(), tokens.end()};
  REQUIRE(stream->Write(request));
  stream->WritesDone();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  std::vector<int32_t> ids;
  size_t events = 0, largest_tokens = 0, largest_bytes = 0;
  drt::v1::AppendResponse response;
  std::optional<drt::v1::AppendSummary> summary;
  while (stream->Read(&response)) {
    if (response.has_summary()) summary = response.summary();
    if (!response.has_prompt_logprobs()) continue;
    const drt::v1::PromptLogprobs& event = response.prompt_logprobs();
    ++events;
    CHECK(event.first_token_index() == static_cast<int64_t>(ids.size()));
    ids.insert(ids.end(), event.token_ids().begin(), event.token_ids().end());
    largest_tokens = std::max<size_t>(largest_tokens, event.token_ids_size());
    largest_bytes = std::max(largest_bytes, response.ByteSizeLong());
  }
  const grpc::Status status = stream->Finish();
  INFO(status.error_message() << "; " << events << " events, largest " << largest_tokens
                              << " tokens, " << largest_bytes << " bytes");
  REQUIRE(status.ok());
  CHECK(ids == tokens);
  CHECK(largest_tokens <= 512);  // kMaxPromptLogprobsEventTokens
  // 335 B a token at most here (byte tokens, server/prompt_logprobs.h).
  CHECK(largest_bytes <= 512 * 335 + 64);
  REQUIRE(summary.has_value());
  CHECK(summary->scored_tokens() == static_cast<int64_t>(tokens.size()) - 1);
}

TEST_CASE("prompt_logprobs on a later Append message is refused by name, and that message is not "
          "appended, the earlier ones are",
          "[server][score]") {
  InProcessServer server;
  const std::string id = NewSession(server.stub());
  const std::vector<int32_t> first = RandomTokens(60, 86), second = RandomTokens(50, 87);
  grpc::ClientContext context;
  auto stream = server.stub().Append(&context);
  drt::v1::AppendRequest request;
  request.set_session_id(id);
  *request.mutable_tokens()->mutable_ids() = {first.begin(), first.end()};
  REQUIRE(stream->Write(request));
  request.Clear();
  request.set_prompt_logprobs(2);
  *request.mutable_tokens()->mutable_ids() = {second.begin(), second.end()};
  stream->Write(request);
  stream->WritesDone();
  drt::v1::AppendResponse response;
  bool scores_sent = false;
  while (stream->Read(&response)) scores_sent |= response.has_prompt_logprobs();
  const grpc::Status status = stream->Finish();
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(status.error_message(), Contains("message 1 sets prompt_logprobs"));
  CHECK_FALSE(scores_sent);
  grpc::ClientContext info_context;
  drt::v1::GetSessionRequest info_request;
  info_request.set_session_id(id);
  drt::v1::SessionInfo info;
  REQUIRE(server.stub().GetSession(&info_context, info_request, &info).ok());
  CHECK(info.tokens() == static_cast<int64_t>(first.size()));
}

}  // namespace
}  // namespace drt::server
