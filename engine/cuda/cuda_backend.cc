#include "engine/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/backend_factory.h"
#include "engine/cuda/cuda_session.h"
#include "engine/cuda/cuda_batched_step.h"
#include "engine/cuda/cuda_step.h"
#include "engine/cuda/host/chunk_record_layout.h"
#include "engine/cuda/host/chunk_tier_policy.h"
#include "engine/cuda/host/decode_graph_plan.h"
#include "engine/cuda/host/host_chunk_store.h"
#include "engine/cuda/host/step_rows.h"
#include "engine/cuda/host/stream_delay.h"
#include "engine/cuda/device_weights.h"
#include "engine/cuda/pinned_allocator.h"
#include "engine/cuda/status_macros.h"
#include "engine/forward_pass.h"
#include "engine/model_rules.h"
#include "kernels/cluster_code.h"
#include "kernels/cublas_library.h"
#include "kernels/cuda_check.h"
#include "kernels/decode_gemv_plan.h"
#include "kernels/device_query.h"
#include "kernels/window_attention.h"

namespace drt {
namespace {

constexpr int64_t kMaxStepPositions = int64_t{1} << 16;

absl::Status CheckSupported(const ModelConfig& c) {
  // The kernels hard-code 64-row chunks with the landmark in the last row
  // (drt-model.md, Forward pass 4 and 7): the GCA kernel reads 64 rows per
  // chunk, which must be the model's rule (engine/model_rules.h).
  if (c.chunk_positions() != 64 || GcaRowsPerChunk(c) != 64) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the CUDA backend needs enc_chunk_size 63 (64 decoder positions per chunk), got %d",
        c.enc_chunk_size));
  }
  const int64_t dh = c.head_dim();
  if (dh % 8 != 0 || dh > 128) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the CUDA backend needs a head dimension that is a multiple of 8 and at most 128, got %d",
        dh));
  }
  if (c.num_key_value_heads < 1 || c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "num_attention_heads %d is not a multiple of num_key_value_heads %d",
        c.num_attention_heads, c.num_key_value_heads));
  }
  if (c.chunk_topk < 1 || c.chunk_topk > 32) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the CUDA backend needs chunk_topk in 1..32, got %d", c.chunk_topk));
  }
  if (c.slide_window < 0 || c.slide_window > (1 << 24)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("slide_window %d is out of range", c.slide_window));
  }
  return absl::OkStatus();
}

// The device tier (CudaChunkTier::kDevice, and kAuto, which may choose it)
// keeps K/V: it is refused with a store of encoder rows, which
// state_export selects (the state format and the disk tier move encoder
// rows; docs/cuda.md, "Device tier").
absl::Status CheckChunkTier(const CudaBackendOptions& options) {
  if (options.chunk_tier == CudaChunkTier::kHost) return absl::OkStatus();
  // The option as both binaries spell it (drt-bench has no state export).
  const std::string tier = absl::StrFormat(
      "chunk tier %s (drt-server --cuda_chunk_tier=%s, drt-bench --chunk_tier=%s)",
      CudaChunkTierName(options.chunk_tier), CudaChunkTierName(options.chunk_tier),
      CudaChunkTierName(options.chunk_tier));
  if (options.state_export) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s cannot be combined with state export (drt-server --cuda_state_export): the device "
        "tier keeps keys and values, and state export (and the disk tier) needs the chunk "
        "store of encoder rows",
        tier));
  }
  if (options.chunk_store == CudaChunkStore::kEncoderRows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s cannot be combined with the chunk store of encoder rows (--cuda_chunk_store="
        "encoder_rows, in drt-server and drt-bench): the device tier keeps keys and values "
        "(use --cuda_chunk_store=kv)",
        tier));
  }
  if (options.auto_tier_budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "auto_tier_budget_bytes must be 0 (90%% of the free device memory) or positive, got %d",
        options.auto_tier_budget_bytes));
  }
  if (options.chunk_tier == CudaChunkTier::kAuto && options.auto_tier_max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s needs the largest session context (auto_tier_max_tokens: drt-server's "
        "--max_context_tokens, drt-bench's --prompt_tokens + --generate) to be at least 1, "
        "got %d",
        tier, options.auto_tier_max_tokens));
  }
  return absl::OkStatus();
}

// T: the storage type of options.precision (engine/cuda/storage_type.h).
template <typename T>
class CudaBackend final : public Backend {
 public:
  // tier_ledger: CudaChunkTier::kAuto's budget of device bytes for chunk
  // stores; null otherwise.
  CudaBackend(const ModelConfig& config, const CudaBackendOptions& options,
              std::unique_ptr<cuda::DeviceWeights<T>> weights,
              std::shared_ptr<cuda::DeviceTierLedger> tier_ledger)
      : config_(config),
        options_(options),
        weights_(std::move(weights)),
        host_allocator_(std::make_shared<cuda::PinnedHostAllocator>()),
        tier_ledger_(std::move(tier_ledger)) {}
  ~CudaBackend() override { cudaSetDevice(options_.device_index); }

  std::string name() const override { return "cuda"; }
  const ModelConfig& config() const override { return config_; }
  // Every session's buffers hold this many rows (engine/cuda/session_buffers.h).
  int64_t max_step_positions() const override {
    const int64_t S = config_.chunk_positions();
    return std::max(S, options_.max_step_positions / S * S);
  }
  // Lower-only forwards (StepPlan::lower_only) have never run on a GPU
  // here: the CUDA step's bookkeeping of its window rings, slots and
  // prefetches is not checked against skipped upper rows. Off until it is.
  bool runs_lower_only_forwards() const override { return false; }
  int64_t host_bytes_per_chunk() const override {
    // The device tier keeps chunks off the host. kAuto may put a session on
    // either tier, so the budget expects the host's figure.
    if (options_.chunk_tier == CudaChunkTier::kDevice) return 0;
    const int64_t element = options_.precision == CudaPrecision::kFp32 ? 4 : 2;
    return cuda::ChunkRecordLayoutFor(config_, EffectiveChunkStore(options_)).elements() * element;
  }

  absl::Status Step(const StepPlan& plan, absl::Span<BackendSession* const> sessions,
                    absl::Span<float> logits) override {
    // Everything that can be refused is refused before any state changes.
    std::vector<cuda::CudaSession<T>*> cuda_sessions(sessions.size());
    for (size_t r = 0; r < sessions.size(); ++r) {
      cuda_sessions[r] = dynamic_cast<cuda::CudaSession<T>*>(sessions[r]);
      if (cuda_sessions[r] == nullptr) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "session %d of the step was not made by a CUDA backend of this precision", r));
      }
    }
    if (absl::Status s = CheckStep(plan, sessions, logits.size()); !s.ok()) return s;
    for (const SlicePlan& slice : plan.slices) {
      if (absl::Status s = cuda_sessions[slice.request]->PrepareSlice(slice); !s.ok()) return s;
    }
    DRT_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device_index), "cudaSetDevice");
    // The kernel launchers return cudaGetLastError(): an error some earlier
    // call on this thread left set, and reported already as its own Status
    // (a failed allocation of another session; AllocationFailure clears
    // those) or ignored (a destructor's free), would fail this forward's
    // first launch and mark all its sessions failed. Cleared here. A sticky
    // error (a corrupted context) is not hidden: every later call reports
    // it again.
    (void)cudaGetLastError();
    absl::Status status;
    if (options_.batched_step_rows) {
      // One set of step-wide buffers: batched steps run one at a time.
      std::lock_guard<std::mutex> lock(step_buffers_mutex_);
      if (absl::Status s = ReserveStepBuffers(plan); !s.ok()) return s;
      cuda::CudaBatchedStep<T> step(config_, *weights_, options_.disable_gca,
                                    options_.decode_fused_gemv, options_.debug_stream_delay,
                                    cuda_sessions, *step_buffers_);
      status = RunForward(config_, plan, step, logits);
      if (!status.ok()) {
        // Slices launched before the failure may still read and write the
        // step-wide buffers on their sessions' streams, which the step
        // stream never waited for: drain them before the next batched step
        // can reuse (or Reserve free) those buffers. Errors here add
        // nothing to `status`.
        for (const SlicePlan& slice : plan.slices) {
          (void)cudaStreamSynchronize(cuda_sessions[slice.request]->compute_stream());
        }
      }
    } else {
      // CudaBackendOptions::decode_graphs: the slices that may replay their
      // session's graph launch it first (engine/cuda/host/decode_graph_plan.h);
      // the forward walk then runs the others and collects every slice's
      // logits.
      std::vector<char> replayed(plan.slices.size(), 0);
      if (options_.decode_graphs) {
        for (size_t s = 0; s < plan.slices.size() && status.ok(); ++s) {
          const cuda::DecodeGraphDecision decision =
              cuda::DecideDecodeGraph(plan, static_cast<int64_t>(s));
          const SlicePlan& slice = plan.slices[s];
          cuda::CudaSession<T>& session = *cuda_sessions[slice.request];
          if (!decision.replays() || !session.UseDecodeGraph(decision.key)) continue;
          // false: the capture failed and the session's graphs are off; the
          // eager walk runs the slice.
          absl::StatusOr<bool> launched = session.LaunchDecodeGraph(plan, slice, decision.key);
          if (!launched.ok()) {
            status = launched.status();
          } else if (*launched) {
            replayed[s] = 1;
          }
        }
      }
      if (status.ok()) {
        cuda::CudaStep<T> step(config_, *weights_, cuda_sessions, replayed);
        status = RunForward(config_, plan, step, logits);
      }
    }
    if (!status.ok()) {
      // Work started: every session of the step may be half updated.
      for (const SlicePlan& slice : plan.slices) cuda_sessions[slice.request]->MarkFailed(status);
    }
    return status;
  }
  absl::Status PrepareSessionForStep(BackendSession& session, int64_t end_position) override {
    auto* cuda_session = dynamic_cast<cuda::CudaSession<T>*>(&session);
    if (cuda_session == nullptr) {
      return absl::InvalidArgumentError(
          "the session was not made by a CUDA backend of this precision");
    }
    return cuda_session->ReserveForStep(end_position);
  }
  absl::StatusOr<std::unique_ptr<BackendSession>> NewSession() override {
    auto session =
        cuda::CudaSession<T>::Create(config_, *weights_, options_, host_allocator_, tier_ledger_);
    if (!session.ok()) return session.status();
    return std::unique_ptr<BackendSession>(*std::move(session));
  }

 private:
  // Before a batched step changes anything: the plan's rows fit the
  // step-wide buffers' layout, which are made or grown to hold them.
  absl::Status ReserveStepBuffers(const StepPlan& plan) {
    if (absl::Status s = cuda::CheckStepRows(plan, max_step_positions()); !s.ok()) return s;
    if (step_buffers_ == nullptr) {
      auto made = cuda::StepBuffers<T>::Create(
          cuda::ComputeSessionSizes(config_, options_.max_step_positions));
      if (!made.ok()) return made.status();
      step_buffers_ = *std::move(made);
    }
    return step_buffers_->Reserve(plan.num_rows, static_cast<int64_t>(plan.logit_rows.size()),
                                  static_cast<int64_t>(plan.slices.size()));
  }

  const ModelConfig& config_;
  CudaBackendOptions options_;
  std::unique_ptr<cuda::DeviceWeights<T>> weights_;
  std::shared_ptr<cuda::HostAllocator> host_allocator_;
  std::shared_ptr<cuda::DeviceTierLedger> tier_ledger_;
  // CudaBackendOptions::batched_step_rows: made at the first batched step.
  std::mutex step_buffers_mutex_;
  std::unique_ptr<cuda::StepBuffers<T>> step_buffers_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<Backend>> UploadAndMake(const ModelConfig& config,
                                                       const ModelWeights& weights,
                                                       const CudaBackendOptions& options) {
  auto device_weights = cuda::DeviceWeights<T>::Upload(config, weights);
  if (!device_weights.ok()) return device_weights.status();
  std::shared_ptr<cuda::DeviceTierLedger> tier_ledger;
  if (options.chunk_tier == CudaChunkTier::kAuto) {
    // Measured once, with the weights on the device: what kAuto's sessions
    // may share, and the reserve every decision leaves free
    // (engine/cuda/host/chunk_tier_policy.h).
    size_t free_bytes = 0, total_bytes = 0;
    DRT_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    const int64_t free_now = static_cast<int64_t>(free_bytes);
    const int64_t measured_budget =
        cuda::DeviceTierBudgetBytes(free_now, cuda::kDeviceTierReserveFraction);
    const int64_t budget = options.auto_tier_budget_bytes > 0 ? options.auto_tier_budget_bytes
                                                              : measured_budget;
    tier_ledger = std::make_shared<cuda::DeviceTierLedger>(budget, free_now - measured_budget);
  }
  return std::unique_ptr<Backend>(
      new CudaBackend<T>(config, options, *std::move(device_weights), std::move(tier_ledger)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const ModelConfig& config,
                                                         const ModelWeights& weights,
                                                         const CudaBackendOptions& options) {
  if (absl::Status s = CheckSupported(config); !s.ok()) return s;
  // Rows of a slice are passed to the kernels and cuBLAS as int, and row
  // offsets (rows x width) must stay far from 2^31.
  if (options.max_step_positions < 1 || options.max_step_positions > kMaxStepPositions) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_step_positions must be in 1..%d for the CUDA backend, got %d",
                        kMaxStepPositions, options.max_step_positions));
  }
  if (absl::Status s = CheckChunkTier(options); !s.ok()) return s;
  if (absl::Status s = CheckCudaStreamDelay(options.debug_stream_delay); !s.ok()) return s;
  if (absl::Status s = cuda::CudaSlabOptions(options.max_slab_chunks).status(); !s.ok()) {
    return s;
  }
  const int splits = options.window_decode_splits;
  if (splits != 0 && splits != 1 && splits != 2 && splits != 4 && splits != 8) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "window_decode_splits must be 0, 1, 2, 4 or 8, got %d", splits));
  }
  if (options.decode_graphs && options.batched_step_rows) {
    // A batched step runs the row-wise work of all slices over step-wide
    // buffers; the decode graphs capture a session's own slice ops.
    return absl::InvalidArgumentError(
        "decode_graphs and batched_step_rows cannot be combined: decode graphs capture the "
        "slice-by-slice step (docs/cuda.md, \"Decode graphs\")");
  }
  if (options.decode_fused_gemv) {
    // Refused here rather than at the first decode step: every fused launch
    // the model would make, at 8 rows.
    const int64_t element_bytes = options.precision == CudaPrecision::kFp32 ? 4 : 2;
    if (absl::Status s = kernels::CheckDecodeGemvModel(
            config.hidden_size, config.num_key_value_heads * config.head_dim(),
            config.intermediate_size, element_bytes);
        !s.ok()) {
      return s;
    }
  }
  // cuBLAS is opened at run time by each session's GEMM handle
  // (kernels/cublas_library.h); opened here too, so that a machine without
  // it refuses the backend at start-up instead of every session later (a
  // server that passes its probes and fails every call: review-deploy F1).
  if (absl::StatusOr<kernels::CublasLibrary> cublas = kernels::CublasLibrary::Open(); !cublas.ok()) {
    return cublas.status();
  }
  absl::StatusOr<int> count = cuda::CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (options.device_index < 0 || options.device_index >= *count) {
    return absl::UnavailableError(absl::StrFormat("CUDA device %d requested, %d found",
                                                  options.device_index, *count));
  }
  DRT_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device_index), "cudaSetDevice");
  int major = 0;
  DRT_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, options.device_index),
      "cudaDeviceGetAttribute");
  // The tensor-core prefill kernels use bf16 mma.sync (compute capability
  // 8.0+); fp32 precision ignores the option. Refused here rather than
  // failing at the first prefill step (kernels/mma_bf16.cuh).
  if (options.prefill_tensor_cores && options.precision == CudaPrecision::kBf16 && major < 8) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prefill_tensor_cores needs bf16 tensor cores (compute capability 8.0+); CUDA device "
        "%d has %d.x (leave it off)",
        options.device_index, major));
  }
  if (splits > 1) {
    // The split decode kernel's blocks form a thread block cluster.
    if (major < 9) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "window_decode_splits %d needs thread block clusters (compute capability 9.0+); "
          "CUDA device %d has %d.x (use 0 or 1)",
          splits, options.device_index, major));
    }
    // And the binary must hold the cluster code (sm_90): without it the
    // first decode step would fail and poison every session in it.
    int ptx_version = 0;
    int binary_version = 0;
    DRT_CUDA_RETURN_IF_ERROR(kernels::WindowSplitDecodeCodeVersions(&ptx_version, &binary_version),
                             "reading the split decode kernel's attributes");
    DRT_RETURN_IF_ERROR(kernels::CheckSplitDecodeCode(splits, ptx_version, binary_version));
  }
  switch (options.precision) {
    case CudaPrecision::kBf16: return UploadAndMake<cuda::bf16>(config, weights, options);
    case CudaPrecision::kFp32: return UploadAndMake<float>(config, weights, options);
  }
  return absl::InvalidArgumentError("unknown CUDA precision");
}

}  // namespace drt
