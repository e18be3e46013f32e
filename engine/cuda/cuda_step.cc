#include "engine/cuda/cuda_step.h"

#include <vector>

#include "absl/strings/str_format.h"
#include "engine/cuda/status_macros.h"

namespace drt::cuda {

template <typename T>
const DeviceLayer<T>& CudaStep<T>::Layer(DecoderLayerId layer) const {
  if (layer.group < 0) return weights_.lower[layer.within];
  return weights_.upper[layer.group][layer.within].base;
}

template <typename T>
std::vector<const SlicePlan*> CudaStep<T>::EagerSlices(const StepPlan& plan) const {
  std::vector<const SlicePlan*> eager;
  for (size_t s = 0; s < plan.slices.size(); ++s) {
    if (!Replayed(static_cast<int64_t>(s))) eager.push_back(&plan.slices[s]);
  }
  return eager;
}

template <typename T>
absl::Status CudaStep<T>::Embed(const StepPlan& plan) {
  for (const SlicePlan* eager : EagerSlices(plan)) {
    const SlicePlan& slice = *eager;
    DRT_RETURN_IF_ERROR(SessionOf(slice).Embed(plan, slice));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStep<T>::Attention(const StepPlan& plan, DecoderLayerId layer) {
  for (const SlicePlan* eager : EagerSlices(plan)) {
    const SlicePlan& slice = *eager;
    DRT_RETURN_IF_ERROR(SessionOf(slice).Attention(slice, layer.index, Layer(layer)));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStep<T>::Mlp(const StepPlan& plan, DecoderLayerId layer) {
  for (const SlicePlan* eager : EagerSlices(plan)) {
    const SlicePlan& slice = *eager;
    DRT_RETURN_IF_ERROR(SessionOf(slice).Mlp(slice, Layer(layer)));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStep<T>::CloseChunks(const StepPlan& plan) {
  for (const SlicePlan* eager : EagerSlices(plan)) {
    const SlicePlan& slice = *eager;
    DRT_RETURN_IF_ERROR(SessionOf(slice).CloseChunks(slice));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStep<T>::Retrieve(const StepPlan& plan, int64_t group) {
  for (const SlicePlan* eager : EagerSlices(plan)) {
    const SlicePlan& slice = *eager;
    DRT_RETURN_IF_ERROR(SessionOf(slice).LaunchRetrieval(slice, group));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStep<T>::AwaitSelections(const StepPlan& plan, int64_t group) {
  for (const SlicePlan* eager : EagerSlices(plan)) {
    const SlicePlan& slice = *eager;
    if (slice.selection_serves_in_step) {
      DRT_RETURN_IF_ERROR(SessionOf(slice).CollectRetrieval(slice, group));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStep<T>::PrepareGca(const StepPlan& plan, int64_t group) {
  for (const SlicePlan* eager : EagerSlices(plan)) {
    const SlicePlan& slice = *eager;
    DRT_RETURN_IF_ERROR(SessionOf(slice).PrepareGca(slice, group));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStep<T>::GcaMlp(const StepPlan& plan, DecoderLayerId layer) {
  const DeviceUpperLayer<T>& weights = weights_.upper[layer.group][layer.within];
  for (const SlicePlan* eager : EagerSlices(plan)) {
    const SlicePlan& slice = *eager;
    DRT_RETURN_IF_ERROR(SessionOf(slice).GcaMlp(slice, layer.group, weights));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStep<T>::CommitSelections(const StepPlan& plan) {
  for (const SlicePlan* eager : EagerSlices(plan)) {
    const SlicePlan& slice = *eager;
    DRT_RETURN_IF_ERROR(SessionOf(slice).CommitSelections(slice));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStep<T>::Logits(const StepPlan& plan, absl::Span<float> logits) {
  const int64_t V = config_.vocab_size;
  // plan.logit_rows runs slice by slice: each slice's rows are one stretch,
  // and a session holds one stretch in flight.
  std::vector<int64_t> rows;
  std::vector<const SlicePlan*> queued;
  int64_t previous = -1;
  for (size_t i = 0; i < plan.logit_rows.size();) {
    const int64_t s = plan.logit_rows[i].slice;
    if (s <= previous || s >= static_cast<int64_t>(plan.slices.size())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit row %d names slice %d: the plan's logit rows must go slice by slice", i, s));
    }
    previous = s;
    const size_t first = i;
    rows.clear();
    while (i < plan.logit_rows.size() && plan.logit_rows[i].slice == s) {
      rows.push_back(plan.logit_rows[i].row);
      ++i;
    }
    const SlicePlan& slice = plan.slices[s];
    const absl::Span<float> out = logits.subspan(first * V, rows.size() * V);
    // A replayed slice's graph has queued its logits already.
    DRT_RETURN_IF_ERROR(Replayed(s) ? SessionOf(slice).ExpectGraphLogits(slice, rows, out)
                                    : SessionOf(slice).QueueLogits(slice, rows, out));
    queued.push_back(&slice);
  }
  for (const SlicePlan* slice : queued) DRT_RETURN_IF_ERROR(SessionOf(*slice).FinishLogits());
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaStep<T>::Finish(const StepPlan& plan) {
  for (const SlicePlan& slice : plan.slices) SessionOf(slice).Finish(slice);
  return absl::OkStatus();
}

template class CudaStep<bf16>;
template class CudaStep<float>;

}  // namespace drt::cuda
