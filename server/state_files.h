// The files of a durable state directory (docs/state_format.md): the
// small-state file of a session (replaced atomically), chunk logs
// (append-only records with CRC-32C) and the file primitives they need.
// server/state_store.h decides which files exist; this file only reads and
// writes them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "server/session_manager.h"

namespace drt::server {

// Version of chunk logs, and of the directory (FORMAT) until a version-3
// session record is written into it; a file with a larger one is refused by
// name, and so is one of version 1 (kStateFormatVersion1Refusal).
// 2: a chunk record holds the chunk's landmark and encoder rows
// (engine/session_state.h, ChunkData); 1 held its landmark and GCA K/V.
inline constexpr uint32_t kStateFormatVersion = 2;
// FORMAT of a directory a version-3 session record was written into (the
// store raises it from 2 before that record's first write and never lowers
// it): a server that reads only version-2 records then refuses the whole
// directory by name and changes nothing, rather than quarantining that
// record and deleting the chunk logs it alone still names (a fork whose
// parent was deleted). The layout and the chunk logs are those of version
// 2. Likewise FORMAT 4 for a version-4 record (kStateDirFormatWithRecord4).
inline constexpr uint32_t kStateDirFormatWithRecord3 = 3;
inline constexpr uint32_t kStateDirFormatWithRecord4 = 4;
// The newest FORMAT this server reads (directories of version 2 to it).
inline constexpr uint32_t kNewestStateDirFormat = kStateDirFormatWithRecord4;
// Version of a session record (the small-state file and the head of a
// SaveSession file), which may be newer than the directory's: 3 adds the
// session's min_p, penalties and logit_bias defaults; 4 adds
// SessionSettings::appended_since_generate. A record is written in the
// lowest version that holds it (SessionRecordVersionFor): one whose
// defaults leave all of version 3's fields off and whose
// appended_since_generate is true (what a version-2 or -3 record reads back
// as) is written as version 2, byte for byte what a version-2 server writes,
// so that such a server still reads it (docs/state_format.md, "Versions");
// versions 2 to 4 are read, a larger version is refused by name, and so is
// version 1.
inline constexpr uint32_t kSessionRecordVersion = 4;
// The directory format a record of `record_version` needs (2 for a
// version-2 record, else the record's version): FORMAT is raised to it
// before the record's first write.
inline uint32_t DirFormatForRecordVersion(uint32_t record_version) {
  return record_version < 3 ? kStateFormatVersion : record_version;
}
// Why a version-1 file or directory cannot be read, after its path: its
// chunks hold K/V, and the encoder rows they were made from cannot be had
// back from them (K = C W_k^T keeps only what W_k passes).
inline constexpr char kStateFormatVersion1Refusal[] =
    "has format version 1, whose chunk records hold GCA keys and values; version 2 stores "
    "each chunk's encoder output rows instead, and keys and values cannot be converted back "
    "to encoder rows: re-ingest the context (send its tokens to a new session) with this "
    "server, or read the file with the drt-server that wrote it";

// Writes a file atomically, in pieces: the bytes go to a temporary file of
// a unique name in the same directory (".<name>.tmp-XXXXXX", made by
// mkstemp: a leading dot, which no session file name or state file has, so
// it never is another file, and two writers of one path never share one),
// which Commit fsyncs, renames over the path and follows with an fsync of the
// directory: after a crash the path holds either the old or the new bytes.
// Destroyed without a successful Commit, it deletes the temporary file.
// Append writes through (a piece at a time): a large file is never held in
// memory whole.
class AtomicFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Create(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  absl::Status Append(std::string_view bytes);
  // Fsyncs and closes the temporary file: what Commit does before its
  // rename, done apart so that a caller can publish (Commit) under a short
  // lock and the slow fsync outside it. Commit calls it when not called.
  absl::Status Sync();
  absl::Status Commit();
  int64_t bytes_written() const { return written_; }
  const std::string& temp_path() const { return temp_; }

 private:
  AtomicFileWriter(std::string path, std::string temp, int fd);
  std::string path_, temp_;
  int fd_;
  int64_t written_ = 0;
  bool synced_ = false;
  bool committed_ = false;
};
// Whether a directory entry is a temporary file of AtomicFileWriter (or of
// the servers before it, "<name>.tmp"): what a write interrupted by a crash
// leaves behind.
bool IsTemporaryFileName(std::string_view name);

// AtomicFileWriter with all of `bytes` at once.
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);
absl::Status FsyncDir(const std::string& dir);
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// A run of chunks of one chunk log: its first `chunks` records.
struct ChunkSegment {
  std::string log;  // file name under DIR/chunks/, without ".log"
  int64_t chunks = 0;
};

// The small-state file of one session ("DIR/sessions/<id>.state").
struct SessionRecord {
  std::string id;
  SessionSettings settings;
  // The session's closed chunks, in order: those of a fork's ancestors
  // first, its own log last (docs/state_format.md, "Forks").
  std::vector<ChunkSegment> segments;
  std::string state;  // drt::EncodeSessionState
};
// Version SessionRecordVersionFor(record.settings).
std::string EncodeSessionRecord(const SessionRecord& record);
// 4 when appended_since_generate is false; else 3 when min_p, a penalty or
// logit_bias is set; else 2.
uint32_t SessionRecordVersionFor(const SessionSettings& settings);
// `path` is named in errors. Refuses a foreign file and a newer version; a
// version-2 record gives settings with min_p, the penalties and logit_bias
// off; a version-2 or -3 record gives appended_since_generate true (so an
// unset pad_to_chunk_boundary pads as the server that wrote it did).
// Sampling defaults outside what CreateSession accepts
// (ValidateSamplingParams) and a max_context_tokens or idle_ttl_seconds
// below 1 (a server writes the resolved limits) are DATA_LOSS, as any other
// damage.
absl::StatusOr<SessionRecord> DecodeSessionRecord(std::string_view bytes, const std::string& path);
// Whether `bytes` start with a DRTSTATE header whose version is larger than
// this server reads (kSessionRecordVersion): a record of a newer server,
// whose chunk segments this server cannot know.
bool IsNewerSessionRecord(std::string_view bytes);
// The checks of a decoded record that need the model: its logit_bias ids
// (ValidateLogitBiasIds: inside the vocabulary, neither the landmark nor
// the pad id), which CreateSession checks. DATA_LOSS "<path> is corrupt:
// ..." otherwise, as any other damage of the record (a CRC-valid record
// that this server did not write for this model).
absl::Status CheckSessionRecordForModel(const SessionRecord& record, const ModelConfig& config,
                                        const std::string& path);
// An encoded record is this fixed header (magic, u32 version, u32 CRC-32C of
// the body, u64 body length), then the body. A reader that reads a record
// from a larger file (a session file: the record, then chunk records) reads
// the header first and asks it for the body's length.
inline constexpr size_t kSessionRecordHeaderBytes = 8 + 4 + 4 + 8;
// The body length `header` (at least kSessionRecordHeaderBytes) announces;
// nothing else is checked here (DecodeSessionRecord checks it all).
uint64_t SessionRecordBodyBytes(std::string_view header);

// An error for the failed system call (errno) `what` on `path`, both named:
// RESOURCE_EXHAUSTED for a full disk or quota, NOT_FOUND for a missing
// file, PERMISSION_DENIED for access and read-only file systems, INTERNAL
// otherwise. Reads errno first.
absl::Status ErrnoStatus(const char* what, const std::string& path);

// Writes all of `bytes` to `fd`, again after a short write (whose errno is
// stale: the next write reports why, e.g. ENOSPC or EFBIG) or EINTR; a
// failure is ErrnoStatus(what, path).
absl::Status WriteAll(int fd, std::string_view bytes, const char* what, const std::string& path);

// Chunk logs: a 16-byte header, then one record per chunk.
inline constexpr size_t kChunkLogHeaderBytes = 16;
inline constexpr size_t kChunkRecordHeaderBytes = 8;  // u32 length, u32 crc32c
std::string ChunkLogHeader(size_t payload_bytes);
// Appends one record (header + payload) to `out`.
void AppendChunkRecord(std::string_view payload, std::string& out);
inline uint64_t ChunkRecordOffset(int64_t index, size_t payload_bytes) {
  return kChunkLogHeaderBytes + static_cast<uint64_t>(index) * (kChunkRecordHeaderBytes + payload_bytes);
}

// What a chunk log holds: its whole, checksummed records from the start;
// anything after them (a torn or damaged tail) is not counted.
struct ChunkLogScan {
  int64_t whole_records = 0;
  uint64_t file_bytes = 0;
  std::string tail_problem;  // empty when the file ends after a whole record
};
// Reads and checks every record. FAILED_PRECONDITION / DATA_LOSS naming the
// path for a missing file, a foreign header, a newer version or records of
// another size than `payload_bytes`.
// `on_read`, when set, is called with the bytes of each piece read (the
// header, then up to 64 records at a time): the restore's progress.
absl::StatusOr<ChunkLogScan> ScanChunkLog(const std::string& path, size_t payload_bytes,
                                          const std::function<void(uint64_t bytes)>& on_read = {});
// Reads record `index` (checked again) from an open file.
absl::Status ReadChunkRecord(int fd, const std::string& path, int64_t index, size_t payload_bytes,
                             std::string& payload);
// Reads the chunk record at byte `offset` of an open file (record `index`,
// named in errors) and checks its length and CRC-32C.
absl::Status ReadChunkRecordAt(int fd, const std::string& path, uint64_t offset, int64_t index,
                               size_t payload_bytes, std::string& payload);
// Reads exactly `size` bytes at `offset`; DATA_LOSS naming the path when the
// file ends before.
absl::Status ReadExactlyAt(int fd, const std::string& path, char* out, size_t size,
                           uint64_t offset);

}  // namespace drt::server
