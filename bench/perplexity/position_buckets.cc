#include "bench/perplexity/position_buckets.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/niah/eval_options.h"

namespace drt::ppl {

std::vector<int64_t> PowerOfTwoStarts(int64_t length) {
  std::vector<int64_t> starts;
  for (int64_t start = 1024; start < length; start *= 2) starts.push_back(start);
  return starts;
}

absl::StatusOr<std::vector<int64_t>> ParseBucketStarts(absl::string_view list) {
  std::vector<int64_t> starts;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    // One entry at a time, so that the error names it (ParseLengths's own
    // message says --lengths).
    absl::StatusOr<std::vector<int64_t>> one = drt::niah::ParseLengths(part);
    if (!one.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--buckets: bad bucket start '%s' (a whole number of tokens >= 1, K = 1024, "
          "M = 1048576; the first bucket starts at 0)",
          part));
    }
    if (!starts.empty() && one->front() <= starts.back()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--buckets: bucket start '%s' is not above the one before it (%d): starts must "
          "increase",
          part, starts.back()));
    }
    starts.push_back(one->front());
  }
  return starts;
}

BucketSummary Summarize(const Bucket& bucket) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  BucketSummary summary{kNaN, kNaN, kNaN};
  if (bucket.tokens == 0) return summary;
  summary.mean_nll = bucket.nll_sum / static_cast<double>(bucket.tokens);
  summary.perplexity = std::exp(summary.mean_nll);
  if (bucket.bytes > 0) {
    summary.bits_per_byte = bucket.nll_sum / std::log(2.0) / static_cast<double>(bucket.bytes);
  }
  return summary;
}

PositionBuckets::PositionBuckets(const std::vector<int64_t>& starts, int64_t length) {
  int64_t begin = 0;
  for (int64_t start : starts) {
    if (start >= length) break;
    buckets_.push_back(Bucket{begin, start});
    begin = start;
  }
  buckets_.push_back(Bucket{begin, length});
}

void PositionBuckets::Add(int64_t position, double nll, int64_t bytes) {
  // The last bucket whose begin is <= position.
  auto it = std::upper_bound(buckets_.begin(), buckets_.end(), position,
                             [](int64_t p, const Bucket& b) { return p < b.begin; });
  Bucket& bucket = *std::prev(it);
  ++bucket.tokens;
  bucket.bytes += bytes;
  bucket.nll_sum += nll;
}

Bucket PositionBuckets::Overall() const {
  Bucket all{0, buckets_.back().end};
  for (const Bucket& b : buckets_) {
    all.tokens += b.tokens;
    all.bytes += b.bytes;
    all.nll_sum += b.nll_sum;
  }
  return all;
}

}  // namespace drt::ppl
