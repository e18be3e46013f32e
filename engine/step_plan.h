// The host-side plan of one forward over several sessions (issue 11): which
// sessions and positions take part, where the landmark rows are and which
// chunk each closes, which selection serves each run of rows, and which rows
// need logits. It is computed once here; backends only execute the ops of
// engine/forward_pass.h over it.
//
// The rows of a forward are one matrix: the slices of the sessions one after
// another. Each slice holds its session's new real tokens with a landmark
// inserted after every enc_chunk_size real tokens (drt-model.md, Forward
// pass 1).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model_config.h"

namespace drt {

// What one session brings to a forward.
struct SliceRequest {
  int64_t position = 0;    // decoder positions it has processed (landmarks included)
  int64_t num_tokens = 0;  // real tokens it holds
  absl::Span<const int32_t> tokens;  // new real tokens (already validated); at least one
  bool all_logits = false;           // logits of every new token, else of the last only
  // Whether the last token's logits are wanted (when not all_logits): a
  // piece with tokens following needs none (its session's last logits are
  // stale until they are appended, engine/batch_step.h).
  bool last_logits = true;
  // The slice runs the embedding, the lower layers and the chunk encoder
  // only (SlicePlan::lower_only). Lower-only requests come after every
  // other request of the forward.
  bool lower_only = false;
};

// A landmark row of the step and the chunk it closes.
struct PlannedLandmark {
  int64_t row = 0;
  int64_t chunk = 0;
};

// A run of consecutive rows of one slice inside one chunk: they share a
// selection in every group (drt-model.md, Forward pass 5: the selection made
// at chunk t's landmark serves every position of chunk t + 1).
struct GcaRun {
  static constexpr int64_t kInForce = -1;
  int64_t first_row = 0;
  int64_t num_rows = 0;
  int64_t chunk = 0;  // the chunk its positions lie in
  // kInForce: the selection in force before the step; otherwise the index in
  // SlicePlan::landmarks of the landmark of this step whose selection serves
  // it (the one closing chunk - 1).
  int64_t made_at = kInForce;
};

struct SlicePlan {
  int64_t request = 0;         // index of its SliceRequest
  int64_t first_row = 0;       // in the step's rows
  int64_t num_rows = 0;        // real tokens and landmarks
  int64_t first_position = 0;  // decoder position of first_row
  int64_t num_new_tokens = 0;
  // Rows of the open chunk the session holds from earlier steps
  // (first_position % chunk_positions); the first chunk the slice closes
  // starts with them.
  int64_t open_rows_before = 0;
  std::vector<PlannedLandmark> landmarks;  // in row order
  // Chunks it closes are entries [first_encoded, first_encoded +
  // landmarks.size()) of the step's encoder batch.
  int64_t first_encoded = 0;
  std::vector<GcaRun> runs;  // in row order, covering every row
  // Some run is served by a selection made in this step: that selection
  // must be known on the host before the upper layers run.
  bool selection_serves_in_step = false;
  // The slice ends on a landmark: the selection made there first serves the
  // session's next step (a backend may start fetching its chunks now).
  bool ends_on_landmark = false;
  // Its rows run the embedding, the lower layers and the chunk encoder only
  // (engine/model_rules.h, UpperLayerReach): no retrieval, no upper layer,
  // no logits; its session's upper windows skip its rows. Lower-only slices
  // are the last slices of a plan (StepPlan::upper_slices()).
  bool lower_only = false;
};

// A row whose logits the step returns.
struct LogitRow {
  int64_t row = 0;
  int64_t slice = 0;
  int64_t token = 0;  // index into its request's tokens
};

struct StepPlan {
  int64_t num_rows = 0;
  std::vector<int32_t> ids;  // num_rows token ids, landmarks inserted
  std::vector<SlicePlan> slices;
  std::vector<LogitRow> logit_rows;  // slice by slice, in row order
  int64_t num_encoded_chunks = 0;    // chunks closed in the step, all slices
  bool selection_serves_in_step = false;  // any slice's flag
  // A lower-only forward (engine/model_rules.h, UpperLayerReach): every row
  // runs the embedding, the lower layers and the chunk encoder (Forward pass
  // 2-4) and nothing more; no retrieval, no upper layer, no logits. Only for
  // rows whose upper-layer results cannot reach the state a caller reads.
  // True exactly when every slice is lower-only (upper_slices() == 0).
  bool lower_only = false;

  // The upper layers (retrieval, the upper decoder layers, the logits) run
  // over the first upper_slices() slices, rows [0, upper_rows()): the
  // slices before the first lower-only one (SlicePlan::lower_only); the
  // slices after them are lower-only (PlanStep puts them last;
  // Backend::CheckStep refuses a plan with a slice that runs the upper
  // layers after a lower-only one). Every row runs the embedding, the lower
  // layers and the chunk encoder. A plan with both kinds of slices (a mixed
  // lower-only plan) needs Backend::runs_mixed_lower_only_forwards. Derived
  // from the slices' flags on each call (a pass over the slices), not
  // stored: a plan builder cannot leave them disagreeing with its slices.
  int64_t upper_slices() const;
  int64_t upper_rows() const;

  int64_t num_landmarks() const { return num_encoded_chunks; }
  // Some slices are lower-only and some are not.
  bool mixed_lower_only() const {
    const int64_t upper = upper_slices();
    return upper > 0 && upper < static_cast<int64_t>(slices.size());
  }
  // A slice that runs the upper layers has no logit row (its request's
  // last_logits was false).
  bool skips_some_logits() const;
};

// Plans one forward; a lower-only one (StepPlan::lower_only) when
// `lower_only`, else one whose slices are lower-only where their requests
// say so (SliceRequest::lower_only). INVALID_ARGUMENT when a request has no
// tokens or a position that does not match its token count, asks for all
// logits of a lower-only slice, or is not lower-only after one that is.
absl::StatusOr<StepPlan> PlanStep(const ModelConfig& config,
                                  absl::Span<const SliceRequest> requests,
                                  bool lower_only = false);

// How many of `available` new real tokens of a session holding `num_tokens`
// fit in `budget` decoder positions (the landmarks they bring count).
int64_t TokensFitting(const ModelConfig& config, int64_t num_tokens, int64_t available,
                      int64_t budget);

}  // namespace drt
