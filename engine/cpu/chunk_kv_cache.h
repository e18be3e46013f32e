// One CPU session's GCA keys and values of closed chunks, made from their
// encoder rows (engine/cpu/chunk_kv.h) when a selection first reads them.
// The chunk store holds only encoder rows; this cache holds K/V of the
// chunks the selections in force name (each step reads them again) plus a
// reserve of the most recently read others, which later selections may
// name again (docs/engine.md, "Chunk store of encoder rows"). Within a step
// it also holds the chunks one group's selections read (CpuStep trims it
// before each group).
//
// Entries are immutable once made and shared by pointer, so a fork copies
// the cache without copying K/V. What an entry holds never depends on the
// cache's state: the same chunk gives the same K/V whenever it is made.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/types/span.h"

namespace drt::cpu {

// K/V of one chunk: [chunk_positions x d] each, the landmark row zero.
struct ChunkKv {
  std::vector<float> keys, values;
};

class ChunkKvCache {
 public:
  // `reserve`: how many chunks beyond those a Trim keeps by name it keeps
  // anyway, the most recently used first.
  explicit ChunkKvCache(int64_t reserve) : reserve_(reserve) {}

  // The entry of `chunk`, marked as just used; nullptr when not made.
  const ChunkKv* Use(int64_t chunk);
  bool Contains(int64_t chunk) const { return entries_.count(chunk) != 0; }
  // Adds an entry for `chunk` (not present) with keys and values of
  // `floats` each, for the caller to fill before anyone reads it; marked
  // as just used.
  ChunkKv& Add(int64_t chunk, int64_t floats);
  // Drops every entry but those of `keep` and the `reserve` most recently
  // used others.
  void Trim(absl::Span<const int64_t> keep);

  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  int64_t reserve() const { return reserve_; }
  // Bytes of K/V held (entries shared with a fork counted in full).
  size_t bytes() const;
  // Of bytes(), what the other holders of entries shared with forks count
  // (as ChunkStore::shared_elsewhere_bytes).
  size_t shared_elsewhere_bytes() const;

 private:
  struct Entry {
    std::shared_ptr<ChunkKv> kv;
    uint64_t last_used = 0;
  };
  int64_t reserve_;
  uint64_t clock_ = 0;
  std::unordered_map<int64_t, Entry> entries_;
};

}  // namespace drt::cpu
