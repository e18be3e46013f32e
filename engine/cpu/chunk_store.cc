#include "engine/cpu/chunk_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"

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
  block.rows.reserve(kChunksPerBlock * rows_ * width_);
  return block;
}

void ChunkStore::Append(const float* landmark, const float* rows) {
  Block& block = WritableLastBlock();
  block.landmarks.insert(block.landmarks.end(), landmark, landmark + width_);
  block.rows.insert(block.rows.end(), rows, rows + rows_ * width_);
  ++block.count;
  ++size_;
}

const float* ChunkStore::landmark(int64_t chunk) const {
  const Block& b = *blocks_[chunk / kChunksPerBlock];
  return b.landmarks.data() + (chunk % kChunksPerBlock) * width_;
}
const float* ChunkStore::encoder_rows(int64_t chunk) const {
  const Block& b = *blocks_[chunk / kChunksPerBlock];
  if (b.mapped != nullptr) return b.mapped->encoder_rows(chunk);
  return b.rows.data() + (chunk % kChunksPerBlock) * rows_ * width_;
}

absl::Status ChunkStore::CheckMappedBlock(const MappedChunks& mapped, int64_t first) const {
  if (mapped.first() != first || mapped.size() != kChunksPerBlock) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a mapping of chunks [%d, %d) is not block %d of the chunk store, chunks [%d, %d)",
        mapped.first(), mapped.first() + mapped.size(), first / kChunksPerBlock, first,
        first + kChunksPerBlock));
  }
  return absl::OkStatus();
}

absl::Status ChunkStore::AppendMappedBlock(std::shared_ptr<const MappedChunks> mapped) {
  if (size_ % kChunksPerBlock != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "a mapped block can only follow whole blocks; the store holds %d chunks", size_));
  }
  if (absl::Status s = CheckMappedBlock(*mapped, size_); !s.ok()) return s;
  auto block = std::make_shared<Block>();
  block->landmarks.resize(kChunksPerBlock * width_);
  for (int64_t i = 0; i < kChunksPerBlock; ++i) {
    std::memcpy(block->landmarks.data() + i * width_, mapped->landmark(size_ + i),
                width_ * sizeof(float));
  }
  block->count = kChunksPerBlock;
  block->mapped = std::move(mapped);
  blocks_.push_back(std::move(block));
  size_ += kChunksPerBlock;
  return absl::OkStatus();
}

absl::Status ChunkStore::MapBlock(std::shared_ptr<const MappedChunks> mapped) {
  const int64_t first = mapped->first();
  if (first % kChunksPerBlock != 0 || first + kChunksPerBlock > size_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "chunks [%d, %d) are not a whole block of the %d closed chunks", first,
        first + mapped->size(), size_));
  }
  if (absl::Status s = CheckMappedBlock(*mapped, first); !s.ok()) return s;
  std::shared_ptr<Block>& slot = blocks_[first / kChunksPerBlock];
  if (slot->mapped != nullptr) return absl::OkStatus();  // mapped already
  // Always a new block in the slot, never a change of the old one in
  // place: a fork may share it and read it on another thread (its own
  // MapBlock, its steps), and a use_count() of 1 seen here is a relaxed
  // load that orders nothing after the other owner's last reads
  // (review-writecap, "The MapBlock race"). A full block is thus never
  // written once filled (WritableLastBlock only writes a block not full).
  // The old block, with its rows, is freed here when this store held it
  // alone, and lives on with the fork when shared.
  auto own = std::make_shared<Block>();
  own->landmarks = slot->landmarks;
  own->count = slot->count;
  own->mapped = std::move(mapped);
  slot = std::move(own);
  return absl::OkStatus();
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

size_t ChunkStore::encoder_row_bytes() const {
  size_t bytes = 0;
  for (const auto& b : blocks_) bytes += b->rows.capacity() * sizeof(float);
  return bytes;
}

size_t ChunkStore::mapped_bytes() const {
  size_t bytes = 0;
  for (const auto& b : blocks_) {
    if (b->mapped != nullptr) bytes += b->mapped->encoder_row_bytes();
  }
  return bytes;
}

size_t ChunkStore::shared_bytes() const {
  size_t bytes = 0;
  for (const auto& b : blocks_) {
    if (b.use_count() > 1) {
      bytes += (b->rows.capacity() + b->landmarks.capacity()) * sizeof(float);
    }
  }
  return bytes;
}

size_t ChunkStore::shared_elsewhere_bytes() const {
  size_t bytes = 0;
  for (const auto& b : blocks_) {
    const long holders = b.use_count();
    if (holders > 1) {
      const size_t block = (b->rows.capacity() + b->landmarks.capacity()) * sizeof(float);
      bytes += block - block / static_cast<size_t>(holders);
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
