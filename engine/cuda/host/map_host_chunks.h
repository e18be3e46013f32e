// The disk tier of the CUDA backend on the host (docs/state_format.md, "Disk
// tier"): handing closed chunks over to a mapping of the session's chunk
// files, and reading a mapped chunk back in the backend's storage type.
// Plain C++, tested without a GPU (tests/map_host_chunks_test.cc); the
// device side is CudaSession::MapChunks and FetchChunks.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "engine/cuda/host/host_chunk_store.h"
#include "engine/cuda/host/mapped_chunk_table.h"
#include "engine/cuda/host/ring_state.h"
#include "engine/mapped_chunks.h"

namespace drt::cuda {

// Chunks `chunks` (whole units of `unit`, all closed, i.e. in `store`, none
// mapped before) are read from the mapping from now on: it joins `table`
// and `store` releases their records. All or nothing: INVALID_ARGUMENT
// naming the problem changes neither. Every device copy into or out of
// those records must be done before this is called.
template <typename Element>
absl::Status MapHostChunks(std::shared_ptr<const MappedChunks> chunks, int64_t unit,
                           HostChunkStore<Element>& store, MappedChunkTable& table) {
  if (chunks == nullptr) return absl::InvalidArgumentError("no mapped chunks given");
  if (absl::Status s = table.CheckNew(*chunks, unit, store.size()); !s.ok()) return s;
  if (absl::Status s = store.Release(chunks->first(), chunks->size()); !s.ok()) return s;
  table.Add(std::move(chunks));
  return absl::OkStatus();
}

// The first `count` of chunk `chunk`'s fp32 encoder rows' floats in
// `mapped` (the state format) rounded to Element (bf16: round to nearest
// even, engine/cuda/host/bf16.h, which gives a bf16 value widened to float
// back exactly; fp32: unchanged) into `rows`, e.g. a pinned staging slot.
template <typename Element>
void MappedRowsToElements(const MappedChunks& mapped, int64_t chunk, int64_t count,
                          Element* rows) {
  FloatsToElements(mapped.encoder_rows(chunk), count, rows);
}

}  // namespace drt::cuda
