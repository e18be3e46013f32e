// The host side of a slice's GCA on the CUDA backend (plain C++, tested
// without a GPU): which selection serves each run of rows of the slice
// (engine/step_plan.h, GcaRun::made_at), the chunks to make resident in the
// group's slot buffer, and the [run][topk] slot table and weights the GCA
// kernel reads (kernels/gca_attention.h: one row per query chunk, in order).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/step_plan.h"

namespace drt::cuda {

// The selection serving each run: `in_force` for GcaRun::kInForce, else
// made[made_at], the one made at the slice's landmark made_at in this step.
// INTERNAL when a run needs a selection of this step that is not known yet
// (`made_known` false) or made_at names no landmark of the slice.
absl::StatusOr<std::vector<const Retrieval*>> ServingSelections(
    absl::Span<const GcaRun> runs, const Retrieval& in_force, absl::Span<const Retrieval> made,
    bool made_known);

// The chunks of every serving selection, run after run (repeats kept): the
// request for ChunkResidency, whose answer `slots` follows the same order.
std::vector<int64_t> ChunksToRequest(absl::Span<const Retrieval* const> serving);

// The slots of `chunks` when the group's chunk array is the session's
// device chunk store (CudaChunkTier::kDevice, docs/cuda.md "Device tier"):
// chunk c sits in "slot" c, its index in the store, so the GCA kernel reads
// it in place. INTERNAL naming the chunk when one is negative or not stored
// yet (>= stored_chunks): the kernel would read memory the store does not
// hold.
absl::StatusOr<std::vector<int>> DeviceStoreSlots(absl::Span<const int64_t> chunks,
                                                  int64_t stored_chunks);

// Row q of table / weights (each serving.size() x topk) holds the slots and
// weights of serving[q]'s chunks, then -1 / 0 where it has fewer than topk.
void FillSlotTable(absl::Span<const Retrieval* const> serving, absl::Span<const int> slots,
                   int64_t topk, int32_t* table, float* weights);

}  // namespace drt::cuda
