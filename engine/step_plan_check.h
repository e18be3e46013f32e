// The geometry of a StepPlan checked against itself: the ids, the slices'
// rows, their landmarks, encoder entries and GCA runs, the figures derived
// from them (each slice's num_new_tokens, open_rows_before,
// selection_serves_in_step and ends_on_landmark, the plan's
// selection_serves_in_step) and the logit rows' token indices, all as
// PlanStep derives them from each slice's first_position and num_rows.
// (CheckStep then ties each first_position to its session's position.) Backend::CheckStep runs it so that a plan
// edited or built by hand (tests, tools, future callers) is refused before
// the ops read rows, landmarks or chunks it names (backend.h: a refused
// plan changes nothing).
#pragma once

#include "absl/status/status.h"
#include "engine/model_config.h"
#include "engine/step_plan.h"

namespace drt {

// INVALID_ARGUMENT naming the first field that disagrees with the rows.
absl::Status CheckPlanGeometry(const ModelConfig& config, const StepPlan& plan);

}  // namespace drt
