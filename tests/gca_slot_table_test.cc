// The CUDA backend's host-side GCA bookkeeping (engine/cuda/host/
// gca_slot_table.h), plain C++: which selection serves each run of a slice
// and the slot table the GCA kernel reads, against hand-computed tables.
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cuda/host/chunk_residency.h"
#include "engine/cuda/host/gca_slot_table.h"

namespace drt::cuda {
namespace {

Retrieval Made(std::vector<int64_t> chunks, std::vector<float> weights) {
  Retrieval r;
  r.chunks = std::move(chunks);
  r.weights = std::move(weights);
  return r;
}

GcaRun Run(int64_t made_at) {
  GcaRun run;
  run.made_at = made_at;
  return run;
}

TEST_CASE("gca slot table: each run reads the selection the plan names", "[cuda_host]") {
  // A slice over three chunks: the first run is served by the selection in
  // force, the next two by those made at the slice's landmarks 0 and 1.
  const Retrieval in_force = Made({2, 0}, {0.75f, 0.25f});
  const std::vector<Retrieval> made = {Made({5, 1, 3}, {0.5f, 0.3f, 0.2f}), Made({4}, {1.f})};
  const std::vector<GcaRun> runs = {Run(GcaRun::kInForce), Run(0), Run(1)};
  auto serving = ServingSelections(runs, in_force, made, /*made_known=*/true);
  REQUIRE(serving.ok());
  REQUIRE(serving->size() == 3);
  CHECK((*serving)[0] == &in_force);
  CHECK((*serving)[1] == &made[0]);
  CHECK((*serving)[2] == &made[1]);
  const std::vector<int64_t> request = ChunksToRequest(*serving);
  CHECK(request == std::vector<int64_t>{2, 0, 5, 1, 3, 4});

  ChunkResidency residency(9);
  auto plan = residency.Request(request);
  REQUIRE(plan.ok());
  const int64_t k = 3;
  std::vector<int32_t> table(3 * k, 7);
  std::vector<float> weights(3 * k, 7.f);
  FillSlotTable(*serving, plan->slots, k, table.data(), weights.data());
  const auto& s = plan->slots;  // slots of 2, 0, 5, 1, 3, 4 in that order
  CHECK(table == std::vector<int32_t>{s[0], s[1], -1, s[2], s[3], s[4], s[5], -1, -1});
  CHECK(weights == std::vector<float>{0.75f, 0.25f, 0.f, 0.5f, 0.3f, 0.2f, 1.f, 0.f, 0.f});
  // Each table entry is the slot that holds its chunk.
  CHECK(residency.chunk_in_slot(table[0]) == 2);
  CHECK(residency.chunk_in_slot(table[5]) == 3);
  CHECK(residency.chunk_in_slot(table[6]) == 4);
}

TEST_CASE("gca slot table: a selection of this step that is not known is refused",
          "[cuda_host]") {
  const Retrieval in_force = Made({0}, {1.f});
  const std::vector<Retrieval> made = {Made({1}, {1.f})};
  // Not read back yet.
  auto unknown = ServingSelections({Run(0)}, in_force, made, /*made_known=*/false);
  CHECK(unknown.status().code() == absl::StatusCode::kInternal);
  // A landmark the slice does not have.
  auto missing = ServingSelections({Run(1)}, in_force, made, /*made_known=*/true);
  CHECK(missing.status().code() == absl::StatusCode::kInternal);
  // Runs served by the selection in force need nothing of this step.
  auto in_force_only =
      ServingSelections({Run(GcaRun::kInForce)}, in_force, {}, /*made_known=*/false);
  REQUIRE(in_force_only.ok());
  CHECK((*in_force_only)[0] == &in_force);
}

}  // namespace
}  // namespace drt::cuda
