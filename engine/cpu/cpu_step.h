// The CPU executor of the forward pass (engine/forward_pass.h): one step over
// the slices of several CpuSessions. Row-wise work (embedding, RMSNorms,
// every Linear, the MLPs, the logits) runs over all rows of the step at once,
// so the weights are streamed once per step, not once per session; window
// attention and retrieval run per slice against that slice's session; the
// chunk encoder takes every closed chunk of the step as one batch; GCA takes
// every run of every slice in one GroupedCrossAttention call, over K/V made
// from the stored encoder rows of the chunks it reads (ChunkKvCache).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/cpu/chunk_encoder.h"
#include "engine/cpu/cpu_session.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/thread_pool.h"
#include "engine/forward_pass.h"

namespace drt::cpu {

// Row buffers of a step, [rows x width]. They outlive a step so that the
// next one reuses their memory (a decode step is short; fresh buffers cost it
// page faults and zero-fills).
struct CpuStepScratch {
  std::vector<float> h, x, q, k_new, v_new, attn, residual, gca_q, gca_out, mixed, gate, up;
  std::vector<float> window_keys, window_values;  // one slice's window + new rows
  std::vector<float> closed_rows;  // lower-layer rows of the chunks a step closes
  EncodedChunks encoded;
};

class CpuStep final : public ForwardOps {
 public:
  // sessions[r] is the session of the plan's request r. Everything must
  // outlive the step; the scratch is the step's alone while it runs.
  CpuStep(const ModelConfig& config, const ModelWeights& weights, ThreadPool& pool,
          absl::Span<CpuSession* const> sessions, CpuStepScratch& scratch);

  absl::Status Embed(const StepPlan& plan) override;
  absl::Status Attention(const StepPlan& plan, DecoderLayerId layer) override;
  absl::Status Mlp(const StepPlan& plan, DecoderLayerId layer) override;
  absl::Status CloseChunks(const StepPlan& plan) override;
  absl::Status Retrieve(const StepPlan& plan, int64_t group) override;
  // Retrieve runs synchronously on the CPU: nothing to wait for.
  absl::Status AwaitSelections(const StepPlan& plan, int64_t group) override;
  absl::Status PrepareGca(const StepPlan& plan, int64_t group) override;
  absl::Status GcaMlp(const StepPlan& plan, DecoderLayerId layer) override;
  absl::Status CommitSelections(const StepPlan& plan) override;
  absl::Status Logits(const StepPlan& plan, absl::Span<float> logits) override;
  absl::Status Finish(const StepPlan& plan) override;

 private:
  CpuSession& SessionOf(const SlicePlan& slice) const { return *sessions_[slice.request]; }
  const LayerWeights& Layer(DecoderLayerId layer) const;
  // h = residual + MLP(RMSNorm2(normed_input)) over n rows; residual may
  // alias h.
  void MlpBlock(const LayerWeights& layer, const float* residual, const float* normed_input,
                float* h, int64_t n);
  // The selection GCA run `run` of slice `slice` reads in `group`.
  const Retrieval& RunSelection(const StepPlan& plan, size_t slice, const GcaRun& run,
                                int64_t group) const;
  // The chunks the selections in force after this step will name, for
  // slice `slice`: per group the last selection the step made so far, or
  // the one in force when it made none.
  std::vector<int64_t> ChunksInForceAfter(const StepPlan& plan, size_t slice) const;
  // Trims every session's ChunkKvCache to the chunks the group reads and
  // ChunksInForceAfter (and its reserve), then makes the K/V of every chunk the group's runs read that
  // the cache lacks.
  void MakeMissingKeysValues(const StepPlan& plan, int64_t group);

  const ModelConfig& config_;
  const ModelWeights& weights_;
  ThreadPool& pool_;
  absl::Span<CpuSession* const> sessions_;
  std::vector<float>&h_, &x_, &q_, &k_new_, &v_new_, &attn_, &residual_, &gca_q_, &gca_out_,
      &mixed_, &gate_, &up_, &window_keys_, &window_values_, &closed_rows_;
  EncodedChunks& encoded_;
  // Selections made in this step: [slice][group][landmark of the slice].
  std::vector<std::vector<std::vector<Retrieval>>> made_;
  // The window attention of a group of slices: where each gathered slice's
  // keys start in window_keys_, and the kernel's inputs.
  std::vector<int64_t> key_offsets_;
  std::vector<WindowAttentionSlice> attention_slices_;
  // The slices of more than kInPlaceWindowRows rows, whose windows are
  // gathered.
  std::vector<size_t> gathered_slices_;
  // The GCA runs of the group being run, over all slices.
  struct RunChunks {
    std::vector<const float*> k, v;
  };
  std::vector<RunChunks> run_chunks_;
  std::vector<GcaBlock> gca_blocks_;
  std::vector<int64_t> gca_first_row_;
};

}  // namespace drt::cpu
