#include "engine/backend.h"

#include "absl/strings/str_format.h"

namespace drt {

absl::Status BackendSession::Forward(absl::Span<const int32_t> ids,
                                     absl::Span<const int64_t> logit_rows,
                                     absl::Span<float> logits) {
  return absl::UnimplementedError(
      "this backend runs positions only through Backend::Step (engine/forward_pass.h)");
}

absl::Status Backend::Step(const StepPlan& plan, absl::Span<BackendSession* const> sessions,
                           absl::Span<float> logits) {
  const int64_t V = config().vocab_size;
  if (static_cast<int64_t>(logits.size()) != static_cast<int64_t>(plan.logit_rows.size()) * V) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "logits buffer holds %d floats, %d rows x vocab %d needed", logits.size(),
        plan.logit_rows.size(), V));
  }
  size_t next_logit = 0;
  std::vector<int64_t> rows;
  for (size_t s = 0; s < plan.slices.size(); ++s) {
    const SlicePlan& slice = plan.slices[s];
    if (slice.request < 0 || slice.request >= static_cast<int64_t>(sessions.size())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("slice %d names request %d of %d sessions", s, slice.request,
                          sessions.size()));
    }
    rows.clear();
    const size_t first_logit = next_logit;
    while (next_logit < plan.logit_rows.size() &&
           plan.logit_rows[next_logit].slice == static_cast<int64_t>(s)) {
      rows.push_back(plan.logit_rows[next_logit].row - slice.first_row);
      ++next_logit;
    }
    absl::Status status = sessions[slice.request]->Forward(
        absl::MakeConstSpan(plan.ids).subspan(slice.first_row, slice.num_rows), rows,
        logits.subspan(first_logit * V, rows.size() * V));
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace drt
