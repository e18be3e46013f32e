// The CUDA backend's disk tier on the host, with plain memory standing in
// for cudaHostAlloc: records released from the host chunk store (which
// slabs are freed, forks keeping theirs), the table of mapped ranges and
// its refusals, the fp32 -> storage-type conversion into staging, and the
// staging slots' reuse.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cuda/host/chunk_staging.h"
#include "engine/cuda/host/host_chunk_store.h"
#include "tests/test_util/counting_host_allocator.h"
#include "engine/cuda/host/map_host_chunks.h"
#include "engine/cuda/host/mapped_chunk_table.h"
#include "tests/test_util/vector_mapped_chunks.h"

namespace drt::cuda {
namespace {

using drt::testing::VectorMappedChunks;

using CountingAllocator = drt::testing::CountingHostAllocator;

using Store = HostChunkStore<float>;
constexpr int64_t kRows = 4, kWidth = 3, kKv = kRows * kWidth;
constexpr size_t kChunkBytes = 2 * kKv * sizeof(float);  // keys and values

float Value(int64_t chunk, int which, int64_t i) {
  return static_cast<float>(chunk * 1000 + which * 100 + i);
}

// Slabs of 2, 4, 4, ... chunks: chunks [0, 2), [2, 6), [6, 10), ...
Store StoreOf(int64_t chunks, std::shared_ptr<CountingAllocator> allocator) {
  Store store(kRows, kWidth, allocator, HostChunkStoreOptions{2, 4});
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<float> k(kKv), v(kKv);
    for (int64_t i = 0; i < kKv; ++i) k[i] = Value(c, 0, i), v[i] = Value(c, 1, i);
    REQUIRE(store.Append(k.data(), v.data()).ok());
  }
  return store;
}

bool Holds(const Store& store, int64_t c) {
  if (store.released(c)) return false;
  for (int64_t i = 0; i < kKv; ++i) {
    if (store.keys(c)[i] != Value(c, 0, i) || store.values(c)[i] != Value(c, 1, i)) return false;
  }
  return true;
}

std::shared_ptr<const MappedChunks> MappingOf(int64_t first, int64_t count) {
  std::vector<ChunkData> chunks(count);
  for (int64_t c = 0; c < count; ++c) {
    chunks[c].landmark.assign(kWidth, static_cast<float>(first + c));
    for (int64_t i = 0; i < kKv; ++i) chunks[c].rows.push_back(Value(first + c, 0, i));
  }
  return std::make_shared<VectorMappedChunks>(first, std::move(chunks));
}

TEST_CASE("host chunk store: released records free a slab once none of it is held") {
  auto allocator = std::make_shared<CountingAllocator>();
  Store store = StoreOf(10, allocator);
  REQUIRE(store.num_slabs() == 3);
  REQUIRE(store.bytes() == 10 * kChunkBytes);

  REQUIRE(store.Release(0, 2).ok());  // all of slab 0
  CHECK(store.num_slabs() == 2);
  CHECK(store.bytes() == 8 * kChunkBytes);
  CHECK(allocator->live_bytes == 8 * kChunkBytes);
  CHECK(store.released_count() == 2);

  REQUIRE(store.Release(2, 2).ok());  // half of slab 1: nothing freed
  CHECK(store.bytes() == 8 * kChunkBytes);
  CHECK(store.keys(2) == nullptr);
  CHECK(store.values(3) == nullptr);
  CHECK(Holds(store, 4));
  CHECK(Holds(store, 5));

  REQUIRE(store.Release(4, 2).ok());  // the rest of slab 1
  CHECK(store.bytes() == 4 * kChunkBytes);
  CHECK(allocator->live_bytes == 4 * kChunkBytes);
  for (int64_t c = 0; c < 6; ++c) CHECK(store.released(c));
  for (int64_t c = 6; c < 10; ++c) CHECK(Holds(store, c));
  CHECK(store.size() == 10);
}

TEST_CASE("host chunk store: a bad release names the problem and changes nothing") {
  auto allocator = std::make_shared<CountingAllocator>();
  Store store = StoreOf(10, allocator);
  REQUIRE(store.Release(4, 2).ok());

  absl::Status outside = store.Release(8, 4);
  CHECK(outside.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(outside.message()), Catch::Contains("[8, 12)") &&
                                                 Catch::Contains("[0, 10)"));
  absl::Status twice = store.Release(5, 2);
  CHECK(twice.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(twice.message()), Catch::Contains("chunk 5 is released already"));
  CHECK(store.Release(-1, 1).code() == absl::StatusCode::kInvalidArgument);

  CHECK(Holds(store, 6));  // before the released chunk in the refused range: kept
  CHECK(Holds(store, 8));
  CHECK(store.released_count() == 2);
  CHECK(store.bytes() == 10 * kChunkBytes);
}

TEST_CASE("host chunk store: appends after the last slab was freed go to a new one") {
  auto allocator = std::make_shared<CountingAllocator>();
  Store store = StoreOf(3, allocator);  // slab 1 holds chunk 2 and has room for 3 more
  REQUIRE(store.Release(2, 1).ok());
  CHECK(store.bytes() == 2 * kChunkBytes);
  std::vector<float> k(kKv), v(kKv);
  for (int64_t i = 0; i < kKv; ++i) k[i] = Value(3, 0, i), v[i] = Value(3, 1, i);
  REQUIRE(store.Append(k.data(), v.data()).ok());
  CHECK(Holds(store, 3));
  CHECK(Holds(store, 0));
  CHECK(store.num_slabs() == 2);
}

TEST_CASE("host chunk store: a fork keeps the records its parent released") {
  auto allocator = std::make_shared<CountingAllocator>();
  Store parent = StoreOf(6, allocator);
  Store fork = parent;
  REQUIRE(parent.Release(0, 2).ok());
  CHECK(parent.bytes() == 4 * kChunkBytes);
  CHECK(allocator->live_bytes == 6 * kChunkBytes);  // the fork still holds slab 0
  CHECK(Holds(fork, 0));
  CHECK(Holds(fork, 1));
  CHECK(fork.shared_bytes() == 4 * kChunkBytes);  // slab 1 only

  REQUIRE(fork.Release(0, 2).ok());
  CHECK(allocator->live_bytes == 4 * kChunkBytes);
}

TEST_CASE("host chunk store: chunks appended released hold no memory") {
  auto allocator = std::make_shared<CountingAllocator>();
  Store store(kRows, kWidth, allocator, HostChunkStoreOptions{2, 4});
  store.AppendReleased(4);
  CHECK(store.size() == 4);
  CHECK(store.bytes() == 0);
  CHECK(allocator->allocations == 0);
  std::vector<float> k(kKv), v(kKv);
  for (int64_t i = 0; i < kKv; ++i) k[i] = Value(4, 0, i), v[i] = Value(4, 1, i);
  REQUIRE(store.Append(k.data(), v.data()).ok());
  CHECK(Holds(store, 4));
  for (int64_t c = 0; c < 4; ++c) CHECK(store.released(c));
  CHECK(store.Release(2, 1).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("mapped chunk table: whole units of closed chunks, no overlap") {
  MappedChunkTable table;
  const int64_t unit = 2, closed = 8;
  REQUIRE(table.CheckNew(*MappingOf(2, 2), unit, closed).ok());
  table.Add(MappingOf(2, 2));

  auto refused = [&](int64_t first, int64_t count, const std::string& why) {
    absl::Status s = table.CheckNew(*MappingOf(first, count), unit, closed);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains(why));
  };
  refused(1, 2, "not whole units of 2 chunks");
  refused(4, 3, "not whole units of 2 chunks");
  refused(4, 0, "not whole units");
  refused(6, 4, "not all closed; the session has 8 closed chunks");
  refused(2, 2, "overlap chunks [2, 4) mapped already");
  refused(0, 4, "overlap chunks [2, 4)");
  refused(2, 6, "overlap chunks [2, 4)");
  CHECK(table.CheckNew(*MappingOf(0, 2), 0, closed).code() ==
        absl::StatusCode::kInvalidArgument);

  table.Add(MappingOf(6, 2));
  REQUIRE(table.CheckNew(*MappingOf(4, 2), unit, closed).ok());
  CHECK(table.Find(0) == nullptr);
  CHECK(table.Find(1) == nullptr);
  REQUIRE(table.Find(3) != nullptr);
  CHECK(table.Find(3)->first() == 2);
  CHECK(table.Find(4) == nullptr);
  REQUIRE(table.Find(7) != nullptr);
  CHECK(table.Find(7)->first() == 6);
  CHECK(table.Find(8) == nullptr);
  CHECK(table.mapped_chunks() == 4);
  CHECK(table.encoder_row_bytes() == 4 * kKv * sizeof(float));  // the mappings' rows

  // Covers: every chunk of the range mapped (what CudaSession::MapChunks
  // accepts again as a no-op, like the CPU's ChunkStore::MapBlock).
  CHECK(table.Covers(2, 2));
  CHECK(table.Covers(3, 1));
  CHECK(table.Covers(6, 2));
  CHECK_FALSE(table.Covers(2, 4));  // 4 and 5 are not mapped
  CHECK_FALSE(table.Covers(0, 2));
  CHECK_FALSE(table.Covers(6, 4));  // past the last mapping
  CHECK_FALSE(table.Covers(2, 0));
  table.Add(MappingOf(4, 2));
  CHECK(table.Covers(2, 6));  // three adjacent mappings
}

TEST_CASE("MapHostChunks: releases the mapped records, refuses bad ranges changing nothing") {
  auto allocator = std::make_shared<CountingAllocator>();
  Store store = StoreOf(10, allocator);
  MappedChunkTable table;
  const int64_t unit = 2;

  REQUIRE(MapHostChunks<float>(MappingOf(0, 2), unit, store, table).ok());
  CHECK(store.bytes() == 8 * kChunkBytes);
  CHECK(table.mapped_chunks() == 2);

  auto refused = [&](std::shared_ptr<const MappedChunks> m, const std::string& why) {
    absl::Status s = MapHostChunks<float>(std::move(m), unit, store, table);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains(why));
    CHECK(store.bytes() == 8 * kChunkBytes);
    CHECK(store.released_count() == 2);
    CHECK(table.mapped_chunks() == 2);
    for (int64_t c = 2; c < 10; ++c) CHECK(Holds(store, c));
  };
  refused(MappingOf(3, 2), "not whole units");
  refused(MappingOf(8, 4), "not all closed; the session has 10 closed chunks");
  refused(MappingOf(0, 4), "overlap");
  refused(nullptr, "no mapped chunks");

  REQUIRE(MapHostChunks<float>(MappingOf(2, 4), unit, store, table).ok());
  CHECK(store.bytes() == 4 * kChunkBytes);  // slab [2, 6) freed
  CHECK(table.Find(5) != nullptr);
}

TEST_CASE("mapped chunk to staging: fp32 kept, bf16 rounded to nearest even") {
  // Hand-computed bf16 bits: 1 (0x3f80); 1 + 2^-8 is halfway between 0x3f80
  // and 0x3f81 and goes to the even 0x3f80; 1 + 3 * 2^-8 halfway between
  // 0x3f81 and 0x3f82 goes to 0x3f82; pi (0x40490fdb) rounds down to 0x4049;
  // -2 is 0xc000; 1 + 2^-8 + 2^-16 is past halfway: 0x3f81.
  const std::vector<float> floats = {1.f, 1.00390625f, 1.01171875f, 3.14159274f, -2.f,
                                     1.f + 0x1p-8f + 0x1p-16f};
  const std::vector<Bf16Bits> expected = {0x3f80, 0x3f80, 0x3f82, 0x4049, 0xc000, 0x3f81};
  const int64_t kv = static_cast<int64_t>(floats.size());
  std::vector<ChunkData> chunks(2);
  for (ChunkData& c : chunks) c.landmark.assign(1, 0.f);
  chunks[0].rows.resize(kv);
  for (int64_t i = 0; i < kv; ++i) chunks[0].rows[i] = -floats[i];
  chunks[1].rows = floats;
  VectorMappedChunks mapped(4, std::move(chunks));

  std::vector<Bf16Bits> rows(kv), other(kv);
  MappedRowsToElements<Bf16Bits>(mapped, 5, kv, rows.data());
  MappedRowsToElements<Bf16Bits>(mapped, 4, kv, other.data());
  for (int64_t i = 0; i < kv; ++i) {
    CHECK(rows[i] == expected[i]);
    CHECK(other[i] == static_cast<Bf16Bits>(expected[i] ^ 0x8000));  // the sign bit
    CHECK(rows[i] == FloatToBf16(floats[i]));  // what the store path rounds to
  }
  std::vector<float> frows(kv), fother(kv);
  MappedRowsToElements<float>(mapped, 5, kv, frows.data());
  MappedRowsToElements<float>(mapped, 4, kv, fother.data());
  CHECK(std::memcmp(frows.data(), floats.data(), kv * sizeof(float)) == 0);
  CHECK(fother[2] == -1.01171875f);
}

TEST_CASE("chunk staging: slots in turn, allocated on first use, reuse of a queued slot waits") {
  auto allocator = std::make_shared<CountingAllocator>();
  ChunkStaging<Bf16Bits> staging(3, 10, allocator);
  CHECK(allocator->allocations == 0);
  CHECK(staging.bytes() == 0);

  allocator->fail = true;
  absl::StatusOr<ChunkStaging<Bf16Bits>::Slot> failed = staging.Next();
  CHECK(failed.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(failed.status().message()), Catch::Contains("staging"));
  CHECK(staging.Allocate().code() == absl::StatusCode::kResourceExhausted);
  CHECK(staging.bytes() == 0);
  allocator->fail = false;
  // Allocate ahead of use (what MapChunks does before it releases records);
  // Next then allocates nothing more.
  REQUIRE(staging.Allocate().ok());
  REQUIRE(staging.Allocate().ok());
  CHECK(allocator->allocations == 1);

  std::vector<ChunkStaging<Bf16Bits>::Slot> slots;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<ChunkStaging<Bf16Bits>::Slot> s = staging.Next();
    REQUIRE(s.ok());
    CHECK(s->index == i);
    CHECK_FALSE(s->must_wait);
    slots.push_back(*s);
  }
  CHECK(allocator->allocations == 1);
  CHECK(staging.bytes() == 3 * 10 * sizeof(Bf16Bits));
  CHECK(slots[1].data == slots[0].data + 10);  // disjoint slots
  CHECK(slots[2].data == slots[1].data + 10);

  staging.Queued(0);
  staging.Queued(1);
  absl::StatusOr<ChunkStaging<Bf16Bits>::Slot> again = staging.Next();
  REQUIRE(again.ok());
  CHECK(again->index == 0);
  CHECK(again->must_wait);
  CHECK(again->data == slots[0].data);
  CHECK(staging.Next()->must_wait);         // slot 1
  CHECK_FALSE(staging.Next()->must_wait);  // slot 2: no copy queued from it
}

}  // namespace
}  // namespace drt::cuda
