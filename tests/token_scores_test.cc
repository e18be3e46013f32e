// Scored appends (AppendOptions::score, engine/token_scores.h) against an
// independent reference: a double-precision log-softmax, and a brute-force
// top-N ranking, of the all_logits rows of the same tokens appended in one
// unscored Append to a fresh session.
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/session.h"
#include "engine/token_scores.h"
#include "tests/test_util/random_model.h"
#include "tests/test_util/sampling_reference.h"

namespace drt {
namespace {

using Catch::Matchers::Contains;

struct Fixture {
  ModelConfig config = testing::TinyConfig();
  ModelWeights weights = testing::RandomWeights(config, 33);
  std::unique_ptr<Backend> backend = [&] {
    CpuBackendOptions options;
    options.num_threads = 2;
    // 8 chunks (64 positions) a forward: 400 tokens take 8 pieces.
    options.max_step_positions = 8 * config.chunk_positions();
    return MakeCpuBackend(config, weights, options);
  }();

  std::unique_ptr<Session> NewSession() {
    auto s = Session::Create(*backend);
    REQUIRE(s.ok());
    return *std::move(s);
  }
  std::vector<int32_t> Unlisted() const {
    return {static_cast<int32_t>(config.chunk_id), static_cast<int32_t>(config.pad_id)};
  }
};

// log-softmax of `row` at `token`, in double.
double ReferenceLogProb(absl::Span<const float> row, int32_t token) {
  double max = row[0];
  for (float l : row) max = std::max(max, static_cast<double>(l));
  double sum = 0;
  for (float l : row) sum += std::exp(static_cast<double>(l) - max);
  return static_cast<double>(row[token]) - max - std::log(sum);
}

// The logits of every token of prefix + tokens, appended at once to a fresh
// session (all_logits: every row runs every layer).
std::vector<float> AllLogits(Fixture& f, const std::vector<int32_t>& all) {
  auto session = f.NewSession();
  AppendOptions options;
  options.all_logits = true;
  auto result = session->Append(all, options);
  REQUIRE(result.ok());
  return std::move(result->logits);
}

// Checks `scores` of all[first..] against the reference rows `logits` of
// `all`: the first scored only when `first_scored`.
void CheckAgainstReference(const Fixture& f, const std::vector<TokenScore>& scores,
                             const std::vector<int32_t>& all, size_t first,
                             const std::vector<float>& logits, bool first_scored, int32_t top) {
  const int64_t V = f.config.vocab_size;
  REQUIRE(scores.size() == all.size() - first);
  for (size_t i = 0; i < scores.size(); ++i) {
    const size_t at = first + i;
    INFO("token " << at);
    REQUIRE(scores[i].token == all[at]);
    if (at == 0 || (i == 0 && !first_scored)) {
      CHECK_FALSE(scores[i].scored);
      CHECK(scores[i].top.empty());
      continue;
    }
    REQUIRE(scores[i].scored);
    const absl::Span<const float> row(logits.data() + (at - 1) * V, V);
    const double want = ReferenceLogProb(row, all[at]);
    // Measured: the largest difference here is 8.9e-6 (logprobs of
    // magnitude ~6 in float, rows cut into other forwards than the
    // reference's, so other GEMM shapes); 5e-5 leaves 5x.
    CHECK(scores[i].logprob == Approx(want).margin(5e-5));
    const testing::RankedLogProbs ranked = testing::BruteForceTopLogProbs(row, top, f.Unlisted());
    REQUIRE(scores[i].top.size() == ranked.ids.size());
    for (size_t k = 0; k < ranked.ids.size(); ++k) {
      CHECK(scores[i].top[k].token == ranked.ids[k]);
      CHECK(scores[i].top[k].logprob == Approx(static_cast<double>(ranked.logprobs[k])).margin(5e-5));
    }
  }
}

TEST_CASE("a scored append gives each token's log-softmax of the logits before it", "[session][score]") {
  Fixture f;
  const std::vector<int32_t> prefix = testing::RandomTokens(f.config, 30, 1);
  const std::vector<int32_t> tokens = testing::RandomTokens(f.config, 400, 2);
  std::vector<int32_t> all = prefix;
  all.insert(all.end(), tokens.begin(), tokens.end());
  const std::vector<float> reference = AllLogits(f, all);

  SECTION("into an empty session: the first token has no score") {
    auto session = f.NewSession();
    AppendOptions options;
    options.score = true;
    options.score_top_logprobs = 5;
    auto result = session->Append(all, options);
    REQUIRE(result.ok());
    CheckAgainstReference(f, result->scores, all, 0, reference, false, 5);
    CHECK(result->scored_tokens == static_cast<int64_t>(all.size()) - 1);
    double sum = 0;
    for (const TokenScore& s : result->scores) sum += s.logprob;
    CHECK(result->logprob_sum == Approx(sum).epsilon(1e-12));
  }
  SECTION("after earlier tokens: the first is scored from the session's last logits") {
    auto session = f.NewSession();
    REQUIRE(session->Append(prefix).ok());
    AppendOptions options;
    options.score = true;
    options.score_top_logprobs = 20;
    auto result = session->Append(tokens, options);
    REQUIRE(result.ok());
    CheckAgainstReference(f, result->scores, all, prefix.size(), reference, true, 20);
    CHECK(result->scored_tokens == static_cast<int64_t>(tokens.size()));
    // The state is that of an unscored append.
    auto plain = f.NewSession();
    REQUIRE(plain->Append(all).ok());
    // Measured 3.3e-7 (2026-11-25; scored appends ask for all logits, so
    // their forwards' GEMMs differ from the plain append's): 1e-5 leaves 30x.
    CHECK(testing::RelativeDifference(session->last_logits().data(), plain->last_logits().data(),
                                      f.config.vocab_size) <= 1e-5);
  }
}

TEST_CASE("scores come piece by piece, and split appends give those of one", "[session][score]") {
  Fixture f;
  const std::vector<int32_t> tokens = testing::RandomTokens(f.config, 400, 3);
  auto whole = f.NewSession();
  AppendOptions options;
  options.score = true;
  options.score_top_logprobs = 3;
  std::vector<size_t> piece_sizes;
  std::vector<TokenScore> streamed;
  options.on_scores = [&](absl::Span<const TokenScore> piece) {
    piece_sizes.push_back(piece.size());
    streamed.insert(streamed.end(), piece.begin(), piece.end());
  };
  auto one = whole->Append(tokens, options);
  REQUIRE(one.ok());
  CHECK(one->scores.empty());  // they went to on_scores
  REQUIRE(streamed.size() == tokens.size());
  // 64 positions a forward hold 56 tokens (7 of every 8 positions).
  REQUIRE(piece_sizes.size() > 1);
  for (size_t size : piece_sizes) CHECK(size <= 56);

  auto split = f.NewSession();
  std::vector<TokenScore> pieces;
  double sum = 0;
  int64_t scored = 0;
  for (auto [begin, end] : {std::pair<size_t, size_t>{0, 1}, {1, 57}, {57, 250}, {250, 400}}) {
    AppendOptions o;
    o.score = true;
    o.score_top_logprobs = 3;
    auto r = split->Append(absl::MakeConstSpan(tokens).subspan(begin, end - begin), o);
    REQUIRE(r.ok());
    pieces.insert(pieces.end(), r->scores.begin(), r->scores.end());
    sum += r->logprob_sum;
    scored += r->scored_tokens;
  }
  REQUIRE(pieces.size() == streamed.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    INFO("token " << i);
    CHECK(pieces[i].scored == streamed[i].scored);
    // Measured: at most 9.5e-6 apart (the appends cut the rows into other
    // forwards, so GEMM shapes differ); 5e-5 leaves 5x.
    CHECK(pieces[i].logprob == Approx(streamed[i].logprob).margin(5e-5));
    REQUIRE(pieces[i].top.size() == streamed[i].top.size());
    for (size_t k = 0; k < pieces[i].top.size(); ++k) {
      CHECK(pieces[i].top[k].token == streamed[i].top[k].token);
    }
  }
  CHECK(scored == one->scored_tokens);
  CHECK(scored == 399);
  // Measured 2.15e-5 apart (2026-11-25) on a sum of -8208.37 (399 float
  // logprobs, added in other pieces): 1e-3 leaves 46x.
  CHECK(sum == Approx(one->logprob_sum).margin(1e-3));
}

TEST_CASE("a scored append stopped early scores only the tokens it kept", "[session][score]") {
  Fixture f;
  const std::vector<int32_t> tokens = testing::RandomTokens(f.config, 400, 4);
  auto session = f.NewSession();
  AppendOptions options;
  options.score = true;
  int pieces = 0;
  options.on_progress = [&](const AppendProgress&) { ++pieces; };
  options.should_stop = [&] { return pieces >= 2; };
  auto result = session->Append(tokens, options);
  REQUIRE(result.ok());
  CHECK(result->stopped_early);
  // A scored append never skips upper layers nor logits: it stops at once.
  CHECK(result->tokens_accepted == session->num_tokens());
  CHECK(result->tokens_accepted < 400);
  CHECK(static_cast<int64_t>(result->scores.size()) == result->tokens_accepted);
  CHECK(result->scored_tokens == result->tokens_accepted - 1);
  CHECK(session->CheckStateWhole().ok());
}

TEST_CASE("a scored append refuses top alternatives outside [0, 20], changing nothing",
          "[session][score]") {
  Fixture f;
  auto session = f.NewSession();
  REQUIRE(session->Append(testing::RandomTokens(f.config, 10, 5)).ok());
  for (int32_t top : {-1, 21}) {
    AppendOptions options;
    options.score = true;
    options.score_top_logprobs = top;
    auto result = session->Append(testing::RandomTokens(f.config, 10, 6), options);
    REQUIRE(result.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(result.status().message()), Contains("prompt_logprobs"));
    CHECK(session->num_tokens() == 10);
  }
}

TEST_CASE("TokenScorer carries the last row across calls and checks sizes", "[score]") {
  // Hand-made rows: token 1 after row {0, ln 3} has probability 3/4.
  const std::vector<float> before = {0.f, std::log(3.f)};
  auto scorer = TokenScorer::Create(1, before, {});
  REQUIRE(scorer.ok());
  std::vector<TokenScore> out;
  const std::vector<int32_t> first = {1};
  const std::vector<float> row1 = {std::log(4.f), 0.f};  // token 0 next: 4/5
  REQUIRE(scorer->Score(first, row1, 2, &out).ok());
  const std::vector<int32_t> second = {0};
  const std::vector<float> row2 = {0.f, 0.f};
  REQUIRE(scorer->Score(second, row2, 2, &out).ok());
  REQUIRE(out.size() == 2);
  CHECK(out[0].logprob == Approx(std::log(0.75)).margin(1e-7));
  CHECK(out[1].logprob == Approx(std::log(0.8)).margin(1e-7));
  REQUIRE(out[1].top.size() == 1);
  CHECK(out[1].top[0].token == 0);
  CHECK(scorer->scored_tokens() == 2);
  CHECK(scorer->logprob_sum() == Approx(std::log(0.6)).margin(1e-6));
  const absl::Status bad = scorer->Score(first, row1, 3, &out);
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(out.size() == 2);
}

}  // namespace
}  // namespace drt
