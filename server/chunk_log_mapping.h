// The disk tier's side in the state directory: maps a run of a session's
// closed chunks from its chunk logs (docs/state_format.md, "Chunk log" and
// "Disk tier") for the engine to read (engine/mapped_chunks.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/mapped_chunks.h"
#include "engine/model_config.h"
#include "server/state_files.h"

namespace drt::server {

// Maps chunks [first, first + count) of the session whose closed chunks are
// the concatenation of `segments` (log names; `log_path` gives each file).
// The records must be whole and on disk (they were written and fsynced, or
// checked at start-up). Read-only, shared mappings: the page cache decides
// what is resident. Errors name the file.
absl::StatusOr<std::shared_ptr<const MappedChunks>> MapChunkLogs(
    const std::vector<ChunkSegment>& segments, const std::vector<std::string>& log_paths,
    int64_t first, int64_t count, const ModelConfig& config);

}  // namespace drt::server
