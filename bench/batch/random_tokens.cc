#include "bench/batch/random_tokens.h"

#include <algorithm>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace drt::bench {

absl::StatusOr<TokenRange> UsableTokens(const drt::v1::ModelInfo& info) {
  int64_t limit = info.vocab_size();
  if (info.tokenizer() == "bytes") limit = std::min<int64_t>(limit, 256);
  // The special ids sit at the top of the vocabulary in every DRT model.
  limit = std::min<int64_t>({limit, info.pad_id(), info.chunk_id()});
  if (limit <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model %s has no token id below its pad id %d and landmark id %d (vocab %d)", info.name(),
        info.pad_id(), info.chunk_id(), info.vocab_size()));
  }
  return TokenRange{static_cast<int32_t>(limit)};
}

std::vector<int32_t> RandomTokens(int64_t n, TokenRange range, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, range.limit - 1);
  std::vector<int32_t> out(static_cast<size_t>(std::max<int64_t>(0, n)));
  for (int32_t& t : out) t = id(rng);
  return out;
}

}  // namespace drt::bench
