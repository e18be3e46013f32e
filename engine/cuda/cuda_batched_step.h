// The batched CUDA executor of the forward pass (engine/forward_pass.h), opt
// in (CudaBackendOptions::batched_step_rows): every row-wise op runs once
// over all rows of all slices in step-wide buffers (engine/cuda/step_buffers.h)
// on the step's own stream, so the decode rows of N sessions are one GEMM
// of N rows and the weights are read once per step, not once per session.
// Window attention, GCA, the chunk encoder and retrieval stay per slice,
// against each session's own rings, slot buffers, landmarks and store,
// reading and writing the slice's rows of the step-wide buffers
// (docs/cuda.md, "Batched steps").
//
// Streams: the row-wise kernels run on the step stream; everything that
// touches a session's own state (window attention and the ring write, GCA,
// CloseChunks, retrieval, PrepareGca and the fetch/store copies they start)
// runs on that session's streams, as in the slice-by-slice path, so the
// sessions' per-slice kernels overlap on the GPU. Each hand-off is a fork
// (SessionsAfterStep: every session's compute stream waits for the rows the
// step stream produced) and a join (StepAfterSessions: the step stream waits
// for every session before it overwrites or reads those rows again).
//
// Written without a GPU; NOT YET RUN ON ONE, hence off by default.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "engine/cuda/cuda_session.h"
#include "engine/cuda/device_weights.h"
#include "engine/cuda/step_buffers.h"
#include "engine/forward_pass.h"

namespace drt::cuda {

template <typename T>
class CudaBatchedStep final : public ForwardOps {
 public:
  // sessions[r] is the session of the plan's request r; `buffers` has been
  // Reserved for the plan. Everything must outlive the step. fused_gemv:
  // CudaBackendOptions::decode_fused_gemv (a step of at most 8 rows runs
  // the fused decode GEMVs, engine/cuda/fused_decode_ops.h). stream_delay:
  // CudaBackendOptions::debug_stream_delay (test-only; off by default).
  CudaBatchedStep(const ModelConfig& config, const DeviceWeights<T>& weights, bool disable_gca,
                  bool fused_gemv, const CudaStreamDelay& stream_delay,
                  absl::Span<CudaSession<T>* const> sessions, StepBuffers<T>& buffers)
      : config_(config),
        weights_(weights),
        disable_gca_(disable_gca),
        fused_gemv_(fused_gemv),
        stream_delay_(stream_delay),
        sessions_(sessions),
        b_(buffers) {}

  absl::Status Embed(const StepPlan& plan) override;
  absl::Status Attention(const StepPlan& plan, DecoderLayerId layer) override;
  absl::Status Mlp(const StepPlan& plan, DecoderLayerId layer) override;
  absl::Status CloseChunks(const StepPlan& plan) override;
  absl::Status Retrieve(const StepPlan& plan, int64_t group) override;
  absl::Status AwaitSelections(const StepPlan& plan, int64_t group) override;
  absl::Status PrepareGca(const StepPlan& plan, int64_t group) override;
  absl::Status GcaMlp(const StepPlan& plan, DecoderLayerId layer) override;
  absl::Status CommitSelections(const StepPlan& plan) override;
  absl::Status Logits(const StepPlan& plan, absl::Span<float> logits) override;
  absl::Status Finish(const StepPlan& plan) override;

 private:
  CudaSession<T>& SessionOf(const SlicePlan& slice) const { return *sessions_[slice.request]; }
  const DeviceLayer<T>& Layer(DecoderLayerId layer) const;
  // Join: the step stream waits for everything queued so far on the compute
  // stream of every slice's session (of slice `slice` only).
  absl::Status StepAfterSessions(const StepPlan& plan);
  absl::Status StepAfterSession(const StepPlan& plan, size_t slice);
  // Fork: every slice's session's compute stream waits for everything queued
  // so far on the step stream.
  absl::Status SessionsAfterStep(const StepPlan& plan);
  // out += MLP(RMSNorm2(norm_input)) over the plan's rows.
  absl::Status MlpRows(const StepPlan& plan, const DeviceLayer<T>& layer,
                       const float* norm_input, float* out);
  // The test-only delay of the step stream (stream_delay_ of kStep), counted
  // in every slice's session (BackendSessionStats::stream_delays): it holds
  // back the step's work for all of them.
  absl::Status DelayStepStream(const StepPlan& plan);
  // `launches` fused decode GEMV kernels ran over the plan's rows: counted
  // in every slice's session (BackendSessionStats::fused_gemv_launches).
  void CountFused(const StepPlan& plan, int64_t launches) const;

  const ModelConfig& config_;
  const DeviceWeights<T>& weights_;
  const bool disable_gca_;
  const bool fused_gemv_;
  const CudaStreamDelay stream_delay_;
  absl::Span<CudaSession<T>* const> sessions_;
  StepBuffers<T>& b_;
};

}  // namespace drt::cuda
