#include "engine/logit_order.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace drt {
namespace {

// A key whose unsigned order is "larger logit first, then lower id". The
// float's bits map to an unsigned value that grows with the float (negative
// values: all bits flipped; others: the sign bit set); inverting that puts
// the larger logit first. `+ 0.f` turns -0 into +0 so that they tie, as
// `>` has them.
uint64_t KeyOf(float logit, int32_t id) {
  const float canonical = logit + 0.f;
  uint32_t bits;
  std::memcpy(&bits, &canonical, sizeof bits);
  const uint32_t ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<uint64_t>(~ascending) << 32) | static_cast<uint32_t>(id);
}

// Stable LSD radix sort of `keys` by their upper 32 bits (the logit part),
// in three passes of 11, 11 and 10 bits. The keys arrive in id order, so
// stability keeps equal logits in id order: the result is the keys' full
// 64-bit order. `spare` is scratch of the same size.
void RadixSortByLogit(std::vector<uint64_t>& keys, std::vector<uint64_t>& spare) {
  constexpr int kShifts[3] = {32, 43, 54};
  constexpr uint32_t kMasks[3] = {0x7ff, 0x7ff, 0x3ff};
  std::array<std::array<uint32_t, 2048>, 3> counts{};
  for (uint64_t k : keys) {
    for (int p = 0; p < 3; ++p) ++counts[p][(k >> kShifts[p]) & kMasks[p]];
  }
  spare.resize(keys.size());
  for (int p = 0; p < 3; ++p) {
    // A pass whose digit is the same for every key moves nothing.
    if (counts[p][(keys[0] >> kShifts[p]) & kMasks[p]] == keys.size()) continue;
    uint32_t next = 0;
    for (uint32_t& c : counts[p]) {
      const uint32_t n = c;
      c = next;
      next += n;
    }
    for (uint64_t k : keys) spare[counts[p][(k >> kShifts[p]) & kMasks[p]]++] = k;
    keys.swap(spare);
  }
}

// Below this many wanted ids a partial sort (a heap of `count` keys) beats
// sorting them all.
constexpr int32_t kPartialSortMax = 256;

}  // namespace

absl::Span<const int32_t> LogitOrder::Best(absl::Span<const float> logits, int32_t count) {
  const int32_t n = static_cast<int32_t>(logits.size());
  keys_.resize(n);
  for (int32_t i = 0; i < n; ++i) keys_[i] = KeyOf(logits[i], i);
  if (count <= kPartialSortMax && count < n) {
    std::partial_sort(keys_.begin(), keys_.begin() + count, keys_.end());
  } else {
    RadixSortByLogit(keys_, spare_);
  }
  ids_.resize(count);
  for (int32_t i = 0; i < count; ++i) ids_[i] = static_cast<int32_t>(keys_[i] & 0xffffffffu);
  return ids_;
}

}  // namespace drt
