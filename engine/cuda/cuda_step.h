// The CUDA executor of the forward pass (engine/forward_pass.h): one step over
// the slices of several CudaSessions, slice by slice. Each op runs, for every
// slice in plan order, that slice's part on its own session's buffers and
// streams (CudaSession's slice ops), so the sessions' kernels of one op are
// queued back to back on different streams and may overlap on the GPU. The
// weights are read once per session, not once per step: decode rows of N
// sessions do not share one GEMM here; CudaBackendOptions::batched_step_rows
// runs engine/cuda/cuda_batched_step.h instead, which does (docs/cuda.md,
// "Steps of several sessions").
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/cuda/cuda_session.h"
#include "engine/cuda/device_weights.h"
#include "engine/forward_pass.h"

namespace drt::cuda {

template <typename T>
class CudaStep final : public ForwardOps {
 public:
  // sessions[r] is the session of the plan's request r. replayed[s] true:
  // slice s launched its session's decode graph already
  // (CudaSession::LaunchDecodeGraph), so the ops leave it alone but for
  // collecting its logits (Logits) and finishing it (Finish); empty: none
  // did. Everything must outlive the step.
  CudaStep(const ModelConfig& config, const DeviceWeights<T>& weights,
           absl::Span<CudaSession<T>* const> sessions, absl::Span<const char> replayed = {})
      : config_(config), weights_(weights), sessions_(sessions), replayed_(replayed) {}

  absl::Status Embed(const StepPlan& plan) override;
  absl::Status Attention(const StepPlan& plan, DecoderLayerId layer) override;
  absl::Status Mlp(const StepPlan& plan, DecoderLayerId layer) override;
  absl::Status CloseChunks(const StepPlan& plan) override;
  // Launches every slice's top-k; nothing is read back here.
  absl::Status Retrieve(const StepPlan& plan, int64_t group) override;
  // Reads back the selections of the slices whose own rows they serve
  // (SlicePlan::selection_serves_in_step); the others stay in flight.
  absl::Status AwaitSelections(const StepPlan& plan, int64_t group) override;
  absl::Status PrepareGca(const StepPlan& plan, int64_t group) override;
  absl::Status GcaMlp(const StepPlan& plan, DecoderLayerId layer) override;
  absl::Status CommitSelections(const StepPlan& plan) override;
  // Queues every slice's logits, then waits for each.
  absl::Status Logits(const StepPlan& plan, absl::Span<float> logits) override;
  absl::Status Finish(const StepPlan& plan) override;

 private:
  CudaSession<T>& SessionOf(const SlicePlan& slice) const { return *sessions_[slice.request]; }
  // Whether plan.slices[s] replayed a graph.
  bool Replayed(int64_t s) const {
    return s < static_cast<int64_t>(replayed_.size()) && replayed_[s] != 0;
  }
  // The slices of `plan` the ops run (those that did not replay a graph).
  std::vector<const SlicePlan*> EagerSlices(const StepPlan& plan) const;
  const DeviceLayer<T>& Layer(DecoderLayerId layer) const;

  const ModelConfig& config_;
  const DeviceWeights<T>& weights_;
  absl::Span<CudaSession<T>* const> sessions_;
  absl::Span<const char> replayed_;
};

}  // namespace drt::cuda
