// A MappedChunks (engine/mapped_chunks.h) over chunks held in vectors: the
// disk tier's mapping without files, for tests of what a backend does with
// mapped chunks.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/mapped_chunks.h"
#include "engine/session_state.h"

namespace drt::testing {

class VectorMappedChunks final : public MappedChunks {
 public:
  // `chunks` are the session's chunks first, first + 1, ...
  VectorMappedChunks(int64_t first, std::vector<ChunkData> chunks)
      : first_(first), chunks_(std::move(chunks)) {}
  int64_t first() const override { return first_; }
  int64_t size() const override { return static_cast<int64_t>(chunks_.size()); }
  const float* landmark(int64_t c) const override { return chunks_[c - first_].landmark.data(); }
  const float* encoder_rows(int64_t c) const override { return chunks_[c - first_].rows.data(); }
  size_t encoder_row_bytes() const override {
    size_t bytes = 0;
    for (const ChunkData& c : chunks_) bytes += c.rows.size() * sizeof(float);
    return bytes;
  }

 private:
  int64_t first_;
  std::vector<ChunkData> chunks_;
};

}  // namespace drt::testing
