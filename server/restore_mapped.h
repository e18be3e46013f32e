// One durable session's restore at start-up (server/state_store.h,
// RestoreAll; docs/state_format.md, "Disk tier"): with the disk tier its
// closed chunks are mapped from the chunk logs as far as the mapper can
// (vm.max_map_count or EMFILE can stop it part-way, the data intact) and
// only the rest is read into memory, the outcome the disk tier has at run
// time after a failed mapping (StateStore::MapChunksOnDisk). What that
// failure makes it read must fit the host memory budget beside the sessions
// restored before it; otherwise the restore is refused before any of it is
// read.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/session.h"
#include "engine/session_state.h"

namespace drt::server {

struct MappedRestore {
  std::unique_ptr<Session> session;
  // Leading closed chunks the session reads from the logs (whole units).
  int64_t chunks_mapped = 0;
  // The mapper's first error (OK: none failed); no chunk after it is
  // mapped, and the session holds them in memory.
  absl::Status map_error;
  // After a failed mapping: the chunks read into memory from there on,
  // and their host bytes as the budget counts them (chunks x
  // Backend::host_bytes_per_chunk). 0 when no mapping failed.
  int64_t chunks_read_after_failure = 0;
  int64_t bytes_read_after_failure = 0;
};

// Restores `state` through `read` and `map` (null: no disk tier).
// `host_budget_bytes` is --host_memory_budget_gb, `restored_host_bytes` what
// the sessions restored before this one hold. The budget counts the chunks
// the failed mapping leaves to read (closed - chunks_mapped) at
// Backend::host_bytes_per_chunk each: a lower bound of what they take (see
// docs/state_format.md, "When mapping fails"). Errors: RESOURCE_EXHAUSTED
// naming the mapping error, what to raise (MapErrorAdvice), the bytes and
// the budget when a mapping failed and the chunks left do not fit (nothing
// of them read); INTERNAL when the backend asks for a mapping after a read
// (the budget relies on every mapping coming first); a failed read after a
// failed mapping names both errors; any other error of Session::Restore as
// it is.
absl::StatusOr<MappedRestore> RestoreMappingWhatItCan(Backend& backend, const SessionState& state,
                                                      const ChunkReader& read,
                                                      const ChunkMapper& map,
                                                      int64_t host_budget_bytes,
                                                      int64_t restored_host_bytes);

// What RestoreMappingWhatItCan does around the restore itself, which
// `restore` runs with the watched reader and mapper (there: Session::Restore
// of a session with `closed` closed chunks). Apart so that tests can drive
// the watch with a backend that breaks the order of reads and mappings.
using WatchedRestore = std::function<absl::StatusOr<std::unique_ptr<Session>>(
    const ChunkReader& read, const ChunkMapper& map)>;
absl::StatusOr<MappedRestore> RestoreWithinBudget(int64_t closed, int64_t host_bytes_per_chunk,
                                                  const ChunkReader& read, const ChunkMapper& map,
                                                  int64_t host_budget_bytes,
                                                  int64_t restored_host_bytes,
                                                  const WatchedRestore& restore);

// What the quarantine line tells the operator to raise for a mapping error:
// the open-file limit for EMFILE/ENFILE, vm.max_map_count for ENOMEM (what
// mmap gives at that limit), both when the message names neither.
std::string MapErrorAdvice(const absl::Status& map_error);

}  // namespace drt::server
