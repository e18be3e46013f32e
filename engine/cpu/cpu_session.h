// Per-session state of the CPU backend (design.md, "Session state"). The
// forward pass that reads and advances it is engine/forward_pass.h, executed
// by CpuStep (engine/cpu/cpu_step.h) over all sessions of a step at once.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/chunk_kv_cache.h"
#include "engine/cpu/chunk_store.h"
#include "engine/cpu/window_cache.h"

namespace drt::cpu {

class CpuStep;

class CpuSession final : public BackendSession {
 public:
  // `chunk_kv_reserve`: CpuBackendOptions::chunk_kv_reserve.
  CpuSession(const ModelConfig& config, int64_t chunk_kv_reserve);

  int64_t position() const override { return position_; }
  int64_t num_chunks() const override { return store_.size(); }
  SessionMemory memory() const override;
  std::vector<Retrieval> current_retrieval() const override { return selection_; }
  void set_retrieval_observer(RetrievalObserver observer) override {
    observer_ = std::move(observer);
  }
  bool has_retrieval_observer() const override { return observer_ != nullptr; }
  BackendSessionStats stats() const override { return stats_; }
  absl::StatusOr<std::unique_ptr<BackendSession>> Fork() const override;
  // engine/cpu/cpu_session_state.cc
  absl::Status ExportState(BackendSessionState& out) const override;
  absl::Status ReadChunk(int64_t chunk, ChunkData& out) const override;
  absl::Status ImportState(const BackendSessionState& state, int64_t num_chunks,
                           const ChunkReader& read, const ChunkMapper& map = nullptr) override;
  // The disk tier maps whole chunk-store blocks.
  int64_t chunk_map_unit() const override { return ChunkStore::kChunksPerBlock; }
  absl::Status MapChunks(std::shared_ptr<const MappedChunks> chunks) override {
    return store_.MapBlock(std::move(chunks));
  }

 private:
  // The executor of the forward pass reads and advances the state below.
  friend class CpuStep;

  const ModelConfig& config_;  // the backend's; for the state export
  int64_t position_ = 0;
  std::vector<WindowCache> windows_;  // one per decoder layer, lower then upper
  std::vector<float> open_chunk_;     // lower-layer rows of the open chunk
  ChunkStore store_;
  // GCA K/V of the chunks the selections read, made from store_'s rows.
  ChunkKvCache kv_cache_;
  std::vector<Retrieval> selection_;  // in force now, per group
  RetrievalObserver observer_;
  BackendSessionStats stats_;  // upper_rows_skipped, logit_rows and the ChunkKvCache counters only
};

}  // namespace drt::cpu
