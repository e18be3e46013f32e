#include "engine/cuda/host/mapped_chunk_table.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace drt::cuda {
namespace {

// The first range whose first() is after `chunk`.
auto RangeAfter(const std::vector<std::shared_ptr<const MappedChunks>>& ranges, int64_t chunk) {
  return std::upper_bound(ranges.begin(), ranges.end(), chunk,
                          [](int64_t c, const auto& r) { return c < r->first(); });
}

}  // namespace

absl::Status MappedChunkTable::CheckNew(const MappedChunks& chunks, int64_t unit,
                                        int64_t closed_chunks) const {
  const int64_t first = chunks.first(), count = chunks.size();
  const auto range = [&] { return absl::StrFormat("mapped chunks [%d, %d)", first, first + count); };
  if (unit <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: this session maps no chunks (map unit %d)", range(), unit));
  }
  if (count <= 0 || first < 0 || first % unit != 0 || count % unit != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not whole units of %d chunks (first and size must be positive multiples)", range(),
        unit));
  }
  if (first + count > closed_chunks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not all closed; the session has %d closed chunks", range(), closed_chunks));
  }
  auto after = RangeAfter(ranges_, first);
  const bool overlaps_before =
      after != ranges_.begin() && (*std::prev(after))->first() + (*std::prev(after))->size() > first;
  const bool overlaps_after = after != ranges_.end() && (*after)->first() < first + count;
  if (overlaps_before || overlaps_after) {
    const MappedChunks& other = overlaps_before ? **std::prev(after) : **after;
    return absl::InvalidArgumentError(absl::StrFormat("%s: overlap chunks [%d, %d) mapped already",
                                                      range(), other.first(),
                                                      other.first() + other.size()));
  }
  return absl::OkStatus();
}

void MappedChunkTable::Add(std::shared_ptr<const MappedChunks> chunks) {
  mapped_chunks_ += chunks->size();
  encoder_row_bytes_ += chunks->encoder_row_bytes();
  ranges_.insert(RangeAfter(ranges_, chunks->first()), std::move(chunks));
}

bool MappedChunkTable::Covers(int64_t first, int64_t count) const {
  if (count <= 0) return false;
  int64_t c = first;
  while (c < first + count) {
    const MappedChunks* r = Find(c);
    if (r == nullptr) return false;
    c = r->first() + r->size();
  }
  return true;
}

const MappedChunks* MappedChunkTable::Find(int64_t chunk) const {
  auto after = RangeAfter(ranges_, chunk);
  if (after == ranges_.begin()) return nullptr;
  const MappedChunks& r = **std::prev(after);
  return chunk < r.first() + r.size() ? &r : nullptr;
}

}  // namespace drt::cuda
