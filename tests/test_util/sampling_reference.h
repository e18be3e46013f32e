// Independent references for the sampler's tests: a brute-force top-N
// ranking with log-softmax in long double, and a frequency check of many
// draws against the probabilities a test derived by hand or from the rule.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/types/span.h"
#include "engine/sampler.h"

namespace drt::testing {

struct RankedLogProbs {
  std::vector<int32_t> ids;
  std::vector<long double> logprobs;
};

// The n most likely ids of `logits` by a stable sort (ties to the lower
// id), never a -inf one nor one of `unlisted`, each with its log-softmax
// over the whole row (unlisted ids included), in long double.
inline RankedLogProbs BruteForceTopLogProbs(absl::Span<const float> logits, int32_t n,
                                            absl::Span<const int32_t> unlisted) {
  long double max = -INFINITY;
  for (float l : logits) max = std::max<long double>(max, l);
  long double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<long double>(l) - max);
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] == -std::numeric_limits<float>::infinity()) continue;
    if (std::find(unlisted.begin(), unlisted.end(), i) != unlisted.end()) continue;
    ids.push_back(i);
  }
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (static_cast<int32_t>(ids.size()) > n) ids.resize(std::max(n, 0));
  RankedLogProbs ranked{ids, {}};
  for (int32_t id : ids) ranked.logprobs.push_back(logits[id] - max - std::log(sum));
  return ranked;
}

// Draws `draws` samples with a Sampler of `params` and checks each token's
// frequency against `want` within 5 standard deviations of a binomial
// count (and exactly zero where want is zero); every draw must be an id of
// `logits`.
inline void CheckSampledFrequencies(const std::vector<float>& logits, const SamplingParams& params,
                                    const std::vector<double>& want, int draws) {
  Sampler sampler(params);
  std::vector<int> counts(logits.size(), 0);
  int out_of_range = 0;
  for (int i = 0; i < draws; ++i) {
    const int32_t t = *sampler.Sample(logits);
    if (t < 0 || t >= static_cast<int32_t>(logits.size())) {
      ++out_of_range;
    } else {
      ++counts[t];
    }
  }
  REQUIRE(out_of_range == 0);
  for (size_t i = 0; i < logits.size(); ++i) {
    const double freq = double(counts[i]) / draws;
    const double sd = std::sqrt(want[i] * (1.0 - want[i]) / draws);
    INFO("token " << i << ": frequency " << freq << ", probability " << want[i]
                  << " (T=" << params.temperature << " top_k=" << params.top_k
                  << " top_p=" << params.top_p << " min_p=" << params.min_p << ")");
    if (want[i] == 0.0) {
      CHECK(counts[i] == 0);
    } else {
      CHECK(std::fabs(freq - want[i]) <= 5.0 * sd);
    }
  }
}

}  // namespace drt::testing
