// Which closed chunks of a CUDA session are read from mapped chunk files
// (the disk tier, engine/mapped_chunks.h) instead of the host chunk store.
// Copying the table is the fork's share of the mappings: both read the same
// files, which the state directory keeps while any session uses them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/mapped_chunks.h"

namespace drt::cuda {

class MappedChunkTable {
 public:
  // OK when `chunks` may be added to a session with `closed_chunks` closed
  // chunks that maps `unit` chunks at a time: it is not empty, its first
  // chunk and size are multiples of `unit`, it ends at or before
  // `closed_chunks`, and it overlaps no range added before.
  // INVALID_ARGUMENT naming the problem otherwise.
  absl::Status CheckNew(const MappedChunks& chunks, int64_t unit, int64_t closed_chunks) const;
  // After CheckNew said OK.
  void Add(std::shared_ptr<const MappedChunks> chunks);

  // Whether every chunk of [first, first + count) is mapped already (count
  // > 0). Mapping such a range again is a no-op, as on the CPU backend
  // (ChunkStore::MapBlock): a fork inherits its parent's mappings and the
  // server may map them for it again.
  bool Covers(int64_t first, int64_t count) const;
  // The mapping that holds `chunk`, or null when it is not mapped.
  const MappedChunks* Find(int64_t chunk) const;
  int64_t mapped_chunks() const { return mapped_chunks_; }
  size_t encoder_row_bytes() const { return encoder_row_bytes_; }
  bool empty() const { return ranges_.empty(); }

 private:
  std::vector<std::shared_ptr<const MappedChunks>> ranges_;  // sorted by first(), disjoint
  int64_t mapped_chunks_ = 0;
  size_t encoder_row_bytes_ = 0;
};

}  // namespace drt::cuda
