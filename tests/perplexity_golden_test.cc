// drt-ppl's scoring loop (bench/perplexity/document_scorer.h) against the
// Python reference: every token's NLL on each golden fixture equals
// -log_softmax of the reference's float64 logits
// (tests/fixtures/<name>/nll_golden.safetensors, weights_tools/
// make_nll_golden.py), whatever the piece size; and its refusals change
// nothing.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "bench/perplexity/document_scorer.h"
#include "engine/backend.h"
#include "engine/model_dir.h"
#include "engine/safetensors.h"
#include "engine/session.h"
#include "tests/test_util/fixture_dirs.h"
#include "tests/test_util/golden.h"

namespace drt::ppl {
namespace {

// Measured 2026-11-25 (CPU engine, f32, against the reference's float64
// stored as F32): worst per-token NLL difference 2.7e-5 nats over the three
// fixtures and the pieces below (NLLs reach 36 nats), worst difference of
// the mean 8.6e-8. The bounds are about 4x and 10x those.
constexpr double kNllTolerance = 1e-4;
constexpr double kMeanNllTolerance = 1e-6;

std::vector<float> GoldenNll(const std::string& dir) {
  auto file = SafetensorsFile::Open(dir + "/nll_golden.safetensors");
  REQUIRE(file.ok());
  auto nll = (*file)->ReadF32("token_nll");
  REQUIRE(nll.ok());
  return *nll;
}

TEST_CASE("drt-ppl scores every token as the Python reference does, any piece size", "[ppl][golden]") {
  const auto dirs = testing::GoldenFixtureDirs();
  REQUIRE(dirs.size() >= 3);
  double worst = 0, worst_mean = 0;
  for (const std::string& dir : dirs) {
    auto model = LoadModelDir(dir);
    REQUIRE(model.ok());
    const testing::Golden golden = testing::LoadGolden(dir + "/golden.safetensors");
    const std::vector<float> expected = GoldenNll(dir);
    REQUIRE(expected.size() + 1 == golden.tokens.size());
    auto backend = MakeCpuBackend(model->config, model->weights);
    // Whole document in one piece; pieces that cut chunks anywhere (100 is
    // not a multiple of 63); tiny pieces (the carried row every 7 tokens).
    for (int64_t piece : {int64_t{1} << 20, int64_t{100}, int64_t{7}}) {
      INFO("fixture " << dir << ", piece " << piece);
      auto session = Session::Create(*backend);
      REQUIRE(session.ok());
      std::vector<int64_t> positions;
      std::vector<double> nll;
      ScoreCallbacks callbacks;
      callbacks.on_scored = [&](int64_t position, double value) {
        positions.push_back(position);
        nll.push_back(value);
      };
      int64_t pieces = 0;
      callbacks.on_piece = [&](int64_t) { ++pieces; };
      REQUIRE(ScoreTokens(**session, golden.tokens, piece, callbacks).ok());
      const int64_t L = static_cast<int64_t>(golden.tokens.size());
      CHECK(pieces == (L + piece - 1) / piece);
      CHECK((*session)->num_tokens() == L);
      // Positions 1 .. L-1, each once, in order.
      REQUIRE(static_cast<int64_t>(positions.size()) == L - 1);
      for (int64_t i = 0; i < L - 1; ++i) REQUIRE(positions[i] == i + 1);
      double sum = 0, expected_sum = 0, piece_worst = 0;
      for (size_t i = 0; i < nll.size(); ++i) {
        piece_worst = std::max(piece_worst, std::abs(nll[i] - expected[i]));
        sum += nll[i];
        expected_sum += expected[i];
      }
      const double mean_difference = std::abs(sum - expected_sum) / static_cast<double>(nll.size());
      INFO("worst per-token NLL difference " << piece_worst << ", mean " << mean_difference);
      CHECK(piece_worst <= kNllTolerance);
      CHECK(mean_difference <= kMeanNllTolerance);
      worst = std::max(worst, piece_worst);
      worst_mean = std::max(worst_mean, mean_difference);
    }
  }
  WARN("drt-ppl vs reference: worst per-token NLL difference " << worst << ", worst mean "
                                                               << worst_mean);
}

TEST_CASE("drt-ppl scoring refuses a bad piece, bad ids and a used session, changing nothing", "[ppl]") {
  const std::string dir = testing::GoldenFixtureDirs().front();
  auto model = LoadModelDir(dir);
  REQUIRE(model.ok());
  auto backend = MakeCpuBackend(model->config, model->weights);
  auto session = Session::Create(*backend);
  REQUIRE(session.ok());
  int64_t scored = 0;
  ScoreCallbacks callbacks;
  callbacks.on_scored = [&](int64_t, double) { ++scored; };
  const std::vector<int32_t> good = {1, 2, 3, 4, 5};

  absl::Status no_piece = ScoreTokens(**session, good, 0, callbacks);
  CHECK(no_piece.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(no_piece.message()).find("--piece") != std::string::npos);

  // A landmark id late in the document: refused before the first piece runs.
  std::vector<int32_t> bad(500, 7);
  bad[450] = static_cast<int32_t>(model->config.chunk_id);
  absl::Status refused = ScoreTokens(**session, bad, 100, callbacks);
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK((*session)->num_tokens() == 0);
  CHECK(scored == 0);

  REQUIRE(ScoreTokens(**session, good, 2, callbacks).ok());
  CHECK(scored == 4);
  absl::Status used = ScoreTokens(**session, good, 2, callbacks);
  CHECK(used.code() == absl::StatusCode::kFailedPrecondition);
  CHECK((*session)->num_tokens() == 5);
}

}  // namespace
}  // namespace drt::ppl
