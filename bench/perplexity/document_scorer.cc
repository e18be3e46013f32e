#include "bench/perplexity/document_scorer.h"

#include <algorithm>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "engine/token_scores.h"

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

  // Each piece is one scored Append (engine/token_scores.h): its first token
  // is scored from the session's last logits, the last row of the piece
  // before, so only the document's first token goes unscored.
  AppendOptions options;
  options.score = true;
  const int64_t total = static_cast<int64_t>(tokens.size());
  for (int64_t at = 0; at < total; at += piece) {
    const int64_t n = std::min(piece, total - at);
    int64_t next = at;  // the document position of the next score delivered
    absl::Status unscored = absl::OkStatus();
    options.on_scores = [&](absl::Span<const TokenScore> scores) {
      for (const TokenScore& score : scores) {
        const int64_t position = next++;
        if (!score.scored) {
          if (position != 0 && unscored.ok()) {
            unscored = absl::InternalError(
                absl::StrFormat("the token at position %d has no logits before it", position));
          }
          continue;
        }
        if (callbacks.on_scored) callbacks.on_scored(position, -static_cast<double>(score.logprob));
      }
    };
    absl::StatusOr<AppendResult> appended = session.Append(tokens.subspan(at, n), options);
    if (!appended.ok()) return appended.status();
    if (!unscored.ok()) return unscored;
    if (appended->tokens_accepted != n || next != at + n) {
      return absl::InternalError(absl::StrFormat(
          "Append at token %d accepted %d of %d tokens with %d scores", at,
          appended->tokens_accepted, n, next - at));
    }
    if (callbacks.on_piece) callbacks.on_piece(at + n);
  }
  return absl::OkStatus();
}

}  // namespace drt::ppl
