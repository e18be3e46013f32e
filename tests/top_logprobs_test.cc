// TopLogProbs (engine/top_logprobs.h) against a brute-force reference: a
// stable sort of every listable id by logit, and log-softmax in long double.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "engine/sampler.h"
#include "engine/top_logprobs.h"
#include "tests/test_util/sampling_reference.h"

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Many exact ties (multiples of 1/4), signed zeros, -inf and a spread of
// magnitudes, as a language model's row never has but the order must take.
std::vector<float> TiedLogits(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<float> v(n);
  for (float& x : v) {
    switch (kind(gen)) {
      case 0: x = -0.f; break;
      case 1: x = 0.f; break;
      case 2: x = -kInf; break;
      default: x = std::round(normal(gen) * 4.f) / 4.f;
    }
  }
  return v;
}

}  // namespace

TEST_CASE("TopLogProbs lists the best ids with their log-softmax, ties to the lower id",
          "[sampler][top_logprobs]") {
  for (size_t vocab : {1u, 2u, 5u, 21u, 300u, 50257u}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      std::vector<float> logits = TiedLogits(vocab, seed * 131 + static_cast<uint32_t>(vocab));
      logits[vocab / 2] = 1.5f;  // at least one finite logit
      const std::vector<int32_t> unlisted =
          vocab > 4 ? std::vector<int32_t>{0, static_cast<int32_t>(vocab) - 1} : std::vector<int32_t>{};
      for (int32_t n : {0, 1, 2, 5, 19, 20}) {
        INFO("vocab " << vocab << " seed " << seed << " n " << n);
        const auto got = drt::TopLogProbs(logits, n, unlisted);
        REQUIRE(got.ok());
        const drt::testing::RankedLogProbs want = drt::testing::BruteForceTopLogProbs(logits, n, unlisted);
        REQUIRE(got->size() == want.ids.size());
        for (size_t i = 0; i < got->size(); ++i) {
          CHECK((*got)[i].token == want.ids[i]);
          // float rounding of a value of magnitude < 1e3: 1e-6 relative
          // covers it (measured: the largest difference here is 3e-7 relative).
          CHECK((*got)[i].logprob ==
                Approx(static_cast<double>(want.logprobs[i])).epsilon(1e-6).margin(1e-6));
          // The very number Sampler::LogProb gives for the same token.
          CHECK((*got)[i].logprob == *drt::Sampler::LogProb(logits, (*got)[i].token));
        }
      }
    }
  }
}

TEST_CASE("TopLogProbs never lists -inf or unlisted ids, and counts them in the normaliser",
          "[sampler][top_logprobs]") {
  // Two finite logits besides the unlisted best one: at most two come back.
  const std::vector<float> logits = {-kInf, 2.f, 5.f, -kInf, 1.f};
  const auto got = drt::TopLogProbs(logits, 20, std::vector<int32_t>{2});
  REQUIRE(got.ok());
  REQUIRE(got->size() == 2);
  CHECK((*got)[0].token == 1);
  CHECK((*got)[1].token == 4);
  // Hand-computed: log(e^2 / (e^2 + e^5 + e^1)) = 2 - 5 - log(1 + e^-3 + e^-4).
  CHECK((*got)[0].logprob == Approx(-3.0 - std::log(1.0 + std::exp(-3.0) + std::exp(-4.0))));
  CHECK((*got)[1].logprob == Approx(-4.0 - std::log(1.0 + std::exp(-3.0) + std::exp(-4.0))));
  // Large logits do not overflow.
  const auto big = drt::TopLogProbs(std::vector<float>{1000.f, 1001.f}, 2);
  REQUIRE(big.ok());
  CHECK((*big)[0].token == 1);
  CHECK((*big)[0].logprob == Approx(-std::log1p(std::exp(-1.0))));
  CHECK((*big)[1].logprob == Approx(-1.0 - std::log1p(std::exp(-1.0))));
}

TEST_CASE("TopLogProbs refuses n out of range and logits the sampler refuses",
          "[sampler][top_logprobs]") {
  const std::vector<float> logits = {1.f, 2.f};
  for (int32_t n : {-1, drt::kMaxTopLogprobs + 1}) {
    const auto got = drt::TopLogProbs(logits, n);
    CHECK(got.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(got.status().message()).find("top_logprobs must be in [0, 20]") !=
          std::string::npos);
  }
  const auto nan = drt::TopLogProbs(std::vector<float>{1.f, std::nanf("")}, 1);
  CHECK(nan.status().code() == absl::StatusCode::kInvalidArgument);
  const auto all_inf = drt::TopLogProbs(std::vector<float>{-kInf, -kInf}, 1);
  CHECK(all_inf.status().code() == absl::StatusCode::kInvalidArgument);
}
