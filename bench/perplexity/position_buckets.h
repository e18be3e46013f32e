// drt-ppl's aggregation: per-token negative log-likelihoods summed into
// buckets of token position (the DRT paper's perplexity-by-position view), and
// each bucket's mean NLL, perplexity and bits per byte.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace drt::ppl {

// The starts of the buckets after the first (which starts at 0), for the
// default: powers of two from 1024 below `length`, i.e. [0, 1K), [1K, 2K),
// [2K, 4K), ... with the last bucket ending at `length`.
std::vector<int64_t> PowerOfTwoStarts(int64_t length);

// --buckets "1K,4K,16K": bucket starts after 0, each a whole number >= 1
// (K = 1024, M = 1048576, as --lengths of drt-niah), strictly increasing.
// INVALID_ARGUMENT naming --buckets and the bad entry.
absl::StatusOr<std::vector<int64_t>> ParseBucketStarts(absl::string_view list);

struct Bucket {
  int64_t begin = 0;    // first position
  int64_t end = 0;      // one past the last position
  int64_t tokens = 0;   // tokens scored in [begin, end)
  int64_t bytes = 0;    // their bytes (bits per byte)
  double nll_sum = 0;   // their NLLs, nats
};

struct BucketSummary {
  double mean_nll;       // nats per token
  double perplexity;     // exp(mean_nll)
  double bits_per_byte;  // nll_sum / ln 2 / bytes
};
// NaN fields where the bucket has no tokens (or no bytes, for bits per byte).
BucketSummary Summarize(const Bucket& bucket);

class PositionBuckets {
 public:
  // Buckets [0, s1), [s1, s2), ..., [sn, length) for the starts below
  // `length` (starts at or past it are dropped); one bucket [0, length)
  // when none is below. `starts` must be strictly increasing and >= 1
  // (ParseBucketStarts, PowerOfTwoStarts).
  PositionBuckets(const std::vector<int64_t>& starts, int64_t length);

  // Adds the score of the token at `position` (0 <= position < length) to
  // its bucket.
  void Add(int64_t position, double nll, int64_t bytes);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Every bucket together: [0, length).
  Bucket Overall() const;

 private:
  std::vector<Bucket> buckets_;
};

}  // namespace drt::ppl
