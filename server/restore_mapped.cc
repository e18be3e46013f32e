#include "server/restore_mapped.h"

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"

namespace drt::server {

std::string MapErrorAdvice(const absl::Status& map_error) {
  // MapChunkLogs (server/chunk_log_mapping.cc) puts strerror's text in its
  // messages: an open() at the descriptor limit, or an mmap() at the
  // mapping limit (ENOMEM). strerror(EMFILE) also begins strerror(ENFILE).
  const absl::string_view message = map_error.message();
  const bool files = absl::StrContains(message, std::strerror(EMFILE));
  const bool maps = absl::StrContains(message, std::strerror(ENOMEM));
  if (files && !maps) return "raise the open-file limit, ulimit -n";
  if (maps && !files) return "raise vm.max_map_count";
  return "raise vm.max_map_count or the open-file limit, ulimit -n";
}

absl::StatusOr<MappedRestore> RestoreWithinBudget(int64_t closed, int64_t host_bytes_per_chunk,
                                                  const ChunkReader& read, const ChunkMapper& map,
                                                  int64_t host_budget_bytes,
                                                  int64_t restored_host_bytes,
                                                  const WatchedRestore& restore) {
  MappedRestore out;
  // Set by the first read; a mapping asked for after it breaks the order
  // the budget relies on (backend.h, ImportState), and is refused.
  bool read_any = false;
  absl::Status out_of_order;
  // Which leading chunks were mapped, and the mapper's first error.
  ChunkMapper watched_map;
  if (map != nullptr) {
    watched_map = [&](int64_t first,
                      int64_t count) -> absl::StatusOr<std::shared_ptr<const MappedChunks>> {
      if (read_any) {
        if (out_of_order.ok()) {
          out_of_order = absl::InternalError(absl::StrFormat(
              "the backend asked to map chunks [%d, %d) after it had read chunks: every "
              "mapping must come before the first read (BackendSession::ImportState)",
              first, first + count));
        }
        return out_of_order;
      }
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
  // anything is read. Every mapping came before it (refused otherwise), so
  // the mapped prefix is final and the backend reads all the rest
  // (BackendSession::ImportState): `closed - chunks_mapped` chunks go into
  // memory, whatever order it reads them in. Without a failure only the
  // last, partial unit is read, as before.
  bool checked = false;
  absl::Status over_budget;
  const ChunkReader watched_read = [&](int64_t chunk, ChunkData& data) -> absl::Status {
    read_any = true;
    if (!out_of_order.ok()) return out_of_order;
    if (!out.map_error.ok() && !checked) {
      checked = true;
      out.chunks_read_after_failure = closed - out.chunks_mapped;
      out.bytes_read_after_failure = out.chunks_read_after_failure * host_bytes_per_chunk;
      // (Written as a difference: the default budget is the int64 maximum.)
      if (out.bytes_read_after_failure > host_budget_bytes - restored_host_bytes) {
        over_budget = absl::ResourceExhaustedError(absl::StrFormat(
            "the disk tier could not map its chunks from chunk %d on (%s; %s), and reading "
            "those %d chunks into memory (%d bytes, about %d MiB) would pass the host memory "
            "budget (%d bytes, about %d MiB, of which sessions restored before it hold %d "
            "bytes; --host_memory_budget_gb)",
            out.chunks_mapped, out.map_error.message(), MapErrorAdvice(out.map_error),
            out.chunks_read_after_failure, out.bytes_read_after_failure,
            out.bytes_read_after_failure >> 20, host_budget_bytes, host_budget_bytes >> 20,
            restored_host_bytes));
        return over_budget;
      }
    }
    return read(chunk, data);
  };
  absl::StatusOr<std::unique_ptr<Session>> session = restore(watched_read, watched_map);
  if (!out_of_order.ok()) return out_of_order;  // even if the backend went on
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

absl::StatusOr<MappedRestore> RestoreMappingWhatItCan(Backend& backend, const SessionState& state,
                                                      const ChunkReader& read,
                                                      const ChunkMapper& map,
                                                      int64_t host_budget_bytes,
                                                      int64_t restored_host_bytes) {
  return RestoreWithinBudget(
      ClosedChunks(state, backend.config()), backend.host_bytes_per_chunk(), read, map,
      host_budget_bytes, restored_host_bytes,
      [&](const ChunkReader& watched_read, const ChunkMapper& watched_map) {
        return Session::Restore(backend, state, watched_read, watched_map);
      });
}

}  // namespace drt::server
