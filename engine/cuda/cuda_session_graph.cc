// Decode graphs of a CUDA session (CudaBackendOptions::decode_graphs;
// docs/cuda.md, "Decode graphs"): a step that DecideDecodeGraph lets replay
// runs its host work here, then its device work as one launch of the graph
// captured from the very slice ops an eager step runs (engine/cuda/
// cuda_step.h over the slice's own one-slice plan), in their capture mode
// (CudaSession::capturing_): the position is read on the device, and every
// host wait, host staging write and event record is done here, around the
// launch, instead of inside the graph.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/cuda/cuda_session.h"
#include "engine/cuda/cuda_step.h"
#include "engine/cuda/debug_stream_delay.h"
#include "engine/cuda/status_macros.h"
#include "engine/forward_pass.h"
#include "kernels/cuda_check.h"

namespace drt::cuda {
namespace {

// The forward of one slice as CudaStep runs it, but for the end: the logits
// are only queued (their copy to pinned memory is the graph's last node; the
// host waits after the launch) and the step is not finished (the position
// advances when the step that launched the graph finishes).
template <typename T>
class CapturedSliceOps final : public ForwardOps {
 public:
  CapturedSliceOps(CudaStep<T>& step, CudaSession<T>& session) : step_(step), session_(session) {}

  absl::Status Embed(const StepPlan& plan) override { return step_.Embed(plan); }
  absl::Status Attention(const StepPlan& plan, DecoderLayerId layer) override {
    return step_.Attention(plan, layer);
  }
  absl::Status Mlp(const StepPlan& plan, DecoderLayerId layer) override {
    return step_.Mlp(plan, layer);
  }
  absl::Status CloseChunks(const StepPlan& plan) override { return step_.CloseChunks(plan); }
  absl::Status Retrieve(const StepPlan& plan, int64_t group) override {
    return step_.Retrieve(plan, group);
  }
  absl::Status AwaitSelections(const StepPlan& plan, int64_t group) override {
    return absl::InternalError("a decode graph cannot wait for a selection of its step");
  }
  absl::Status PrepareGca(const StepPlan& plan, int64_t group) override {
    return step_.PrepareGca(plan, group);
  }
  absl::Status GcaMlp(const StepPlan& plan, DecoderLayerId layer) override {
    return step_.GcaMlp(plan, layer);
  }
  absl::Status CommitSelections(const StepPlan& plan) override {
    return step_.CommitSelections(plan);
  }
  absl::Status Logits(const StepPlan& plan, absl::Span<float> logits) override {
    std::vector<int64_t> rows;
    for (const LogitRow& row : plan.logit_rows) rows.push_back(row.row);
    return session_.QueueLogits(plan.slices[0], rows, logits);
  }
  absl::Status Finish(const StepPlan& plan) override { return absl::OkStatus(); }

 private:
  CudaStep<T>& step_;
  CudaSession<T>& session_;
};

}  // namespace

template <typename T>
absl::StatusOr<bool> CudaSession<T>::LaunchDecodeGraph(const StepPlan& plan,
                                                       const SlicePlan& slice,
                                                       const DecodeGraphKey& key) {
  if (!options_.decode_graphs) {
    return absl::FailedPreconditionError("decode graphs are off (CudaBackendOptions::decode_graphs)");
  }
  if (slice.num_rows != key.rows || slice.num_rows != 1 || !slice.landmarks.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a slice of %d rows with %d landmarks cannot replay a decode graph of %d rows",
        slice.num_rows, slice.landmarks.size(), key.rows));
  }
  cudaStream_t stream = compute_stream_.get();
  // The host work of the step, as the eager ops do it. The staging the
  // graph's head copies from (token ids, position) must have been read by
  // the previous launch or upload.
  DRT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ids_uploaded_.get()),
                           "waiting for the previous id upload");
  buffers_.ids_host.get()[0] = plan.ids[slice.first_row];
  graphs_.host_position()[0] = slice.first_position;
  // Restored if the capture fails: the eager walk then stages again and
  // counts the same chunks (on the host tier, the chunks this staging
  // copied count once more as resident hits there; one step per session).
  const int64_t resident_hits_before = stats_.resident_hits;
  const int64_t fused_launches_before = stats_.fused_gemv_launches;
  BeginStep();
  if (!options_.disable_gca) {
    for (int64_t g = 0; g < sizes_.groups; ++g) {
      // Which chunks serve, their copies if any (fetch stream), the slot
      // table into the group's pinned staging, which the graph uploads.
      absl::StatusOr<int64_t> entries = StageSlotTable(slice, g);
      if (!entries.ok()) return entries.status();
      if (*entries != sizes_.topk) {
        return absl::InternalError(absl::StrFormat(
            "group %d: a decode graph uploads one slot table row, the step has %d entries", g,
            *entries));
      }
      // The graph starts after the group's chunk copies (an eager step waits
      // only before its first GCA of the group; a replay waits before its
      // head: the wait is outside the graph, on an event recorded outside).
      // The device tier copies nothing (as the eager PrepareGca).
      if (!device_tier_) {
        DRT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, fetched_[g].get(), 0),
                                 "ordering the decode graph after the chunk copies");
      }
    }
  }
  // Outside the graph, before its launch (or its capture's first launch).
  DRT_RETURN_IF_ERROR(
      DelayStreamForTest(options_.debug_stream_delay, CudaDelayedStream::kCompute, stream,
                         stats_.stream_delays));

  const GraphExec* exec = graphs_.Find(key);
  if (exec == nullptr) {
    const StepPlan single = SingleSlicePlan(plan, &slice - plan.slices.data());
    CudaSession* self = this;
    CudaStep<T> step(config_, weights_, absl::Span<CudaSession* const>(&self, 1));
    CapturedSliceOps<T> ops(step, *this);
    std::vector<float> unused_logits(single.logit_rows.size() * sizes_.vocab);
    capturing_ = true;
    absl::StatusOr<GraphExec> captured = CaptureGraph(stream, [&]() -> absl::Status {
      return RunForward(config_, single, ops, absl::MakeSpan(unused_logits));
    });
    capturing_ = false;
    // QueueLogits pointed the pending logits at unused_logits; the replay
    // says where they go (ExpectGraphLogits).
    pending_logits_ = nullptr;
    pending_logit_rows_ = 0;
    if (!captured.ok()) {
      // Likely a call the capture does not allow, or an instantiation the
      // device refuses: not a failed step. CaptureGraph ended the capture;
      // the runtime's last error is cleared so that the eager walk's checks
      // do not report it. Nothing captured ran, so the eager walk runs the
      // slice from the same state.
      (void)cudaGetLastError();
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      DRT_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture),
                               "checking the compute stream after a failed capture");
      if (capture != cudaStreamCaptureStatusNone) {
        return absl::InternalError(absl::StrCat(
            "the compute stream is still capturing after a failed capture: ",
            captured.status().message()));
      }
      ++stats_.graph_capture_failures;
      stats_.resident_hits = resident_hits_before;
      stats_.fused_gemv_launches = fused_launches_before;  // the eager walk counts its own
      const bool off_for_good = graphs_.CaptureFailed();
      std::fprintf(stderr,
                   "drt-server: a CUDA decode graph could not be captured (%s); %s\n",
                   std::string(captured.status().message()).c_str(),
                   off_for_good
                       ? "this session decodes without graphs from now on (several failures "
                         "in a row)"
                       : "this session decodes without graphs for a while, then tries again");
      return false;
    }
    graphs_.Add(key, *std::move(captured));
    graphs_.CaptureSucceeded();
    ++stats_.graph_captures;
    exec = graphs_.Find(key);
  }
  DRT_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec->get(), stream), "cudaGraphLaunch");
  ++stats_.graph_replays;
  // The events the captured ops would have recorded, after the whole graph
  // (later than an eager step records them; nothing waits for them before
  // the step's logits anyway): the staging reads (ids, position, slot
  // tables) and the last GCA reading each group's slots.
  DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(ids_uploaded_.get(), stream),
                           "recording the id upload");
  if (!options_.disable_gca) {
    for (int64_t g = 0; g < sizes_.groups; ++g) {
      DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploads_done_[g].get(), stream),
                               "recording the group's uploads");
      DRT_CUDA_RETURN_IF_ERROR(cudaEventRecord(gca_done_[g].get(), stream),
                               "recording the group's GCA");
    }
  }
  return true;
}

template <typename T>
absl::Status CudaSession<T>::ExpectGraphLogits(const SlicePlan& slice,
                                               absl::Span<const int64_t> rows,
                                               absl::Span<float> logits) {
  if (rows.size() != 1 || rows[0] != slice.first_row ||
      static_cast<int64_t>(logits.size()) != sizes_.vocab) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a decode graph computes the logits of its slice's one row %d, asked for %d rows",
        slice.first_row, rows.size()));
  }
  pending_logits_ = logits.data();
  pending_logit_rows_ = 1;
  return absl::OkStatus();
}

template absl::StatusOr<bool> CudaSession<bf16>::LaunchDecodeGraph(const StepPlan&,
                                                                   const SlicePlan&,
                                                                   const DecodeGraphKey&);
template absl::StatusOr<bool> CudaSession<float>::LaunchDecodeGraph(const StepPlan&,
                                                                    const SlicePlan&,
                                                                    const DecodeGraphKey&);
template absl::Status CudaSession<bf16>::ExpectGraphLogits(const SlicePlan&,
                                                           absl::Span<const int64_t>,
                                                           absl::Span<float>);
template absl::Status CudaSession<float>::ExpectGraphLogits(const SlicePlan&,
                                                            absl::Span<const int64_t>,
                                                            absl::Span<float>);

}  // namespace drt::cuda
