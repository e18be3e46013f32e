#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_format.h"

namespace drt {

absl::Status ValidateSamplingParams(const SamplingParams& params) {
  if (!(params.temperature >= 0.f) || !std::isfinite(params.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("temperature must be a finite number >= 0, got %g", params.temperature));
  }
  if (params.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_k must be >= 0 (0 disables it), got %d", params.top_k));
  }
  if (!(params.top_p > 0.f && params.top_p <= 1.f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_p must be in (0, 1], got %g", params.top_p));
  }
  return absl::OkStatus();
}

int32_t Sampler::Sample(absl::Span<const float> logits) {
  const int32_t n = static_cast<int32_t>(logits.size());
  if (params_.temperature == 0.f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Candidates sorted by logit, best first (stable: lower index wins ties).
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const int32_t keep_k = params_.top_k > 0 ? std::min(params_.top_k, n) : n;
  std::partial_sort(order.begin(), order.begin() + keep_k, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  order.resize(keep_k);
  std::vector<double> probs(keep_k);
  const double best = logits[order[0]];
  double sum = 0.0;
  for (int32_t i = 0; i < keep_k; ++i) {
    probs[i] = std::exp((logits[order[i]] - best) / params_.temperature);
    sum += probs[i];
  }
  // Nucleus: the smallest prefix whose mass reaches top_p.
  int32_t keep = keep_k;
  if (params_.top_p < 1.f) {
    double mass = 0.0;
    for (int32_t i = 0; i < keep_k; ++i) {
      mass += probs[i] / sum;
      if (mass >= params_.top_p) {
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
  return order[keep - 1];
}

float Sampler::LogProb(absl::Span<const float> logits, int32_t index) {
  const float best = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - best);
  return static_cast<float>(logits[index] - best - std::log(sum));
}

}  // namespace drt
