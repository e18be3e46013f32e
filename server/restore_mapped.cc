#include "server/restore_mapped.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace drt::server {

absl::StatusOr<MappedRestore> RestoreMappingWhatItCan(Backend& backend, const SessionState& state,
                                                      const ChunkReader& read,
                                                      const ChunkMapper& map,
                                                      int64_t host_budget_bytes,
                                                      int64_t restored_host_bytes) {
  MappedRestore out;
  const int64_t closed = ClosedChunks(state, backend.config());
  // Which leading chunks were mapped, and the mapper's first error.
  ChunkMapper watched_map;
  if (map != nullptr) {
    watched_map = [&](int64_t first, int64_t count) {
      auto mapped = map(first, count);
      if (!mapped.ok()) {
        if (out.map_error.ok()) out.map_error = mapped.status();
      } else if (out.map_error.ok()) {
        out.chunks_mapped = first + count;
      }
      return mapped;
    };
  }
  // The budget is checked at the first read after a failed mapping, before
  // anything is read: the backend reads every chunk from the failed unit on
  // (BackendSession::ImportState), so `closed - chunk` chunks go into memory.
  // Without a failure only the last, partial unit is read, as before.
  bool checked = false;
  absl::Status over_budget;
  const ChunkReader watched_read = [&](int64_t chunk, ChunkData& data) -> absl::Status {
    if (!out.map_error.ok() && !checked) {
      checked = true;
      out.chunks_read_after_failure = closed - chunk;
      out.bytes_read_after_failure = (closed - chunk) * backend.host_bytes_per_chunk();
      // (Written as a difference: the default budget is the int64 maximum.)
      if (out.bytes_read_after_failure > host_budget_bytes - restored_host_bytes) {
        over_budget = absl::ResourceExhaustedError(absl::StrFormat(
            "the disk tier could not map its chunks from chunk %d on (%s; raise "
            "vm.max_map_count), and reading those %d chunks into memory (%d bytes, about %d MiB) "
            "would pass the host memory budget (%d bytes, about %d MiB, of which sessions "
            "restored before it hold %d bytes; --host_memory_budget_gb)",
            chunk, out.map_error.message(), out.chunks_read_after_failure,
            out.bytes_read_after_failure, out.bytes_read_after_failure >> 20, host_budget_bytes,
            host_budget_bytes >> 20, restored_host_bytes));
        return over_budget;
      }
    }
    return read(chunk, data);
  };
  absl::StatusOr<std::unique_ptr<Session>> session =
      Session::Restore(backend, state, watched_read, watched_map);
  if (!session.ok()) {
    if (!over_budget.ok()) return over_budget;
    if (!out.map_error.ok()) {
      return absl::Status(
          session.status().code(),
          absl::StrFormat("the disk tier could not map its chunks from chunk %d on (%s), and "
                          "reading them into memory failed: %s",
                          out.chunks_mapped, out.map_error.message(), session.status().message()));
    }
    return session.status();
  }
  out.session = *std::move(session);
  return out;
}

}  // namespace drt::server
