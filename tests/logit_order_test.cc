// LogitOrder (engine/logit_order.h): the sampler's candidate order, against a
// stable sort of the ids by the comparison `>` (which keeps equal logits,
// -0 and +0 among them, in id order).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "engine/logit_order.h"

namespace {

std::vector<int32_t> NaiveBest(const std::vector<float>& logits, int32_t count) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  ids.resize(count);
  return ids;
}

// Logits with many exact ties (multiples of 1/4), signed zeros, -inf, a
// denormal and values far apart in magnitude: each part of the key matters.
std::vector<float> HardLogits(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_int_distribution<int> kind(0, 19);
  std::vector<float> v(n);
  for (float& x : v) {
    switch (kind(gen)) {
      case 0: x = -0.f; break;
      case 1: x = 0.f; break;
      case 2: x = -std::numeric_limits<float>::infinity(); break;
      case 3: x = std::numeric_limits<float>::denorm_min() * (gen() % 2 ? 1.f : -1.f); break;
      case 4: x = normal(gen) * 1e30f; break;
      default: x = std::round(normal(gen) * 4.f) / 4.f;  // -0 too, from small negatives
    }
  }
  return v;
}

}  // namespace

TEST_CASE("LogitOrder::Best is the stable order by logit, best first", "[sampler]") {
  drt::LogitOrder order;
  for (size_t n : {1u, 2u, 3u, 17u, 258u, 300u, 5000u}) {
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      const std::vector<float> logits = HardLogits(n, seed * 7919 + static_cast<uint32_t>(n));
      // Counts on both sides of the partial-sort / radix-sort switch (256).
      for (int32_t count : {1, 2, 50, 255, 256, 257, 299, static_cast<int32_t>(n)}) {
        if (count > static_cast<int32_t>(n)) continue;
        INFO("n " << n << " seed " << seed << " count " << count);
        const auto got = order.Best(logits, count);
        CHECK(std::vector<int32_t>(got.begin(), got.end()) == NaiveBest(logits, count));
      }
    }
  }
  // Hand-made: equal logits by id; -0 and +0 tie; -inf last.
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> hand = {0.f, ninf, 2.f, -0.f, 2.f, -1.f, 0.f};
  const auto got = order.Best(hand, 7);
  CHECK(std::vector<int32_t>(got.begin(), got.end()) == std::vector<int32_t>{2, 4, 0, 3, 6, 5, 1});
  const auto top2 = order.Best(hand, 4);
  CHECK(std::vector<int32_t>(top2.begin(), top2.end()) == std::vector<int32_t>{2, 4, 0, 3});
}
