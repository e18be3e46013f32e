// Choosing the next token from logits: greedy, or temperature / top-k /
// top-p sampling with a seeded generator (reproducible for a given seed).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/logit_order.h"

namespace drt {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy
  int32_t top_k = 0;        // 0: no limit
  float top_p = 1.f;        // 1: no limit
  uint64_t seed = 0;
};

// INVALID_ARGUMENT naming the bad field.
absl::Status ValidateSamplingParams(const SamplingParams& params);

// Logits the sampler accepts: finite values and -inf (a token that cannot be
// chosen, as Session masks the landmark and pad ids), at least one of them
// finite. NaN or +inf (a forward pass that overflowed, or damaged input)
// orders nothing, so it is refused: INVALID_ARGUMENT naming the first such
// logit, or saying that every logit is -inf (docs/engine.md, "Sampling").
absl::Status CheckSamplableLogits(absl::Span<const float> logits);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  // Index of the chosen logit; ties in greedy go to the lowest index; a -inf
  // logit is never chosen. CheckSamplableLogits's error, drawing nothing,
  // for logits it refuses.
  absl::StatusOr<int32_t> Sample(absl::Span<const float> logits);
  // log-softmax of logits at `index`, at temperature 1 (-inf for a -inf
  // logit). CheckSamplableLogits's error for logits it refuses, and
  // INVALID_ARGUMENT for an index outside them.
  static absl::StatusOr<float> LogProb(absl::Span<const float> logits, int32_t index);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  // Scratch kept between calls (a vocabulary's worth each).
  LogitOrder order_;
  std::vector<double> probs_;
};

}  // namespace drt
