#include "bench/niah/cell_seed.h"

#include <cstring>

namespace drt::niah {

uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

uint64_t CellSeed(uint64_t seed, std::string_view task, int64_t length, double depth) {
  // Each part is folded in through the mixer, so that no two parts cancel.
  uint64_t h = Mix64(seed);
  for (unsigned char c : task) h = Mix64(h ^ c);
  h = Mix64(h ^ task.size());  // "ab" + "c" differs from "a" + "bc"
  h = Mix64(h ^ static_cast<uint64_t>(length));
  if (depth == 0) depth = 0;  // -0.0 is 0.0
  uint64_t depth_bits = 0;
  std::memcpy(&depth_bits, &depth, sizeof depth_bits);
  return Mix64(h ^ depth_bits);
}

uint64_t TrialSeed(uint64_t cell_seed, int64_t trial) {
  return Mix64(cell_seed ^ Mix64(static_cast<uint64_t>(trial)));
}

}  // namespace drt::niah
