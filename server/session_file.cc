#include "server/session_file.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/session_state.h"
#include "server/state_files.h"

namespace drt::server {
namespace {

// A session file is a small-state file (state_files.h) whose one segment is
// named kInlineChunks, followed by that many chunk records.
constexpr char kInlineChunks[] = "(inline)";
constexpr size_t kStateHeaderBytes = 8 + 4 + 4 + 8;  // as in state_files.cc

}  // namespace

absl::Status CheckSessionFileName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 128 && name[0] != '.';
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "file_name must be 1 to 128 characters of A-Z a-z 0-9 . _ - and not start with a dot (a "
      "name inside the server's --session_files_dir, not a path)");
}

absl::StatusOr<int64_t> SaveSessionFile(const std::string& path, const std::string& id,
                                        const SessionSettings& settings, const Session& session) {
  auto state = session.ExportState();
  if (!state.ok()) return state.status();
  SessionRecord record;
  record.id = id;
  record.settings = settings;
  record.segments = {ChunkSegment{kInlineChunks, session.num_chunks()}};
  record.state = EncodeSessionState(*state, session.config());
  std::string bytes = EncodeSessionRecord(record);
  ChunkData chunk;
  std::string payload;
  for (int64_t c = 0; c < session.num_chunks(); ++c) {
    if (absl::Status s = session.backend_session().ReadChunk(c, chunk); !s.ok()) return s;
    payload.clear();
    EncodeChunk(chunk, payload);
    AppendChunkRecord(payload, bytes);
  }
  if (absl::Status s = WriteFileAtomically(path, bytes); !s.ok()) return s;
  return static_cast<int64_t>(bytes.size());
}

absl::StatusOr<LoadedSession> LoadSessionFile(const std::string& path, Backend& backend) {
  auto bytes = ReadWholeFile(path);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() < kStateHeaderBytes) {
    return absl::DataLossError(absl::StrFormat("%s is not a drt session file", path));
  }
  uint64_t body = 0;
  std::memcpy(&body, bytes->data() + 16, sizeof body);
  const uint64_t record_bytes =
      body <= bytes->size() - kStateHeaderBytes ? kStateHeaderBytes + body : bytes->size();
  auto record = DecodeSessionRecord(std::string_view(*bytes).substr(0, record_bytes), path);
  if (!record.ok()) return record.status();
  if (record->segments.size() != 1 || record->segments[0].log != kInlineChunks) {
    return absl::DataLossError(absl::StrFormat(
        "%s is a state directory's session file, not a SaveSession file", path));
  }
  const int64_t chunks = record->segments[0].chunks;
  const size_t payload_bytes = ChunkPayloadBytes(backend.config());
  const size_t record_size = kChunkRecordHeaderBytes + payload_bytes;
  const std::string_view tail = std::string_view(*bytes).substr(record_bytes);
  if (tail.size() != static_cast<uint64_t>(chunks) * record_size) {
    return absl::DataLossError(absl::StrFormat(
        "%s is truncated or padded: it names %d chunks of %d bytes but holds %d bytes after its "
        "state (or the chunks are another model's)",
        path, chunks, record_size, tail.size()));
  }
  auto state = DecodeSessionState(record->state, backend.config());
  if (!state.ok()) {
    return absl::Status(state.status().code(),
                        absl::StrFormat("%s: %s", path, state.status().message()));
  }
  auto session = Session::Restore(backend, *state, [&](int64_t c, ChunkData& out) -> absl::Status {
    const std::string_view rec = tail.substr(c * record_size, record_size);
    uint32_t length = 0, crc = 0;
    std::memcpy(&length, rec.data(), 4);
    std::memcpy(&crc, rec.data() + 4, 4);
    const std::string_view payload = rec.substr(kChunkRecordHeaderBytes);
    std::string one;
    AppendChunkRecord(payload, one);
    uint32_t want = 0;
    std::memcpy(&want, one.data() + 4, 4);
    if (length != payload_bytes || crc != want) {
      return absl::DataLossError(
          absl::StrFormat("%s: chunk record %d is damaged (bad length or CRC-32C)", path, c));
    }
    return DecodeChunk(payload, backend.config(), out);
  });
  if (!session.ok()) {
    return absl::Status(session.status().code(),
                        absl::StrFormat("%s: %s", path, session.status().message()));
  }
  return LoadedSession{record->id, record->settings, *std::move(session)};
}

}  // namespace drt::server
