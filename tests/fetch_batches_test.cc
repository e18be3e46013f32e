// The host side of a fetch in encoder-rows mode (engine/cuda/host/
// fetch_batches.h): which chunks' rows come from the step's encoder, the
// host store or a mapping, in which batch and entry, and the element
// offsets of the staging, against hand-computed layouts.
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cuda/host/fetch_batches.h"

namespace drt::cuda {
namespace {

StagedChunk Staged(int64_t chunk, int slot, int64_t entry, RowSource source,
                   int64_t encoder_index = -1) {
  return StagedChunk{chunk, slot, entry, source, encoder_index};
}

TEST_CASE("fetch batches: each chunk staged in order, its rows' source named", "[cuda_host]") {
  // The step's encoder made chunks 10 and 11; 4 is mapped.
  const std::vector<ChunkResidency::Copy> copies = {{3, 5}, {11, 0}, {4, 2}, {10, 7}, {0, 1}};
  const std::set<int64_t> mapped = {4};
  auto batches = PlanFetchBatches(copies, /*first_new_chunk=*/10, /*new_chunks=*/2,
                                  /*capacity=*/8,
                                  [&](int64_t c) { return mapped.count(c) > 0; });
  REQUIRE(batches.ok());
  REQUIRE(batches->size() == 1);
  CHECK((*batches)[0] == std::vector<StagedChunk>{
                             Staged(3, 5, 0, RowSource::kHostStore),
                             Staged(11, 0, 1, RowSource::kEncoder, /*encoder_index=*/1),
                             Staged(4, 2, 2, RowSource::kMapped),
                             Staged(10, 7, 3, RowSource::kEncoder, /*encoder_index=*/0),
                             Staged(0, 1, 4, RowSource::kHostStore),
                         });
}

TEST_CASE("fetch batches: more chunks than the capacity take several batches", "[cuda_host]") {
  std::vector<ChunkResidency::Copy> copies;
  for (int i = 0; i < 7; ++i) copies.push_back({100 + i, 20 - i});
  // Chunk 106 is the step's first new one; capacity 3: 3 + 3 + 1, entries
  // restart at 0 in each batch.
  auto batches = PlanFetchBatches(copies, 106, 1, 3, nullptr);
  REQUIRE(batches.ok());
  REQUIRE(batches->size() == 3);
  const RowSource host = RowSource::kHostStore;
  CHECK((*batches)[0] ==
        std::vector<StagedChunk>{Staged(100, 20, 0, host), Staged(101, 19, 1, host),
                                 Staged(102, 18, 2, host)});
  CHECK((*batches)[1] ==
        std::vector<StagedChunk>{Staged(103, 17, 0, host), Staged(104, 16, 1, host),
                                 Staged(105, 15, 2, host)});
  CHECK((*batches)[2] == std::vector<StagedChunk>{Staged(106, 14, 0, RowSource::kEncoder, 0)});
}

TEST_CASE("fetch batches: an empty fetch has no batch", "[cuda_host]") {
  auto empty = PlanFetchBatches({}, 0, 0, 4, nullptr);
  REQUIRE(empty.ok());
  CHECK(empty->empty());
}

TEST_CASE("fetch batches: bad arguments are refused by name", "[cuda_host]") {
  auto capacity = PlanFetchBatches({{1, 0}}, 0, 0, 0, nullptr);
  CHECK(capacity.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(capacity.status().message() == "a fetch batch of 0 chunks: at least 1");
  auto fresh = PlanFetchBatches({{1, 0}}, 0, -1, 4, nullptr);
  CHECK(fresh.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(fresh.status().message() == "-1 chunks made by the step's encoder");
  auto chunk = PlanFetchBatches({{2, 1}, {-2, 0}}, 0, 0, 4, nullptr);
  CHECK(chunk.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(chunk.status().message() == "fetch of chunk -2");
}

TEST_CASE("fetch batches: offsets and sizes of the 128M configuration", "[cuda_host]") {
  // S = 64 positions per chunk, S' = 63 stored rows, d = 768.
  const FetchBatchShape shape{64, 63, 768};
  CHECK(shape.entry_offset(0) == 0);
  CHECK(shape.entry_offset(3) == 3 * 64 * 768);
  CHECK(shape.record_elements() == 48384);  // 63 * 768: rows into an entry
  CHECK(shape.entry_elements() == 49152);   // 64 * 768: K (or V) into a slot
  CHECK(shape.gemm_rows(16) == 1024);
  CHECK(shape.landmark_row() == 63);
}

TEST_CASE("fetch batches: the staging holds one decode fetch, at most a group's slots",
          "[cuda_host]") {
  CHECK(FetchBatchCapacity(/*topk=*/8, /*slots_per_group=*/136) == 16);
  CHECK(FetchBatchCapacity(64, 1040) == 64);  // a top-k above 16
  CHECK(FetchBatchCapacity(8, 12) == 12);     // a small step: the group's slots
  CHECK(FetchBatchCapacity(0, 0) == 1);
}

}  // namespace
}  // namespace drt::cuda
