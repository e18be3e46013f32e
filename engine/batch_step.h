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
  // Real tokens the caller appends to this session right after this entry,
  // before anything reads its logits or state (Session::Append's later
  // pieces). RunStep counts them to the end of the entry, so more of its
  // rows may skip the upper layers, and may compute no logits for it
  // (RunStepSkipsLastLogits); until they are appended, the session's
  // last_logits() and upper-layer state are not its own. 0: the entry's
  // tokens end what the caller appends.
  int64_t tokens_following = 0;
};

// Runs one step. Returns one status per entry, in order:
// - an entry whose tokens Session::ValidateTokens refuses, that has no
//   tokens, or whose session is already in an earlier entry gets
//   INVALID_ARGUMENT and is left out, unchanged; the others run;
// - an entry whose session Backend::PrepareSessionForStep refuses when a
//   forward is formed (the CUDA device tier's chunk store finding no room
//   to grow, a CUDA session that failed earlier) gets that error and is
//   left out of that forward and the later ones, its session unchanged by
//   them; the others run as in a step without it;
// - a backend failure fails every entry of the forward that failed (on the
//   CUDA backend their sessions are then unusable, as after a failed
//   Forward); entries not in that forward go on.
// Any number of tokens is accepted; the backend bounds the memory of one
// forward by its step size (Backend::max_step_positions), running several
// forwards when the entries hold more positions than that: each forward
// takes the entries in order, each with as many of its remaining tokens as
// still fit. Tokens of an earlier forward stay applied if a later one fails.
//
// Where the backend runs lower-only forwards (Backend::runs_lower_only_
// forwards), a forward whose every slice lies more than
// Backend::upper_layer_reach() positions before the end of its entry (its
// tokens_following counted) runs lower-only: the state the step leaves is
// the same, bit for bit, as the forwards are cut the same way either way
// (engine/model_rules.h, UpperLayerReach). Never for an entry that asks for
// all logits, nor a session with a retrieval observer.
//
// Where the backend also runs mixed lower-only forwards
// (Backend::runs_mixed_lower_only_forwards), each slice that lies in those
// rows runs lower-only by itself, also beside slices that run every layer
// (a decode row): the lower-only slices go last in the forward, and the
// upper layers run over the rows before them. The rows that run the upper
// layers then share their GEMMs with fewer rows than without it, so their
// results may differ from those of a step without the skipping in the last
// bits (docs/batching.md, "Lower-only slices in mixed steps"). And an entry
// with tokens following gets no logits at all (RunStepSkipsLastLogits).
std::vector<absl::Status> RunStep(Backend& backend, absl::Span<const StepEntry> entries);

// Whether RunStep computes no logits for `entry`: on a backend that runs
// mixed lower-only forwards, for an entry with tokens_following > 0 that
// does not ask for all logits (nobody reads them before the following
// tokens replace them). Its session's last_logits() are then stale until a
// step without tokens following, like its upper-layer state after rows
// that skipped the upper layers; a caller that may stop before appending
// the following tokens must run a closing piece (server/scheduler.h).
bool RunStepSkipsLastLogits(const Backend& backend, const StepEntry& entry);

}  // namespace drt
