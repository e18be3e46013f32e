// The N most likely tokens of a logit row with their log-probabilities, for
// the "top alternatives" that vLLM's and llama.cpp's servers return beside
// each generated token (drt.v1 GenerateRequest.top_logprobs; the OpenAI
// API's `logprobs`). Kept apart from the sampler: it chooses nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace drt {

// The most alternatives one token may list: vLLM's default max_logprobs.
// (OpenAI's completions API allows 5; server/openai_api.cc says which it takes.)
constexpr int32_t kMaxTopLogprobs = 20;

struct TokenLogProb {
  int32_t token;
  float logprob;  // log-softmax at temperature 1
};

// The `n` best tokens of `logits`, best first: a larger logit first, equal
// logits by the lower id; -inf logits and the ids in `unlisted` (the
// landmark and pad ids, which a session never emits) are never listed, so
// fewer than `n` come back when fewer are listable. Log-probabilities are of
// the whole row at temperature 1 (`unlisted` ids count in the normaliser),
// computed as Sampler::LogProb computes them, so a token's entry here equals
// its Sampler::LogProb bit for bit. One pass keeps the best `n` (a sorted
// array of at most kMaxTopLogprobs, no sort of the row) and finds the
// maximum; a second sums the exponentials (the sum needs the maximum).
// INVALID_ARGUMENT for `n` outside [0, kMaxTopLogprobs], and
// CheckSamplableLogits's error for logits it refuses (NaN, +inf, all -inf).
absl::StatusOr<std::vector<TokenLogProb>> TopLogProbs(absl::Span<const float> logits, int32_t n,
                                                      absl::Span<const int32_t> unlisted = {});

}  // namespace drt
