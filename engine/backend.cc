#include "engine/backend.h"

#include <set>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/forward_input.h"
#include "engine/step_plan_check.h"

namespace drt {
namespace {

// The upper layers run over the slices before the first lower-only one
// (StepPlan::upper_slices(), derived from the slices' flags); the ops trust
// every slice after them to be lower-only and plan.lower_only to say
// whether any slice runs the upper layers, so a plan that breaks either is
// refused before anything changes.
absl::Status CheckUpperLayerSplit(const StepPlan& plan) {
  const int64_t num_slices = static_cast<int64_t>(plan.slices.size());
  const int64_t upper_slices = plan.upper_slices();
  for (int64_t i = upper_slices; i < num_slices; ++i) {
    if (!plan.slices[i].lower_only) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "slice %d is not lower-only but slice %d before it is: lower-only slices must come "
          "after every slice that runs the upper layers",
          i, upper_slices));
    }
  }
  if (num_slices > 0 && plan.lower_only != (upper_slices == 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the plan's lower_only is %s but %d of its slices run the upper layers",
        plan.lower_only ? "true" : "false", upper_slices));
  }
  for (const LogitRow& row : plan.logit_rows) {
    if (row.slice < 0 || row.slice >= upper_slices) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a logit row (row %d) names slice %d, which is not one that runs the upper layers "
          "(the first %d)",
          row.row, row.slice, upper_slices));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Backend::CheckStep(const StepPlan& plan,
                               absl::Span<BackendSession* const> sessions,
                               size_t logits_size) const {
  const int64_t V = config().vocab_size;
  if (static_cast<int64_t>(logits_size) != static_cast<int64_t>(plan.logit_rows.size()) * V) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "logits buffer holds %d floats, %d rows x vocab %d needed", logits_size,
        plan.logit_rows.size(), V));
  }
  if (plan.lower_only && !runs_lower_only_forwards()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the %s backend does not run lower-only forwards", name()));
  }
  if (plan.mixed_lower_only() && !runs_mixed_lower_only_forwards()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the %s backend does not run forwards in which only some slices are lower-only",
        name()));
  }
  if (plan.skips_some_logits() && !runs_mixed_lower_only_forwards()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the %s backend does not run forwards in which a slice asks for no logits", name()));
  }
  if (plan.lower_only && !plan.logit_rows.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a lower-only forward computes no logits, but the plan asks for %d rows",
        plan.logit_rows.size()));
  }
  if (plan.num_rows > max_step_positions()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a step of %d positions exceeds the step size %d", plan.num_rows, max_step_positions()));
  }
  // The rows, landmarks, runs and logit rows' order agree (the ops trust
  // them as CheckUpperLayerSplit's figures); after it, each slice's rows lie
  // inside ids.
  if (absl::Status s = CheckPlanGeometry(config(), plan); !s.ok()) return s;
  std::vector<bool> used(sessions.size(), false);
  std::set<const BackendSession*> distinct;
  size_t next_logit_row = 0;  // logit rows go slice by slice (CheckPlanGeometry)
  for (size_t slice_index = 0; slice_index < plan.slices.size(); ++slice_index) {
    const SlicePlan& slice = plan.slices[slice_index];
    if (slice.request < 0 || slice.request >= static_cast<int64_t>(sessions.size()) ||
        used[slice.request]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a slice names request %d: not one of the %d sessions, or named twice", slice.request,
          sessions.size()));
    }
    used[slice.request] = true;
    if (!distinct.insert(sessions[slice.request]).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "request %d names a session that another slice of the step already holds",
          slice.request));
    }
    const int64_t position = sessions[slice.request]->position();
    if (slice.first_position != position) {
      return absl::InvalidArgumentError(
          absl::StrFormat("a slice starts at decoder position %d but its session is at %d",
                          slice.first_position, position));
    }
    // The slice's logit rows, counted from its first row: CheckForwardInput
    // refuses one outside the slice or on a landmark.
    std::vector<int64_t> logit_rows;
    for (; next_logit_row < plan.logit_rows.size() &&
           plan.logit_rows[next_logit_row].slice == static_cast<int64_t>(slice_index);
         ++next_logit_row) {
      logit_rows.push_back(plan.logit_rows[next_logit_row].row - slice.first_row);
    }
    if (absl::Status s = CheckForwardInput(
            config(), position,
            absl::MakeConstSpan(plan.ids).subspan(slice.first_row, slice.num_rows), logit_rows);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "slice %d (rows from %d): %s", slice_index, slice.first_row, s.message()));
    }
  }
  // Last, so that the checks above name their own problems first.
  return CheckUpperLayerSplit(plan);
}

}  // namespace drt
