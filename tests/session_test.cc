// Session behaviour: input validation that changes nothing, generation,
// padding, early stop, fork.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_format.h"

#include "engine/backend.h"
#include "engine/session.h"
#include "tests/test_util/random_model.h"

namespace drt {
namespace {

using Catch::Matchers::Contains;

struct Fixture {
  ModelConfig config = testing::TinyConfig();
  ModelWeights weights = testing::RandomWeights(config, 21);
  std::unique_ptr<Backend> backend = MakeCpuBackend(config, weights);

  std::unique_ptr<Session> NewSession() {
    auto s = Session::Create(*backend);
    REQUIRE(s.ok());
    return *std::move(s);
  }
};

// Generation never emits the engine's own ids (pad, landmark).
int32_t Argmax(absl::Span<const float> v, const ModelConfig& config) {
  int32_t best = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(v.size()); ++i) {
    if (i == config.pad_id || i == config.chunk_id) continue;
    if (best < 0 || v[i] > v[best]) best = i;
  }
  return best;
}

TEST_CASE("bad tokens are rejected with a clear message and change nothing", "[session]") {
  Fixture f;
  auto session = f.NewSession();
  const auto prompt = testing::RandomTokens(f.config, 30, 1);
  REQUIRE((*session).Append(prompt).ok());
  const std::vector<float> logits_before(session->last_logits().begin(), session->last_logits().end());
  const int64_t chunks_before = session->num_chunks();

  struct Case {
    std::vector<int32_t> tokens;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{5, static_cast<int32_t>(f.config.vocab_size)}, "outside the vocabulary"},
      {{5, -1}, "outside the vocabulary"},
      {{5, 6, static_cast<int32_t>(f.config.chunk_id)}, "landmark id"},
      {{static_cast<int32_t>(f.config.pad_id)}, "pad id"},
  };
  for (const Case& c : cases) {
    auto result = session->Append(c.tokens);
    REQUIRE_FALSE(result.ok());
    REQUIRE(result.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(result.status().message()), Contains(c.message));
    REQUIRE(session->num_tokens() == 30);
    REQUIRE(session->num_chunks() == chunks_before);
    REQUIRE(std::equal(logits_before.begin(), logits_before.end(), session->last_logits().begin()));
  }
  // The session is still usable and equals a fresh one given the same tokens.
  const auto more = testing::RandomTokens(f.config, 9, 2);
  REQUIRE(session->Append(more).ok());
  auto fresh = f.NewSession();
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), more.begin(), more.end());
  REQUIRE(fresh->Append(all).ok());
  REQUIRE(testing::RelativeDifference(session->last_logits().data(), fresh->last_logits().data(),
                                      f.config.vocab_size) <= 1e-5);
}

TEST_CASE("greedy generation follows the argmax of the logits", "[session][generate]") {
  Fixture f;
  const auto prompt = testing::RandomTokens(f.config, 40, 3);
  auto session = f.NewSession();
  REQUIRE(session->Append(prompt).ok());
  GenerateOptions options;
  options.max_tokens = 12;
  std::vector<float> logprobs;
  options.on_token = [&](int32_t, float lp) {
    logprobs.push_back(lp);
    return true;
  };
  auto result = session->Generate(options);
  REQUIRE(result.ok());
  REQUIRE(result->tokens.size() == 12);
  REQUIRE(result->finish_reason == FinishReason::kLength);
  REQUIRE(session->num_tokens() == 52);  // generated tokens joined the context

  auto manual = f.NewSession();
  REQUIRE(manual->Append(prompt).ok());
  for (size_t i = 0; i < result->tokens.size(); ++i) {
    const int32_t expected = Argmax(manual->last_logits(), f.config);
    REQUIRE(result->tokens[i] == expected);
    REQUIRE(logprobs[i] <= 0.f);
    REQUIRE(manual->Append(std::vector<int32_t>{expected}).ok());
  }
}

TEST_CASE("generation stops at a stop id and on cancellation", "[session][generate]") {
  Fixture f;
  auto session = f.NewSession();
  REQUIRE(session->Append(testing::RandomTokens(f.config, 20, 4)).ok());
  auto probe = session->Fork();
  REQUIRE(probe.ok());
  GenerateOptions options;
  options.max_tokens = 5;
  auto first = (*probe)->Generate(options);
  REQUIRE(first.ok());

  options.stop_ids = {first->tokens[2]};
  auto stopped = session->Fork();
  REQUIRE(stopped.ok());
  auto result = (*stopped)->Generate(options);
  REQUIRE(result.ok());
  REQUIRE(result->finish_reason == FinishReason::kEndOfText);
  REQUIRE(result->tokens.back() == first->tokens[2]);
  REQUIRE(result->tokens.size() <= 3);

  GenerateOptions cancel;
  cancel.max_tokens = 10;
  int calls = 0;
  cancel.on_token = [&](int32_t, float) { return ++calls < 2; };
  auto cancelled = session->Generate(cancel);
  REQUIRE(cancelled.ok());
  REQUIRE(cancelled->finish_reason == FinishReason::kCancelled);
  REQUIRE(cancelled->tokens.size() == 2);
}

TEST_CASE("sampling is reproducible for a seed and validated", "[session][generate]") {
  Fixture f;
  auto session = f.NewSession();
  REQUIRE(session->Append(testing::RandomTokens(f.config, 20, 5)).ok());
  GenerateOptions options;
  options.max_tokens = 8;
  options.sampling = {1.0f, 20, 0.9f, 1234};
  auto a = (*session->Fork())->Generate(options);
  auto b = (*session->Fork())->Generate(options);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->tokens == b->tokens);

  options.sampling.top_p = 0.f;
  auto bad = session->Generate(options);
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(bad.status().message()), Contains("top_p"));
  REQUIRE(session->num_tokens() == 20);

  auto empty = f.NewSession();
  auto none = empty->Generate(GenerateOptions{});
  REQUIRE(none.status().code() == absl::StatusCode::kFailedPrecondition);
}

// Session::Generate checks logit_bias ids itself, before padding: without
// that check an id >= vocab_size would pad the session and then fail inside
// the Sampler, and a landmark or pad id would be accepted silently (bias plus
// the mask's -inf is -inf).
TEST_CASE("Generate refuses logit_bias ids it cannot sample and changes nothing",
          "[session][generate][sampling]") {
  Fixture f;
  auto session = f.NewSession();
  // 10 tokens: not on a chunk boundary, so padding would change the session.
  REQUIRE(session->Append(testing::RandomTokens(f.config, 10, 8)).ok());
  REQUIRE(10 % f.config.enc_chunk_size != 0);
  const std::vector<float> logits_before(session->last_logits().begin(),
                                         session->last_logits().end());
  const int64_t tokens_before = session->num_tokens();
  const int64_t chunks_before = session->num_chunks();

  struct Case {
    int32_t id;
    std::string message;
  };
  const int32_t vocab = static_cast<int32_t>(f.config.vocab_size);
  const std::vector<Case> cases = {
      {vocab, absl::StrFormat("logit_bias names token %d, outside the vocabulary", vocab)},
      {-1, "logit_bias names token -1; token ids are >= 0"},
      {static_cast<int32_t>(f.config.chunk_id),
       absl::StrFormat("logit_bias names token %d, the landmark (chunk) id", f.config.chunk_id)},
      {static_cast<int32_t>(f.config.pad_id),
       absl::StrFormat("logit_bias names token %d, the pad id", f.config.pad_id)},
  };
  for (const Case& c : cases) {
    GenerateOptions options;
    options.max_tokens = 3;
    options.pad_to_chunk_boundary = true;
    options.sampling.logit_bias = {{c.id, 1.0f}};
    auto result = session->Generate(options);
    INFO("id " << c.id);
    REQUIRE(result.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(result.status().message()), Contains(c.message));
    REQUIRE(session->num_tokens() == tokens_before);
    REQUIRE(session->num_chunks() == chunks_before);
    REQUIRE(std::equal(logits_before.begin(), logits_before.end(),
                       session->last_logits().begin(), session->last_logits().end()));
  }
}

TEST_CASE("padding to the chunk boundary closes the open chunk", "[session]") {
  Fixture f;
  auto session = f.NewSession();
  REQUIRE(session->Append(testing::RandomTokens(f.config, 10, 6)).ok());
  REQUIRE(session->num_chunks() == 1);
  REQUIRE(session->PadToChunkBoundary().ok());
  REQUIRE(session->num_tokens() == 14);
  REQUIRE(session->num_chunks() == 2);
  REQUIRE(session->PadToChunkBoundary().ok());  // already on a boundary
  REQUIRE(session->num_tokens() == 14);

  GenerateOptions options;
  options.max_tokens = 1;
  options.pad_to_chunk_boundary = true;
  auto other = f.NewSession();
  REQUIRE(other->Append(testing::RandomTokens(f.config, 10, 6)).ok());
  auto result = other->Generate(options);
  REQUIRE(result.ok());
  REQUIRE(result->tokens[0] == Argmax(session->last_logits(), f.config));
}

TEST_CASE("an append stopped between pieces keeps exactly the accepted tokens", "[session]") {
  Fixture f;
  CpuBackendOptions small_steps;
  small_steps.max_step_positions = 16;  // two chunks: 100 tokens take several steps
  auto small_backend = MakeCpuBackend(f.config, f.weights, small_steps);
  auto session = Session::Create(*small_backend);
  REQUIRE(session.ok());
  const auto tokens = testing::RandomTokens(f.config, 100, 7);
  AppendOptions options;
  int checks = 0;
  options.should_stop = [&] { return ++checks == 3; };
  std::vector<int64_t> progress;
  options.on_progress = [&](const AppendProgress& p) { progress.push_back(p.tokens_done); };
  auto result = (*session)->Append(tokens, options);
  REQUIRE(result.ok());
  REQUIRE(result->stopped_early);
  REQUIRE(result->tokens_accepted == progress.back());
  REQUIRE((*session)->num_tokens() == result->tokens_accepted);
  REQUIRE(std::is_sorted(progress.begin(), progress.end()));

  // Appending the rest gives what one full append gives.
  REQUIRE((*session)->Append(absl::MakeConstSpan(tokens).subspan(result->tokens_accepted)).ok());
  auto full = f.NewSession();
  REQUIRE(full->Append(tokens).ok());
  REQUIRE(testing::RelativeDifference((*session)->last_logits().data(), full->last_logits().data(),
                                      f.config.vocab_size) <= 1e-5);
}

TEST_CASE("a fork continues exactly like its parent and leaves it untouched", "[session][fork]") {
  Fixture f;
  auto parent = f.NewSession();
  const auto prompt = testing::RandomTokens(f.config, 60, 8);
  REQUIRE(parent->Append(prompt).ok());
  auto child = parent->Fork();
  REQUIRE(child.ok());
  // The fork shares the closed chunks: their bytes are counted as shared.
  REQUIRE((*child)->backend_session().memory().shared_bytes > 0);
  REQUIRE((*child)->backend_session().memory().shared_bytes ==
          parent->backend_session().memory().shared_bytes);
  const auto tail = testing::RandomTokens(f.config, 25, 9);
  REQUIRE((*child)->Append(tail).ok());
  REQUIRE(parent->num_tokens() == 60);

  auto reference = f.NewSession();
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), tail.begin(), tail.end());
  REQUIRE(reference->Append(all).ok());
  REQUIRE(testing::RelativeDifference((*child)->last_logits().data(),
                                      reference->last_logits().data(), f.config.vocab_size) <= 1e-5);

  // The parent, appending something else after the fork, matches a fresh run.
  const auto other = testing::RandomTokens(f.config, 25, 10);
  REQUIRE(parent->Append(other).ok());
  auto reference2 = f.NewSession();
  std::vector<int32_t> all2 = prompt;
  all2.insert(all2.end(), other.begin(), other.end());
  REQUIRE(reference2->Append(all2).ok());
  REQUIRE(testing::RelativeDifference(parent->last_logits().data(), reference2->last_logits().data(),
                                      f.config.vocab_size) <= 1e-5);
}

// Finite weights (all the loader accepts) can still overflow: a final norm
// of 3e38 makes the normalized hidden state, and so the logits, infinite or
// NaN. Sampling then fails the step by name instead of emitting a token.
TEST_CASE("non-finite logits from the forward fail the generation step", "[session]") {
  Fixture f;
  ModelWeights overflowing = f.weights;
  for (float& w : overflowing.norm) w = 3e38f;
  auto backend = MakeCpuBackend(f.config, overflowing);
  auto session = Session::Create(*backend);
  REQUIRE(session.ok());
  REQUIRE((*session)->Append(testing::RandomTokens(f.config, 5, 3)).ok());
  const auto logits = (*session)->last_logits();
  REQUIRE(std::any_of(logits.begin(), logits.end(), [](float l) { return !std::isfinite(l); }));
  const int64_t tokens_before = (*session)->num_tokens();

  GenerateOptions options;
  options.max_tokens = 3;
  for (float temperature : {0.f, 1.f}) {
    INFO("T=" << temperature);
    options.sampling.temperature = temperature;
    auto result = (*session)->Generate(options);
    REQUIRE(result.status().code() == absl::StatusCode::kInternal);
    REQUIRE_THAT(std::string(result.status().message()),
                 Contains("logits after 5 tokens cannot be sampled") && Contains("logit"));
    REQUIRE((*session)->num_tokens() == tokens_before);  // nothing appended
  }
}

}  // namespace
}  // namespace drt
