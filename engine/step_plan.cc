#include "engine/step_plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "engine/model_rules.h"

namespace drt {

absl::StatusOr<StepPlan> PlanStep(const ModelConfig& config,
                                  absl::Span<const SliceRequest> requests,
                                  bool lower_only) {
  const int64_t S = config.chunk_positions();
  StepPlan plan;
  plan.slices.reserve(requests.size());
  for (size_t r = 0; r < requests.size(); ++r) {
    const SliceRequest& request = requests[r];
    const bool slice_lower_only = lower_only || request.lower_only;
    if (request.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("slice request %d has no tokens", r));
    }
    if (request.num_tokens < 0 ||
        request.position != DecoderPositionsFor(config, request.num_tokens)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "slice request %d: position %d does not match %d real tokens (%d expected)", r,
          request.position, request.num_tokens, DecoderPositionsFor(config, request.num_tokens)));
    }
    if (slice_lower_only && request.all_logits) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "slice request %d asks for all logits of a lower-only slice, which has none", r));
    }
    if (!slice_lower_only && !plan.slices.empty() && plan.slices.back().lower_only) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "slice request %d runs the upper layers after a lower-only one; lower-only slices "
          "must come last",
          r));
    }
    SlicePlan slice;
    slice.request = static_cast<int64_t>(r);
    slice.first_row = plan.num_rows;
    slice.first_position = request.position;
    slice.num_new_tokens = static_cast<int64_t>(request.tokens.size());
    slice.open_rows_before = OpenChunkRows(config, request.position);
    slice.first_encoded = plan.num_encoded_chunks;
    const int64_t slice_index = static_cast<int64_t>(plan.slices.size());
    for (int64_t t = 0; t < slice.num_new_tokens; ++t) {
      const int64_t row = static_cast<int64_t>(plan.ids.size());
      plan.ids.push_back(request.tokens[t]);
      if (!slice_lower_only &&
          (request.all_logits || (request.last_logits && t == slice.num_new_tokens - 1))) {
        plan.logit_rows.push_back({row, slice_index, t});
      }
      // The next row is a chunk's last position: its landmark follows this token.
      if (IsLandmarkPosition(config, request.position + (row + 1 - slice.first_row))) {
        const int64_t landmark_row = static_cast<int64_t>(plan.ids.size());
        plan.ids.push_back(static_cast<int32_t>(config.chunk_id));
        slice.landmarks.push_back(
            {landmark_row, (request.position + landmark_row - slice.first_row) / S});
      }
    }
    slice.num_rows = static_cast<int64_t>(plan.ids.size()) - slice.first_row;
    plan.num_rows = static_cast<int64_t>(plan.ids.size());
    plan.num_encoded_chunks += static_cast<int64_t>(slice.landmarks.size());

    // Runs of rows per chunk. Chunk c's rows are served by the selection
    // made at chunk c - 1's landmark: in force already when that landmark
    // came in an earlier step, else made at one of this slice's landmarks.
    const int64_t first_chunk = slice.first_position / S;
    for (int64_t i = 0; i < slice.num_rows;) {
      GcaRun run;
      run.chunk = (slice.first_position + i) / S;
      const int64_t end = std::min(slice.num_rows, (run.chunk + 1) * S - slice.first_position);
      run.first_row = slice.first_row + i;
      run.num_rows = end - i;
      if (run.chunk != first_chunk) {
        // This slice's landmarks close chunks first_chunk, first_chunk+1, ...
        run.made_at = run.chunk - 1 - first_chunk;
        slice.selection_serves_in_step = true;
      }
      slice.runs.push_back(run);
      i = end;
    }
    slice.ends_on_landmark =
        IsLandmarkPosition(config, slice.first_position + slice.num_rows - 1);
    slice.lower_only = slice_lower_only;
    if (!slice_lower_only) {
      // Retrieval and the selections only run for slices above the lower layers.
      plan.selection_serves_in_step |= slice.selection_serves_in_step;
    }
    plan.slices.push_back(std::move(slice));
  }
  plan.lower_only = lower_only || (!plan.slices.empty() && plan.upper_slices() == 0);
  return plan;
}

int64_t StepPlan::upper_slices() const {
  int64_t upper = 0;
  while (upper < static_cast<int64_t>(slices.size()) && !slices[upper].lower_only) ++upper;
  return upper;
}

int64_t StepPlan::upper_rows() const {
  const int64_t upper = upper_slices();
  int64_t rows = 0;
  for (int64_t i = 0; i < upper; ++i) rows += slices[i].num_rows;
  return rows;
}

bool StepPlan::skips_some_logits() const {
  // logit_rows are slice by slice, in row order: count the slices they touch.
  int64_t slices_with_logits = 0;
  for (size_t i = 0; i < logit_rows.size(); ++i) {
    if (i == 0 || logit_rows[i].slice != logit_rows[i - 1].slice) ++slices_with_logits;
  }
  return slices_with_logits < upper_slices();
}

int64_t TokensFitting(const ModelConfig& config, int64_t num_tokens, int64_t available,
                      int64_t budget) {
  int64_t tokens = 0;
  int64_t positions = 0;
  while (tokens < available) {
    // A token that completes a chunk brings its landmark with it.
    const int64_t cost =
        IsLandmarkPosition(config, DecoderPositionsFor(config, num_tokens + tokens) + 1) ? 2 : 1;
    if (positions + cost > budget) break;
    positions += cost;
    ++tokens;
  }
  return tokens;
}

}  // namespace drt
