// The evaluators' shared command-line values (bench/niah/eval_options.h),
// against hand-computed lengths and depths.
#include "bench/niah/eval_options.h"

#include <catch2/catch.hpp>

namespace drt::niah {
namespace {

TEST_CASE("niah ParseLengths: K and M are binary, fractions allowed", "[niah]") {
  auto lengths = ParseLengths("4K,64k,1M,1000,1.5K");
  REQUIRE(lengths.ok());
  CHECK(*lengths == std::vector<int64_t>{4096, 65536, 1048576, 1000, 1536});
}

TEST_CASE("niah ParseLengths names the bad entry", "[niah]") {
  for (const char* bad : {"4K,x", "4K,", "0", "-3K", "0.5", "K"}) {
    INFO(bad);
    auto lengths = ParseLengths(bad);
    REQUIRE_FALSE(lengths.ok());
    CHECK(lengths.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(lengths.status().message().find("bad length '") != std::string::npos);
  }
}

TEST_CASE("niah ParseDepths takes [0, 1] and refuses the rest", "[niah]") {
  auto depths = ParseDepths("0,0.5,1");
  REQUIRE(depths.ok());
  CHECK(*depths == std::vector<double>{0.0, 0.5, 1.0});
  for (const char* bad : {"1.01", "-0.1", "nan", "half", ""}) {
    INFO(bad);
    auto refused = ParseDepths(bad);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().message().find("bad depth '") != std::string::npos);
  }
}

}  // namespace
}  // namespace drt::niah
