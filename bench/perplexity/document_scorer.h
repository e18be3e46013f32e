// drt-ppl's scoring loop: a document appended to a session piece by piece,
// each piece a scored Session::Append (AppendOptions::score,
// engine/token_scores.h, the server's prompt logprobs), so each token gets
// the log-probability the model gave it from the tokens before it
// (Sampler::LogProb's value: temperature 1, over the whole vocabulary as the
// model outputs it). The engine holds one step's logits at a time.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/session.h"

namespace drt::ppl {

struct ScoreCallbacks {
  // Called for every token but the first (which has nothing before it):
  // its position in `tokens` and -log p(token | tokens before it), nats.
  std::function<void(int64_t position, double nll)> on_scored;
  // Called after each piece with the tokens appended so far (progress).
  std::function<void(int64_t tokens_done)> on_piece;
};

// Appends `tokens` to `session`, which must hold no tokens yet (positions
// count from the document's start), in pieces of `piece` tokens.
// INVALID_ARGUMENT, before appending anything, for piece < 1 or tokens the
// session refuses (Session::ValidateTokens); FAILED_PRECONDITION for a
// session that holds tokens; an Append's error (a scoring failure among them) (naming the
// position) otherwise.
absl::Status ScoreTokens(Session& session, absl::Span<const int32_t> tokens, int64_t piece,
                         const ScoreCallbacks& callbacks);

}  // namespace drt::ppl
