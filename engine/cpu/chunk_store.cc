#include "engine/cpu/chunk_store.h"

#include <algorithm>
#include <cstring>

namespace drt::cpu {

ChunkStore::Block& ChunkStore::WritableLastBlock() {
  if (blocks_.empty() || blocks_.back()->count == kChunksPerBlock) {
    blocks_.push_back(std::make_shared<Block>());
  } else if (blocks_.back().use_count() > 1) {
    blocks_.back() = std::make_shared<Block>(*blocks_.back());  // shared with a fork
  }
  Block& block = *blocks_.back();
  // Full capacity up front: no reallocation (and no 2x slack) while filling.
  block.landmarks.reserve(kChunksPerBlock * width_);
  block.keys.reserve(kChunksPerBlock * rows_ * width_);
  block.values.reserve(kChunksPerBlock * rows_ * width_);
  return block;
}

void ChunkStore::Append(const float* landmark, const float* keys, const float* values) {
  Block& block = WritableLastBlock();
  const int64_t kv = rows_ * width_;
  block.landmarks.insert(block.landmarks.end(), landmark, landmark + width_);
  block.keys.insert(block.keys.end(), keys, keys + kv);
  block.values.insert(block.values.end(), values, values + kv);
  ++block.count;
  ++size_;
}

const float* ChunkStore::landmark(int64_t chunk) const {
  const Block& b = *blocks_[chunk / kChunksPerBlock];
  return b.landmarks.data() + (chunk % kChunksPerBlock) * width_;
}
const float* ChunkStore::keys(int64_t chunk) const {
  const Block& b = *blocks_[chunk / kChunksPerBlock];
  return b.keys.data() + (chunk % kChunksPerBlock) * rows_ * width_;
}
const float* ChunkStore::values(int64_t chunk) const {
  const Block& b = *blocks_[chunk / kChunksPerBlock];
  return b.values.data() + (chunk % kChunksPerBlock) * rows_ * width_;
}

std::vector<ChunkStore::LandmarkSpan> ChunkStore::LandmarkSpans(int64_t num_chunks) const {
  std::vector<LandmarkSpan> spans;
  num_chunks = std::min(num_chunks, size_);
  for (int64_t first = 0; first < num_chunks; first += kChunksPerBlock) {
    const Block& b = *blocks_[first / kChunksPerBlock];
    spans.push_back({first, std::min(kChunksPerBlock, num_chunks - first), b.landmarks.data()});
  }
  return spans;
}

size_t ChunkStore::kv_bytes() const {
  size_t bytes = 0;
  for (const auto& b : blocks_) bytes += (b->keys.capacity() + b->values.capacity()) * sizeof(float);
  return bytes;
}

size_t ChunkStore::shared_bytes() const {
  size_t bytes = 0;
  for (const auto& b : blocks_) {
    if (b.use_count() > 1) {
      bytes += (b->keys.capacity() + b->values.capacity() + b->landmarks.capacity()) * sizeof(float);
    }
  }
  return bytes;
}

size_t ChunkStore::landmark_bytes() const {
  size_t bytes = 0;
  for (const auto& b : blocks_) bytes += b->landmarks.capacity() * sizeof(float);
  return bytes;
}

}  // namespace drt::cpu
