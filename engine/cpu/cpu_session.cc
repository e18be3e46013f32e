#include "engine/cpu/cpu_session.h"

#include <algorithm>

namespace drt::cpu {

CpuSession::CpuSession(const ModelConfig& config, int64_t chunk_kv_reserve)
    : config_(config),
      open_chunk_(config.chunk_positions() * config.hidden_size, 0.f),
      store_(config.enc_chunk_size, config.hidden_size),
      kv_cache_(chunk_kv_reserve),
      selection_(config.num_groups()) {
  const int64_t kv_width = config.num_key_value_heads * config.head_dim();
  const int64_t layers = config.num_lower_layers() + config.num_upper_layers();
  windows_.reserve(layers);
  for (int64_t l = 0; l < layers; ++l) {
    windows_.emplace_back(std::max<int64_t>(1, config.slide_window), kv_width);
  }
}

SessionMemory CpuSession::memory() const {
  SessionMemory m;
  for (const WindowCache& w : windows_) m.window_bytes += w.bytes();
  m.open_chunk_bytes = open_chunk_.capacity() * sizeof(float);
  m.landmark_bytes = store_.landmark_bytes();
  m.chunk_store_bytes = store_.encoder_row_bytes();
  m.chunk_kv_cache_bytes = kv_cache_.bytes();
  m.mapped_chunk_bytes = store_.mapped_bytes();
  m.shared_bytes = store_.shared_bytes();
  m.shared_elsewhere_bytes = store_.shared_elsewhere_bytes() + kv_cache_.shared_elsewhere_bytes();
  for (const Retrieval& r : selection_) {
    m.selection_bytes += r.chunks.capacity() * sizeof(int64_t) + r.weights.capacity() * sizeof(float);
  }
  return m;
}

absl::StatusOr<std::unique_ptr<BackendSession>> CpuSession::Fork() const {
  auto fork = std::make_unique<CpuSession>(*this);
  fork->observer_ = nullptr;
  fork->stats_ = {};
  return fork;
}

}  // namespace drt::cpu
