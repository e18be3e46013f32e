// The retrieval evaluators' per-cell seeds (bench/niah/cell_seed.h): the
// mixer against SplitMix64's published outputs, and seeds that change with
// every part of a cell and with nothing else.
#include "bench/niah/cell_seed.h"

#include <catch2/catch.hpp>
#include <set>

namespace drt::niah {
namespace {

TEST_CASE("niah Mix64 is SplitMix64", "[niah]") {
  // SplitMix64 from state 0 gives 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4,
  // 0x06C45D188009454F (its state steps by 0x9E3779B97F4A7C15 per output,
  // which Mix64 adds itself).
  CHECK(Mix64(0) == 0xE220A8397B1DCDAFULL);
  CHECK(Mix64(0x9E3779B97F4A7C15ULL) == 0x6E789E6AA1B965F4ULL);
  CHECK(Mix64(2 * 0x9E3779B97F4A7C15ULL) == 0x06C45D188009454FULL);
}

TEST_CASE("niah CellSeed changes with every part of a cell and nothing else", "[niah]") {
  const uint64_t base = CellSeed(1, "passkey", 4096, 0.5);
  CHECK(CellSeed(1, "passkey", 4096, 0.5) == base);  // a function of its arguments alone
  std::set<uint64_t> seen = {base, CellSeed(2, "passkey", 4096, 0.5), CellSeed(1, "keyed", 4096, 0.5),
                             CellSeed(1, "passkey", 4097, 0.5), CellSeed(1, "passkey", 4096, 0.25),
                             CellSeed(1, "passke", 4096, 0.5), CellSeed(0, "passkey", 4096, 0.5)};
  CHECK(seen.size() == 7);
  CHECK(CellSeed(1, "passkey", 4096, 0.0) == CellSeed(1, "passkey", 4096, -0.0));
  std::set<uint64_t> trials;
  for (int t = 0; t < 100; ++t) trials.insert(TrialSeed(base, t));
  CHECK(trials.size() == 100);
  CHECK(TrialSeed(base, 3) == TrialSeed(base, 3));
  CHECK(TrialSeed(base, 3) != TrialSeed(CellSeed(2, "passkey", 4096, 0.5), 3));
}

}  // namespace
}  // namespace drt::niah
