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
#include <memory>

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
// the sessions restored before this one hold. Errors: RESOURCE_EXHAUSTED
// naming the mapping error, vm.max_map_count, the bytes and the budget when
// a mapping failed and the chunks left do not fit (nothing of them read);
// a failed read after a failed mapping names both errors; any other error
// of Session::Restore as it is.
absl::StatusOr<MappedRestore> RestoreMappingWhatItCan(Backend& backend, const SessionState& state,
                                                      const ChunkReader& read,
                                                      const ChunkMapper& map,
                                                      int64_t host_budget_bytes,
                                                      int64_t restored_host_bytes);

}  // namespace drt::server
