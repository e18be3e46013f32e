#include "engine/cuda/host/gca_slot_table.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_format.h"

namespace drt::cuda {

absl::StatusOr<std::vector<const Retrieval*>> ServingSelections(
    absl::Span<const GcaRun> runs, const Retrieval& in_force, absl::Span<const Retrieval> made,
    bool made_known) {
  std::vector<const Retrieval*> serving;
  serving.reserve(runs.size());
  for (const GcaRun& run : runs) {
    if (run.made_at == GcaRun::kInForce) {
      serving.push_back(&in_force);
      continue;
    }
    if (!made_known || run.made_at < 0 || run.made_at >= static_cast<int64_t>(made.size())) {
      return absl::InternalError(absl::StrFormat(
          "the selection of the slice's landmark %d serves rows of this step but was not read "
          "back before its chunks are needed (%d known)",
          run.made_at, made_known ? made.size() : 0));
    }
    serving.push_back(&made[run.made_at]);
  }
  return serving;
}

std::vector<int64_t> ChunksToRequest(absl::Span<const Retrieval* const> serving) {
  std::vector<int64_t> request;
  for (const Retrieval* r : serving) request.insert(request.end(), r->chunks.begin(), r->chunks.end());
  return request;
}

absl::StatusOr<std::vector<int>> DeviceStoreSlots(absl::Span<const int64_t> chunks,
                                                  int64_t stored_chunks) {
  std::vector<int> slots;
  slots.reserve(chunks.size());
  for (const int64_t c : chunks) {
    // Slots are int32 in the table; the store holds far fewer chunks
    // (at most 2^20 landmarks, kernels/landmark_topk.h).
    if (c < 0 || c >= stored_chunks || c > std::numeric_limits<int32_t>::max()) {
      return absl::InternalError(absl::StrFormat(
          "chunk %d is selected but the device chunk store holds %d chunks", c,
          stored_chunks));
    }
    slots.push_back(static_cast<int>(c));
  }
  return slots;
}

void FillSlotTable(absl::Span<const Retrieval* const> serving, absl::Span<const int> slots,
                   int64_t topk, int32_t* table, float* weights) {
  const int64_t entries = static_cast<int64_t>(serving.size()) * topk;
  std::fill_n(table, entries, -1);
  std::fill_n(weights, entries, 0.f);
  size_t next = 0;
  for (size_t q = 0; q < serving.size(); ++q) {
    for (size_t i = 0; i < serving[q]->chunks.size(); ++i) {
      table[q * topk + i] = slots[next++];
      weights[q * topk + i] = serving[q]->weights[i];
    }
  }
}

}  // namespace drt::cuda
