// The host side of a fetch in encoder-rows mode (engine/cuda/host/
// fetch_batches.h): which copied chunks come from the step's encoder, which
// are staged, in which batch and entry, and the element offsets of the
// staging, against hand-computed layouts.
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cuda/host/fetch_batches.h"

namespace drt::cuda {
namespace {

TEST_CASE("fetch batches: fresh chunks stay device copies, the rest are staged in order",
          "[cuda_host]") {
  // The step's encoder made chunks 10 and 11; 4 is mapped.
  const std::vector<ChunkResidency::Copy> copies = {{3, 5}, {11, 0}, {4, 2}, {10, 7}, {0, 1}};
  const std::set<int64_t> mapped = {4};
  auto layout = PlanFetchBatches(copies, /*first_new_chunk=*/10, /*new_chunks=*/2,
                                 /*batch_capacity=*/8,
                                 [&](int64_t c) { return mapped.count(c) > 0; });
  REQUIRE(layout.ok());
  CHECK(layout->fresh ==
        std::vector<FreshChunkCopy>{{11, 0, /*encoder_index=*/1}, {10, 7, /*encoder_index=*/0}});
  REQUIRE(layout->batches.size() == 1);
  CHECK(layout->batches[0] == std::vector<StagedChunk>{{3, 5, 0, false},
                                                       {4, 2, 1, true},
                                                       {0, 1, 2, false}});
}

TEST_CASE("fetch batches: more staged chunks than the capacity take several batches",
          "[cuda_host]") {
  std::vector<ChunkResidency::Copy> copies;
  for (int i = 0; i < 7; ++i) copies.push_back({100 + i, 20 - i});
  // No fresh chunks (new_chunks 0); capacity 3: 3 + 3 + 1, entries restart at 0.
  auto layout = PlanFetchBatches(copies, 107, 0, 3, nullptr);
  REQUIRE(layout.ok());
  CHECK(layout->fresh.empty());
  REQUIRE(layout->batches.size() == 3);
  CHECK(layout->batches[0] ==
        std::vector<StagedChunk>{{100, 20, 0, false}, {101, 19, 1, false}, {102, 18, 2, false}});
  CHECK(layout->batches[1] ==
        std::vector<StagedChunk>{{103, 17, 0, false}, {104, 16, 1, false}, {105, 15, 2, false}});
  CHECK(layout->batches[2] == std::vector<StagedChunk>{{106, 14, 0, false}});
}

TEST_CASE("fetch batches: only fresh chunks make no batch, an empty fetch nothing",
          "[cuda_host]") {
  auto fresh_only = PlanFetchBatches({{5, 0}, {6, 1}}, 5, 2, 4, nullptr);
  REQUIRE(fresh_only.ok());
  CHECK(fresh_only->batches.empty());
  CHECK(fresh_only->fresh == std::vector<FreshChunkCopy>{{5, 0, 0}, {6, 1, 1}});
  auto empty = PlanFetchBatches({}, 0, 0, 4, nullptr);
  REQUIRE(empty.ok());
  CHECK(empty->fresh.empty());
  CHECK(empty->batches.empty());
}

TEST_CASE("fetch batches: bad arguments are refused by name", "[cuda_host]") {
  auto capacity = PlanFetchBatches({{1, 0}}, 0, 0, 0, nullptr);
  CHECK(capacity.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(capacity.status().message() == "a fetch batch of 0 chunks: at least 1");
  auto fresh = PlanFetchBatches({{1, 0}}, 0, -1, 4, nullptr);
  CHECK(fresh.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(fresh.status().message() == "-1 chunks made by the step's encoder");
  auto chunk = PlanFetchBatches({{-2, 0}}, 0, 0, 4, nullptr);
  CHECK(chunk.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(chunk.status().message() == "fetch of chunk -2");
}

TEST_CASE("fetch batches: offsets and sizes of the 128M configuration", "[cuda_host]") {
  // S = 64 positions per chunk, S' = 63 stored rows, d = 768.
  const FetchBatchShape shape{64, 63, 768};
  CHECK(shape.entry_offset(0) == 0);
  CHECK(shape.entry_offset(3) == 3 * 64 * 768);
  CHECK(shape.record_elements() == 48384);  // 63 * 768: the host -> device copy
  CHECK(shape.entry_elements() == 49152);   // 64 * 768: K (or V) into a slot
  CHECK(shape.gemm_rows(8) == 512);
  CHECK(shape.landmark_row() == 63);
}

TEST_CASE("fetch batches: the staging holds one decode fetch, at most a group's slots",
          "[cuda_host]") {
  CHECK(FetchBatchCapacity(/*topk=*/8, /*slots_per_group=*/136) == 32);
  CHECK(FetchBatchCapacity(64, 1040) == 64);  // a top-k above 32
  CHECK(FetchBatchCapacity(8, 16) == 16);     // a small step: the group's slots
  CHECK(FetchBatchCapacity(0, 0) == 1);
}

}  // namespace
}  // namespace drt::cuda
