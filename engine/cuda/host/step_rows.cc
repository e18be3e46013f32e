#include "engine/cuda/host/step_rows.h"

#include "absl/strings/str_format.h"

namespace drt::cuda {

absl::Status CheckStepRows(const StepPlan& plan, int64_t capacity) {
  if (plan.lower_only) {
    return absl::InvalidArgumentError("a lower-only plan does not run as a batched CUDA step");
  }
  if (plan.num_rows < 1 || plan.num_rows > capacity) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a plan of %d rows: the step's buffers hold 1..%d", plan.num_rows, capacity));
  }
  if (static_cast<int64_t>(plan.ids.size()) != plan.num_rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the plan has %d ids for %d rows", plan.ids.size(), plan.num_rows));
  }
  int64_t next = 0;
  for (size_t s = 0; s < plan.slices.size(); ++s) {
    const SlicePlan& slice = plan.slices[s];
    if (slice.first_row != next || slice.num_rows < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "slice %d holds rows %d..%d: the slices must tile the step's rows in order from row %d",
          s, slice.first_row, slice.first_row + slice.num_rows - 1, next));
    }
    next += slice.num_rows;
  }
  if (next != plan.num_rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the slices hold %d rows, the plan %d", next, plan.num_rows));
  }
  for (size_t i = 0; i < plan.logit_rows.size(); ++i) {
    const LogitRow& row = plan.logit_rows[i];
    if (row.slice < 0 || row.slice >= static_cast<int64_t>(plan.slices.size())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("logit row %d names slice %d of %d", i, row.slice, plan.slices.size()));
    }
    const SlicePlan& slice = plan.slices[row.slice];
    if (row.row < slice.first_row || row.row >= slice.first_row + slice.num_rows) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit row %d (step row %d) lies outside its slice (rows %d..%d)", i, row.row,
          slice.first_row, slice.first_row + slice.num_rows - 1));
    }
  }
  return absl::OkStatus();
}

std::vector<RowRun> ConsecutiveRowRuns(absl::Span<const LogitRow> rows) {
  std::vector<RowRun> runs;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!runs.empty() && rows[i].row == runs.back().first_row + runs.back().count) {
      ++runs.back().count;
    } else {
      runs.push_back(RowRun{rows[i].row, 1, static_cast<int64_t>(i)});
    }
  }
  return runs;
}

}  // namespace drt::cuda
