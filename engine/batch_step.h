// One engine step over several sessions (continuous batching, issue 11):
// the tokens of every entry go through the backend together, so that the
// weights are read once per step instead of once per session.
//
// This is the engine API the server's scheduler calls. Session::Append and
// Session::GenerateStep are single-entry uses of it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/session.h"

namespace drt {

struct StepEntry {
  Session* session = nullptr;        // each session at most once per step
  absl::Span<const int32_t> tokens;  // real tokens appended to it; at least one
  bool allow_pad = false;            // accept pad_id (the engine's own padding)
  // When set, the logits of every token of this entry are appended here
  // (tokens x vocab). The last token's logits always become the session's
  // last_logits().
  std::vector<float>* all_logits = nullptr;
};

// Runs one step. Returns one status per entry, in order:
// - an entry whose tokens Session::ValidateTokens refuses, that has no
//   tokens, or whose session is already in an earlier entry gets
//   INVALID_ARGUMENT and is left out, unchanged; the others run;
// - a backend failure fails every entry of the forward that failed (on the
//   CUDA backend their sessions are then unusable, as after a failed
//   Forward); entries not in that forward go on.
// Any number of tokens is accepted; the backend bounds the memory of one
// forward by its step size (Backend::max_step_positions), running several
// forwards when the entries hold more positions than that: each forward
// takes the entries in order, each with as many of its remaining tokens as
// still fit. Tokens of an earlier forward stay applied if a later one fails.
std::vector<absl::Status> RunStep(Backend& backend, absl::Span<const StepEntry> entries);

}  // namespace drt
