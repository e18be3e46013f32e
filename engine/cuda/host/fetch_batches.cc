#include "engine/cuda/host/fetch_batches.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace drt::cuda {

absl::StatusOr<FetchLayout> PlanFetchBatches(absl::Span<const ChunkResidency::Copy> copies,
                                             int64_t first_new_chunk, int64_t new_chunks,
                                             int64_t batch_capacity,
                                             const std::function<bool(int64_t)>& mapped) {
  if (batch_capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a fetch batch of %d chunks: at least 1", batch_capacity));
  }
  if (new_chunks < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d chunks made by the step's encoder", new_chunks));
  }
  FetchLayout layout;
  for (const ChunkResidency::Copy& copy : copies) {
    if (copy.chunk < 0) {
      return absl::InvalidArgumentError(absl::StrFormat("fetch of chunk %d", copy.chunk));
    }
    const int64_t fresh = copy.chunk - first_new_chunk;
    if (fresh >= 0 && fresh < new_chunks) {
      layout.fresh.push_back(FreshChunkCopy{copy.chunk, copy.slot, fresh});
      continue;
    }
    if (layout.batches.empty() ||
        static_cast<int64_t>(layout.batches.back().size()) == batch_capacity) {
      layout.batches.emplace_back();
    }
    std::vector<StagedChunk>& batch = layout.batches.back();
    batch.push_back(StagedChunk{copy.chunk, copy.slot, static_cast<int64_t>(batch.size()),
                                mapped != nullptr && mapped(copy.chunk)});
  }
  return layout;
}

int64_t FetchBatchCapacity(int64_t topk, int64_t slots_per_group) {
  // 32 entries (3 MiB of bf16 rows at d 768) when a group holds that many;
  // never fewer than one decode fetch (top-k chunks).
  constexpr int64_t kPreferred = 32;
  return std::max<int64_t>(1, std::min(slots_per_group, std::max(topk, kPreferred)));
}

}  // namespace drt::cuda
