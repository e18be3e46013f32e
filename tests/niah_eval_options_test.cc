// The evaluators' shared command-line values (bench/niah/eval_options.h),
// against hand-computed lengths and depths.
#include "bench/niah/eval_options.h"

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"

namespace drt::niah {
namespace {

TEST_CASE("niah ParseLengths: K and M are binary, fractions allowed", "[niah]") {
  auto lengths = ParseLengths("4K,64k,1M,1000,1.5K");
  REQUIRE(lengths.ok());
  CHECK(*lengths == std::vector<int64_t>{4096, 65536, 1048576, 1000, 1536});
}

TEST_CASE("niah ParseLengths names the flag and the bad entry", "[niah]") {
  // nan, inf, 1e30 and non-whole lengths were accepted: drt-niah-text ended
  // in std::bad_alloc (review-tools #5).
  struct Bad {
    const char* list;
    const char* entry;
  };
  for (const Bad& bad : {Bad{"4K,x", "x"}, Bad{"4K,", ""}, Bad{"0", "0"}, Bad{"-3K", "-3K"},
                         Bad{"0.5", "0.5"}, Bad{"K", "K"}, Bad{"nan", "nan"}, Bad{"NaN", "NaN"},
                         Bad{"inf", "inf"}, Bad{"-inf", "-inf"}, Bad{"1e30", "1e30"},
                         Bad{"4K,1e30", "1e30"}, Bad{"1000.5", "1000.5"}, Bad{"1.3K", "1.3K"},
                         Bad{"4097M", "4097M"}, Bad{"4294967297", "4294967297"}}) {
    INFO(bad.list);
    auto lengths = ParseLengths(bad.list);
    REQUIRE_FALSE(lengths.ok());
    CHECK(lengths.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(lengths.status().message().find(absl::StrCat("--lengths: bad length '", bad.entry, "'")) !=
          std::string::npos);
  }
}

TEST_CASE("niah ParseLengths takes lengths up to 4G", "[niah]") {
  auto lengths = ParseLengths("4096M,4294967296,16M");
  REQUIRE(lengths.ok());
  CHECK(*lengths == std::vector<int64_t>{int64_t{1} << 32, int64_t{1} << 32, 16777216});
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
