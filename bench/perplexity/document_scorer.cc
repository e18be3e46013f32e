#include "bench/perplexity/document_scorer.h"

#include <algorithm>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "engine/sampler.h"

namespace drt::ppl {

absl::Status ScoreTokens(Session& session, absl::Span<const int32_t> tokens, int64_t piece,
                         const ScoreCallbacks& callbacks) {
  if (piece < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("--piece must be at least 1, got %d", piece));
  }
  if (session.num_tokens() != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "scoring needs an empty session; this one holds %d tokens", session.num_tokens()));
  }
  // Checked whole first, so that a bad id late in the document fails before
  // minutes of appending.
  if (absl::Status s = session.ValidateTokens(tokens); !s.ok()) return s;

  const int64_t vocab = session.config().vocab_size;
  AppendOptions options;
  options.all_logits = true;
  // The row that predicts the next piece's first token: the last row of the
  // piece before (empty before the first piece: the first token is unscored).
  std::vector<float> carried;
  const int64_t total = static_cast<int64_t>(tokens.size());
  for (int64_t at = 0; at < total; at += piece) {
    const int64_t n = std::min(piece, total - at);
    absl::StatusOr<AppendResult> appended = session.Append(tokens.subspan(at, n), options);
    if (!appended.ok()) return appended.status();
    const std::vector<float>& logits = appended->logits;
    if (appended->tokens_accepted != n || static_cast<int64_t>(logits.size()) != n * vocab) {
      return absl::InternalError(absl::StrFormat(
          "Append at token %d accepted %d of %d tokens with %d logits (expected %d)", at,
          appended->tokens_accepted, n, logits.size(), n * vocab));
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t position = at + j;
      if (position == 0) continue;
      absl::Span<const float> row =
          j == 0 ? absl::MakeConstSpan(carried)
                 : absl::MakeConstSpan(logits).subspan((j - 1) * vocab, vocab);
      absl::StatusOr<float> logprob = Sampler::LogProb(row, tokens[position]);
      if (!logprob.ok()) {
        return absl::InternalError(absl::StrFormat("scoring the token at position %d: %s",
                                                   position, logprob.status().message()));
      }
      if (callbacks.on_scored) callbacks.on_scored(position, -static_cast<double>(*logprob));
    }
    carried.assign(logits.end() - vocab, logits.end());
    if (callbacks.on_piece) callbacks.on_piece(at + n);
  }
  return absl::OkStatus();
}

}  // namespace drt::ppl
