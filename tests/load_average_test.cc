// The benchmarks' shared load average (bench/load_average.h) against
// hand-written /proc/loadavg lines and this machine's own file.
#include "bench/load_average.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

namespace drt::bench {
namespace {

TEST_CASE("ParseLoadAverage reads the first three fields of a /proc/loadavg line", "[bench]") {
  const auto load = ParseLoadAverage("0.52 10.25 3.00 2/467 12345\n");
  CHECK(load[0] == 0.52);
  CHECK(load[1] == 10.25);
  CHECK(load[2] == 3.00);
}

TEST_CASE("ParseLoadAverage gives NaN for missing or malformed fields", "[bench]") {
  const auto empty = ParseLoadAverage("");
  CHECK(std::isnan(empty[0]));
  CHECK(std::isnan(empty[1]));
  CHECK(std::isnan(empty[2]));
  const auto short_line = ParseLoadAverage("1.5 2.5");
  CHECK(short_line[0] == 1.5);
  CHECK(short_line[1] == 2.5);
  CHECK(std::isnan(short_line[2]));
  const auto bad = ParseLoadAverage("1.5 x2 3.5 1/2 3");
  CHECK(bad[0] == 1.5);
  CHECK(std::isnan(bad[1]));
  CHECK(bad[2] == 3.5);
}

TEST_CASE("LoadAverageText prints this machine's three load averages", "[bench]") {
  std::ifstream in("/proc/loadavg");
  if (!in) {
    WARN("cannot run here, skipping: no /proc/loadavg");
    return;
  }
  const std::string text = LoadAverageText();
  CAPTURE(text);
  // Three numbers with two decimals, nothing of the fourth and fifth fields.
  double a = -1, b = -1, c = -1;
  char rest = 0;
  REQUIRE(std::sscanf(text.c_str(), "%lf %lf %lf%c", &a, &b, &c, &rest) == 3);
  CHECK(a >= 0);
  CHECK(b >= 0);
  CHECK(c >= 0);
  CHECK(text.find('/') == std::string::npos);
}

}  // namespace
}  // namespace drt::bench
