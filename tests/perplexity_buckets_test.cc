// drt-ppl's pure parts (bench/perplexity/position_buckets.h): bucket starts,
// the bucket a position falls in, and each bucket's mean NLL, perplexity and
// bits per byte, on cases computed by hand.
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "bench/perplexity/position_buckets.h"

namespace drt::ppl {
namespace {

TEST_CASE("drt-ppl default buckets are powers of two from 1K below the length", "[ppl]") {
  CHECK(PowerOfTwoStarts(1024).empty());  // one bucket [0, 1024)
  CHECK(PowerOfTwoStarts(1025) == std::vector<int64_t>{1024});
  CHECK(PowerOfTwoStarts(5000) == std::vector<int64_t>{1024, 2048, 4096});
  CHECK(PowerOfTwoStarts(8192) == std::vector<int64_t>{1024, 2048, 4096});
  CHECK(PowerOfTwoStarts(10).empty());
}

TEST_CASE("drt-ppl --buckets parses increasing starts and refuses others by name", "[ppl]") {
  auto parsed = ParseBucketStarts("1K,4K,16384,1M");
  REQUIRE(parsed.ok());
  CHECK(*parsed == std::vector<int64_t>{1024, 4096, 16384, 1048576});
  for (const std::string bad : {"0", "4K,1K", "1K,1K", "abc", "", "1K,,2K", "1.3K", "-5"}) {
    INFO("--buckets " << bad);
    auto refused = ParseBucketStarts(bad);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(refused.status().message()).find("--buckets") != std::string::npos);
  }
}

TEST_CASE("drt-ppl buckets sum scores by position, with means, perplexity and bits per byte by hand", "[ppl]") {
  // [0, 2), [2, 4), [4, 6)
  PositionBuckets buckets({2, 4}, 6);
  REQUIRE(buckets.buckets().size() == 3);
  buckets.Add(1, std::log(2.0), 1);                                  // bucket 0
  buckets.Add(2, std::log(2.0), 1);                                  // bucket 1
  buckets.Add(3, std::log(8.0), 2);                                  // bucket 1
  buckets.Add(4, std::log(4.0), 1);                                  // bucket 2
  buckets.Add(5, std::log(4.0), 1);                                  // bucket 2
  const std::vector<Bucket>& b = buckets.buckets();
  CHECK((b[0].begin == 0 && b[0].end == 2 && b[0].tokens == 1 && b[0].bytes == 1));
  CHECK((b[1].begin == 2 && b[1].end == 4 && b[1].tokens == 2 && b[1].bytes == 3));
  CHECK((b[2].begin == 4 && b[2].end == 6 && b[2].tokens == 2 && b[2].bytes == 2));

  // Bucket 0: one token of 1 bit in 1 byte: perplexity 2, 1 bit per byte.
  BucketSummary s0 = Summarize(b[0]);
  CHECK(s0.mean_nll == Approx(std::log(2.0)));
  CHECK(s0.perplexity == Approx(2.0));
  CHECK(s0.bits_per_byte == Approx(1.0));
  // Bucket 1: 1 + 3 = 4 bits over 2 tokens (perplexity 2^2 = 4) and 3 bytes.
  BucketSummary s1 = Summarize(b[1]);
  CHECK(s1.mean_nll == Approx(std::log(4.0)));
  CHECK(s1.perplexity == Approx(4.0));
  CHECK(s1.bits_per_byte == Approx(4.0 / 3.0));
  // Bucket 2: 2 + 2 bits over 2 tokens and 2 bytes.
  BucketSummary s2 = Summarize(b[2]);
  CHECK(s2.perplexity == Approx(4.0));
  CHECK(s2.bits_per_byte == Approx(2.0));
  // All: 1 + 4 + 4 = 9 bits over 5 tokens and 6 bytes.
  const Bucket all = buckets.Overall();
  CHECK((all.begin == 0 && all.end == 6 && all.tokens == 5 && all.bytes == 6));
  BucketSummary sa = Summarize(all);
  CHECK(sa.perplexity == Approx(std::pow(2.0, 9.0 / 5.0)));
  CHECK(sa.bits_per_byte == Approx(9.0 / 6.0));
}

TEST_CASE("drt-ppl buckets drop starts at or past the length, and an empty bucket has no figures", "[ppl]") {
  PositionBuckets buckets({1024, 2048, 4096}, 1500);
  REQUIRE(buckets.buckets().size() == 2);
  CHECK((buckets.buckets()[0].begin == 0 && buckets.buckets()[0].end == 1024));
  CHECK((buckets.buckets()[1].begin == 1024 && buckets.buckets()[1].end == 1500));
  buckets.Add(1499, 1.0, 1);  // the last position goes to the last bucket
  CHECK(buckets.buckets()[1].tokens == 1);
  const BucketSummary empty = Summarize(buckets.buckets()[0]);
  CHECK(std::isnan(empty.mean_nll));
  CHECK(std::isnan(empty.perplexity));
  CHECK(std::isnan(empty.bits_per_byte));

  PositionBuckets one({}, 10);  // no starts: one bucket [0, 10)
  REQUIRE(one.buckets().size() == 1);
  CHECK(one.buckets()[0].end == 10);
  // Tokens without bytes (a BPE id that decodes to nothing) leave bits per
  // byte undefined, not infinite.
  one.Add(3, 2.0, 0);
  CHECK(std::isnan(Summarize(one.buckets()[0]).bits_per_byte));
  CHECK(Summarize(one.buckets()[0]).mean_nll == Approx(2.0));
}

}  // namespace
}  // namespace drt::ppl
