#include "engine/mapped_chunks.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace drt {

absl::StatusOr<int64_t> MapLeadingUnits(
    const ChunkMapper& map, int64_t unit, int64_t num_chunks,
    const std::function<absl::Status(std::shared_ptr<const MappedChunks>)>& take) {
  if (map == nullptr || unit <= 0) return 0;
  int64_t c = 0;
  for (; c + unit <= num_chunks; c += unit) {
    absl::StatusOr<std::shared_ptr<const MappedChunks>> mapped = map(c, unit);
    if (!mapped.ok()) break;  // the rest is read into memory (see the header)
    if (*mapped == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("mapping chunks [%d, %d) gave nothing", c, c + unit));
    }
    if ((*mapped)->first() != c || (*mapped)->size() != unit) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "mapping chunks [%d, %d) gave chunks [%d, %d)", c, c + unit, (*mapped)->first(),
          (*mapped)->first() + (*mapped)->size()));
    }
    if (absl::Status s = take(*std::move(mapped)); !s.ok()) return s;
  }
  return c;
}

}  // namespace drt
