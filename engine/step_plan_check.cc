#include "engine/step_plan_check.h"

#include <cstdint>

#include "absl/strings/str_format.h"
#include "engine/model_rules.h"

namespace drt {
namespace {

const char* Bool(bool b) { return b ? "true" : "false"; }

// The figures of slice `s` a backend reads beside its rows, each derived
// from its first_position, num_rows and (checked) runs as PlanStep derives
// it. The CPU backend reads none of them; the CUDA backend reads
// open_rows_before (which chunk rows it gathers and encodes),
// selection_serves_in_step (whether it reads a selection back before the
// GCA: false where a run needs one fails the step half done, the session
// then lost) and ends_on_landmark (whether it fetches the new selection's
// chunks ahead). num_new_tokens no backend reads; it is checked so that a
// plan is whole or refused.
absl::Status CheckSliceCounts(const ModelConfig& config, const SlicePlan& slice, int64_t s) {
  const int64_t end = slice.first_position + slice.num_rows;
  const int64_t new_tokens =
      RealTokensFor(config, end) - RealTokensFor(config, slice.first_position);
  if (slice.num_new_tokens != new_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "slice %d's num_new_tokens is %d; its rows (decoder positions [%d, %d)) hold %d real "
        "tokens",
        s, slice.num_new_tokens, slice.first_position, end, new_tokens));
  }
  const int64_t open = OpenChunkRows(config, slice.first_position);
  if (slice.open_rows_before != open) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "slice %d's open_rows_before is %d; a session at decoder position %d holds %d rows of "
        "its open chunk",
        s, slice.open_rows_before, slice.first_position, open));
  }
  // A run served by a selection made in this step (its made_at, checked
  // above against the chunk it lies in).
  bool served_in_step = false;
  for (const GcaRun& run : slice.runs) served_in_step |= run.made_at != GcaRun::kInForce;
  if (slice.selection_serves_in_step != served_in_step) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "slice %d's selection_serves_in_step is %s; its GCA runs (%d, over chunks %d to %d) "
        "say %s",
        s, Bool(slice.selection_serves_in_step), slice.runs.size(), slice.runs.front().chunk,
        slice.runs.back().chunk, Bool(served_in_step)));
  }
  const bool on_landmark = IsLandmarkPosition(config, end - 1);
  if (slice.ends_on_landmark != on_landmark) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "slice %d's ends_on_landmark is %s; its last row (decoder position %d) %s a landmark",
        s, Bool(slice.ends_on_landmark), end - 1, on_landmark ? "is" : "is not"));
  }
  return absl::OkStatus();
}

// Slice `s`'s landmarks, encoder entries and runs as PlanStep makes them
// (engine/step_plan.cc); `encoded` is the count of earlier slices'
// landmarks.
absl::Status CheckSlice(const ModelConfig& config, const SlicePlan& slice, int64_t s,
                        int64_t encoded) {
  const int64_t S = config.chunk_positions();
  if (slice.first_encoded != encoded) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "slice %d's first_encoded is %d; the slices before it close %d chunks", s,
        slice.first_encoded, encoded));
  }
  size_t next_landmark = 0;
  for (int64_t i = 0; i < slice.num_rows; ++i) {
    const int64_t position = slice.first_position + i;
    if (!IsLandmarkPosition(config, position)) continue;
    const PlannedLandmark want{slice.first_row + i, position / S};
    if (next_landmark >= slice.landmarks.size() ||
        slice.landmarks[next_landmark].row != want.row ||
        slice.landmarks[next_landmark].chunk != want.chunk) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "slice %d's landmark %d should be row %d closing chunk %d (decoder position %d)", s,
          next_landmark, want.row, want.chunk, position));
    }
    ++next_landmark;
  }
  if (next_landmark != slice.landmarks.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "slice %d lists %d landmarks; its rows hold %d", s, slice.landmarks.size(),
        next_landmark));
  }
  // Runs: consecutive rows of one chunk each, covering the slice in order;
  // chunk c's rows served by the selection in force (the slice's first
  // chunk) or made at the slice's landmark closing chunk c - 1.
  const int64_t first_chunk = slice.first_position / S;
  int64_t next_row = slice.first_row;
  for (size_t r = 0; r < slice.runs.size(); ++r) {
    const GcaRun& run = slice.runs[r];
    const int64_t first_position = slice.first_position + (run.first_row - slice.first_row);
    const bool tiles = run.first_row == next_row && run.num_rows >= 1 &&
                       run.first_row + run.num_rows <= slice.first_row + slice.num_rows &&
                       run.chunk == first_position / S &&
                       (first_position + run.num_rows - 1) / S == run.chunk &&
                       (r == 0 || first_position % S == 0);
    const int64_t want_made_at =
        run.chunk == first_chunk ? GcaRun::kInForce : run.chunk - 1 - first_chunk;
    if (!tiles || run.made_at != want_made_at) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "slice %d's GCA run %d (rows [%d, %d), chunk %d, made_at %d) is not the run of "
          "chunk %d's rows from row %d served by %d",
          s, r, run.first_row, run.first_row + run.num_rows, run.chunk, run.made_at,
          first_position / S, next_row, want_made_at));
    }
    next_row += run.num_rows;
  }
  if (next_row != slice.first_row + slice.num_rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "slice %d's GCA runs cover rows [%d, %d) of its rows [%d, %d)", s, slice.first_row,
        next_row, slice.first_row, slice.first_row + slice.num_rows));
  }
  return CheckSliceCounts(config, slice, s);
}

}  // namespace

absl::Status CheckPlanGeometry(const ModelConfig& config, const StepPlan& plan) {
  if (plan.num_rows < 0 || static_cast<int64_t>(plan.ids.size()) != plan.num_rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the plan has %d rows but holds %d ids", plan.num_rows, plan.ids.size()));
  }
  int64_t next_row = 0, encoded = 0;
  for (size_t s = 0; s < plan.slices.size(); ++s) {
    const SlicePlan& slice = plan.slices[s];
    if (slice.first_row != next_row || slice.num_rows < 1 ||
        slice.num_rows > plan.num_rows - next_row) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "slice %d holds rows [%d, %d); the slices must tile the plan's %d rows in order, "
          "this one from row %d",
          s, slice.first_row, slice.first_row + slice.num_rows, plan.num_rows, next_row));
    }
    if (absl::Status st = CheckSlice(config, slice, static_cast<int64_t>(s), encoded); !st.ok()) {
      return st;
    }
    next_row += slice.num_rows;
    encoded += static_cast<int64_t>(slice.landmarks.size());
  }
  if (next_row != plan.num_rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the slices hold %d rows; the plan has %d", next_row, plan.num_rows));
  }
  if (plan.num_encoded_chunks != encoded) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the plan's num_encoded_chunks is %d; its slices close %d chunks",
        plan.num_encoded_chunks, encoded));
  }
  // RunForward waits for the selections made in the step only when the plan
  // says some slice that runs the upper layers reads one (lower-only slices
  // retrieve nothing): PlanStep's OR over those slices' flags.
  bool served_in_step = false;
  int64_t served_slice = -1;
  for (int64_t s = 0, upper = plan.upper_slices(); s < upper && !served_in_step; ++s) {
    served_in_step = plan.slices[s].selection_serves_in_step;
    served_slice = s;
  }
  if (plan.selection_serves_in_step != served_in_step) {
    return served_in_step
               ? absl::InvalidArgumentError(absl::StrFormat(
                     "the plan's selection_serves_in_step is false; slice %d, which runs the "
                     "upper layers, says true",
                     served_slice))
               : absl::InvalidArgumentError(absl::StrFormat(
                     "the plan's selection_serves_in_step is true; none of its %d slices that "
                     "run the upper layers says so",
                     plan.upper_slices()));
  }
  // Logit rows: slice by slice in row order (StepPlan::skips_some_logits
  // counts on it), each inside the slice it names and naming the token its
  // row holds. A row on a landmark is left to CheckForwardInput, which
  // CheckStep runs on each slice after this.
  for (size_t i = 0; i < plan.logit_rows.size(); ++i) {
    const LogitRow& row = plan.logit_rows[i];
    if (row.slice < 0 || row.slice >= static_cast<int64_t>(plan.slices.size())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit row %d names slice %d; the plan has %d", i, row.slice, plan.slices.size()));
    }
    if (i > 0 && row.row <= plan.logit_rows[i - 1].row) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit row %d (row %d) does not follow row %d: logit rows go in row order", i,
          row.row, plan.logit_rows[i - 1].row));
    }
    const SlicePlan& slice = plan.slices[row.slice];
    const int64_t position = slice.first_position + (row.row - slice.first_row);
    const bool in_slice = row.row >= slice.first_row && row.row < slice.first_row + slice.num_rows;
    // A row outside its slice is refused here: CheckStep hands each slice
    // only the rows that name it while they run in slice order, so a row
    // naming an earlier slice would reach no check at all. A row on a
    // landmark is left to CheckForwardInput.
    if (!in_slice) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit row %d (row %d) lies outside its slice %d (rows %d to %d)", i, row.row,
          row.slice, slice.first_row, slice.first_row + slice.num_rows - 1));
    }
    if (IsLandmarkPosition(config, position)) continue;  // CheckForwardInput's to refuse
    const int64_t token =
        RealTokensFor(config, position) - RealTokensFor(config, slice.first_position);
    if (row.token != token) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit row %d (row %d) says token %d of its slice; the row holds token %d", i,
          row.row, row.token, token));
    }
  }
  return absl::OkStatus();
}

}  // namespace drt
