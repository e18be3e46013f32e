#include "server/session_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/session_state.h"
#include "server/state_files.h"

namespace drt::server {
namespace {

// A session file is a small-state file (state_files.h) whose one segment is
// named kInlineChunks, followed by that many chunk records.
constexpr char kInlineChunks[] = "(inline)";
constexpr size_t kStateHeaderBytes = kSessionRecordHeaderBytes;

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
  absl::StatusOr<std::string> encoded = EncodeSessionState(*state, session.config());
  if (!encoded.ok()) return encoded.status();
  record.state = *std::move(encoded);
  auto file = AtomicFileWriter::Create(path);
  if (!file.ok()) return file.status();
  AtomicFileWriter& writer = **file;
  if (absl::Status s = writer.Append(EncodeSessionRecord(record)); !s.ok()) return s;
  ChunkData chunk;
  std::string payload, one_record;
  for (int64_t c = 0; c < session.num_chunks(); ++c) {
    if (absl::Status s = session.backend_session().ReadChunk(c, chunk); !s.ok()) return s;
    payload.clear();
    EncodeChunk(chunk, payload);
    one_record.clear();
    AppendChunkRecord(payload, one_record);
    if (absl::Status s = writer.Append(one_record); !s.ok()) return s;
  }
  const int64_t bytes = writer.bytes_written();
  if (absl::Status s = writer.Commit(); !s.ok()) return s;
  return bytes;
}

absl::StatusOr<LoadedSession> LoadSessionFile(
    const std::string& path, Backend& backend,
    absl::FunctionRef<absl::Status(int64_t chunks)> admit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::string text = absl::StrFormat("cannot open %s: %s", path, std::strerror(e));
    if (e == ENOENT) return absl::NotFoundError(text);
    if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(text);
    return absl::InternalError(text);
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrFormat("cannot stat %s: %s", path, std::strerror(errno)));
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kStateHeaderBytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s is not a drt session file (it has %d bytes, less than the %d-byte DRTSTATE header)",
        path, file_bytes, kStateHeaderBytes));
  }
  // The header announces the small state's length; it is read whole (a
  // few KiB to MiB: the state, not the chunks).
  char header[kStateHeaderBytes];
  if (absl::Status s = ReadExactlyAt(fd, path, header, sizeof header, 0); !s.ok()) return s;
  const uint64_t body = SessionRecordBodyBytes(std::string_view(header, sizeof header));
  // A state longer than the file: only the header is passed on, whose
  // decoding names the problem (not a session file, a foreign version, or
  // truncated), without reading the rest of a possibly large file.
  const uint64_t record_bytes =
      body <= file_bytes - kStateHeaderBytes ? kStateHeaderBytes + body : kStateHeaderBytes;
  std::string record_text(record_bytes, '\0');
  if (absl::Status s = ReadExactlyAt(fd, path, record_text.data(), record_bytes, 0); !s.ok()) {
    return s;
  }
  auto record = DecodeSessionRecord(record_text, path);
  if (!record.ok()) return record.status();
  record_text = std::string();
  if (record->segments.size() != 1 || record->segments[0].log != kInlineChunks) {
    return absl::DataLossError(absl::StrFormat(
        "%s is a state directory's session file, not a SaveSession file", path));
  }
  // Another model's file, before anything this model's sizes decide: its
  // chunk records have that model's size, so the size check below would
  // call a whole file "truncated or padded" (review-durable F4), and its
  // logit_bias ids are that model's (review-userfix U2).
  if (std::optional<StateModelMismatch> other =
          FindStateModelMismatch(record->state, backend.config())) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s was saved by a server of another model: %s; load it into a server of the model "
        "that saved it",
        path, DescribeStateModelMismatch(*other)));
  }
  // Before the session is made: its logit_bias ids against this model.
  if (absl::Status s = CheckSessionRecordForModel(*record, backend.config(), path); !s.ok()) {
    return s;
  }
  const int64_t chunks = record->segments[0].chunks;
  const size_t payload_bytes = ChunkPayloadBytes(backend.config());
  const uint64_t record_size = kChunkRecordHeaderBytes + payload_bytes;
  const uint64_t tail = file_bytes - record_bytes;
  if (tail % record_size != 0 || tail / record_size != static_cast<uint64_t>(chunks)) {
    return absl::DataLossError(absl::StrFormat(
        "%s is truncated or padded: it names %d chunks of %d bytes but holds %d bytes after its "
        "state",
        path, chunks, record_size, tail));
  }
  auto state = DecodeSessionState(record->state, backend.config());
  if (!state.ok()) {
    return absl::Status(state.status().code(),
                        absl::StrFormat("%s: %s", path, state.status().message()));
  }
  // The state's own count of closed chunks must be the records' (a file
  // whose CRC-valid record says otherwise was not written by SaveSession).
  if (ClosedChunks(*state, backend.config()) != chunks) {
    return absl::DataLossError(absl::StrFormat(
        "%s: the state has %d closed chunks but the file holds %d chunk records", path,
        ClosedChunks(*state, backend.config()), chunks));
  }
  if (absl::Status s = admit(chunks); !s.ok()) return s;
  std::string payload;
  auto session = Session::Restore(backend, *state, [&](int64_t c, ChunkData& out) -> absl::Status {
    if (c < 0 || c >= chunks) {
      return absl::DataLossError(absl::StrFormat("%s has no chunk record %d", path, c));
    }
    const uint64_t offset = record_bytes + static_cast<uint64_t>(c) * record_size;
    if (absl::Status s = ReadChunkRecordAt(fd, path, offset, c, payload_bytes, payload); !s.ok()) {
      return s;
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
