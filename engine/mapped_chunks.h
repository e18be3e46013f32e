// The disk tier (docs/state_format.md, "Disk tier"): closed chunks a session
// reads from memory-mapped chunk files instead of holding them in RAM. The
// page cache then decides which of them stay in memory, so host RAM bounds
// what is resident, not how long a context can grow.
//
// The owner of the files (the server's state directory,
// server/chunk_log_mapping.h) maps them; a backend only reads through this
// interface. Landmarks are read once, when the chunks are handed over: the
// backend keeps those in memory, because retrieval scans all of them for
// every chunk (drt-model.md, Forward pass 5).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"

namespace drt {

// Chunks [first(), first() + size()) of one session, with the contents the
// session wrote. The pointers stay valid while this object lives.
class MappedChunks {
 public:
  virtual ~MappedChunks() = default;
  virtual int64_t first() const = 0;
  virtual int64_t size() const = 0;
  // `chunk` is the session's chunk index, in [first(), first() + size()).
  virtual const float* landmark(int64_t chunk) const = 0;  // [hidden_size]
  // The chunk's encoder output rows (engine/session_state.h, ChunkData::rows):
  // [enc_chunk_size x hidden_size].
  virtual const float* encoder_rows(int64_t chunk) const = 0;
  // Bytes of encoder rows it maps (what the session no longer holds in RAM).
  virtual size_t encoder_row_bytes() const = 0;
};

// Maps chunks [first, first + count) of a session. It may fail where the
// environment runs out (vm.max_map_count, EMFILE) with the data intact.
using ChunkMapper =
    std::function<absl::StatusOr<std::shared_ptr<const MappedChunks>>(int64_t first, int64_t count)>;

// The import side of the disk tier (BackendSession::ImportState): maps a
// session's leading whole units of `unit` chunks, of its `num_chunks` closed
// ones, through `map`, one unit at a time from chunk 0, and hands each to
// `take`, until less than a unit is left or a mapping fails. A failed
// mapping is no error: as at run time (server/state_store.cc,
// MapChunksOnDisk, which stops at a session's first failure), nothing after
// it is mapped, and the caller reads every chunk from the returned count on
// into memory. So a restore keeps the blocks it could map instead of
// needing all of them in RAM. Returns the chunks mapped (a multiple of
// `unit`; 0 without `map` or with `unit` <= 0). Errors: INVALID_ARGUMENT
// for a mapping that is null or of other chunks than asked (a broken
// mapper, not the environment), and whatever `take` returns (a mapping the
// backend refuses); the caller then refuses the import.
absl::StatusOr<int64_t> MapLeadingUnits(
    const ChunkMapper& map, int64_t unit, int64_t num_chunks,
    const std::function<absl::Status(std::shared_ptr<const MappedChunks>)>& take);

}  // namespace drt
