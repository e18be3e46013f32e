// CompleteRequest.prompt_logprobs and prompt_only: the prompt's scores
// (GenerateResponse.prompt_logprobs events) against those a scored gRPC
// Append of the same tokens gives (itself checked against the engine in
// prompt_logprobs_service_test.cc), all before the first piece and once
// whatever n; prompt_only generates nothing and leaves no session; refusal
// by name.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "server/session_manager.h"
#include "tests/server/test_util/append_scores.h"
#include "tests/server/test_util/check_status.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

struct Scores {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<drt::v1::TokenTopLogprobs> tops;
  void Add(const drt::v1::PromptLogprobs& event) {
    CHECK(event.first_token_index() == static_cast<int64_t>(ids.size()));
    ids.insert(ids.end(), event.token_ids().begin(), event.token_ids().end());
    logprobs.insert(logprobs.end(), event.logprobs().begin(), event.logprobs().end());
    tops.insert(tops.end(), event.top_logprobs().begin(), event.top_logprobs().end());
  }
};

// The reference: a scored Append of `prompt` into a new session.
Scores AppendScores(drt::v1::Drt::Stub& stub, const std::vector<int32_t>& prompt, int32_t top) {
  Scores out;
  for (const drt::v1::PromptLogprobs& event : AppendScoreEvents(stub, prompt, top)) out.Add(event);
  return out;
}

struct Completed {
  grpc::Status status;
  Scores scores;
  bool scores_after_piece = false;
  int events = 0;                                // prompt_logprobs events
  std::map<int32_t, std::vector<int32_t>> tokens;  // by choice
  std::map<int32_t, drt::v1::GenerateDone> done;   // by choice
};

// A Complete of `prompt` in two messages; `configure` sets the first's options.
template <typename Configure>
Completed Complete(drt::v1::Drt::Stub& stub, const std::vector<int32_t>& prompt,
                   Configure configure) {
  grpc::ClientContext context;
  SetDeadline(context, 120);
  auto stream = stub.Complete(&context);
  drt::v1::CompleteRequest first;
  configure(first);
  const size_t half = prompt.size() / 2;
  first.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.begin() + half);
  stream->Write(first);
  drt::v1::CompleteRequest rest;
  rest.mutable_tokens()->mutable_ids()->Add(prompt.begin() + half, prompt.end());
  stream->Write(rest);
  stream->WritesDone();
  Completed out;
  bool piece_seen = false;
  drt::v1::GenerateResponse response;
  while (stream->Read(&response)) {
    if (response.has_prompt_logprobs()) {
      ++out.events;
      if (piece_seen) out.scores_after_piece = true;
      out.scores.Add(response.prompt_logprobs());
    } else if (response.has_piece()) {
      piece_seen = true;
      auto& ids = out.tokens[response.piece().choice()];
      ids.insert(ids.end(), response.piece().token_ids().begin(),
                 response.piece().token_ids().end());
    } else if (response.has_done()) {
      out.done[response.done().choice()] = response.done();
    }
  }
  out.status = stream->Finish();
  return out;
}

void CheckSameScores(const Scores& got, const Scores& want, size_t tokens, int32_t top) {
  REQUIRE(want.ids.size() == tokens);
  REQUIRE(got.ids == want.ids);
  REQUIRE(got.logprobs.size() == tokens);
  REQUIRE(got.tops.size() == (top > 0 ? tokens : 0));
  CHECK(std::isnan(got.logprobs[0]));  // the first token of the call's empty session
  for (size_t i = 1; i < tokens; ++i) {
    INFO("token " << i);
    // Other step cuts than the Append's (scheduler_scores_test.cc measured
    // 2.4e-5 at most between cuts): 1e-4, as prompt_logprobs_service_test.cc.
    CHECK(got.logprobs[i] == Approx(want.logprobs[i]).margin(1e-4));
    if (top > 0) {
      REQUIRE(got.tops[i].alternatives_size() == top);
      CHECK(got.tops[i].alternatives(0).token_id() == want.tops[i].alternatives(0).token_id());
    }
  }
}

TEST_CASE("Complete with prompt_logprobs sends the prompt's scores once, before any piece",
          "[server][score][complete]") {
  InProcessServer server;
  const std::vector<int32_t> prompt = RandomTokens(900, 91);
  const Scores want = AppendScores(server.stub(), prompt, 2);
  const Completed got = Complete(server.stub(), prompt, [](drt::v1::CompleteRequest& first) {
    first.mutable_generate()->set_max_tokens(5);
    first.set_n(2);
    first.set_prompt_logprobs(2);
  });
  INFO(got.status.error_message());
  REQUIRE(got.status.ok());
  CHECK_FALSE(got.scores_after_piece);
  CheckSameScores(got.scores, want, prompt.size(), 2);  // once: as many scores as tokens
  // The generation is unchanged by the scoring.
  const std::vector<int32_t> greedy = EngineGreedy(prompt, 5);
  REQUIRE(got.tokens.size() == 2);
  CHECK(got.tokens.at(0) == greedy);
  CHECK(got.tokens.at(1) == greedy);
  CHECK(got.done.size() == 2);
}

TEST_CASE("Complete with prompt_only scores the prompt, generates nothing, leaves no session",
          "[server][score][complete]") {
  InProcessServer server;
  SessionManager& sessions = server.service().session_manager();
  const std::vector<int32_t> prompt = RandomTokens(300, 92);
  const Scores want = AppendScores(server.stub(), prompt, 0);
  for (int32_t n : {1, 3}) {
    INFO("n " << n);
    const Completed got = Complete(server.stub(), prompt, [n](drt::v1::CompleteRequest& first) {
      first.set_n(n);
      first.set_prompt_logprobs(0);
      first.set_prompt_only(true);
    });
    INFO(got.status.error_message());
    REQUIRE(got.status.ok());
    CheckSameScores(got.scores, want, prompt.size(), 0);
    CHECK(got.tokens.empty());
    REQUIRE(got.done.size() == static_cast<size_t>(n));
    for (const auto& [choice, done] : got.done) {
      CHECK(done.finish_reason() == drt::v1::FINISH_REASON_LENGTH);
      CHECK(done.tokens_appended() == 0);
      CHECK(done.session_tokens() == static_cast<int64_t>(prompt.size()));
      CHECK(done.timings().prompt_tokens() == static_cast<int64_t>(prompt.size()));
      CHECK(done.timings().generated_tokens() == 0);
    }
    CHECK(sessions.count() == 0);
  }
  // Without prompt_logprobs: only the dones.
  const Completed plain = Complete(server.stub(), prompt, [](drt::v1::CompleteRequest& first) {
    first.set_prompt_only(true);
  });
  REQUIRE(plain.status.ok());
  CHECK(plain.events == 0);
  CHECK(plain.tokens.empty());
  CHECK(plain.done.size() == 1);
  CHECK(sessions.count() == 0);
}

TEST_CASE("Complete refuses prompt_logprobs outside [0, 20] by name, running nothing",
          "[server][score][complete]") {
  InProcessServer server;
  SessionManager& sessions = server.service().session_manager();
  for (int32_t top : {-1, 21}) {
    const Completed got =
        Complete(server.stub(), RandomTokens(40, 93), [top](drt::v1::CompleteRequest& first) {
          first.mutable_generate()->set_max_tokens(2);
          first.set_prompt_logprobs(top);
        });
    CHECK_STATUS(got.status, grpc::StatusCode::INVALID_ARGUMENT, "prompt_logprobs must be in [0, 20]");
    CHECK(got.events == 0);
    CHECK(got.tokens.empty());
    CHECK(sessions.count() == 0);
  }
}

}  // namespace
}  // namespace drt::server
