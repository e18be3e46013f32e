#include "engine/top_logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "engine/sampler.h"

namespace drt {

absl::StatusOr<std::vector<TokenLogProb>> TopLogProbs(absl::Span<const float> logits, int32_t n,
                                                      absl::Span<const int32_t> unlisted) {
  if (n < 0 || n > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_logprobs must be in [0, %d], got %d", kMaxTopLogprobs, n));
  }
  if (absl::Status s = CheckSamplableLogits(logits); !s.ok()) return s;
  // best[0..size) holds the best ids so far, best first. Ids arrive in
  // increasing order, so a logit equal to a held one goes after it (ties to
  // the lower id) and, when the array is full, displaces nothing.
  int32_t best[kMaxTopLogprobs];
  int32_t size = 0;
  float max = -std::numeric_limits<float>::infinity();
  const int32_t count = static_cast<int32_t>(logits.size());
  for (int32_t id = 0; id < count; ++id) {
    const float l = logits[id];
    max = std::max(max, l);
    if (n == 0 || l == -std::numeric_limits<float>::infinity()) continue;
    if (size == n && !(l > logits[best[size - 1]])) continue;
    if (std::find(unlisted.begin(), unlisted.end(), id) != unlisted.end()) continue;
    int32_t at = size < n ? size++ : n - 1;  // the slot it takes, then moved up
    while (at > 0 && l > logits[best[at - 1]]) {
      best[at] = best[at - 1];
      --at;
    }
    best[at] = id;
  }
  // As Sampler::LogProb: max is finite (CheckSamplableLogits).
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  std::vector<TokenLogProb> out;
  out.reserve(size);
  for (int32_t i = 0; i < size; ++i) {
    out.push_back({best[i], static_cast<float>(logits[best[i]] - max - std::log(sum))});
  }
  return out;
}

}  // namespace drt
