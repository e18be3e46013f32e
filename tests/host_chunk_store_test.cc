// The CUDA backend's pinned host chunk store, with plain memory standing in
// for cudaHostAlloc: slab growth, record contents, fork sharing, failures.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cuda/host/chunk_record_layout.h"
#include "engine/cuda/host/host_chunk_store.h"
#include "engine/model_config.h"
#include "tests/test_util/counting_host_allocator.h"

namespace drt::cuda {
namespace {

using CountingAllocator = drt::testing::CountingHostAllocator;

using Bf16Store = HostChunkStore<Bf16Bits>;

constexpr int64_t kRows = 4, kWidth = 3;
constexpr size_t kChunkBytes = 2 * kRows * kWidth * sizeof(Bf16Bits);

std::vector<Bf16Bits> Block(int chunk, int which) {
  std::vector<Bf16Bits> b(kRows * kWidth);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<Bf16Bits>(chunk * 1000 + which * 100 + i);
  return b;
}

void AppendChunk(Bf16Store& store, int chunk) {
  const auto k = Block(chunk, 0), v = Block(chunk, 1);
  REQUIRE(store.Append(k.data(), v.data()).ok());
}

bool HoldsChunk(const Bf16Store& store, int64_t index, int chunk) {
  const auto k = Block(chunk, 0), v = Block(chunk, 1);
  return std::equal(k.begin(), k.end(), store.keys(index)) &&
         std::equal(v.begin(), v.end(), store.values(index));
}

TEST_CASE("host chunk store: slabs double up to the largest size", "[host_chunk_store]") {
  auto alloc = std::make_shared<CountingAllocator>();
  {
    Bf16Store store(kRows, kWidth, alloc, HostChunkStoreOptions{2, 8});
    CHECK(store.size() == 0);
    CHECK(store.bytes() == 0);
    for (int c = 0; c < 2; ++c) AppendChunk(store, c);
    CHECK(store.num_slabs() == 1);
    AppendChunk(store, 2);
    CHECK(store.num_slabs() == 2);  // 2 + 4
    for (int c = 3; c < 14; ++c) AppendChunk(store, c);
    CHECK(store.num_slabs() == 3);  // 2 + 4 + 8 = 14
    AppendChunk(store, 14);
    CHECK(store.num_slabs() == 4);  // capped at 8
    CHECK(alloc->sizes == std::vector<size_t>{2 * kChunkBytes, 4 * kChunkBytes, 8 * kChunkBytes,
                                              8 * kChunkBytes});
    CHECK(store.bytes() == 22 * kChunkBytes);
    CHECK(alloc->live_bytes == store.bytes());
    CHECK(store.size() == 15);
    for (int c = 0; c < 15; ++c) CHECK(HoldsChunk(store, c, c));
    CHECK(store.shared_bytes() == 0);
  }
  CHECK(alloc->live_bytes == 0);
}

TEST_CASE("host chunk store: records written in place after AppendUninitialized",
          "[host_chunk_store]") {
  auto alloc = std::make_shared<CountingAllocator>();
  Bf16Store store(kRows, kWidth, alloc, HostChunkStoreOptions{2, 2});
  auto first = store.AppendUninitialized(3);  // spans two slabs
  REQUIRE(first.ok());
  CHECK(*first == 0);
  CHECK(store.size() == 3);
  CHECK(store.num_slabs() == 2);
  for (int c = 0; c < 3; ++c) {
    const auto k = Block(c, 0), v = Block(c, 1);
    std::copy(k.begin(), k.end(), store.mutable_keys(c));
    std::copy(v.begin(), v.end(), store.mutable_values(c));
  }
  for (int c = 0; c < 3; ++c) CHECK(HoldsChunk(store, c, c));
  // Keys and values of one chunk are one contiguous record.
  CHECK(store.values(0) == store.keys(0) + kRows * kWidth);
  CHECK(store.block_bytes() == kRows * kWidth * sizeof(Bf16Bits));
}

TEST_CASE("host chunk store: a fork shares every slab and neither side writes a shared one",
          "[host_chunk_store]") {
  auto alloc = std::make_shared<CountingAllocator>();
  Bf16Store parent(kRows, kWidth, alloc, HostChunkStoreOptions{4, 4});
  for (int c = 0; c < 6; ++c) AppendChunk(parent, c);  // slab 1 full, slab 2 half
  REQUIRE(parent.num_slabs() == 2);
  const size_t before = alloc->live_bytes;
  std::vector<const Bf16Bits*> parent_records;
  for (int c = 0; c < 6; ++c) parent_records.push_back(parent.keys(c));
  {
    Bf16Store fork = parent;
    CHECK(alloc->live_bytes == before);  // nothing copied
    CHECK(fork.shared_bytes() == fork.bytes());
    CHECK(parent.shared_bytes() == parent.bytes());
    // Each side's own share (bytes less what the other holder counts):
    // together the slabs once, what the allocator holds (review-server F2).
    auto own = [](const Bf16Store& s) { return s.bytes() - s.shared_elsewhere_bytes(); };
    CHECK(own(parent) + own(fork) == alloc->live_bytes);
    CHECK(parent.shared_elsewhere_bytes() == parent.bytes() / 2);
    for (int c = 0; c < 6; ++c) CHECK(fork.keys(c) == parent_records[c]);

    AppendChunk(fork, 100);  // into a new slab: the half-full one is shared
    CHECK(fork.num_slabs() == 3);
    AppendChunk(parent, 200);  // the parent may not write it either
    CHECK(parent.num_slabs() == 3);
    CHECK(own(parent) + own(fork) == alloc->live_bytes);
    CHECK(fork.keys(6) != parent.keys(6));
    CHECK(HoldsChunk(fork, 6, 100));
    CHECK(HoldsChunk(parent, 6, 200));
    for (int c = 0; c < 6; ++c) {
      CHECK(HoldsChunk(parent, c, c));
      CHECK(HoldsChunk(fork, c, c));
    }
    CHECK(parent.shared_bytes() == 2 * 4 * kChunkBytes);
  }
  // The fork is gone: its own slab is freed, the shared ones stay.
  CHECK(alloc->live_bytes == 3 * 4 * kChunkBytes);
  CHECK(parent.shared_bytes() == 0);
  for (int c = 0; c < 6; ++c) CHECK(HoldsChunk(parent, c, c));
  CHECK(HoldsChunk(parent, 6, 200));
}

TEST_CASE("host chunk store: an allocation failure appends nothing", "[host_chunk_store]") {
  auto alloc = std::make_shared<CountingAllocator>();
  Bf16Store store(kRows, kWidth, alloc, HostChunkStoreOptions{2, 2});
  AppendChunk(store, 0);
  AppendChunk(store, 1);
  alloc->fail = true;
  auto more = store.AppendUninitialized(1);
  CHECK(more.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(store.size() == 2);
  alloc->fail = false;
  AppendChunk(store, 2);
  CHECK(store.size() == 3);
  CHECK(HoldsChunk(store, 2, 2));
}

// --- Reserve: the slabs of the next appends opened ahead (a CUDA session
// calls it before a step, so that no kernel of the step waits for, or
// fails on, a pinned allocation; review of the CUDA host side, finding 2).

TEST_CASE("host chunk store: the appends Reserve made room for allocate nothing",
          "[host_chunk_store]") {
  auto alloc = std::make_shared<CountingAllocator>();
  Bf16Store store(kRows, kWidth, alloc, HostChunkStoreOptions{2, 8});
  AppendChunk(store, 0);  // slab 0: 2 chunks, 1 free
  REQUIRE(store.Reserve(5).ok());
  // 1 free in slab 0 + slab 1 (4 chunks) = 5: one slab opened, of the size
  // the second slab has without Reserve.
  CHECK(alloc->sizes == std::vector<size_t>{2 * kChunkBytes, 4 * kChunkBytes});
  CHECK(store.num_slabs() == 2);
  CHECK(store.bytes() == 6 * kChunkBytes);
  CHECK(alloc->live_bytes == store.bytes());
  CHECK(store.size() == 1);
  REQUIRE(store.Reserve(5).ok());  // room already: nothing more
  REQUIRE(store.Reserve(0).ok());
  CHECK(alloc->allocations == 2);

  alloc->fail = true;  // every allocation from now on fails
  auto two = store.AppendUninitialized(2);  // across the slabs, in pieces
  REQUIRE(two.ok());
  for (int c = 3; c < 6; ++c) AppendChunk(store, c);
  CHECK(store.size() == 6);
  CHECK(store.AppendUninitialized(1).status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(store.size() == 6);
  for (int c = 1; c < 3; ++c) {
    const auto k = Block(c, 0), v = Block(c, 1);
    std::copy(k.begin(), k.end(), store.mutable_keys(c));
    std::copy(v.begin(), v.end(), store.mutable_values(c));
  }
  for (int c = 0; c < 6; ++c) CHECK(HoldsChunk(store, c, c));

  // The slab after them is the one the store opens without Reserve (the
  // third: 8 chunks).
  alloc->fail = false;
  AppendChunk(store, 6);
  CHECK(alloc->sizes ==
        std::vector<size_t>{2 * kChunkBytes, 4 * kChunkBytes, 8 * kChunkBytes});
  CHECK(HoldsChunk(store, 6, 6));
}

TEST_CASE("host chunk store: a Reserve that fails changes nothing", "[host_chunk_store]") {
  auto alloc = std::make_shared<CountingAllocator>();
  Bf16Store store(kRows, kWidth, alloc, HostChunkStoreOptions{2, 2});
  AppendChunk(store, 0);
  // Room for 5 more takes two new slabs; the second allocation fails.
  alloc->fail_after = 2;
  const absl::Status refused = store.Reserve(5);
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(refused.message()).find("room for 5 more chunks") != std::string::npos);
  CHECK(store.size() == 1);
  CHECK(store.num_slabs() == 1);
  CHECK(store.bytes() == 2 * kChunkBytes);
  CHECK(alloc->live_bytes == store.bytes());  // the slab it did open is freed
  // Appends go on as if nothing happened: chunk 1 in slab 0, chunk 2 in a new
  // slab of 2.
  alloc->fail_after = -1;
  AppendChunk(store, 1);
  CHECK(store.num_slabs() == 1);
  AppendChunk(store, 2);
  CHECK(store.num_slabs() == 2);
  for (int c = 0; c < 3; ++c) CHECK(HoldsChunk(store, c, c));
  CHECK(alloc->live_bytes == 4 * kChunkBytes);
}

TEST_CASE("host chunk store: a fork gets none of the slabs Reserve holds ahead",
          "[host_chunk_store]") {
  auto alloc = std::make_shared<CountingAllocator>();
  Bf16Store parent(kRows, kWidth, alloc, HostChunkStoreOptions{4, 4});
  for (int c = 0; c < 2; ++c) AppendChunk(parent, c);
  REQUIRE(parent.Reserve(6).ok());  // 2 free in slab 0 + a slab of 4 ahead
  REQUIRE(parent.num_slabs() == 2);
  {
    Bf16Store fork = parent;
    CHECK(fork.num_slabs() == 1);
    CHECK(fork.bytes() == 4 * kChunkBytes);
    CHECK(parent.bytes() == 8 * kChunkBytes);
    alloc->fail = true;
    // The fork has no slab ahead, and slab 0 is shared (read-only): it must
    // allocate, and cannot.
    CHECK(fork.AppendUninitialized(1).status().code() ==
          absl::StatusCode::kResourceExhausted);
    // The parent writes its slab ahead (slab 0 is shared for it too).
    for (int c = 2; c < 6; ++c) AppendChunk(parent, c);
    CHECK(parent.AppendUninitialized(1).status().code() ==
          absl::StatusCode::kResourceExhausted);
    alloc->fail = false;
    AppendChunk(fork, 100);  // its own new slab, not the parent's
    CHECK(fork.num_slabs() == 2);
    for (int c = 2; c < 6; ++c) CHECK(fork.keys(2) != parent.keys(c));
    CHECK(HoldsChunk(fork, 2, 100));
  }
  for (int c = 0; c < 6; ++c) CHECK(HoldsChunk(parent, c, c));
}

TEST_CASE("host chunk store: CUDA slab options honour max_slab_chunks and refuse < 1",
          "[host_chunk_store]") {
  for (const int64_t bad : {int64_t{0}, int64_t{-1}, int64_t{-1024}}) {
    INFO("max_slab_chunks " << bad);
    absl::StatusOr<HostChunkStoreOptions> refused = CudaSlabOptions(bad);
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(refused.status().message()).find("max_slab_chunks") != std::string::npos);
  }
  // From 16 chunks, or from the cap itself when it is smaller.
  const std::vector<std::pair<int64_t, std::pair<int64_t, int64_t>>> cases = {
      {1, {1, 1}}, {4, {4, 4}}, {15, {15, 15}}, {16, {16, 16}}, {1024, {16, 1024}}};
  for (const auto& [max, expected] : cases) {
    INFO("max_slab_chunks " << max);
    absl::StatusOr<HostChunkStoreOptions> options = CudaSlabOptions(max);
    REQUIRE(options.ok());
    CHECK(options->first_slab_chunks == expected.first);
    CHECK(options->max_slab_chunks == expected.second);
  }
  // A cap of 4 makes slabs of 4 chunks, every one.
  auto alloc = std::make_shared<CountingAllocator>();
  Bf16Store store(kRows, kWidth, alloc, *CudaSlabOptions(4));
  for (int c = 0; c < 9; ++c) AppendChunk(store, c);
  CHECK(alloc->sizes ==
        std::vector<size_t>{4 * kChunkBytes, 4 * kChunkBytes, 4 * kChunkBytes});
}

TEST_CASE("host chunk store: fp32 records (the CUDA backend's fp32 precision)",
          "[host_chunk_store]") {
  auto alloc = std::make_shared<CountingAllocator>();
  HostChunkStore<float> store(kRows, kWidth, alloc, HostChunkStoreOptions{2, 2});
  // Twice the bytes of a bf16 record, values right after the keys.
  CHECK(store.block_bytes() == kRows * kWidth * sizeof(float));
  std::vector<float> k(kRows * kWidth), v(kRows * kWidth);
  for (int c = 0; c < 3; ++c) {  // the third opens a second slab
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = 0.1f * c + 1e-7f * i;  // not representable in bf16
      v[i] = -k[i];
    }
    REQUIRE(store.Append(k.data(), v.data()).ok());
  }
  CHECK(store.num_slabs() == 2);
  CHECK(alloc->live_bytes == 2 * 2 * 2 * kRows * kWidth * sizeof(float));
  CHECK(store.values(1) == store.keys(1) + kRows * kWidth);
  for (int c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < kRows * kWidth; ++i) {
      CHECK(store.keys(c)[i] == 0.1f * c + 1e-7f * i);
      CHECK(store.values(c)[i] == -(0.1f * c + 1e-7f * i));
    }
  }
}

TEST_CASE("chunk record layout: encoder rows hold half the bytes of K/V (128M config)",
          "[host_chunk_store]") {
  ModelConfig config;  // the 128M configuration's chunk and width
  config.hidden_size = 768;
  config.enc_chunk_size = 63;
  const ChunkRecordLayout kv = ChunkRecordLayoutFor(config, CudaChunkStore::kKeysValues);
  const ChunkRecordLayout rows = ChunkRecordLayoutFor(config, CudaChunkStore::kEncoderRows);
  CHECK(kv == ChunkRecordLayout{64, 768, 2});    // keys and values, landmark row included
  CHECK(rows == ChunkRecordLayout{63, 768, 1});  // C's real rows only
  auto alloc = std::make_shared<CountingAllocator>();
  HostChunkStore<Bf16Bits> kv_store(kv, alloc, HostChunkStoreOptions{1, 1});
  HostChunkStore<Bf16Bits> rows_store(rows, alloc, HostChunkStoreOptions{1, 1});
  HostChunkStore<float> rows_fp32(rows, alloc, HostChunkStoreOptions{1, 1});
  // bf16: 2 x 64 x 768 x 2 = 196,608 bytes per chunk (3,120.8 per real
  // token) against 63 x 768 x 2 = 96,768 (1,536 per real token).
  CHECK(kv_store.record_bytes() == 196608);
  CHECK(rows_store.record_bytes() == 96768);
  CHECK(rows_store.record_bytes() / 63 == 1536);
  CHECK(rows_fp32.record_bytes() == 193536);
  // The slabs are sized by the record: one chunk each here.
  REQUIRE(kv_store.AppendUninitialized(1).ok());
  REQUIRE(rows_store.AppendUninitialized(1).ok());
  REQUIRE(rows_fp32.AppendUninitialized(1).ok());
  CHECK(alloc->sizes == std::vector<size_t>{196608, 96768, 193536});
  CHECK(kv_store.bytes() == 196608);
  CHECK(rows_store.bytes() == 96768);
}

TEST_CASE("host chunk store: encoder-row records, one block each, one after the other",
          "[host_chunk_store]") {
  const ChunkRecordLayout layout{kRows - 1, kWidth, 1};  // S' = S - 1 rows
  const int64_t elements = (kRows - 1) * kWidth;
  auto alloc = std::make_shared<CountingAllocator>();
  Bf16Store store(layout, alloc, HostChunkStoreOptions{2, 2});
  CHECK(store.record_bytes() == elements * sizeof(Bf16Bits));
  CHECK(store.block_bytes() == store.record_bytes());
  std::vector<std::vector<Bf16Bits>> written;
  for (int c = 0; c < 3; ++c) {  // the third opens a second slab
    std::vector<Bf16Bits> record(elements);
    for (int64_t i = 0; i < elements; ++i) record[i] = static_cast<Bf16Bits>(c * 100 + i);
    REQUIRE(store.AppendRecord(record.data()).ok());
    written.push_back(record);
  }
  CHECK(store.size() == 3);
  CHECK(alloc->sizes ==
        std::vector<size_t>{2 * elements * sizeof(Bf16Bits), 2 * elements * sizeof(Bf16Bits)});
  CHECK(store.record(1) == store.record(0) + elements);  // same slab, back to back
  for (int c = 0; c < 3; ++c) {
    CHECK(std::equal(written[c].begin(), written[c].end(), store.record(c)));
  }
  // Keys and values do not fit a one-block record: refused, nothing appended.
  const auto k = Block(9, 0), v = Block(9, 1);
  const absl::Status refused = store.Append(k.data(), v.data());
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(refused.message()) ==
        "Append(keys, values) on a chunk store of 1-block records (encoder rows)");
  CHECK(store.size() == 3);
  // Release and forks work on records whatever their layout.
  REQUIRE(store.Release(0, 2).ok());
  CHECK(store.num_slabs() == 1);
  CHECK(std::equal(written[2].begin(), written[2].end(), store.record(2)));
}

}  // namespace
}  // namespace drt::cuda
