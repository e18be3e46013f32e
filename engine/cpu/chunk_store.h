// Append-only memory of closed chunks: per chunk its landmark vector (d) and
// its encoder output rows (rows x d; engine/session_state.h, ChunkData). GCA
// keys and values are made from the rows when a selection reads the chunk
// (engine/cpu/chunk_kv_cache.h), so the store holds half the bytes K and V
// would take. Chunks live in fixed-capacity
// blocks held by shared_ptr, so a forked session shares every closed chunk;
// a block still shared is copied before it is written (copy on write), which
// bounds a fork's cost by one block.
//
// The disk tier (engine/mapped_chunks.h): a full block's encoder rows can be
// handed over to a mapping of the same chunks in files (MapBlock); the block
// then reads its rows there and keeps only its landmarks in memory.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/mapped_chunks.h"

namespace drt::cpu {

class ChunkStore {
 public:
  static constexpr int64_t kChunksPerBlock = 64;

  ChunkStore(int64_t rows_per_chunk, int64_t width)
      : rows_(rows_per_chunk), width_(width) {}

  int64_t size() const { return size_; }
  int64_t rows_per_chunk() const { return rows_; }
  int64_t width() const { return width_; }

  // Copies one chunk in: landmark [width], encoder rows [rows x width].
  void Append(const float* landmark, const float* rows);
  // Appends a whole block (kChunksPerBlock chunks, starting at size(), which
  // must be a multiple of kChunksPerBlock) read from `mapped`: its landmarks
  // are copied, its encoder rows stay in the mapping.
  absl::Status AppendMappedBlock(std::shared_ptr<const MappedChunks> mapped);
  // Hands block `mapped->first() / kChunksPerBlock` (full, closed, the same
  // contents) over to `mapped` in a new block, never changing the old one (a fork
  // may share it): its encoder rows are freed unless a fork still holds them.
  absl::Status MapBlock(std::shared_ptr<const MappedChunks> mapped);

  const float* landmark(int64_t chunk) const;
  const float* encoder_rows(int64_t chunk) const;  // [rows x width]

  // Landmarks of chunks [first, first + count) are contiguous when they lie in
  // one block; Blocks() exposes them that way for scoring.
  struct LandmarkSpan {
    int64_t first_chunk;
    int64_t count;
    const float* landmarks;  // [count x width]
  };
  std::vector<LandmarkSpan> LandmarkSpans(int64_t num_chunks) const;

  // Bytes of encoder rows and of landmarks held (shared blocks counted in
  // full). encoder_row_bytes() counts rows in memory; mapped_bytes() what is
  // read from mapped files.
  size_t encoder_row_bytes() const;
  size_t mapped_bytes() const;
  size_t landmark_bytes() const;
  // The part of encoder_row_bytes() + landmark_bytes() in blocks another session
  // (a fork or a parent) also holds.
  size_t shared_bytes() const;
  // Of shared_bytes(), what the other holders of the shared blocks count: a
  // block held by n stores counts (n - 1) / n of its bytes here
  // (SessionMemory::shared_elsewhere_bytes). use_count() is read relaxed, so
  // while another thread forks or frees a store this may be a block's share
  // behind: a figure, not a synchronisation.
  size_t shared_elsewhere_bytes() const;

 private:
  struct Block {
    std::vector<float> landmarks, rows;
    int64_t count = 0;
    // When set, rows is empty and the rows are read from here.
    std::shared_ptr<const MappedChunks> mapped;
  };
  absl::Status CheckMappedBlock(const MappedChunks& mapped, int64_t first) const;
  Block& WritableLastBlock();

  int64_t rows_;
  int64_t width_;
  int64_t size_ = 0;
  std::vector<std::shared_ptr<Block>> blocks_;
};

}  // namespace drt::cpu
