// How a batched CUDA step (engine/cuda/cuda_batched_step.h) lays a plan's
// rows into its step-wide buffers: row r of the plan is row r of every
// buffer, so slice s owns rows [first_row, first_row + num_rows). Plain C++,
// tested without a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/step_plan.h"

namespace drt::cuda {

// OK when the step-wide buffers of `capacity` rows can hold `plan`: it is a
// full forward (not lower-only), its slices tile rows [0, num_rows) in order
// without gaps, ids has num_rows entries, and every logit row lies inside
// its slice. INVALID_ARGUMENT naming the first problem otherwise.
absl::Status CheckStepRows(const StepPlan& plan, int64_t capacity);

// A stretch of consecutive step rows among the logit rows: `count` rows from
// `first_row`, whose logits are output rows [out_row, out_row + count).
struct RowRun {
  int64_t first_row = 0;
  int64_t count = 0;
  int64_t out_row = 0;

  bool operator==(const RowRun&) const = default;
};

// The logit rows split into runs of consecutive step rows, in order (one
// final-norm launch per run).
std::vector<RowRun> ConsecutiveRowRuns(absl::Span<const LogitRow> rows);

}  // namespace drt::cuda
