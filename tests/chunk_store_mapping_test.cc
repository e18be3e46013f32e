// The CPU chunk store's side of the disk tier (engine/cpu/chunk_store.h):
// a full block handed to a mapping reads its encoder rows there and frees
// its own; a
// fork sharing the block keeps its copy; ranges that are not a whole closed
// block are refused and change nothing. The mapping here is a plain copy in
// memory, so every pointer can be told apart.
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cpu/chunk_store.h"

namespace drt::cpu {
namespace {

constexpr int64_t kRows = 4, kWidth = 3, kBlock = ChunkStore::kChunksPerBlock;

// Chunk c's landmark and encoder rows hold c*1000 + offset: every float differs.
struct ChunkValues {
  std::vector<float> landmark, rows;
  explicit ChunkValues(int64_t c) : landmark(kWidth), rows(kRows * kWidth) {
    for (size_t i = 0; i < landmark.size(); ++i) landmark[i] = c * 1000.f + i;
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = c * 1000.f + 100 + i;
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
  const float* encoder_rows(int64_t c) const override { return chunks_[c - first_].rows.data(); }
  size_t encoder_row_bytes() const override {
    return chunks_.size() * kRows * kWidth * sizeof(float);
  }

 private:
  int64_t first_;
  std::vector<ChunkValues> chunks_;
};

ChunkStore StoreOf(int64_t chunks) {
  ChunkStore store(kRows, kWidth);
  for (int64_t c = 0; c < chunks; ++c) {
    ChunkValues v(c);
    store.Append(v.landmark.data(), v.rows.data());
  }
  return store;
}

bool Holds(const ChunkStore& store, int64_t c) {
  ChunkValues v(c);
  return std::memcmp(store.landmark(c), v.landmark.data(), kWidth * sizeof(float)) == 0 &&
         std::memcmp(store.encoder_rows(c), v.rows.data(), kRows * kWidth * sizeof(float)) == 0;
}

TEST_CASE("a mapped block reads encoder rows from the mapping and frees its own", "[disk_tier]") {
  ChunkStore store = StoreOf(2 * kBlock + 5);
  const ChunkStore fork = store;  // shares every block
  const size_t block_rows = kBlock * kRows * kWidth * sizeof(float);
  const size_t rows_before = store.encoder_row_bytes();
  auto mapping = std::make_shared<CopyMapping>(kBlock, kBlock);
  REQUIRE(store.MapBlock(mapping).ok());
  REQUIRE(store.encoder_rows(kBlock + 3) == mapping->encoder_rows(kBlock + 3));
  REQUIRE(store.encoder_rows(2 * kBlock - 1) == mapping->encoder_rows(2 * kBlock - 1));
  REQUIRE(store.encoder_rows(3) != nullptr);
  REQUIRE(store.encoder_row_bytes() == rows_before - block_rows);
  REQUIRE(store.mapped_bytes() == block_rows);
  for (int64_t c = 0; c < store.size(); ++c) REQUIRE(Holds(store, c));
  // The fork still reads its own copy of the block it shared.
  REQUIRE(fork.encoder_rows(kBlock + 3) != mapping->encoder_rows(kBlock + 3));
  REQUIRE(fork.mapped_bytes() == 0);
  for (int64_t c = 0; c < fork.size(); ++c) REQUIRE(Holds(fork, c));
  // Appending after mapped blocks goes on as before.
  ChunkValues next(store.size());
  store.Append(next.landmark.data(), next.rows.data());
  REQUIRE(Holds(store, store.size() - 1));
}

TEST_CASE("a store can start from mapped blocks", "[disk_tier]") {
  ChunkStore store(kRows, kWidth);
  auto mapping = std::make_shared<CopyMapping>(0, kBlock);
  REQUIRE(store.AppendMappedBlock(mapping).ok());
  ChunkValues next(kBlock);
  store.Append(next.landmark.data(), next.rows.data());
  REQUIRE(store.size() == kBlock + 1);
  for (int64_t c = 0; c < store.size(); ++c) REQUIRE(Holds(store, c));
  REQUIRE(store.landmark(5) != mapping->landmark(5));  // landmarks are copied into RAM
  REQUIRE(store.encoder_rows(5) == mapping->encoder_rows(5));
  // A second mapped block must start where the store is on a block boundary.
  REQUIRE(store.AppendMappedBlock(std::make_shared<CopyMapping>(kBlock + 1, kBlock)).code() ==
          absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("mappings that are not one whole closed block are refused", "[disk_tier]") {
  ChunkStore store = StoreOf(kBlock + 10);
  const size_t rows = store.encoder_row_bytes();
  // Not on a block boundary, not a whole block, not closed yet.
  for (auto [first, count] : {std::pair<int64_t, int64_t>{1, kBlock}, {0, kBlock - 1}, {kBlock, kBlock}}) {
    const absl::Status s = store.MapBlock(std::make_shared<CopyMapping>(first, count));
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(store.encoder_row_bytes() == rows);
    REQUIRE(store.mapped_bytes() == 0);
  }
  for (int64_t c = 0; c < store.size(); ++c) REQUIRE(Holds(store, c));
}

// review-server F2: a block held by n stores counts (n - 1) / n of its bytes
// as held elsewhere in each, so the holders' own shares add up to the block
// once. Hand-computed: a block reserves 64 chunks of 4 x 3 rows and a
// 3-float landmark, 64 x 15 x 4 = 3840 bytes.
TEST_CASE("shared blocks count once over their holders' shares", "[engine][memory]") {
  constexpr size_t kBlockBytes = 3840;
  REQUIRE(kBlock * (kRows + 1) * kWidth * sizeof(float) == kBlockBytes);
  auto own = [](const ChunkStore& s) {
    return s.encoder_row_bytes() + s.landmark_bytes() - s.shared_elsewhere_bytes();
  };
  ChunkStore store = StoreOf(kBlock + 5);  // two blocks
  REQUIRE(store.encoder_row_bytes() + store.landmark_bytes() == 2 * kBlockBytes);
  CHECK(store.shared_elsewhere_bytes() == 0);
  ChunkStore fork = store;
  CHECK(store.shared_elsewhere_bytes() == kBlockBytes);  // half of each block
  CHECK(fork.shared_elsewhere_bytes() == kBlockBytes);
  CHECK(own(store) + own(fork) == 2 * kBlockBytes);
  {
    ChunkStore second = store;  // three holders: two thirds of each elsewhere
    CHECK(store.shared_elsewhere_bytes() == 2 * (kBlockBytes - kBlockBytes / 3));
    CHECK(own(store) + own(fork) + own(second) == 2 * kBlockBytes);
  }
  // The fork writes its last block: a copy of its own (copy on write). The
  // first block stays shared by two, the old last block is the store's alone.
  ChunkValues extra(1000);
  fork.Append(extra.landmark.data(), extra.rows.data());
  CHECK(store.shared_elsewhere_bytes() == kBlockBytes / 2);
  CHECK(fork.shared_elsewhere_bytes() == kBlockBytes / 2);
  CHECK(own(store) + own(fork) == 3 * kBlockBytes);
}

// review-writecap W2 and "The MapBlock race": a full block a fork shares is
// never changed in place. Mapping it in one store leaves the other's rows
// where they were; mapping it in both, each on its own thread at once (two
// sessions' group-commit writes), gives each its own mapped block, with the
// same chunks as before. (The old code wrote the block in place when it saw
// use_count() == 1, a relaxed load that orders nothing after the other
// owner's reads: a data race by the letter, which only a race detector
// shows; this test checks what both threads end with.)
TEST_CASE("a block a fork shares, mapped in one store, leaves the other's rows intact",
          "[disk_tier]") {
  ChunkStore store = StoreOf(kBlock + 5);
  ChunkStore fork = store;  // shares both blocks
  const size_t block_rows = kBlock * kRows * kWidth * sizeof(float);
  const size_t rows_before = fork.encoder_row_bytes();
  const size_t shared_before = fork.shared_bytes();
  const float* fork_rows = fork.encoder_rows(7);
  const float* fork_landmark = fork.landmark(7);
  auto mapping = std::make_shared<CopyMapping>(0, kBlock);
  REQUIRE(store.MapBlock(mapping).ok());
  REQUIRE(store.encoder_rows(7) == mapping->encoder_rows(7));
  // The fork reads the same rows, at the same place, as before.
  REQUIRE(fork.encoder_rows(7) == fork_rows);
  REQUIRE(fork.landmark(7) == fork_landmark);
  REQUIRE(fork.encoder_row_bytes() == rows_before);
  REQUIRE(fork.mapped_bytes() == 0);
  for (int64_t c = 0; c < fork.size(); ++c) {
    REQUIRE(Holds(fork, c));
    REQUIRE(Holds(store, c));
  }
  // Now the fork holds the block alone: mapping it there frees its rows.
  auto fork_mapping = std::make_shared<CopyMapping>(0, kBlock);
  REQUIRE(fork.MapBlock(fork_mapping).ok());
  REQUIRE(fork.encoder_row_bytes() == rows_before - block_rows);
  REQUIRE(fork.encoder_rows(7) == fork_mapping->encoder_rows(7));
  REQUIRE(store.encoder_rows(7) == mapping->encoder_rows(7));
  for (int64_t c = 0; c < fork.size(); ++c) {
    REQUIRE(Holds(fork, c));
    REQUIRE(Holds(store, c));
  }
  // Only the partial last block is still shared.
  REQUIRE(store.shared_bytes() == fork.shared_bytes());
  REQUIRE(store.shared_bytes() > 0);
  REQUIRE(store.shared_bytes() < shared_before);
}

TEST_CASE("blocks a fork shares, mapped in both stores at once from two threads, read the same "
          "chunks in both",
          "[disk_tier]") {
  const size_t block_rows = kBlock * kRows * kWidth * sizeof(float);
  // Many rounds, so that the two threads' MapBlock calls overlap in every
  // order (each round maps two shared blocks in each store).
  for (int round = 0; round < 200; ++round) {
    ChunkStore store = StoreOf(2 * kBlock + 5);
    ChunkStore fork = store;
    const size_t rows_before = store.encoder_row_bytes();
    std::vector<std::shared_ptr<CopyMapping>> store_maps, fork_maps;
    for (int64_t b = 0; b < 2; ++b) {
      store_maps.push_back(std::make_shared<CopyMapping>(b * kBlock, kBlock));
      fork_maps.push_back(std::make_shared<CopyMapping>(b * kBlock, kBlock));
    }
    absl::Status store_status, fork_status;
    auto map_all = [](ChunkStore& s, const std::vector<std::shared_ptr<CopyMapping>>& maps,
                      absl::Status& status) {
      for (const auto& m : maps) {
        status.Update(s.MapBlock(m));
        // Read every chunk as a step would meanwhile.
        for (int64_t c = 0; c < s.size(); ++c) {
          if (!Holds(s, c)) status.Update(absl::InternalError("wrong chunk"));
        }
      }
    };
    std::thread t1([&] { map_all(store, store_maps, store_status); });
    std::thread t2([&] { map_all(fork, fork_maps, fork_status); });
    t1.join();
    t2.join();
    INFO("round " << round);
    REQUIRE(store_status.ok());
    REQUIRE(fork_status.ok());
    for (int64_t c = 0; c < 2 * kBlock; ++c) {
      REQUIRE(store.encoder_rows(c) == store_maps[c / kBlock]->encoder_rows(c));
      REQUIRE(fork.encoder_rows(c) == fork_maps[c / kBlock]->encoder_rows(c));
    }
    for (int64_t c = 0; c < store.size(); ++c) {
      REQUIRE(Holds(store, c));
      REQUIRE(Holds(fork, c));
    }
    REQUIRE(store.encoder_row_bytes() == rows_before - 2 * block_rows);
    REQUIRE(fork.encoder_row_bytes() == rows_before - 2 * block_rows);
    REQUIRE(store.mapped_bytes() == 2 * block_rows);
    REQUIRE(fork.mapped_bytes() == 2 * block_rows);
  }
}

}  // namespace
}  // namespace drt::cpu
