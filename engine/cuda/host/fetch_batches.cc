#include "engine/cuda/host/fetch_batches.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace drt::cuda {

absl::StatusOr<FetchBatches> PlanFetchBatches(absl::Span<const ChunkResidency::Copy> copies,
                                              int64_t first_new_chunk, int64_t new_chunks,
                                              int64_t capacity,
                                              const std::function<bool(int64_t)>& mapped) {
  if (capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a fetch batch of %d chunks: at least 1", capacity));
  }
  if (new_chunks < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d chunks made by the step's encoder", new_chunks));
  }
  FetchBatches batches;
  for (const ChunkResidency::Copy& copy : copies) {
    if (copy.chunk < 0) {
      return absl::InvalidArgumentError(absl::StrFormat("fetch of chunk %d", copy.chunk));
    }
    if (batches.empty() || static_cast<int64_t>(batches.back().size()) == capacity) {
      batches.emplace_back();
    }
    std::vector<StagedChunk>& batch = batches.back();
    StagedChunk staged{copy.chunk, copy.slot, static_cast<int64_t>(batch.size())};
    const int64_t fresh = copy.chunk - first_new_chunk;
    if (fresh >= 0 && fresh < new_chunks) {
      staged.source = RowSource::kEncoder;
      staged.encoder_index = fresh;
    } else if (mapped != nullptr && mapped(copy.chunk)) {
      staged.source = RowSource::kMapped;
    }
    batch.push_back(staged);
  }
  return batches;
}

int64_t FetchBatchCapacity(int64_t topk, int64_t slots_per_group) {
  // Every fetch GEMM runs over all entries (one shape: see the header), so
  // the staging is kept small: 16 entries (1.5 MiB of bf16 rows at d 768)
  // unless top-k is larger; never more than a group's slots.
  constexpr int64_t kPreferred = 16;
  return std::max<int64_t>(1, std::min(slots_per_group, std::max(topk, kPreferred)));
}

}  // namespace drt::cuda
