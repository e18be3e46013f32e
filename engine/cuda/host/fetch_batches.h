// The host side of a chunk fetch when the host chunk store holds encoder
// rows (CudaChunkStore::kEncoderRows; docs/cuda.md, "Chunk store of C").
// A fetch copies the chunks ChunkResidency planned into a group's slots:
// - a chunk the step's encoder just made is copied device -> device from
//   its K/V in enc_k/enc_v (as in K/V mode);
// - any other chunk's rows C ([S' x d], from the host store or, through
//   the pinned staging, a mapping) go host -> device into a device staging
//   buffer of `batch_capacity` entries of S rows each; once a batch is
//   staged, two GEMMs over all its entries make K = C W_k^T and V = C W_v^T
//   (drt-model.md, Forward pass 4), the landmark row of each entry is
//   zeroed (Forward pass 7's off-by-one), and each entry's S rows of K and
//   V are copied into the chunk's slot.
// Plain C++ (tested without a GPU, tests/fetch_batches_test.cc); the device
// side is CudaSession::FetchChunks.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/cuda/host/chunk_residency.h"

namespace drt::cuda {

// Element offsets and counts of the staging and the slots. A staging entry
// and a slot both hold S rows of width d; the stored record fills the
// first S' of an entry (row S - 1, the landmark's, is not stored).
struct FetchBatchShape {
  int64_t chunk_positions = 0;  // S (64)
  int64_t stored_rows = 0;      // S' (63, enc_chunk_size)
  int64_t width = 0;            // d

  // Of staging entry `index`, and of slot `slot`, in a [entries][S][d] buffer.
  int64_t entry_offset(int64_t index) const { return index * chunk_positions * width; }
  // Elements one host -> device copy of a record moves.
  int64_t record_elements() const { return stored_rows * width; }
  // Elements one device -> device copy of an entry's K (or V) into a slot moves.
  int64_t entry_elements() const { return chunk_positions * width; }
  // Rows of the two GEMMs of a batch of `chunks` entries (the landmark rows
  // ride along, then are zeroed).
  int64_t gemm_rows(int64_t chunks) const { return chunks * chunk_positions; }
  int64_t landmark_row() const { return chunk_positions - 1; }
};

// A chunk of the step's encoder: its K/V are rows
// [encoder_index * S, (encoder_index + 1) * S) of enc_k/enc_v.
struct FreshChunkCopy {
  int64_t chunk = 0;
  int slot = 0;
  int64_t encoder_index = 0;
  bool operator==(const FreshChunkCopy&) const = default;
};

// A chunk whose rows are staged at entry `entry` of its batch.
struct StagedChunk {
  int64_t chunk = 0;
  int slot = 0;
  int64_t entry = 0;
  bool mapped = false;  // read from a mapping (the disk tier), else the host store
  bool operator==(const StagedChunk&) const = default;
};

struct FetchLayout {
  std::vector<FreshChunkCopy> fresh;
  // Each batch: at most batch_capacity chunks, entries 0, 1, ... in order;
  // one pair of GEMMs.
  std::vector<std::vector<StagedChunk>> batches;
};

// Splits `copies` (ChunkResidency::Plan::copies, in their order) into
// fresh copies (chunks in [first_new_chunk, first_new_chunk + new_chunks))
// and batches of staged chunks (the rest; `mapped` says which are read from
// a mapping). INVALID_ARGUMENT naming the problem for batch_capacity < 1, a
// negative chunk or new_chunks < 0.
absl::StatusOr<FetchLayout> PlanFetchBatches(absl::Span<const ChunkResidency::Copy> copies,
                                             int64_t first_new_chunk, int64_t new_chunks,
                                             int64_t batch_capacity,
                                             const std::function<bool(int64_t)>& mapped);

// Entries of the device staging a session allocates: one decode fetch
// (top-k chunks of a group) is one batch; a prefill slice's larger fetches
// take several, in turn (the staging is reused in stream order).
int64_t FetchBatchCapacity(int64_t topk, int64_t slots_per_group);

}  // namespace drt::cuda
