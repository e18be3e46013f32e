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
  auto lengths = ParseLengths("4096M,16M");
  REQUIRE(lengths.ok());
  CHECK(*lengths == std::vector<int64_t>{int64_t{1} << 32, 16777216});
  auto exact = ParseLengths("4294967296");
  REQUIRE(exact.ok());
  CHECK(*exact == std::vector<int64_t>{int64_t{1} << 32});
}

TEST_CASE("niah ParseLengths refuses a length given twice, however it is spelled", "[niah]") {
  // 1K,1K printed two table rows with three columns under one depth header
  // (review-tools 2026-11-25 #13).
  struct Twice {
    const char* list;
    const char* message;
  };
  for (const Twice& twice : {Twice{"1K,1K", "--lengths: '1K' is 1024, which is already in the list"},
                             Twice{"4K,1024,1K", "--lengths: '1K' is 1024, which is already in the list"},
                             Twice{"4096M,4294967296", "'4294967296' is 4294967296, which is already"}}) {
    INFO(twice.list);
    auto lengths = ParseLengths(twice.list);
    REQUIRE_FALSE(lengths.ok());
    CHECK(lengths.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(lengths.status().message().find(twice.message) != std::string::npos);
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
    // The flag, the entry and the range (it said only "bad depth '2'").
    CHECK(refused.status().message().find(absl::StrCat("--depths: bad depth '", bad, "'")) !=
          std::string::npos);
    CHECK(refused.status().message().find("in [0, 1]") != std::string::npos);
  }
  auto twice = ParseDepths("0,0.5,0.50");
  REQUIRE_FALSE(twice.ok());
  CHECK(twice.status().message().find("--depths: '0.50' is 0.5, which is already in the list") !=
        std::string::npos);
}

TEST_CASE("niah CheckMaxNewTokens and CheckThreads name the flag, the value and the range", "[niah]") {
  CHECK(CheckMaxNewTokens(1).ok());
  CHECK(CheckMaxNewTokens(8).ok());
  for (int64_t bad : {0, -3}) {
    const absl::Status s = CheckMaxNewTokens(bad);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(absl::StrCat("--max_new_tokens must be at least 1 (an answer needs a token), got ",
                                        bad)) != std::string::npos);
  }
  CHECK(CheckThreads(0).ok());
  CHECK(CheckThreads(3).ok());
  const absl::Status s = CheckThreads(-5);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("--threads must be 0 (the CPUs this process may use) or a positive count, got -5") !=
        std::string::npos);
}

}  // namespace
}  // namespace drt::niah
