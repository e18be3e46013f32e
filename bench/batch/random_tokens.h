// Prompt tokens for drt-batch-bench: seeded random ids that any model
// accepts. Speed does not depend on what the tokens say, and ids need no
// tokenizer, so every server and model gets the same kind of load.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "drt/v1/drt.pb.h"

namespace drt::bench {

// Ids in [0, limit) are real tokens: the byte values for a "bytes"
// tokenizer, otherwise every id below the model's special ids (pad,
// landmark), which the API refuses in a prompt (proto/drt/v1/drt.proto,
// TokenIds).
struct TokenRange {
  int32_t limit = 0;
};

// INVALID_ARGUMENT when the model leaves no usable id.
absl::StatusOr<TokenRange> UsableTokens(const drt::v1::ModelInfo& info);

// n ids drawn uniformly from the range, the same for the same seed.
std::vector<int32_t> RandomTokens(int64_t n, TokenRange range, uint64_t seed);

}  // namespace drt::bench
