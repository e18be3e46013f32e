#include "engine/cuda/cuda_batched_step.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "engine/cuda/debug_stream_delay.h"
#include "engine/cuda/fused_decode_ops.h"
#include "engine/cuda/host/step_rows.h"
#include "engine/cuda/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/decode_gemv_plan.h"
#include "kernels/elementwise.h"

namespace drt::cuda {

template <typename T>
const DeviceLayer<T>& CudaBatchedStep<T>::Layer(DecoderLayerId layer) const {
  if (layer.group < 0) return weights_.lower[layer.within];
  return weights_.upper[layer.group][layer.within].base;
}

template <typename T>
void CudaBatchedStep<T>::CountFused(const StepPlan& plan, int64_t launches) const {
  for (const SlicePlan& slice : plan.slices) SessionOf(slice).CountFusedGemvLaunches(launches);
}

template <typename T>
absl::Status CudaBatchedStep<T>::StepAfterSession(const StepPlan& plan, size_t slice) {
  cudaStream_t compute = SessionOf(plan.slices[slice]).compute_stream();
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(b_.session_done(slice), compute),
                           "recording a session's work for the batched step");
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(b_.stream(), b_.session_done(slice), 0),
                           "ordering the batched step after a session's work");
  return DelayStepStream(plan);
}

template <typename T>
absl::Status CudaBatchedStep<T>::DelayStepStream(const StepPlan& plan) {
  int64_t queued = 0;
  DRT_RETURN_IF_ERROR(
      DelayStreamForTest(stream_delay_, CudaDelayedStream::kStep, b_.stream(), queued));
  if (queued > 0) {
    for (const SlicePlan& slice : plan.slices) SessionOf(slice).CountStreamDelays(queued);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBatchedStep<T>::StepAfterSessions(const StepPlan& plan) {
  for (size_t s = 0; s < plan.slices.size(); ++s) DRT_RETURN_IF_ERROR(StepAfterSession(plan, s));
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBatchedStep<T>::SessionsAfterStep(const StepPlan& plan) {
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(b_.step_done(), b_.stream()),
                           "recording the batched step's work");
  for (const SlicePlan& slice : plan.slices) {
    DRT_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(SessionOf(slice).compute_stream(), b_.step_done(), 0),
        "ordering a session after the batched step's work");
    int64_t queued = 0;
    DRT_RETURN_IF_ERROR(DelayStreamForTest(stream_delay_, CudaDelayedStream::kCompute,
                                           SessionOf(slice).compute_stream(), queued));
    SessionOf(slice).CountStreamDelays(queued);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBatchedStep<T>::Embed(const StepPlan& plan) {
  // The previous batched step has read the pinned ids (it waited for its
  // logits, so this returns at once). The sessions' earlier work needs no
  // wait here: the step stream touches only the step's buffers, and each
  // session's part of this step queues behind it on the session's own stream.
  DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(b_.stream()),
                           "waiting for the previous batched step");
  DRT_RETURN_IF_ERROR(DelayStepStream(plan));
  const int64_t n = plan.num_rows;
  std::memcpy(b_.ids_host.get(), plan.ids.data(), n * sizeof(int32_t));
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b_.ids.get(), b_.ids_host.get(), n * sizeof(int32_t),
                                           cudaMemcpyHostToDevice, b_.stream()),
                           "uploading the step's token ids");
  for (const SlicePlan& slice : plan.slices) SessionOf(slice).BeginStep();
  DRT_CUDA_RETURN_IF_ERROR(
      kernels::LaunchEmbeddingGather(b_.ids.get(), static_cast<int>(n), weights_.embed_tokens,
                                     static_cast<int>(b_.sizes().d), b_.h.get(), b_.stream()),
      "LaunchEmbeddingGather");
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBatchedStep<T>::Attention(const StepPlan& plan, DecoderLayerId id) {
  // h = h + Attn(RMSNorm1(h)): the projections over every row at once, the
  // window attention slice by slice against each session's ring.
  const DeviceLayer<T>& layer = Layer(id);
  const int64_t d = b_.sizes().d;
  const int64_t kvw = b_.sizes().kv_width;
  const int rows = static_cast<int>(plan.num_rows);
  cudaStream_t stream = b_.stream();
  kernels::CublasGemm& gemm = b_.gemm();
  const bool fused = kernels::UseDecodeGemv(fused_gemv_, plan.num_rows);
  if (fused) {
    DRT_RETURN_IF_ERROR(FusedNormQkv(b_.h.get(), layer, rows, FusedDecodeSizesOf(b_.sizes()),
                                     static_cast<float>(config_.rms_norm_eps), b_.q.get(),
                                     b_.k_new.get(), b_.v_new.get(), stream));
    CountFused(plan, 1);
  } else {
    DRT_CUDA_RETURN_IF_ERROR(
        kernels::LaunchRmsNorm(b_.h.get(), layer.input_norm, rows, static_cast<int>(d),
                               static_cast<float>(config_.rms_norm_eps), b_.x.get(), stream),
        "LaunchRmsNorm (input_layernorm)");
    DRT_RETURN_IF_ERROR(gemm.Matmul(b_.x.get(), layer.q, b_.q.get(), rows, d, d, stream));
    DRT_RETURN_IF_ERROR(gemm.Matmul(b_.x.get(), layer.k, b_.k_new.get(), rows, kvw, d, stream));
    DRT_RETURN_IF_ERROR(gemm.Matmul(b_.x.get(), layer.v, b_.v_new.get(), rows, kvw, d, stream));
  }
  // The kernels need 16-byte aligned rows: d and kv_width are multiples of
  // head_dim, itself a multiple of 8 (CheckSupported), so every row offset
  // is a multiple of 16 bytes in bf16 and fp32 alike.
  DRT_RETURN_IF_ERROR(SessionsAfterStep(plan));
  for (const SlicePlan& slice : plan.slices) {
    const int64_t r = slice.first_row;
    const AttentionRows<T> at{b_.q.get() + r * d, b_.k_new.get() + r * kvw,
                              b_.v_new.get() + r * kvw, b_.attn.get() + r * d};
    DRT_RETURN_IF_ERROR(SessionOf(slice).WindowAttentionRows(id.index, at, slice.num_rows,
                                                             slice.first_position));
  }
  DRT_RETURN_IF_ERROR(StepAfterSessions(plan));
  if (fused) {
    CountFused(plan, 1);
    return FusedProjectAdd(b_.attn.get(), layer.o, nullptr, rows, static_cast<int>(d),
                           static_cast<int>(d), b_.h.get(), stream);
  }
  return gemm.Matmul(b_.attn.get(), layer.o, b_.h.get(), rows, d, d, /*accumulate=*/true, stream);
}

template <typename T>
absl::Status CudaBatchedStep<T>::MlpRows(const StepPlan& plan, const DeviceLayer<T>& layer,
                                         const float* norm_input, float* out) {
  const int64_t n = plan.num_rows;
  // out += down(silu(gate(x)) * up(x)), x = RMSNorm2(norm_input), as
  // CudaSession::MlpBlock.
  const int d = static_cast<int>(b_.sizes().d);
  const int f = static_cast<int>(b_.sizes().f);
  const int rows = static_cast<int>(n);
  cudaStream_t stream = b_.stream();
  kernels::CublasGemm& gemm = b_.gemm();
  if (kernels::UseDecodeGemv(fused_gemv_, n)) {
    DRT_RETURN_IF_ERROR(FusedNormSwiGlu(norm_input, layer.post_norm, layer.gate_up, rows,
                                        FusedDecodeSizesOf(b_.sizes()),
                                        static_cast<float>(config_.rms_norm_eps), b_.act.get(),
                                        stream));
    CountFused(plan, 2);  // with the down projection's, next
    return FusedProjectAdd(b_.act.get(), layer.down, nullptr, rows, d, f, out, stream);
  }
  DRT_CUDA_RETURN_IF_ERROR(
      kernels::LaunchRmsNorm(norm_input, layer.post_norm, rows, d,
                             static_cast<float>(config_.rms_norm_eps), b_.x.get(), stream),
      "LaunchRmsNorm (post_attention_layernorm)");
  DRT_RETURN_IF_ERROR(
      gemm.Matmul(b_.x.get(), layer.gate_up, b_.gate_up.get(), rows, 2 * f, d, stream));
  DRT_CUDA_RETURN_IF_ERROR(kernels::LaunchSwiGlu(b_.gate_up.get(), rows, f, b_.act.get(), stream),
                           "LaunchSwiGlu");
  return gemm.Matmul(b_.act.get(), layer.down, out, rows, d, f, /*accumulate=*/true, stream);
}

template <typename T>
absl::Status CudaBatchedStep<T>::Mlp(const StepPlan& plan, DecoderLayerId layer) {
  return MlpRows(plan, Layer(layer), b_.h.get(), b_.h.get());
}

template <typename T>
absl::Status CudaBatchedStep<T>::CloseChunks(const StepPlan& plan) {
  // The base LM keeps no chunk memory (CudaSession::CloseChunks).
  if (disable_gca_) return absl::OkStatus();
  // Each session's encoder reads the slice's lower-layer rows from its own
  // h: copy them there (compute stream, after the lower layers). The step
  // stream waits for the copy only, but the upper layers' first hand-off
  // (Attention) waits for each session's compute stream, where the encoder
  // and top-k run: they do not overlap the upper layers today (an encoder
  // stream of its own would allow it).
  DRT_RETURN_IF_ERROR(SessionsAfterStep(plan));
  const int64_t d = b_.sizes().d;
  for (size_t s = 0; s < plan.slices.size(); ++s) {
    const SlicePlan& slice = plan.slices[s];
    CudaSession<T>& session = SessionOf(slice);
    DRT_RETURN_IF_ERROR(session.LoadRows(b_.h.get() + slice.first_row * d, slice.num_rows));
    DRT_RETURN_IF_ERROR(StepAfterSession(plan, s));
    DRT_RETURN_IF_ERROR(session.CloseChunks(slice));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBatchedStep<T>::Retrieve(const StepPlan& plan, int64_t group) {
  // Top-k reads the landmark rows (group g's input) from the session's own
  // h: copy the slices that have landmarks there first. Group 0's input is
  // the lower layers' output, which CloseChunks copied there already (the
  // encoder leaves h as it is, as in the slice-by-slice path).
  bool any_landmark = false;
  if (group > 0) {
    for (const SlicePlan& slice : plan.slices) any_landmark |= !slice.landmarks.empty();
  }
  if (any_landmark && !disable_gca_) DRT_RETURN_IF_ERROR(SessionsAfterStep(plan));
  const int64_t d = b_.sizes().d;
  for (size_t s = 0; s < plan.slices.size(); ++s) {
    const SlicePlan& slice = plan.slices[s];
    CudaSession<T>& session = SessionOf(slice);
    if (group > 0 && !slice.landmarks.empty() && !disable_gca_) {
      DRT_RETURN_IF_ERROR(session.LoadRows(b_.h.get() + slice.first_row * d, slice.num_rows));
      DRT_RETURN_IF_ERROR(StepAfterSession(plan, s));
    }
    DRT_RETURN_IF_ERROR(session.LaunchRetrieval(slice, group));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBatchedStep<T>::AwaitSelections(const StepPlan& plan, int64_t group) {
  for (const SlicePlan& slice : plan.slices) {
    if (slice.selection_serves_in_step) {
      DRT_RETURN_IF_ERROR(SessionOf(slice).CollectRetrieval(slice, group));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBatchedStep<T>::PrepareGca(const StepPlan& plan, int64_t group) {
  // Entirely the session's: the slot table upload and the chunk copies are
  // ordered on its own streams before its GCA (compute stream), as in the
  // slice-by-slice path.
  for (const SlicePlan& slice : plan.slices) {
    DRT_RETURN_IF_ERROR(SessionOf(slice).PrepareGca(slice, group));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBatchedStep<T>::GcaMlp(const StepPlan& plan, DecoderLayerId id) {
  const DeviceUpperLayer<T>& layer = weights_.upper[id.group][id.within];
  const int64_t n = plan.num_rows;
  // The base LM: the upper layer without its GCA (CudaSession::GcaMlp).
  if (disable_gca_) return MlpRows(plan, layer.base, b_.h.get(), b_.h.get());
  // Forward pass 6 after the attention: r = h; h = r + MLP(RMSNorm2(r + GCA(h))),
  // as CudaSession::GcaBlock; the GCA itself slice by slice.
  const int64_t d = b_.sizes().d;
  const int64_t S = b_.sizes().chunk;
  const int rows = static_cast<int>(n);
  cudaStream_t stream = b_.stream();
  kernels::CublasGemm& gemm = b_.gemm();
  const bool fused = kernels::UseDecodeGemv(fused_gemv_, n);
  if (fused) {
    DRT_RETURN_IF_ERROR(FusedNormProject(b_.h.get(), layer.gca_pre_norm, layer.gca_q, rows,
                                         FusedDecodeSizesOf(b_.sizes()),
                                         static_cast<float>(config_.rms_norm_eps), b_.q.get(),
                                         stream));
  } else {
    DRT_CUDA_RETURN_IF_ERROR(
        kernels::LaunchRmsNorm(b_.h.get(), layer.gca_pre_norm, rows, static_cast<int>(d),
                               static_cast<float>(config_.rms_norm_eps), b_.x.get(), stream),
        "LaunchRmsNorm (gca.pre_norm)");
    DRT_RETURN_IF_ERROR(gemm.Matmul(b_.x.get(), layer.gca_q, b_.q.get(), rows, d, d, stream));
  }
  DRT_RETURN_IF_ERROR(SessionsAfterStep(plan));
  for (const SlicePlan& slice : plan.slices) {
    const int64_t r = slice.first_row;
    // The query chunk of the slice's first row indexes the slot table's
    // first row (CudaSession::GcaMlp).
    DRT_RETURN_IF_ERROR(SessionOf(slice).GcaAttentionRows(id.group, b_.q.get() + r * d,
                                                          b_.attn.get() + r * d, slice.num_rows,
                                                          slice.first_position,
                                                          slice.first_position / S));
  }
  DRT_RETURN_IF_ERROR(StepAfterSessions(plan));
  if (fused) {
    // mixed = h + gca_o(attn) in one launch: no copy of the residual.
    DRT_RETURN_IF_ERROR(FusedProjectAdd(b_.attn.get(), layer.gca_o, b_.h.get(), rows,
                                        static_cast<int>(d), static_cast<int>(d),
                                        b_.mixed.get(), stream));
    CountFused(plan, 2);  // the query's and the output's
    return MlpRows(plan, layer.base, b_.mixed.get(), b_.h.get());
  }
  DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b_.mixed.get(), b_.h.get(), n * d * sizeof(float),
                                           cudaMemcpyDeviceToDevice, stream),
                           "copying the residual");
  DRT_RETURN_IF_ERROR(
      gemm.Matmul(b_.attn.get(), layer.gca_o, b_.mixed.get(), rows, d, d, true, stream));
  return MlpRows(plan, layer.base, b_.mixed.get(), b_.h.get());
}

template <typename T>
absl::Status CudaBatchedStep<T>::CommitSelections(const StepPlan& plan) {
  for (const SlicePlan& slice : plan.slices) {
    DRT_RETURN_IF_ERROR(SessionOf(slice).CommitSelections(slice));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBatchedStep<T>::Logits(const StepPlan& plan, absl::Span<float> logits) {
  // Forward pass 8 over every logit row of the step at once (in batches of
  // the buffers' logit capacity), as CudaSession::LaunchLogitBatch.
  const int64_t d = b_.sizes().d;
  const int64_t V = b_.sizes().vocab;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  cudaStream_t stream = b_.stream();
  const absl::Span<const LogitRow> all(plan.logit_rows);
  for (int64_t b0 = 0; b0 < static_cast<int64_t>(all.size()); b0 += b_.logit_capacity()) {
    const int64_t m = std::min<int64_t>(b_.logit_capacity(), all.size() - b0);
    for (const RowRun& run : ConsecutiveRowRuns(all.subspan(b0, m))) {
      DRT_CUDA_RETURN_IF_ERROR(
          kernels::LaunchRmsNorm(b_.h.get() + run.first_row * d, weights_.norm,
                                 static_cast<int>(run.count), static_cast<int>(d), eps,
                                 b_.final_normed.get() + run.out_row * d, stream),
          "LaunchRmsNorm (final norm)");
    }
    DRT_RETURN_IF_ERROR(b_.gemm().Matmul(b_.final_normed.get(), weights_.lm_head,
                                         b_.logits.get(), static_cast<int>(m),
                                         static_cast<int>(V), static_cast<int>(d),
                                         /*accumulate=*/false, stream));
    DRT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b_.logits_host.get(), b_.logits.get(),
                                             m * V * sizeof(float), cudaMemcpyDeviceToHost,
                                             stream),
                             "copying logits to the host");
    DRT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "waiting for the logits");
    std::memcpy(logits.data() + b0 * V, b_.logits_host.get(), m * V * sizeof(float));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaBatchedStep<T>::Finish(const StepPlan& plan) {
  // The session state this step changed was written on the sessions' own
  // streams, and Logits waited for the step stream: nothing to order.
  for (const SlicePlan& slice : plan.slices) SessionOf(slice).Finish(slice);
  return absl::OkStatus();
}

template class CudaBatchedStep<bf16>;
template class CudaBatchedStep<float>;

}  // namespace drt::cuda
