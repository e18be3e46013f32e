// drt-ppl --context N: a document scored with the model's view cut to N
// tokens (llama-perplexity's -c), the baseline that says what the context
// past N adds. The document is cut into consecutive windows [0, N), [N, 2N),
// ..., each appended (ScoreTokens) to a fresh session, so a token is scored
// from the tokens before it in its own window only, and each window's first
// token, with nothing before it, is not scored (as the document's first is
// not). Unlike llama-perplexity, which scores only the second half of each
// window, every other token of a window is scored: a token at offset j of
// its window has j tokens of context.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bench/perplexity/document_scorer.h"
#include "engine/backend.h"

namespace drt::ppl {

struct WindowsScored {
  int64_t windows = 0;     // sessions used
  int64_t retrievals = 0;  // chunk retrievals of all of them
};

// INVALID_ARGUMENT naming --context unless it is 0 or at least 2.
absl::Status CheckContext(int64_t context);

// Scores `tokens` in windows of `context` tokens (0: one window, the whole
// document), each a fresh Session of `backend` fed in pieces of `piece`.
// on_scored gets positions in the document (window start + offset), on_piece
// the document's tokens done. INVALID_ARGUMENT, before anything runs, for a
// context of 1 (nothing would be scored) or below 0, a piece below 1, or
// tokens a session refuses; a session's or an Append's error otherwise.
absl::StatusOr<WindowsScored> ScoreInWindows(Backend& backend, absl::Span<const int32_t> tokens,
                                             int64_t context, int64_t piece,
                                             const ScoreCallbacks& callbacks);

}  // namespace drt::ppl
