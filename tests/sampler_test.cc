// Sampler (engine/sampler.h): greedy, temperature / top-k / top-p sampling,
// reproducibility by seed, LogProb, and parameter validation.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/sampler.h"
#include "tests/test_util/sampling_reference.h"

namespace {

using drt::Sampler;
using drt::SamplingParams;
using drt::testing::CheckSampledFrequencies;

SamplingParams Params(float temperature, int32_t top_k = 0, float top_p = 1.f,
                      uint64_t seed = 0) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

std::vector<float> RandomLogits(size_t n, uint32_t seed, float scale = 2.f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

int32_t Argmax(const std::vector<float>& logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float l : logits) mx = std::max(mx, double(l));
  std::vector<double> p;
  double den = 0.0;
  for (float l : logits) {
    p.push_back(std::exp((double(l) - mx) / temperature));
    den += p.back();
  }
  for (double& x : p) x /= den;
  return p;
}

// Sampler::Sample as it was before LogitOrder (engine/sampler.cc before
// the F1 fix): a comparison sort of every id, then the same weights, nucleus
// and walk. The fast order must pick the very same token for every draw of
// the same seed, so the sampled distribution is unchanged.
class NaiveSampler {
 public:
  explicit NaiveSampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
  int32_t Sample(const std::vector<float>& logits) {
    const int32_t n = static_cast<int32_t>(logits.size());
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const int32_t keep_k = p_.top_k > 0 ? std::min(p_.top_k, n) : n;
    std::vector<double> probs(keep_k);
    const double best = logits[order[0]];
    double sum = 0.0;
    for (int32_t i = 0; i < keep_k; ++i) sum += (probs[i] = std::exp((logits[order[i]] - best) / p_.temperature));
    int32_t keep = keep_k;
    if (p_.top_p < 1.f) {
      double mass = 0.0;
      for (int32_t i = 0; i < keep_k; ++i) {
        mass += probs[i] / sum;
        if (mass >= p_.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    const double total = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
    const double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
    double acc = 0.0;
    for (int32_t i = 0; i < keep; ++i) {
      acc += probs[i];
      if (u < acc) return order[i];
    }
    int32_t last = keep - 1;
    while (last > 0 && probs[last] == 0.0) --last;
    return order[last];
  }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace

TEST_CASE("Greedy returns the argmax, lowest index on ties", "[sampler]") {
  Sampler greedy(Params(0.f));
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    const auto logits = RandomLogits(100 + seed, seed);
    CHECK(*greedy.Sample(logits) == Argmax(logits));
  }
  CHECK(*greedy.Sample(std::vector<float>{1.f, 3.f, 3.f, 2.f}) == 1);
  CHECK(*greedy.Sample(std::vector<float>{5.f, 5.f, 5.f}) == 0);
  CHECK(*greedy.Sample(std::vector<float>{-1.f, -2.f, 0.5f}) == 2);
  CHECK(*greedy.Sample(std::vector<float>{-3.f, -1e30f, -2.f, -2.f}) == 2);
  CHECK(*greedy.Sample(std::vector<float>{7.f}) == 0);
}

TEST_CASE("top_k = 1 equals greedy at any temperature", "[sampler]") {
  for (float temperature : {0.01f, 0.7f, 1.f, 5.f, 100.f}) {
    Sampler sampler(Params(temperature, 1, 1.f, 99));
    for (uint32_t seed = 1; seed <= 40; ++seed) {
      const auto logits = RandomLogits(64, seed + 1000);
      INFO("T=" << temperature << " seed=" << seed);
      CHECK(*sampler.Sample(logits) == Argmax(logits));
    }
    CHECK(*sampler.Sample(std::vector<float>{1.f, 4.f, 0.f, 4.f}) == 1);  // tie: lowest index
  }
}

TEST_CASE("A tiny top_p equals greedy", "[sampler]") {
  for (float temperature : {0.5f, 1.f, 3.f}) {
    Sampler sampler(Params(temperature, 0, 1e-6f, 7));
    for (uint32_t seed = 1; seed <= 40; ++seed) {
      const auto logits = RandomLogits(64, seed + 2000);
      INFO("T=" << temperature << " seed=" << seed);
      CHECK(*sampler.Sample(logits) == Argmax(logits));
    }
    CHECK(*sampler.Sample(std::vector<float>{2.f, 0.f, 2.f}) == 0);
  }
}

TEST_CASE("Sampling frequencies follow the softmax", "[sampler]") {
  const std::vector<float> logits = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f};
  const int draws = 20000;
  SECTION("temperature 1") { CheckSampledFrequencies(logits, Params(1.f, 0, 1.f, 1234), Softmax(logits, 1.0), draws); }
  SECTION("temperature 0.5") {
    CheckSampledFrequencies(logits, Params(0.5f, 0, 1.f, 4321), Softmax(logits, 0.5), draws);
  }
  SECTION("temperature 1, top_k larger than the vocabulary is no limit") {
    CheckSampledFrequencies(logits, Params(1.f, 100, 1.f, 55), Softmax(logits, 1.0), draws);
  }
  SECTION("top_k = 3 renormalises over the 3 best") {
    // Best three: indices 3 (2.0), 0 (1.0), 1 (0.5).
    const std::vector<float> top = {logits[0], logits[1], logits[3]};
    const auto p = Softmax(top, 1.0);
    CheckSampledFrequencies(logits, Params(1.f, 3, 1.f, 77), {p[0], p[1], 0.0, p[2], 0.0}, draws);
  }
  SECTION("top_p renormalises over the smallest prefix reaching top_p") {
    // softmax(logits): ~0.547 (3), ~0.201 (0), ~0.122 (1), ~0.074 (4), ~0.055 (2); prefix
    // masses 0.547, 0.749, 0.871: top_p 0.8 keeps indices 3, 0, 1.
    const auto full = Softmax(logits, 1.0);
    REQUIRE(full[3] + full[0] < 0.8);
    REQUIRE(full[3] + full[0] + full[1] > 0.8);
    const double kept = full[3] + full[0] + full[1];
    CheckSampledFrequencies(logits, Params(1.f, 0, 0.8f, 88),
                     {full[0] / kept, full[1] / kept, 0.0, full[3] / kept, 0.0}, draws);
  }
}

TEST_CASE("top_k = 2 never leaves the top two", "[sampler]") {
  const std::vector<float> logits = {0.1f, 3.f, -1.f, 2.9f, 0.5f, 2.8f};
  Sampler sampler(Params(4.f, 2, 1.f, 2024));
  int seen1 = 0, seen3 = 0;
  for (int i = 0; i < 3000; ++i) {
    const int32_t t = *sampler.Sample(logits);
    REQUIRE((t == 1 || t == 3));
    (t == 1 ? seen1 : seen3)++;
  }
  CHECK(seen1 > 0);
  CHECK(seen3 > 0);
}

TEST_CASE("Masked (-inf) logits are never sampled", "[sampler]") {
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {ninf, 1.f, ninf, 0.5f, ninf};
  for (int32_t top_k : {0, 4}) {
    Sampler sampler(Params(1.5f, top_k, 1.f, 11));
    bool only_finite = true;
    for (int i = 0; i < 2000; ++i) {
      const int32_t t = *sampler.Sample(logits);
      only_finite = only_finite && (t == 1 || t == 3);
    }
    INFO("top_k=" << top_k);
    CHECK(only_finite);
  }
  CHECK(*Sampler(Params(0.f)).Sample(logits) == 1);
}

TEST_CASE("The seed fixes the sequence", "[sampler]") {
  const auto logits = RandomLogits(50, 31, 0.5f);
  auto draw = [&](uint64_t seed, int32_t top_k, float top_p) {
    Sampler sampler(Params(1.f, top_k, top_p, seed));
    std::vector<int32_t> seq;
    for (int i = 0; i < 200; ++i) seq.push_back(*sampler.Sample(logits));
    return seq;
  };
  for (auto [top_k, top_p] : std::vector<std::pair<int32_t, float>>{{0, 1.f}, {10, 1.f}, {0, 0.9f}}) {
    INFO("top_k=" << top_k << " top_p=" << top_p);
    CHECK(draw(42, top_k, top_p) == draw(42, top_k, top_p));
    CHECK(draw(42, top_k, top_p) != draw(43, top_k, top_p));
  }
}

TEST_CASE("LogProb is log_softmax at temperature 1", "[sampler]") {
  for (float scale : {1.f, 10.f}) {
    const auto logits = RandomLogits(1000, 17, scale);
    double mx = -std::numeric_limits<double>::infinity();
    for (float l : logits) mx = std::max(mx, double(l));
    double den = 0.0;
    for (float l : logits) den += std::exp(double(l) - mx);
    const double lse = mx + std::log(den);
    for (int32_t i = 0; i < 1000; i += 37) {
      const double want = double(logits[i]) - lse;
      INFO("scale " << scale << " index " << i);
      CHECK(*Sampler::LogProb(logits, i) == Approx(want).epsilon(1e-5).margin(1e-5));
    }
  }
  // Large logits must not overflow: log_softmax({1000, 1001})[0] = -log(1 + e).
  CHECK(*Sampler::LogProb(std::vector<float>{1000.f, 1001.f}, 0) ==
        Approx(-std::log1p(std::exp(1.0))).epsilon(1e-6));
  CHECK(*Sampler::LogProb(std::vector<float>{1000.f, 1001.f}, 1) ==
        Approx(-std::log1p(std::exp(-1.0))).epsilon(1e-6));
  CHECK(*Sampler::LogProb(std::vector<float>{3.f}, 0) == 0.f);
  // Uniform logits: -log(n).
  CHECK(*Sampler::LogProb(std::vector<float>(8, 0.25f), 5) == Approx(-std::log(8.0)).epsilon(1e-6));
}

TEST_CASE("Non-finite logits are refused by name, not sampled", "[sampler]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto expect_refused = [](const absl::StatusOr<int32_t>& got, const std::string& words) {
    INFO(got.status().ToString());
    REQUIRE(got.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(got.status().message()).find(words) != std::string::npos);
  };
  // The reviewer's cases: +inf made every probability NaN and the worst
  // token (4) came out; greedy took a NaN at index 0.
  for (float temperature : {0.f, 1.f}) {
    INFO("T=" << temperature);
    Sampler sampler(Params(temperature, 0, 1.f, 5));
    expect_refused(sampler.Sample(std::vector<float>{1.f, 5.f, inf, 2.f, -3.f}), "logit 2 of 5 is +inf");
    expect_refused(sampler.Sample(std::vector<float>{1.f, 5.f, nan, 2.f, -3.f}), "logit 2 of 5 is NaN");
    expect_refused(sampler.Sample(std::vector<float>{nan, 5.f, 1.f}), "logit 0 of 3 is NaN");
    expect_refused(sampler.Sample(std::vector<float>{-inf, -inf, -inf}), "all 3 logits are -inf");
    expect_refused(sampler.Sample(std::vector<float>{}), "no logits");
  }
  // A refused call draws nothing: the sequence goes on as a fresh sampler's.
  const auto logits = RandomLogits(20, 3, 1.f);
  Sampler fresh(Params(1.f, 0, 1.f, 9)), refused(Params(1.f, 0, 1.f, 9));
  REQUIRE_FALSE(refused.Sample(std::vector<float>{inf, 0.f}).ok());
  for (int i = 0; i < 50; ++i) REQUIRE(*refused.Sample(logits) == *fresh.Sample(logits));

  const auto logprob_inf = Sampler::LogProb(std::vector<float>{1.f, 5.f, inf, 2.f, -3.f}, 1);
  CHECK(logprob_inf.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(logprob_inf.status().message()).find("+inf") != std::string::npos);
  const auto out_of_range = Sampler::LogProb(std::vector<float>{1.f, 2.f}, 2);
  CHECK(out_of_range.status().code() == absl::StatusCode::kInvalidArgument);
  // -inf is a token of probability zero: log 0 = -inf; the others as without it.
  CHECK(*Sampler::LogProb(std::vector<float>{-inf, 0.f, 0.f}, 0) == -inf);
  CHECK(*Sampler::LogProb(std::vector<float>{-inf, 0.f, 0.f}, 1) ==
        Approx(-std::log(2.0)).epsilon(1e-6));
}

TEST_CASE("ValidateSamplingParams names the bad field", "[sampler]") {
  CHECK(drt::ValidateSamplingParams(SamplingParams{}).ok());
  CHECK(drt::ValidateSamplingParams(Params(0.7f, 50, 0.9f, 3)).ok());
  CHECK(drt::ValidateSamplingParams(Params(0.f, 0, 1.f)).ok());
  CHECK(drt::ValidateSamplingParams(Params(2.f, 1, 1e-6f)).ok());

  auto expect_bad = [](const SamplingParams& p, const std::string& field) {
    const absl::Status s = drt::ValidateSamplingParams(p);
    INFO("field " << field << ": " << s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find(field) != std::string::npos);
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  expect_bad(Params(-1.f), "temperature");
  expect_bad(Params(-1e-9f), "temperature");
  expect_bad(Params(nan), "temperature");
  expect_bad(Params(inf), "temperature");
  expect_bad(Params(1.f, -1), "top_k");
  expect_bad(Params(1.f, std::numeric_limits<int32_t>::min()), "top_k");
  expect_bad(Params(1.f, 0, 0.f), "top_p");
  expect_bad(Params(1.f, 0, -0.5f), "top_p");
  expect_bad(Params(1.f, 0, 1.5f), "top_p");
  expect_bad(Params(1.f, 0, 1.0000001f), "top_p");
  expect_bad(Params(1.f, 0, nan), "top_p");
}

TEST_CASE("Sample picks the naive full-sort sampler's token for every seed", "[sampler]") {
  const float ninf = -std::numeric_limits<float>::infinity();
  struct Case {
    size_t vocab;
    int draws;
  };
  // 50,265: the paper's GPT-2 vocabulary, where top_k 0 orders all of it.
  for (const Case c : {Case{5, 300}, Case{258, 200}, Case{3000, 40}, Case{50265, 6}}) {
    for (uint32_t seed = 1; seed <= 2; ++seed) {
      std::vector<float> logits = RandomLogits(c.vocab, seed * 131 + static_cast<uint32_t>(c.vocab), 3.f);
      if (seed == 2) {
        // Exact ties, signed zeros and masked ids, as quantised logits and
        // Session's masks give.
        for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::round(logits[i] * 2.f) / 2.f;
        for (size_t i = 1; i < logits.size(); i += 7) logits[i] = (i % 2) ? -0.f : 0.f;
        for (size_t i = 3; i < logits.size(); i += 11) logits[i] = ninf;
      }
      for (float temperature : {0.3f, 0.8f, 1.f, 4.f}) {
        for (int32_t top_k : {0, 1, 50, 300}) {
          for (float top_p : {1.f, 0.9f, 0.3f}) {
            const SamplingParams params = Params(temperature, top_k, top_p, seed * 1000 + top_k);
            Sampler fast(params);
            NaiveSampler naive(params);
            INFO("vocab " << c.vocab << " seed " << seed << " T " << temperature << " top_k " << top_k
                          << " top_p " << top_p);
            std::vector<int32_t> got, want;
            for (int i = 0; i < c.draws; ++i) {
              got.push_back(*fast.Sample(logits));
              want.push_back(naive.Sample(logits));
            }
            CHECK(got == want);
          }
        }
      }
    }
  }
}
