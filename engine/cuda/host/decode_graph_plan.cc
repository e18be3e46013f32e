#include "engine/cuda/host/decode_graph_plan.h"

namespace drt::cuda {

const char* EagerReasonName(EagerReason reason) {
  switch (reason) {
    case EagerReason::kNone: return "replays its decode graph";
    case EagerReason::kLowerOnly: return "lower-only forward";
    case EagerReason::kSeveralRows: return "several rows";
    case EagerReason::kLandmark: return "landmark row";
    case EagerReason::kSelectionOfStep: return "selection made in the step";
    case EagerReason::kLogitRows: return "logit rows other than its row";
  }
  return "unknown reason";
}

DecodeGraphDecision DecideDecodeGraph(const StepPlan& plan, int64_t slice_index) {
  const SlicePlan& slice = plan.slices[slice_index];
  DecodeGraphDecision d;
  if (plan.lower_only) {
    d.eager = EagerReason::kLowerOnly;
    return d;
  }
  // A decode token that completes a chunk comes with its landmark (two
  // rows): the landmark is the reason that matters.
  if (!slice.landmarks.empty()) {
    d.eager = EagerReason::kLandmark;
    return d;
  }
  if (slice.num_rows != 1) {
    d.eager = EagerReason::kSeveralRows;
    return d;
  }
  // A one-row slice without a landmark lies in one chunk, served by the
  // selection in force; anything else is not a plan PlanStep makes, and
  // runs eagerly, where the slice ops check it.
  if (slice.selection_serves_in_step || slice.runs.size() != 1 ||
      slice.runs[0].made_at != GcaRun::kInForce) {
    d.eager = EagerReason::kSelectionOfStep;
    return d;
  }
  int64_t logit_rows = 0;
  bool own_row = false;
  for (const LogitRow& row : plan.logit_rows) {
    if (row.slice != slice_index) continue;
    ++logit_rows;
    own_row = row.row == slice.first_row;
  }
  if (logit_rows != 1 || !own_row) {
    d.eager = EagerReason::kLogitRows;
    return d;
  }
  d.key.rows = slice.num_rows;
  return d;
}

StepPlan SingleSlicePlan(const StepPlan& plan, int64_t slice_index) {
  const SlicePlan& from = plan.slices[slice_index];
  const int64_t shift = from.first_row;
  StepPlan out;
  out.num_rows = from.num_rows;
  out.ids.assign(plan.ids.begin() + shift, plan.ids.begin() + shift + from.num_rows);
  SlicePlan slice = from;
  slice.request = 0;
  slice.first_row = 0;
  slice.first_encoded = 0;
  for (PlannedLandmark& landmark : slice.landmarks) landmark.row -= shift;
  for (GcaRun& run : slice.runs) run.first_row -= shift;
  out.slices.push_back(std::move(slice));
  for (const LogitRow& row : plan.logit_rows) {
    if (row.slice != slice_index) continue;
    out.logit_rows.push_back(LogitRow{row.row - shift, 0, row.token});
  }
  out.num_encoded_chunks = static_cast<int64_t>(from.landmarks.size());
  out.selection_serves_in_step = from.selection_serves_in_step;
  // A plan of this one slice is lower-only when the slice is (its
  // upper-layer split follows from the slice's flag, StepPlan::upper_slices()).
  out.lower_only = from.lower_only;
  return out;
}

}  // namespace drt::cuda
