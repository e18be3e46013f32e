#include "engine/token_scores.h"

#include "absl/strings/str_format.h"
#include "engine/sampler.h"

namespace drt {

absl::StatusOr<TokenScorer> TokenScorer::Create(int32_t top_logprobs,
                                                absl::Span<const float> before,
                                                std::vector<int32_t> unlisted) {
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt_logprobs must be in [0, %d], got %d", kMaxTopLogprobs, top_logprobs));
  }
  return TokenScorer(top_logprobs, std::vector<float>(before.begin(), before.end()),
                     std::move(unlisted));
}

absl::Status TokenScorer::Score(absl::Span<const int32_t> tokens, absl::Span<const float> logits,
                                int64_t vocab, std::vector<TokenScore>* out) {
  if (vocab <= 0 || logits.size() != tokens.size() * static_cast<size_t>(vocab)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "scoring %d tokens needs %d x %d logits, got %d", tokens.size(), tokens.size(), vocab,
        logits.size()));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    const absl::Span<const float> before =
        i == 0 ? absl::Span<const float>(previous_) : logits.subspan((i - 1) * vocab, vocab);
    TokenScore score;
    score.token = tokens[i];
    if (!before.empty()) {
      absl::StatusOr<float> logprob = Sampler::LogProb(before, tokens[i]);
      absl::StatusOr<std::vector<TokenLogProb>> top =
          logprob.ok() ? TopLogProbs(before, top_logprobs_, unlisted_)
                       : absl::StatusOr<std::vector<TokenLogProb>>(logprob.status());
      if (!top.ok()) {
        return absl::InternalError(absl::StrFormat(
            "the logits before token %d of the scored tokens cannot be normalised: %s",
            tokens_seen_, top.status().message()));
      }
      score.scored = true;
      score.logprob = *logprob;
      score.top = *std::move(top);
      ++scored_tokens_;
      logprob_sum_ += *logprob;
    }
    out->push_back(std::move(score));
    ++tokens_seen_;
  }
  if (!tokens.empty()) {
    previous_.assign(logits.end() - vocab, logits.end());
  }
  return absl::OkStatus();
}

}  // namespace drt
