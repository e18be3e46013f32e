// The order in which Sampler::Sample walks its candidates: ids by logit, best
// first, ties to the lower id. Sample needs the whole order when top_k is 0
// (its weights are summed in this order), so the order is found without an
// indirect comparator: each logit becomes one 64-bit key (the logit's bits
// mapped to an unsigned order, inverted, above the id) and the keys are
// radix-sorted, or partial-sorted when only a few are wanted.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace drt {

class LogitOrder {
 public:
  // The `count` best ids of `logits` (1 <= count <= logits.size()), best
  // first: a larger logit first, equal logits (-0 and +0 are equal) by the
  // lower id. Logits must not be NaN (the sampler refuses those first).
  // The span stays valid until the next call.
  absl::Span<const int32_t> Best(absl::Span<const float> logits, int32_t count);

 private:
  std::vector<uint64_t> keys_, spare_;  // scratch kept between calls
  std::vector<int32_t> ids_;
};

}  // namespace drt
