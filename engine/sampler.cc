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
  if (!(params.min_p >= 0.f && params.min_p <= 1.f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("min_p must be in [0, 1] (0 disables it), got %g", params.min_p));
  }
  if (!(params.presence_penalty >= -kMaxPenalty && params.presence_penalty <= kMaxPenalty)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "presence_penalty must be in [-2, 2], got %g", params.presence_penalty));
  }
  if (!(params.frequency_penalty >= -kMaxPenalty && params.frequency_penalty <= kMaxPenalty)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "frequency_penalty must be in [-2, 2], got %g", params.frequency_penalty));
  }
  if (params.logit_bias.size() > static_cast<size_t>(kMaxLogitBiasEntries)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("logit_bias has %d entries; at most %d are allowed (OpenAI's limit)",
                        params.logit_bias.size(), kMaxLogitBiasEntries));
  }
  for (const auto& [id, bias] : params.logit_bias) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("logit_bias names token %d; token ids are >= 0", id));
    }
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit_bias for token %d must be in [-100, 100], got %g", id, bias));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateLogitBiasIds(const SamplingParams& params, int64_t vocab_size,
                                  int64_t chunk_id, int64_t pad_id) {
  for (const auto& [id, bias] : params.logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit_bias names token %d, outside the vocabulary [0, %d)", id, vocab_size));
    }
    if (id == chunk_id || id == pad_id) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit_bias names token %d, the %s id, which is never sampled", id,
          id == chunk_id ? "landmark (chunk)" : "pad"));
    }
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

bool Sampler::Penalises() const {
  return params_.presence_penalty != 0.f || params_.frequency_penalty != 0.f;
}

bool Sampler::Adjusts() const { return Penalises() || !params_.logit_bias.empty(); }

int32_t Sampler::Count(int32_t id) const {
  const auto it = counts_.find(id);
  return it == counts_.end() ? 0 : it->second;
}

absl::StatusOr<int32_t> Sampler::Sample(absl::Span<const float> logits) {
  if (absl::Status s = CheckSamplableLogits(logits); !s.ok()) return s;
  int32_t token = 0;
  if (!Adjusts()) {
    // Without bias or penalties the logits are sampled as given (the same
    // tokens as before these options existed, for every seed).
    token = Choose(logits);
  } else {
    const int64_t n = static_cast<int64_t>(logits.size());
    for (const auto& [id, bias] : params_.logit_bias) {
      if (id < 0 || id >= n) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "logit_bias names token %d; there are %d logits", id, n));
      }
    }
    adjusted_.assign(logits.begin(), logits.end());
    for (const auto& [id, bias] : params_.logit_bias) adjusted_[id] += bias;
    for (const auto& [id, count] : counts_) {
      if (id >= n) continue;  // not a logit of this call (the logits shrank)
      adjusted_[id] -= params_.presence_penalty * (count > 0 ? 1.f : 0.f) +
                       params_.frequency_penalty * static_cast<float>(count);
    }
    // -inf stays -inf under any bias or penalty; only a logit near FLT_MAX
    // could overflow here, and that is refused as a forward's would be.
    if (absl::Status s = CheckSamplableLogits(adjusted_); !s.ok()) return s;
    token = Choose(adjusted_);
  }
  if (Penalises()) ++counts_[token];
  return token;
}

int32_t Sampler::Choose(absl::Span<const float> logits) {
  const int32_t n = static_cast<int32_t>(logits.size());
  if (params_.temperature == 0.f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Candidates sorted by logit, best first (lower index wins ties). The
  // weights below are summed in this order, so with top_k 0 the whole
  // vocabulary is ordered (LogitOrder: a radix sort, not a comparison sort).
  int32_t keep_k = params_.top_k > 0 ? std::min(params_.top_k, n) : n;
  const absl::Span<const int32_t> order = order_.Best(logits, keep_k);
  std::vector<double>& probs = probs_;
  probs.resize(keep_k);
  const double best = logits[order[0]];
  double sum = 0.0;
  for (int32_t i = 0; i < keep_k; ++i) {
    probs[i] = std::exp((logits[order[i]] - best) / params_.temperature);
    sum += probs[i];
  }
  // min_p: a weight is the probability relative to the best candidate's
  // (probs[0] is exp(0) = 1), so the tokens it keeps are a prefix of the
  // order, the same prefix whether it runs before top_k (vLLM V1's order)
  // or after; top_p then takes its nucleus of what min_p and top_k left.
  if (params_.min_p > 0.f) {
    int32_t kept = 1;
    while (kept < keep_k && probs[kept] >= params_.min_p) ++kept;
    if (kept < keep_k) {
      keep_k = kept;
      sum = 0.0;
      for (int32_t i = 0; i < keep_k; ++i) sum += probs[i];
    }
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
