#include "engine/cpu/cpu_backend.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "engine/cpu/cpu_session.h"
#include "engine/cpu/cpu_step.h"
#include "engine/cpu/cpu_threads.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/thread_pool.h"
#include "engine/forward_pass.h"
#include "engine/session_state.h"
#include "engine/model_rules.h"

namespace drt {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelConfig& config, const ModelWeights& weights,
             const CpuBackendOptions& options)
      : config_(config),
        weights_(weights),
        max_step_positions_(std::max(config.chunk_positions(),
                                     options.max_step_positions / config.chunk_positions() *
                                         config.chunk_positions())),
        lower_only_forwards_(options.lower_only_forwards),
        mixed_lower_only_forwards_(options.lower_only_forwards &&
                                   options.mixed_lower_only_forwards),
        upper_layer_reach_(options.upper_layer_reach > 0 ? options.upper_layer_reach
                                                         : UpperLayerReach(config)),
        chunk_kv_reserve_(std::max<int64_t>(0, options.chunk_kv_reserve)),
        pool_(options.num_threads > 0 ? options.num_threads : cpu::DefaultCpuThreads().threads) {
    cpu::UseSingleThreadedBlas();
  }
  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return config_; }
  absl::StatusOr<std::unique_ptr<BackendSession>> NewSession() override {
    return std::make_unique<cpu::CpuSession>(config_, chunk_kv_reserve_);
  }
  int64_t max_step_positions() const override { return max_step_positions_; }
  int64_t host_bytes_per_chunk() const override {
    return static_cast<int64_t>(ChunkPayloadBytes(config_));
  }
  // CpuStep keeps no per-position bookkeeping of the upper layers: their
  // windows simply miss the rows a lower-only forward skips.
  bool runs_lower_only_forwards() const override { return lower_only_forwards_; }
  // CpuStep runs the upper layers over the plan's first upper_rows() rows.
  bool runs_mixed_lower_only_forwards() const override { return mixed_lower_only_forwards_; }
  int64_t upper_layer_reach() const override { return upper_layer_reach_; }
  // A CpuSession's ExportState and ReadChunk only read it (no shared caches),
  // and MapChunks copies a block a fork still shares instead of changing it.
  bool exports_sessions_concurrently() const override { return true; }

  absl::Status Step(const StepPlan& plan, absl::Span<BackendSession* const> sessions,
                    absl::Span<float> logits) override {
    if (absl::Status s = CheckPlan(plan, sessions, logits.size()); !s.ok()) return s;
    std::vector<cpu::CpuSession*> cpu_sessions(sessions.size());
    for (size_t r = 0; r < sessions.size(); ++r) {
      cpu_sessions[r] = static_cast<cpu::CpuSession*>(sessions[r]);
    }
    std::unique_ptr<cpu::CpuStepScratch> scratch = TakeScratch();
    cpu::CpuStep step(config_, weights_, pool_, cpu_sessions, *scratch);
    absl::Status status = RunForward(config_, plan, step, logits);
    GiveBackScratch(std::move(scratch));
    return status;
  }

 private:
  // Steps may run concurrently (on different sessions): each takes its own
  // scratch; idle ones wait here for the next step.
  std::unique_ptr<cpu::CpuStepScratch> TakeScratch() {
    absl::MutexLock lock(&scratch_mutex_);
    if (idle_scratch_.empty()) return std::make_unique<cpu::CpuStepScratch>();
    std::unique_ptr<cpu::CpuStepScratch> scratch = std::move(idle_scratch_.back());
    idle_scratch_.pop_back();
    return scratch;
  }
  void GiveBackScratch(std::unique_ptr<cpu::CpuStepScratch> scratch) {
    absl::MutexLock lock(&scratch_mutex_);
    idle_scratch_.push_back(std::move(scratch));
  }

  // Backend::CheckStep, and every session a CpuSession.
  absl::Status CheckPlan(const StepPlan& plan, absl::Span<BackendSession* const> sessions,
                         size_t logits_size) const {
    for (size_t r = 0; r < sessions.size(); ++r) {
      if (dynamic_cast<cpu::CpuSession*>(sessions[r]) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrFormat("session %d of the step was not made by the CPU backend", r));
      }
    }
    return CheckStep(plan, sessions, logits_size);
  }

  const ModelConfig& config_;
  const ModelWeights& weights_;
  int64_t max_step_positions_;
  bool lower_only_forwards_;
  bool mixed_lower_only_forwards_;
  int64_t upper_layer_reach_;
  int64_t chunk_kv_reserve_;
  cpu::ThreadPool pool_;
  absl::Mutex scratch_mutex_;
  std::vector<std::unique_ptr<cpu::CpuStepScratch>> idle_scratch_ ABSL_GUARDED_BY(scratch_mutex_);
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const ModelConfig& config, const ModelWeights& weights,
                                        const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(config, weights, options);
}

}  // namespace drt
