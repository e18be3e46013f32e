#include "engine/cuda/host/chunk_residency.h"

#include <algorithm>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace drt::cuda {

ChunkResidency::ChunkResidency(int num_slots)
    : slot_chunk_(std::max(0, num_slots), -1), last_used_(std::max(0, num_slots), 0) {}

int ChunkResidency::slot_of(int64_t chunk) const {
  for (size_t s = 0; s < slot_chunk_.size(); ++s) {
    if (slot_chunk_[s] == chunk) return static_cast<int>(s);
  }
  return -1;
}

void ChunkResidency::Clear() {
  std::fill(slot_chunk_.begin(), slot_chunk_.end(), -1);
  std::fill(last_used_.begin(), last_used_.end(), 0);
}

absl::StatusOr<ChunkResidency::Plan> ChunkResidency::Request(absl::Span<const int64_t> chunks) {
  std::unordered_map<int64_t, int> slot_by_chunk;
  for (size_t s = 0; s < slot_chunk_.size(); ++s) {
    if (slot_chunk_[s] >= 0) slot_by_chunk[slot_chunk_[s]] = static_cast<int>(s);
  }
  std::vector<int64_t> distinct;
  for (int64_t c : chunks) {
    if (c < 0) return absl::InvalidArgumentError(absl::StrFormat("chunk %d requested", c));
    if (std::find(distinct.begin(), distinct.end(), c) == distinct.end()) distinct.push_back(c);
  }
  if (distinct.size() > slot_chunk_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d distinct chunks requested of a buffer with %d slots", distinct.size(),
        slot_chunk_.size()));
  }

  ++clock_;
  std::vector<bool> pinned(slot_chunk_.size(), false);  // holds a requested chunk
  Plan plan;
  std::vector<int64_t> missing;
  for (int64_t c : distinct) {
    auto it = slot_by_chunk.find(c);
    if (it == slot_by_chunk.end()) {
      missing.push_back(c);
    } else {
      pinned[it->second] = true;
      ++plan.hits;
    }
  }
  // Victims: empty slots first, then the least recently requested; ties by
  // slot index so that plans are reproducible.
  std::vector<int> victims;
  for (size_t s = 0; s < slot_chunk_.size(); ++s) {
    if (!pinned[s]) victims.push_back(static_cast<int>(s));
  }
  std::stable_sort(victims.begin(), victims.end(), [&](int a, int b) {
    const bool empty_a = slot_chunk_[a] < 0, empty_b = slot_chunk_[b] < 0;
    if (empty_a != empty_b) return empty_a;
    return last_used_[a] < last_used_[b];
  });
  for (size_t i = 0; i < missing.size(); ++i) {
    const int slot = victims[i];
    if (slot_chunk_[slot] >= 0) {
      plan.evicted.push_back(slot_chunk_[slot]);
      slot_by_chunk.erase(slot_chunk_[slot]);
    }
    slot_chunk_[slot] = missing[i];
    slot_by_chunk[missing[i]] = slot;
    plan.copies.push_back({missing[i], slot});
  }
  for (int64_t c : distinct) last_used_[slot_by_chunk.at(c)] = clock_;
  plan.slots.reserve(chunks.size());
  for (int64_t c : chunks) plan.slots.push_back(slot_by_chunk.at(c));
  return plan;
}

}  // namespace drt::cuda
