// The host side of a chunk fetch when the host chunk store holds encoder
// rows (CudaChunkStore::kEncoderRows; docs/cuda.md, "Chunk store of C").
// A fetch makes the chunks ChunkResidency planned resident in a group's
// slots. Each chunk's rows C ([S' x d]) are copied into entry i of a device
// staging of `capacity` entries of S rows each: host -> device from the
// host store or, through the pinned staging, a mapping; device -> device
// from the encoder's output for a chunk the step itself closed. Once a
// batch is staged, two GEMMs over all `capacity` entries make K = C W_k^T
// and V = C W_v^T (drt-model.md, Forward pass 4), the landmark row of each
// entry is zeroed (Forward pass 7's off-by-one), and each entry's S rows of
// K and V are copied into its chunk's slot.
//
// Every chunk's K/V thus come from one GEMM of one shape, whichever way its
// rows came in and however many chunks its batch holds: a restored session
// (which fetches everything from the host) makes the same K/V as the
// session it was exported from (which made some from the encoder's output
// in the step they closed), as long as cuBLAS gives a row the same result
// at every row offset of a GEMM of one shape.
//
// Plain C++ (tested without a GPU, tests/fetch_batches_test.cc); the device
// side is CudaSession::FetchEncoderRows.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/cuda/host/chunk_residency.h"

namespace drt::cuda {

// Element offsets and counts of the staging and the slots. A staging entry
// and a slot both hold S rows of width d; a record fills the first S' rows
// of an entry (row S - 1, the landmark's, is not stored).
struct FetchBatchShape {
  int64_t chunk_positions = 0;  // S (64)
  int64_t stored_rows = 0;      // S' (63, enc_chunk_size)
  int64_t width = 0;            // d

  // Of staging entry `index`, of slot `index`, and of chunk `index` of the
  // encoder's output, in [entries][S][d] buffers.
  int64_t entry_offset(int64_t index) const { return index * chunk_positions * width; }
  // Elements one copy of a chunk's rows into an entry moves.
  int64_t record_elements() const { return stored_rows * width; }
  // Elements one copy of an entry's K (or V) into a slot moves.
  int64_t entry_elements() const { return chunk_positions * width; }
  // Rows of the two GEMMs over a staging of `entries` entries (the landmark
  // rows ride along, then are zeroed).
  int64_t gemm_rows(int64_t entries) const { return entries * chunk_positions; }
  int64_t landmark_row() const { return chunk_positions - 1; }
};

// Where a staged chunk's rows come from.
enum class RowSource {
  kEncoder,    // closed in this step: row block `encoder_index` of the encoder output
  kHostStore,  // its record in the pinned host store
  kMapped,     // a mapping (the disk tier), through the pinned staging
};

struct StagedChunk {
  int64_t chunk = 0;
  int slot = 0;
  int64_t entry = 0;  // in its batch
  RowSource source = RowSource::kHostStore;
  int64_t encoder_index = -1;  // kEncoder only
  bool operator==(const StagedChunk&) const = default;
};

// Each batch: at most `capacity` chunks in entries 0, 1, ..., in the order
// of the plan's copies; one pair of GEMMs each.
using FetchBatches = std::vector<std::vector<StagedChunk>>;

// Splits `copies` (ChunkResidency::Plan::copies, in their order) into
// batches of at most `capacity` chunks. Chunks in [first_new_chunk,
// first_new_chunk + new_chunks) come from the encoder's output; `mapped`
// says which of the rest are read from a mapping (null: none).
// INVALID_ARGUMENT naming the problem for capacity < 1, new_chunks < 0 or
// a negative chunk.
absl::StatusOr<FetchBatches> PlanFetchBatches(absl::Span<const ChunkResidency::Copy> copies,
                                              int64_t first_new_chunk, int64_t new_chunks,
                                              int64_t capacity,
                                              const std::function<bool(int64_t)>& mapped);

// Entries of the device staging a session allocates, and so the chunks of
// every fetch GEMM: one decode fetch (top-k chunks of a group) fits one
// batch; a prefill slice's larger fetches take several, in turn (the staging
// is reused in stream order).
int64_t FetchBatchCapacity(int64_t topk, int64_t slots_per_group);

}  // namespace drt::cuda
