// One session as one file (SaveSession / LoadSession; docs/state_format.md,
// "Session files"): its small-state record followed by all its closed chunks,
// so that an operator can move a session between replicas, as llama.cpp's
// slot save/restore does.
#pragma once

#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/session.h"
#include "server/session_manager.h"

namespace drt::server {

// INVALID_ARGUMENT unless `name` is a plain file name: 1..128 of
// [A-Za-z0-9._-], not starting with a dot (no paths: files stay in the
// server's --session_files_dir).
absl::Status CheckSessionFileName(const std::string& name);

// Writes the session to `path` atomically (a temporary file of a unique
// name, fsync, rename, fsync of the directory: AtomicFileWriter); returns
// the bytes written. The chunks are written one record at a time: the save
// holds one chunk's record in memory, not the session's.
absl::StatusOr<int64_t> SaveSessionFile(const std::string& path, const std::string& id,
                                        const SessionSettings& settings, const Session& session);

struct LoadedSession {
  std::string saved_id;  // the id it had when saved
  SessionSettings settings;
  std::unique_ptr<Session> session;
};
// Reads a file SaveSessionFile wrote; DATA_LOSS / FAILED_PRECONDITION naming
// the path for a foreign, newer, truncated or corrupt file or another model.
// Once the header and the small state are read and checked, and before any
// chunk is, calls `admit` with the session's closed chunks: a status other
// than OK (say, the host-memory budget) ends the load with it. Chunk records
// are then read one at a time from the file (never the whole file at once).
absl::StatusOr<LoadedSession> LoadSessionFile(
    const std::string& path, Backend& backend,
    absl::FunctionRef<absl::Status(int64_t chunks)> admit);

}  // namespace drt::server
