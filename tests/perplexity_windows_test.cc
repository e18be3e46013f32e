// drt-ppl --context (bench/perplexity/context_windows.h): a document scored
// in windows of N tokens gives each token the NLL it gets when its window's
// text is scored alone as a document of its own, window 0's equal the Python
// reference's for the whole document (the model is causal), and a context at
// or past the document's length is the plain run.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "bench/perplexity/context_windows.h"
#include "bench/perplexity/document_scorer.h"
#include "engine/backend.h"
#include "engine/model_dir.h"
#include "engine/safetensors.h"
#include "engine/session.h"
#include "tests/test_util/fixture_dirs.h"
#include "tests/test_util/golden.h"

namespace drt::ppl {
namespace {

// tests/perplexity_golden_test.cc's per-token bound (kNllTolerance):
// measured worst 2.7e-5 nats between this engine and the reference's float64
// forward; runs of the same engine on the same tokens differ by far less.
constexpr double kNllTolerance = 1e-4;

using Scores = std::map<int64_t, double>;  // document position -> NLL

Scores ScoreAlone(Backend& backend, absl::Span<const int32_t> tokens, int64_t piece) {
  auto session = Session::Create(backend);
  REQUIRE(session.ok());
  Scores scores;
  ScoreCallbacks callbacks;
  callbacks.on_scored = [&](int64_t position, double nll) { scores[position] = nll; };
  REQUIRE(ScoreTokens(**session, tokens, piece, callbacks).ok());
  return scores;
}

Scores ScoreWindowed(Backend& backend, absl::Span<const int32_t> tokens, int64_t context,
                     int64_t piece, WindowsScored* out) {
  Scores scores;
  ScoreCallbacks callbacks;
  callbacks.on_scored = [&](int64_t position, double nll) {
    CHECK(scores.count(position) == 0);
    scores[position] = nll;
  };
  auto done = ScoreInWindows(backend, tokens, context, piece, callbacks);
  REQUIRE(done.ok());
  *out = *done;
  return scores;
}

double WorstDifference(const Scores& a, const Scores& b) {
  double worst = 0;
  for (const auto& [position, nll] : a) worst = std::max(worst, std::abs(nll - b.at(position)));
  return worst;
}

std::vector<int64_t> Positions(const Scores& s) {
  std::vector<int64_t> out;
  for (const auto& [position, nll] : s) out.push_back(position);
  return out;
}

TEST_CASE("drt-ppl --context scores each window as a document of its own", "[ppl][golden]") {
  double worst = 0;
  for (const std::string& dir : testing::GoldenFixtureDirs()) {
    auto model = LoadModelDir(dir);
    REQUIRE(model.ok());
    const testing::Golden golden = testing::LoadGolden(dir + "/golden.safetensors");
    auto reference_file = SafetensorsFile::Open(dir + "/nll_golden.safetensors");
    REQUIRE(reference_file.ok());
    auto reference = (*reference_file)->ReadF32("token_nll");
    REQUIRE(reference.ok());
    const absl::Span<const int32_t> tokens(golden.tokens);
    const int64_t L = static_cast<int64_t>(tokens.size());
    auto backend = MakeCpuBackend(model->config, model->weights);
    // 1000: windows cut chunks (63 tokens) anywhere, the last one short;
    // 441: seven whole chunks; pieces smaller and larger than the window.
    for (const auto& [context, piece] : std::vector<std::pair<int64_t, int64_t>>{
             {1000, 4096}, {441, 50}}) {
      INFO("fixture " << dir << ", context " << context << ", piece " << piece);
      WindowsScored done;
      const Scores windowed = ScoreWindowed(*backend, tokens, context, piece, &done);
      const int64_t windows = (L + context - 1) / context;
      CHECK(done.windows == windows);

      // The independent expectation: window k's tokens scored alone, their
      // positions moved to the document's.
      Scores expected;
      int64_t retrievals = 0;
      for (int64_t begin = 0; begin < L; begin += context) {
        const int64_t n = std::min(context, L - begin);
        auto session = Session::Create(*backend);
        REQUIRE(session.ok());
        ScoreCallbacks callbacks;
        callbacks.on_scored = [&](int64_t position, double nll) { expected[begin + position] = nll; };
        REQUIRE(ScoreTokens(**session, tokens.subspan(begin, n), piece, callbacks).ok());
        retrievals += (*session)->retrievals();
      }
      CHECK(done.retrievals == retrievals);
      // Every position but the windows' first tokens, each once.
      REQUIRE(static_cast<int64_t>(windowed.size()) == L - windows);
      REQUIRE(Positions(windowed) == Positions(expected));
      for (int64_t begin = 0; begin < L; begin += context) CHECK(windowed.count(begin) == 0);
      const double difference = WorstDifference(windowed, expected);
      INFO("worst difference from the windows scored alone " << difference);
      CHECK(difference <= kNllTolerance);
      worst = std::max(worst, difference);

      // Window 0 sees what the whole document's first tokens see.
      double window0 = 0;
      for (int64_t i = 1; i < context; ++i) {
        window0 = std::max(window0, std::abs(windowed.at(i) - (*reference)[i - 1]));
      }
      INFO("window 0 against the reference: worst " << window0);
      CHECK(window0 <= kNllTolerance);
    }
    // A context at or past the length: one window, the plain run.
    const Scores plain = ScoreAlone(*backend, tokens, 100);
    for (int64_t context : {L, L + 5, int64_t{0}}) {
      INFO("fixture " << dir << ", context " << context);
      WindowsScored done;
      const Scores whole = ScoreWindowed(*backend, tokens, context, 100, &done);
      CHECK(done.windows == 1);
      REQUIRE(Positions(whole) == Positions(plain));
      CHECK(WorstDifference(whole, plain) <= kNllTolerance);
    }
  }
  WARN("--context windows against the windows scored alone: worst per-token difference " << worst);
}

TEST_CASE("drt-ppl --context refuses 1, a negative context and bad ids before scoring", "[ppl]") {
  const std::string dir = testing::GoldenFixtureDirs().front();
  auto model = LoadModelDir(dir);
  REQUIRE(model.ok());
  auto backend = MakeCpuBackend(model->config, model->weights);
  int64_t scored = 0;
  ScoreCallbacks callbacks;
  callbacks.on_scored = [&](int64_t, double) { ++scored; };
  const std::vector<int32_t> good(20, 5);
  for (int64_t context : {int64_t{1}, int64_t{-3}}) {
    auto refused = ScoreInWindows(*backend, good, context, 100, callbacks);
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(refused.status().message()).find("--context") != std::string::npos);
  }
  CHECK(ScoreInWindows(*backend, good, 10, 0, callbacks).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // A landmark id in the last window: refused before window 0 is scored.
  std::vector<int32_t> bad(300, 7);
  bad[290] = static_cast<int32_t>(model->config.chunk_id);
  CHECK(ScoreInWindows(*backend, bad, 100, 50, callbacks).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(scored == 0);
  // Two windows of 10: 9 + 9 tokens scored.
  auto done = ScoreInWindows(*backend, good, 10, 3, callbacks);
  REQUIRE(done.ok());
  CHECK(done->windows == 2);
  CHECK(scored == 18);
}

}  // namespace
}  // namespace drt::ppl
