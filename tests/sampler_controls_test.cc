// Sampler (engine/sampler.h) controls beyond temperature / top-k / top-p:
// presence and frequency penalties over the tokens this Sampler chose,
// min_p, and logit_bias, each against hand-computed cases and a brute-force
// reference written here from the rule (vLLM V1's order: bias, penalties,
// temperature, min_p, top_k, top_p), plus their validation.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
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

SamplingParams Params(float temperature, uint64_t seed = 0) {
  SamplingParams p;
  p.temperature = temperature;
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

std::vector<int32_t> Draw(Sampler& sampler, const std::vector<float>& logits, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(*sampler.Sample(logits));
  return out;
}

// The rule restated from its definition, over the whole vocabulary at every
// step: bias, then the penalties from its own counts (the expression
// engine/sampler.h documents), greedy argmax, or: probabilities at the
// temperature, min_p against the best probability, top_k, top_p over what is
// left (renormalised), and the draw walking the candidates best first with
// the generator used the way Sampler documents (one uniform in [0, total of
// the kept weights) per draw).
class ReferenceSampler {
 public:
  explicit ReferenceSampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
  int32_t Sample(const std::vector<float>& raw) {
    const int32_t n = static_cast<int32_t>(raw.size());
    std::vector<float> l = raw;
    for (const auto& [id, bias] : p_.logit_bias) l[id] += bias;
    for (const auto& [id, count] : counts_) {
      l[id] -= p_.presence_penalty * (count > 0 ? 1.f : 0.f) +
               p_.frequency_penalty * static_cast<float>(count);
    }
    int32_t token = 0;
    if (p_.temperature == 0.f) {
      for (int32_t i = 1; i < n; ++i)
        if (l[i] > l[token]) token = i;
    } else {
      std::vector<int32_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
      // Weights relative to the best (its weight is 1); probabilities are
      // weights over their sum.
      std::vector<double> w(n);
      double sum = 0.0;
      for (int32_t i = 0; i < n; ++i) sum += (w[i] = std::exp((l[order[i]] - double(l[order[0]])) / p_.temperature));
      int32_t kept = n;
      if (p_.min_p > 0.f) {
        const double best_prob = w[0] / sum;
        kept = 0;
        while (kept < n && w[kept] / sum >= p_.min_p * best_prob) ++kept;
      }
      if (p_.top_k > 0) kept = std::min(kept, p_.top_k);
      double kept_sum = 0.0;
      for (int32_t i = 0; i < kept; ++i) kept_sum += w[i];
      if (p_.top_p < 1.f) {
        double mass = 0.0;
        for (int32_t i = 0; i < kept; ++i) {
          mass += w[i] / kept_sum;
          if (mass >= p_.top_p) {
            kept = i + 1;
            break;
          }
        }
      }
      const double total = std::accumulate(w.begin(), w.begin() + kept, 0.0);
      const double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
      double acc = 0.0;
      token = order[kept - 1];
      for (int32_t i = 0; i < kept; ++i) {
        acc += w[i];
        if (u < acc) {
          token = order[i];
          break;
        }
      }
    }
    if (p_.presence_penalty != 0.f || p_.frequency_penalty != 0.f) ++counts_[token];
    return token;
  }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::map<int32_t, int32_t> counts_;
};

}  // namespace

TEST_CASE("Greedy with a presence penalty moves off a token once it was generated", "[sampler]") {
  // By hand: 0 (2.0); then 0 is 1.0 < 1.5: 1; then 0 1.0, 1 0.5, 2 0.0: 0
  // from then on (presence does not grow with the count).
  SamplingParams p = Params(0.f);
  p.presence_penalty = 1.f;
  Sampler sampler(p);
  CHECK(Draw(sampler, {2.f, 1.5f, 0.f}, 6) == std::vector<int32_t>{0, 1, 0, 0, 0, 0});
  CHECK(sampler.Count(0) == 5);
  CHECK(sampler.Count(1) == 1);
  CHECK(sampler.Count(2) == 0);
}

TEST_CASE("Greedy with a frequency penalty follows the counts", "[sampler]") {
  // Exact binary fractions, so no rounding decides. Logits 1, 0.75, 0.5,
  // frequency 0.375 per generated token. By hand:
  //   step 1: 1, .75, .5 -> 0      step 2: .625, .75, .5 -> 1
  //   step 3: .625, .375, .5 -> 0  step 4: .25, .375, .5 -> 2
  //   step 5: .25, .375, .125 -> 1 step 6: .25, 0, .125 -> 0
  //   step 7: -.125, 0, .125 -> 2
  SamplingParams p = Params(0.f);
  p.frequency_penalty = 0.375f;
  Sampler sampler(p);
  CHECK(Draw(sampler, {1.f, 0.75f, 0.5f}, 7) == std::vector<int32_t>{0, 1, 0, 2, 1, 0, 2});
  // A negative penalty makes the first token stick.
  SamplingParams stick = Params(0.f);
  stick.frequency_penalty = -2.f;
  stick.presence_penalty = -2.f;
  Sampler sticky(stick);
  CHECK(Draw(sticky, {1.f, 0.75f, 0.5f}, 5) == std::vector<int32_t>{0, 0, 0, 0, 0});
}

TEST_CASE("Penalties count only what this Sampler chose", "[sampler]") {
  // Two samplers interleaved (as two requests on one scheduler) keep their
  // own counts: each draws what it draws alone.
  SamplingParams p = Params(0.8f, 5);
  p.frequency_penalty = 0.7f;
  p.presence_penalty = 0.3f;
  const auto logits = RandomLogits(40, 3, 1.f);
  Sampler alone(p);
  const std::vector<int32_t> want = Draw(alone, logits, 60);
  SamplingParams q = p;
  q.seed = 6;
  Sampler a(p), b(q);
  std::vector<int32_t> got;
  for (int i = 0; i < 60; ++i) {
    got.push_back(*a.Sample(logits));
    (void)*b.Sample(logits);
  }
  CHECK(got == want);
  // Counts start empty: a new Sampler (a new request) draws as the first did.
  Sampler again(p);
  CHECK(Draw(again, logits, 60) == want);
  int32_t total = 0;
  for (int32_t id = 0; id < 40; ++id) total += a.Count(id);
  CHECK(total == 60);
}

TEST_CASE("logit_bias is added before everything else", "[sampler]") {
  const std::vector<float> logits = {1.f, 2.f, 3.f};
  SamplingParams p = Params(0.f);
  p.logit_bias = {{0, 5.f}};
  CHECK(*Sampler(p).Sample(logits) == 0);
  p.logit_bias = {{2, -100.f}};
  CHECK(*Sampler(p).Sample(logits) == 1);
  // Sampling frequencies follow softmax(logits + bias).
  SamplingParams t = Params(1.f, 17);
  t.logit_bias = {{0, 1.5f}, {2, -0.5f}};
  const double e0 = std::exp(2.5), e1 = std::exp(2.0), e2 = std::exp(2.5);
  const double z = e0 + e1 + e2;
  CheckSampledFrequencies(logits, t, {e0 / z, e1 / z, e2 / z}, 20000);
  // A -inf logit stays impossible whatever its bias.
  const float ninf = -std::numeric_limits<float>::infinity();
  SamplingParams up = Params(1.f, 3);
  up.logit_bias = {{1, 100.f}};
  Sampler s(up);
  for (int32_t t2 : Draw(s, {0.f, ninf, 0.5f}, 500)) CHECK(t2 != 1);
}

TEST_CASE("min_p drops tokens below min_p times the best probability", "[sampler]") {
  // Probabilities proportional to 1, 0.5, 0.25, 0.1 at temperature 1.
  const std::vector<float> logits = {0.f, std::log(0.5f), std::log(0.25f), std::log(0.1f)};
  SamplingParams p = Params(1.f, 21);
  p.min_p = 0.3f;  // keeps 1 and 0.5
  CheckSampledFrequencies(logits, p, {2.0 / 3, 1.0 / 3, 0.0, 0.0}, 20000);
  // After temperature 0.5 the ratios are squared: 1, .25, .0625, .01.
  p.temperature = 0.5f;
  p.min_p = 0.2f;  // keeps 1 and .25
  CheckSampledFrequencies(logits, p, {0.8, 0.2, 0.0, 0.0}, 20000);
  p.min_p = 0.3f;  // keeps only the best
  CheckSampledFrequencies(logits, p, {1.0, 0.0, 0.0, 0.0}, 2000);
  // min_p 1 keeps the tokens tied with the best.
  SamplingParams one = Params(2.f, 4);
  one.min_p = 1.f;
  CheckSampledFrequencies({3.f, 1.f, 3.f}, one, {0.5, 0.0, 0.5}, 20000);
}

TEST_CASE("top_p takes its nucleus after min_p (vLLM V1's order)", "[sampler]") {
  // Weights 1, .5, .25, .1. min_p 0.2 keeps the first three (masses .571,
  // .286, .143 of what is kept); top_p 0.85 then reaches .857 with two.
  // (The other order, top_p over all four first, masses .541 .811 .946,
  // would keep three.)
  const std::vector<float> logits = {0.f, std::log(0.5f), std::log(0.25f), std::log(0.1f)};
  SamplingParams p = Params(1.f, 33);
  p.min_p = 0.2f;
  p.top_p = 0.85f;
  CheckSampledFrequencies(logits, p, {2.0 / 3, 1.0 / 3, 0.0, 0.0}, 20000);
}

TEST_CASE("Sample with every control picks the reference's token for every seed", "[sampler]") {
  const float ninf = -std::numeric_limits<float>::infinity();
  struct Controls {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    float presence;
    float frequency;
    bool bias;
  };
  const std::vector<Controls> all = {
      {0.f, 0, 1.f, 0.f, 0.5f, 0.25f, false}, {0.f, 0, 1.f, 0.1f, 2.f, 2.f, true},
      {0.f, 0, 1.f, 0.f, -1.f, 0.5f, true},   {1.f, 0, 1.f, 0.f, 1.f, 0.f, false},
      {1.f, 0, 1.f, 0.f, 0.f, 1.f, false},    {0.7f, 0, 1.f, 0.05f, 0.f, 0.f, false},
      {1.f, 0, 1.f, 0.f, 0.f, 0.f, true},     {0.8f, 20, 0.9f, 0.02f, 0.6f, 0.3f, true},
      {1.5f, 0, 0.95f, 0.1f, -0.5f, 1.2f, true}, {1.f, 5, 1.f, 0.5f, 2.f, -2.f, true},
      {3.f, 0, 0.5f, 0.f, 0.f, 2.f, false},   {1.f, 0, 1.f, 1.f, 0.4f, 0.4f, true},
  };
  for (size_t vocab : {7, 260, 5000}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      for (size_t c = 0; c < all.size(); ++c) {
        const Controls& k = all[c];
        SamplingParams p = Params(k.temperature, seed * 100 + c);
        p.top_k = k.top_k;
        p.top_p = k.top_p;
        p.min_p = k.min_p;
        p.presence_penalty = k.presence;
        p.frequency_penalty = k.frequency;
        if (k.bias) {
          std::mt19937 gen(seed + 7 * c);
          for (int i = 0; i < 6; ++i) {
            p.logit_bias[static_cast<int32_t>(gen() % vocab)] =
                std::uniform_real_distribution<float>(-10.f, 10.f)(gen);
          }
        }
        REQUIRE(drt::ValidateSamplingParams(p).ok());
        Sampler fast(p);
        ReferenceSampler ref(p);
        std::vector<int32_t> got, want;
        // New logits each step (as a model gives), some masked and tied,
        // with a small spread so that penalties change the choice.
        for (int step = 0; step < 40; ++step) {
          std::vector<float> logits =
              RandomLogits(vocab, seed * 7919 + static_cast<uint32_t>(step * 31 + vocab), 0.7f);
          if (seed == 3) {
            for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::round(logits[i] * 4.f) / 4.f;
            for (size_t i = 2; i < logits.size(); i += 5) logits[i] = ninf;
          }
          got.push_back(*fast.Sample(logits));
          want.push_back(ref.Sample(logits));
        }
        INFO("vocab " << vocab << " seed " << seed << " controls " << c);
        CHECK(got == want);
      }
    }
  }
}

TEST_CASE("Zero penalties and a zero bias draw the plain sampler's tokens", "[sampler]") {
  // The adjusted path (a bias present, even 0) must not perturb a draw; the
  // plain path is the one the naive full-sort comparison in sampler_test.cc
  // pins to the sampler before these controls.
  for (float temperature : {0.f, 0.6f, 1.f}) {
    SamplingParams plain = Params(temperature, 77);
    plain.top_k = 30;
    plain.top_p = 0.9f;
    SamplingParams zero_bias = plain;
    zero_bias.logit_bias = {{4, 0.f}};
    Sampler a(plain), b(zero_bias);
    const auto logits = RandomLogits(300, 12, 1.5f);
    INFO("T=" << temperature);
    CHECK(Draw(a, logits, 300) == Draw(b, logits, 300));
  }
}

TEST_CASE("Sampling controls are validated by name", "[sampler]") {
  auto expect_bad = [](const SamplingParams& p, const std::string& words) {
    const absl::Status s = drt::ValidateSamplingParams(p);
    INFO(words << ": " << s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find(words) != std::string::npos);
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  SamplingParams ok = Params(1.f);
  ok.min_p = 1.f;
  ok.presence_penalty = -2.f;
  ok.frequency_penalty = 2.f;
  ok.logit_bias = {{0, -100.f}, {5, 100.f}};
  CHECK(drt::ValidateSamplingParams(ok).ok());
  for (float bad : {-0.01f, 1.01f, nan, inf}) {
    SamplingParams p = ok;
    p.min_p = bad;
    expect_bad(p, "min_p");
  }
  for (float bad : {-2.01f, 2.01f, nan, -inf}) {
    SamplingParams p = ok;
    p.presence_penalty = bad;
    expect_bad(p, "presence_penalty");
    p = ok;
    p.frequency_penalty = bad;
    expect_bad(p, "frequency_penalty");
  }
  for (float bad : {-100.5f, 101.f, nan, inf}) {
    SamplingParams p = ok;
    p.logit_bias[7] = bad;
    expect_bad(p, "logit_bias for token 7");
  }
  SamplingParams negative = ok;
  negative.logit_bias[-3] = 1.f;
  expect_bad(negative, "logit_bias names token -3");
  SamplingParams many = ok;
  many.logit_bias.clear();
  for (int32_t i = 0; i < drt::kMaxLogitBiasEntries; ++i) many.logit_bias[i] = 1.f;
  CHECK(drt::ValidateSamplingParams(many).ok());
  many.logit_bias[drt::kMaxLogitBiasEntries] = 1.f;
  expect_bad(many, "logit_bias has 301 entries; at most 300");

  // Ids against a vocabulary of 260 whose landmark is 256 and pad 257.
  auto ids = [](std::map<int32_t, float> bias) {
    SamplingParams p;
    p.logit_bias = std::move(bias);
    return drt::ValidateLogitBiasIds(p, 260, 256, 257);
  };
  CHECK(ids({{0, 1.f}, {255, -1.f}, {258, 2.f}, {259, 3.f}}).ok());
  const auto expect_id = [](const absl::Status& s, const std::string& words) {
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find(words) != std::string::npos);
  };
  expect_id(ids({{0, 1.f}, {260, 1.f}}), "logit_bias names token 260, outside the vocabulary [0, 260)");
  expect_id(ids({{-1, 1.f}}), "logit_bias names token -1, outside");
  expect_id(ids({{256, 1.f}}), "logit_bias names token 256, the landmark (chunk) id");
  expect_id(ids({{257, -5.f}}), "logit_bias names token 257, the pad id");
}

TEST_CASE("A logit_bias id outside the logits is refused, drawing nothing", "[sampler]") {
  SamplingParams p = Params(1.f, 9);
  p.frequency_penalty = 0.5f;
  p.logit_bias = {{3, 1.f}};
  const auto logits = RandomLogits(10, 4, 1.f);
  Sampler fresh(p), refused(p);
  const auto got = refused.Sample(std::vector<float>{0.f, 1.f});
  REQUIRE(got.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(got.status().message()).find("logit_bias names token 3; there are 2 logits") !=
        std::string::npos);
  CHECK(Draw(refused, logits, 50) == Draw(fresh, logits, 50));
}
