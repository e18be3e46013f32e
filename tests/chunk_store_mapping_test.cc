// The CPU chunk store's side of the disk tier (engine/cpu/chunk_store.h):
// a full block handed to a mapping reads its K/V there and frees its own; a
// fork sharing the block keeps its copy; ranges that are not a whole closed
// block are refused and change nothing. The mapping here is a plain copy in
// memory, so every pointer can be told apart.
#include <cstring>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cpu/chunk_store.h"

namespace drt::cpu {
namespace {

constexpr int64_t kRows = 4, kWidth = 3, kBlock = ChunkStore::kChunksPerBlock;

// Chunk c's landmark, keys and values hold c*1000 + offset: every float differs.
struct ChunkValues {
  std::vector<float> landmark, keys, values;
  explicit ChunkValues(int64_t c) : landmark(kWidth), keys(kRows * kWidth), values(kRows * kWidth) {
    for (size_t i = 0; i < landmark.size(); ++i) landmark[i] = c * 1000.f + i;
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = c * 1000.f + 100 + i;
    for (size_t i = 0; i < values.size(); ++i) values[i] = c * 1000.f + 500 + i;
  }
};

class CopyMapping final : public MappedChunks {
 public:
  CopyMapping(int64_t first, int64_t count) : first_(first) {
    for (int64_t c = first; c < first + count; ++c) chunks_.emplace_back(c);
  }
  int64_t first() const override { return first_; }
  int64_t size() const override { return static_cast<int64_t>(chunks_.size()); }
  const float* landmark(int64_t c) const override { return chunks_[c - first_].landmark.data(); }
  const float* keys(int64_t c) const override { return chunks_[c - first_].keys.data(); }
  const float* values(int64_t c) const override { return chunks_[c - first_].values.data(); }
  size_t kv_bytes() const override { return chunks_.size() * 2 * kRows * kWidth * sizeof(float); }

 private:
  int64_t first_;
  std::vector<ChunkValues> chunks_;
};

ChunkStore StoreOf(int64_t chunks) {
  ChunkStore store(kRows, kWidth);
  for (int64_t c = 0; c < chunks; ++c) {
    ChunkValues v(c);
    store.Append(v.landmark.data(), v.keys.data(), v.values.data());
  }
  return store;
}

bool Holds(const ChunkStore& store, int64_t c) {
  ChunkValues v(c);
  return std::memcmp(store.landmark(c), v.landmark.data(), kWidth * sizeof(float)) == 0 &&
         std::memcmp(store.keys(c), v.keys.data(), kRows * kWidth * sizeof(float)) == 0 &&
         std::memcmp(store.values(c), v.values.data(), kRows * kWidth * sizeof(float)) == 0;
}

TEST_CASE("a mapped block reads K/V from the mapping and frees its own", "[disk_tier]") {
  ChunkStore store = StoreOf(2 * kBlock + 5);
  const ChunkStore fork = store;  // shares every block
  const size_t block_kv = kBlock * 2 * kRows * kWidth * sizeof(float);
  const size_t kv_before = store.kv_bytes();
  auto mapping = std::make_shared<CopyMapping>(kBlock, kBlock);
  REQUIRE(store.MapBlock(mapping).ok());
  REQUIRE(store.keys(kBlock + 3) == mapping->keys(kBlock + 3));
  REQUIRE(store.values(2 * kBlock - 1) == mapping->values(2 * kBlock - 1));
  REQUIRE(store.keys(3) != nullptr);
  REQUIRE(store.kv_bytes() == kv_before - block_kv);
  REQUIRE(store.mapped_bytes() == block_kv);
  for (int64_t c = 0; c < store.size(); ++c) REQUIRE(Holds(store, c));
  // The fork still reads its own copy of the block it shared.
  REQUIRE(fork.keys(kBlock + 3) != mapping->keys(kBlock + 3));
  REQUIRE(fork.mapped_bytes() == 0);
  for (int64_t c = 0; c < fork.size(); ++c) REQUIRE(Holds(fork, c));
  // Appending after mapped blocks goes on as before.
  ChunkValues next(store.size());
  store.Append(next.landmark.data(), next.keys.data(), next.values.data());
  REQUIRE(Holds(store, store.size() - 1));
}

TEST_CASE("a store can start from mapped blocks", "[disk_tier]") {
  ChunkStore store(kRows, kWidth);
  auto mapping = std::make_shared<CopyMapping>(0, kBlock);
  REQUIRE(store.AppendMappedBlock(mapping).ok());
  ChunkValues next(kBlock);
  store.Append(next.landmark.data(), next.keys.data(), next.values.data());
  REQUIRE(store.size() == kBlock + 1);
  for (int64_t c = 0; c < store.size(); ++c) REQUIRE(Holds(store, c));
  REQUIRE(store.landmark(5) != mapping->landmark(5));  // landmarks are copied into RAM
  REQUIRE(store.keys(5) == mapping->keys(5));
  // A second mapped block must start where the store is on a block boundary.
  REQUIRE(store.AppendMappedBlock(std::make_shared<CopyMapping>(kBlock + 1, kBlock)).code() ==
          absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("mappings that are not one whole closed block are refused", "[disk_tier]") {
  ChunkStore store = StoreOf(kBlock + 10);
  const size_t kv = store.kv_bytes();
  // Not on a block boundary, not a whole block, not closed yet.
  for (auto [first, count] : {std::pair<int64_t, int64_t>{1, kBlock}, {0, kBlock - 1}, {kBlock, kBlock}}) {
    const absl::Status s = store.MapBlock(std::make_shared<CopyMapping>(first, count));
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(store.kv_bytes() == kv);
    REQUIRE(store.mapped_bytes() == 0);
  }
  for (int64_t c = 0; c < store.size(); ++c) REQUIRE(Holds(store, c));
}

}  // namespace
}  // namespace drt::cpu
