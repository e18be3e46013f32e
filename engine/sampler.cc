#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
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

absl::Status CheckSamplableLogits(absl::Span<const float> logits) {
  if (logits.empty()) return absl::InvalidArgumentError("no logits to sample from");
  bool any_finite = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float l = logits[i];
    if (std::isnan(l) || l == std::numeric_limits<float>::infinity()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit %d of %d is %s; sampling needs finite logits (-inf marks a token that cannot "
          "be chosen)",
          i, logits.size(), std::isnan(l) ? "NaN" : "+inf"));
    }
    any_finite = any_finite || std::isfinite(l);
  }
  if (!any_finite) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "all %d logits are -inf: no token can be chosen", logits.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> Sampler::Sample(absl::Span<const float> logits) {
  if (absl::Status s = CheckSamplableLogits(logits); !s.ok()) return s;
  const int32_t n = static_cast<int32_t>(logits.size());
  if (params_.temperature == 0.f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Candidates sorted by logit, best first (lower index wins ties). The
  // weights below are summed in this order, so with top_k 0 the whole
  // vocabulary is ordered (LogitOrder: a radix sort, not a comparison sort).
  const int32_t keep_k = params_.top_k > 0 ? std::min(params_.top_k, n) : n;
  const absl::Span<const int32_t> order = order_.Best(logits, keep_k);
  std::vector<double>& probs = probs_;
  probs.resize(keep_k);
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
  // Unreachable (acc ends at total > u, summed in the same order), but
  // never hand out a token of probability zero (a -inf logit).
  int32_t last = keep - 1;
  while (last > 0 && probs[last] == 0.0) --last;
  return order[last];
}

absl::StatusOr<float> Sampler::LogProb(absl::Span<const float> logits, int32_t index) {
  if (absl::Status s = CheckSamplableLogits(logits); !s.ok()) return s;
  if (index < 0 || static_cast<size_t>(index) >= logits.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("log-probability of token %d asked; there are %d logits", index,
                        logits.size()));
  }
  const float best = *std::max_element(logits.begin(), logits.end());  // finite
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - best);
  return static_cast<float>(logits[index] - best - std::log(sum));
}

}  // namespace drt
