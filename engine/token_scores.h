// Scores of the tokens a client sends (prompt logprobs, perplexity): each
// token's log-probability under the model given the tokens before it, and
// optionally its top alternatives, as vLLM's prompt_logprobs and OpenAI's
// echo + logprobs give them. Computed piece by piece from the logits of one
// engine step at a time, so a scored append of any length holds one piece's
// logits, never a vocabulary's worth per token (docs/engine.md, "Scoring
// appended tokens").
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/top_logprobs.h"

namespace drt {

struct TokenScore {
  int32_t token = 0;
  // False when no logits precede the token: the first token of an empty
  // session, or of an append to a session whose state is not whole
  // (Session::CheckStateWhole). OpenAI gives null there; logprob is 0 and
  // top empty then.
  bool scored = false;
  // log-softmax at temperature 1 of the logits of the position before the
  // token, at the token (Sampler::LogProb, bit for bit); -inf for a token
  // the model gives probability 0.
  float logprob = 0.f;
  // Its top_logprobs most likely alternatives there (TopLogProbs: never the
  // landmark or pad id), best first.
  std::vector<TokenLogProb> top;
};

// Turns a stream of (token, logits row after it) into TokenScores: the row
// after token i scores token i + 1, so one row is carried from one piece to
// the next. Also keeps the running count and sum for perplexity
// (exp(-sum / count) over the scored tokens).
class TokenScorer {
 public:
  // `before`: the logits of the position before the first token (empty:
  // there are none, so the first token is not scored). `unlisted`: ids
  // never listed as alternatives (the landmark and pad ids).
  // INVALID_ARGUMENT for top_logprobs outside [0, kMaxTopLogprobs].
  static absl::StatusOr<TokenScorer> Create(int32_t top_logprobs, absl::Span<const float> before,
                                            std::vector<int32_t> unlisted);

  // Scores `tokens`, whose logits are `logits` (tokens.size() rows of
  // `vocab`: row i the logits after token i), appending to `out`, and keeps
  // the last row for the next call. INVALID_ARGUMENT when the sizes do not
  // match; INTERNAL naming the token when its preceding logits cannot be
  // normalised (NaN or +inf: CheckSamplableLogits), with the tokens before
  // it in `out`.
  absl::Status Score(absl::Span<const int32_t> tokens, absl::Span<const float> logits,
                     int64_t vocab, std::vector<TokenScore>* out);

  int64_t scored_tokens() const { return scored_tokens_; }
  double logprob_sum() const { return logprob_sum_; }
  int64_t tokens_seen() const { return tokens_seen_; }

 private:
  TokenScorer(int32_t top_logprobs, std::vector<float> before, std::vector<int32_t> unlisted)
      : top_logprobs_(top_logprobs), previous_(std::move(before)), unlisted_(std::move(unlisted)) {}

  int32_t top_logprobs_ = 0;
  std::vector<float> previous_;  // the row before the next token; empty: none
  std::vector<int32_t> unlisted_;
  int64_t scored_tokens_ = 0;
  double logprob_sum_ = 0.0;
  int64_t tokens_seen_ = 0;
};

}  // namespace drt
