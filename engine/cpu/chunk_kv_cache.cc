#include "engine/cpu/chunk_kv_cache.h"

#include <algorithm>

namespace drt::cpu {

const ChunkKv* ChunkKvCache::Use(int64_t chunk) {
  auto it = entries_.find(chunk);
  if (it == entries_.end()) return nullptr;
  it->second.last_used = ++clock_;
  return it->second.kv.get();
}

ChunkKv& ChunkKvCache::Add(int64_t chunk, int64_t floats) {
  Entry& e = entries_[chunk];
  e.kv = std::make_shared<ChunkKv>();
  e.kv->keys.resize(floats);
  e.kv->values.resize(floats);
  e.last_used = ++clock_;
  return *e.kv;
}

void ChunkKvCache::Trim(absl::Span<const int64_t> keep) {
  // The others, most recently used first; the first reserve_ of them stay.
  std::vector<std::pair<uint64_t, int64_t>> others;
  for (const auto& [chunk, e] : entries_) {
    if (std::find(keep.begin(), keep.end(), chunk) == keep.end()) {
      others.push_back({e.last_used, chunk});
    }
  }
  if (static_cast<int64_t>(others.size()) <= reserve_) return;
  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) { return a > b; });
  for (size_t i = static_cast<size_t>(reserve_); i < others.size(); ++i) {
    entries_.erase(others[i].second);
  }
}

size_t ChunkKvCache::bytes() const {
  size_t bytes = 0;
  for (const auto& [chunk, e] : entries_) {
    bytes += (e.kv->keys.capacity() + e.kv->values.capacity()) * sizeof(float);
  }
  return bytes;
}

size_t ChunkKvCache::shared_elsewhere_bytes() const {
  size_t bytes = 0;
  for (const auto& [chunk, e] : entries_) {
    const long holders = e.kv.use_count();
    if (holders > 1) {
      const size_t entry = (e.kv->keys.capacity() + e.kv->values.capacity()) * sizeof(float);
      bytes += entry - entry / static_cast<size_t>(holders);
    }
  }
  return bytes;
}

}  // namespace drt::cpu
