// Per-session state and forward pass of the CPU backend (drt-model.md,
// "Forward pass"; design.md, "One position through the engine").
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/chunk_store.h"
#include "engine/cpu/thread_pool.h"
#include "engine/cpu/window_cache.h"

namespace drt::cpu {

class CpuSession final : public BackendSession {
 public:
  // The pool is the backend's, shared by all its sessions.
  CpuSession(const ModelConfig& config, const ModelWeights& weights, const CpuBackendOptions& options,
             ThreadPool& pool);

  absl::Status Forward(absl::Span<const int32_t> ids, absl::Span<const int64_t> logit_rows,
                       absl::Span<float> logits) override;
  int64_t position() const override { return position_; }
  int64_t num_chunks() const override { return store_.size(); }
  SessionMemory memory() const override;
  std::vector<Retrieval> current_retrieval() const override { return selection_; }
  void set_retrieval_observer(RetrievalObserver observer) override {
    observer_ = std::move(observer);
  }
  absl::StatusOr<std::unique_ptr<BackendSession>> Fork() const override;
  // engine/cpu/cpu_session_state.cc
  absl::Status ExportState(BackendSessionState& out) const override;
  absl::Status ReadChunk(int64_t chunk, ChunkData& out) const override;
  absl::Status ImportState(const BackendSessionState& state, int64_t num_chunks,
                           const ChunkReader& read) override;

 private:
  // Runs one segment of ids starting at position_, which never exceeds
  // max_segment_positions; writes hidden states of its rows into hidden.
  void RunSegment(absl::Span<const int32_t> ids, std::vector<float>& hidden);
  void SelfAttentionBlock(int64_t layer_index, const LayerWeights& layer, float* h, int64_t n,
                          float* scratch_q, float* scratch_k, float* scratch_v, float* scratch_attn);
  void MlpBlock(const LayerWeights& layer, const float* residual, const float* normed_input,
                float* h, int64_t n);
  // Encodes `count` completed chunks whose 64 lower-layer rows each are in
  // rows, and appends them to the store.
  void EncodeChunks(const float* rows, int64_t count);
  Retrieval Retrieve(int64_t group, const float* hidden_row, int64_t chunk) const;

  const ModelConfig& config_;
  const ModelWeights& weights_;
  CpuBackendOptions options_;
  ThreadPool& pool_;

  int64_t position_ = 0;
  std::vector<WindowCache> windows_;  // one per decoder layer, lower then upper
  std::vector<float> open_chunk_;     // lower-layer rows of the open chunk
  ChunkStore store_;
  std::vector<Retrieval> selection_;  // in force now, per group
  RetrievalObserver observer_;
};

}  // namespace drt::cpu
