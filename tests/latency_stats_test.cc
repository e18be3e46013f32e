// drt-batch-bench's statistics (bench/batch/latency_stats.h) against
// hand-computed cases.
#include "bench/batch/latency_stats.h"

#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

namespace drt::bench {
namespace {

TEST_CASE("Percentile interpolates linearly between the closest ranks", "[bench]") {
  const std::vector<double> v = {4, 1, 3, 2};  // unsorted on purpose
  CHECK(Percentile(v, 0.0) == 1.0);
  CHECK(Percentile(v, 1.0) == 4.0);
  // rank 0.5 * 3 = 1.5: halfway between 2 and 3.
  CHECK(Percentile(v, 0.5) == Approx(2.5).epsilon(1e-12));
  CHECK(Median(v) == Approx(2.5).epsilon(1e-12));
  // rank 0.99 * 3 = 2.97: 3 + 0.97 * (4 - 3).
  CHECK(Percentile(v, 0.99) == Approx(3.97).epsilon(1e-12));
  // Odd count: the middle value.
  CHECK(Median({7, 1, 5}) == 5.0);
  CHECK(Percentile({42}, 0.99) == 42.0);
  CHECK(std::isnan(Percentile({}, 0.5)));
}

TEST_CASE("TokenGapsMs: gaps after the first token, several tokens per piece spread", "[bench]") {
  // Tokens at 100 ms, 150 ms, two at 350 ms, a text-only piece, one at 500 ms.
  const std::vector<PieceArrival> arrivals = {
      {0.100, 1}, {0.150, 1}, {0.350, 2}, {0.400, 0}, {0.500, 1}};
  const std::vector<double> gaps = TokenGapsMs(arrivals);
  REQUIRE(gaps.size() == 4);  // 5 tokens, 4 gaps
  CHECK(gaps[0] == Approx(50.0));
  CHECK(gaps[1] == Approx(100.0));  // 200 ms for two tokens
  CHECK(gaps[2] == Approx(100.0));
  CHECK(gaps[3] == Approx(150.0));  // from the last token-bearing piece, not the text one
}

TEST_CASE("TokenGapsMs: tokens of the first piece arrive together", "[bench]") {
  const std::vector<double> gaps = TokenGapsMs({{0.0, 0}, {0.200, 3}, {0.260, 1}});
  REQUIRE(gaps.size() == 3);
  CHECK(gaps[0] == 0.0);
  CHECK(gaps[1] == 0.0);
  CHECK(gaps[2] == Approx(60.0));
  CHECK(TokenGapsMs({}).empty());
  CHECK(TokenGapsMs({{0.3, 1}}).empty());
}

}  // namespace
}  // namespace drt::bench
