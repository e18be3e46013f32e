// The DRT forward pass (drt-model.md, "Forward pass"), written once over a
// StepPlan (engine/step_plan.h). A backend implements ForwardOps: each op
// runs over all rows of the plan (every slice of every session at once)
// wherever the math is row-wise, and per slice against that slice's own
// session state (window caches, open chunk, chunk store, selections)
// wherever it is not. RunForward calls the ops in the order of the model.
//
// Ops may run asynchronously (the CUDA backend queues kernels and copies on
// streams); the order RunForward calls them in is the order of their
// effects. The only host synchronisation points the walk itself asks for are
// AwaitSelections (a selection made in the step serves rows of the same
// step) and Logits.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/model_config.h"
#include "engine/step_plan.h"

namespace drt {

// One decoder layer: `index` counts lower layers first, then the upper
// layers group by group (the order of a session's window caches).
struct DecoderLayerId {
  int64_t index = 0;
  int64_t group = -1;  // -1 for a lower layer
  int64_t within = 0;  // index among the lower layers, or inside its group
};

class ForwardOps {
 public:
  virtual ~ForwardOps() = default;

  // Forward pass 2: h[row] = embed_tokens[plan.ids[row]].
  virtual absl::Status Embed(const StepPlan& plan) = 0;
  // Forward pass 3 (and the first line of 6): h = h + Attn(RMSNorm1(h)).
  // Each slice attends over its own session's window of this layer, which
  // then takes the slice's new keys and values.
  virtual absl::Status Attention(const StepPlan& plan, DecoderLayerId layer) = 0;
  // Forward pass 3, second line (lower layers): h = h + MLP(RMSNorm2(h)).
  virtual absl::Status Mlp(const StepPlan& plan, DecoderLayerId layer) = 0;
  // Forward pass 4, after the lower layers: each slice's rows of its still
  // open chunk are kept in its session; every chunk the step closes (its
  // earlier rows from the session's open chunk, the rest from this step) is
  // encoded (all slices' chunks as one batch, plan.num_encoded_chunks) and
  // appended, landmark and K/V, to its session's chunk memory.
  virtual absl::Status CloseChunks(const StepPlan& plan) = 0;
  // Forward pass 5 for group g at every landmark row of the plan, h being
  // the input of group g: scores the session's strictly earlier chunks and
  // takes the top k. May only be launched here (see AwaitSelections).
  virtual absl::Status Retrieve(const StepPlan& plan, int64_t group) = 0;
  // The selections Retrieve(group) made must be known now: rows of this
  // step read them (a GcaRun with made_at >= 0). Called only when
  // plan.selection_serves_in_step.
  virtual absl::Status AwaitSelections(const StepPlan& plan, int64_t group) = 0;
  // Before group g's upper layers: makes the chunks of every run's
  // selection (SlicePlan::runs) readable by Gca.
  virtual absl::Status PrepareGca(const StepPlan& plan, int64_t group) = 0;
  // Forward pass 6 after the attention, with GCA of 7:
  // r = h; h = r + MLP(RMSNorm2(r + GCA(h))), each run reading its
  // selection's chunks.
  virtual absl::Status GcaMlp(const StepPlan& plan, DecoderLayerId layer) = 0;
  // After every group: per slice and group, the selection made at the
  // slice's last landmark becomes the one in force. A slice that
  // ends_on_landmark may start bringing that selection's chunks close.
  virtual absl::Status CommitSelections(const StepPlan& plan) = 0;
  // Forward pass 8 for plan.logit_rows, in that order, into logits
  // (logit_rows.size() x vocab_size).
  virtual absl::Status Logits(const StepPlan& plan, absl::Span<float> logits) = 0;
  // The step is done: each slice's session has processed its rows (in a
  // lower-only plan, without the upper layers).
  virtual absl::Status Finish(const StepPlan& plan) = 0;
};

// Walks the forward pass over `plan` (drt-model.md, Forward pass 1-8); a
// lower-only plan (StepPlan::lower_only) stops after CloseChunks and calls
// Finish.
absl::Status RunForward(const ModelConfig& config, const StepPlan& plan, ForwardOps& ops,
                        absl::Span<float> logits);

}  // namespace drt
