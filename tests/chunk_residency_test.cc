// The CUDA backend's per-group slot bookkeeping: hits, misses and evictions
// against a hand-computed sequence, and its invariants on random requests.
#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cuda/host/chunk_residency.h"

namespace drt::cuda {
namespace {

using Copies = std::vector<std::pair<int64_t, int>>;

Copies CopiesOf(const ChunkResidency::Plan& plan) {
  Copies c;
  for (const auto& copy : plan.copies) c.emplace_back(copy.chunk, copy.slot);
  return c;
}

TEST_CASE("chunk residency: a hand-computed sequence", "[chunk_residency]") {
  ChunkResidency r(4);
  // 1. Empty buffer: both copied, lowest empty slots first.
  auto p = r.Request({1, 2});
  REQUIRE(p.ok());
  CHECK(p->slots == std::vector<int>{0, 1});
  CHECK(CopiesOf(*p) == Copies{{1, 0}, {2, 1}});
  CHECK(p->hits == 0);
  CHECK(p->evicted.empty());
  // 2. 2 resident (no copy); 3 into the first empty slot.
  p = r.Request({2, 3});
  REQUIRE(p.ok());
  CHECK(p->slots == std::vector<int>{1, 2});
  CHECK(CopiesOf(*p) == Copies{{3, 2}});
  CHECK(p->hits == 1);
  // 3. 1 resident; 4 takes the last empty slot; 5 evicts the least recently
  // requested chunk not requested now: 2 and 3 were both last used in step 2,
  // the lower slot (1, holding 2) goes.
  p = r.Request({4, 5, 1});
  REQUIRE(p.ok());
  CHECK(p->slots == std::vector<int>{3, 1, 0});
  CHECK(CopiesOf(*p) == Copies{{4, 3}, {5, 1}});
  CHECK(p->evicted == std::vector<int64_t>{2});
  CHECK(p->hits == 1);
  // 4. 2 again: 3 (slot 2, last used in step 2) is now the oldest.
  p = r.Request({2});
  REQUIRE(p.ok());
  CHECK(p->slots == std::vector<int>{2});
  CHECK(CopiesOf(*p) == Copies{{2, 2}});
  CHECK(p->evicted == std::vector<int64_t>{3});
  // 5. Repeats share a slot and cost nothing.
  p = r.Request({5, 5});
  REQUIRE(p.ok());
  CHECK(p->slots == std::vector<int>{1, 1});
  CHECK(p->copies.empty());
  CHECK(p->hits == 1);
  // 6. Every resident chunk requested: all hits.
  p = r.Request({1, 2, 4, 5});
  REQUIRE(p.ok());
  CHECK(p->slots == std::vector<int>{0, 2, 3, 1});
  CHECK(p->copies.empty());
  CHECK(p->hits == 4);
  CHECK(r.chunk_in_slot(0) == 1);
  CHECK(r.chunk_in_slot(1) == 5);
  CHECK(r.chunk_in_slot(2) == 2);
  CHECK(r.chunk_in_slot(3) == 4);
  CHECK(r.slot_of(4) == 3);
  CHECK(r.slot_of(3) == -1);
}

TEST_CASE("chunk residency: bad requests change nothing", "[chunk_residency]") {
  ChunkResidency r(2);
  REQUIRE(r.Request({7}).ok());
  CHECK(r.Request({1, 2, 3}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.Request({-1}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.chunk_in_slot(0) == 7);
  CHECK(r.chunk_in_slot(1) == -1);
  // Three requests of which two are distinct fit in two slots.
  auto p = r.Request({1, 7, 1});
  REQUIRE(p.ok());
  CHECK(p->slots == std::vector<int>{1, 0, 1});
  r.Clear();
  CHECK(r.slot_of(7) == -1);
  CHECK(r.Request({7})->copies.size() == 1);
}

TEST_CASE("chunk residency: invariants on random requests", "[chunk_residency]") {
  std::mt19937_64 rng(5);
  const int slots = 12;
  ChunkResidency r(slots);
  for (int step = 0; step < 2000; ++step) {
    std::vector<int64_t> before(slots);
    for (int s = 0; s < slots; ++s) before[s] = r.chunk_in_slot(s);
    std::vector<int64_t> request(rng() % 9);
    for (auto& c : request) c = static_cast<int64_t>(rng() % 30);
    auto p = r.Request(request);
    REQUIRE(p.ok());
    std::set<int64_t> distinct(request.begin(), request.end());
    std::set<int> used;
    for (size_t i = 0; i < request.size(); ++i) {
      // Every requested chunk sits in the slot the plan names.
      REQUIRE(r.chunk_in_slot(p->slots[i]) == request[i]);
      used.insert(p->slots[i]);
    }
    REQUIRE(used.size() == distinct.size());
    // Copies exactly for the chunks that were not resident; nothing requested
    // is evicted; resident requested chunks keep their slot.
    int misses = 0;
    for (int64_t c : distinct) {
      const bool was = std::find(before.begin(), before.end(), c) != before.end();
      misses += was ? 0 : 1;
      if (was) REQUIRE(before[r.slot_of(c)] == c);
    }
    REQUIRE(static_cast<int>(p->copies.size()) == misses);
    REQUIRE(p->hits + misses == static_cast<int>(distinct.size()));
    for (int64_t e : p->evicted) {
      REQUIRE(distinct.count(e) == 0);
      REQUIRE(r.slot_of(e) == -1);  // gone from the buffer
    }
    // Each copy has a slot of its own (no two copies race for one), and
    // evictions are exactly the copies into slots that held a chunk.
    std::set<int> copy_slots;
    size_t refilled = 0;
    for (const auto& copy : p->copies) {
      copy_slots.insert(copy.slot);
      if (before[copy.slot] >= 0) ++refilled;
    }
    REQUIRE(copy_slots.size() == p->copies.size());
    REQUIRE(p->evicted.size() == refilled);
    // Empty slots are used before anything is evicted.
    if (!p->evicted.empty()) {
      for (int s = 0; s < slots; ++s) REQUIRE(r.chunk_in_slot(s) >= 0);
    }
  }
}

}  // namespace
}  // namespace drt::cuda
