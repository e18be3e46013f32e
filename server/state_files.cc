#include "server/state_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "engine/byte_codec.h"
#include "engine/crc32c.h"
#include "engine/sampler.h"

namespace drt::server {
namespace {

constexpr char kStateMagic[8] = {'D', 'R', 'T', 'S', 'T', 'A', 'T', 'E'};
constexpr char kChunkLogMagic[8] = {'D', 'R', 'T', 'C', 'H', 'L', 'O', 'G'};
constexpr size_t kStateHeaderBytes = kSessionRecordHeaderBytes;
constexpr size_t kBodyLengthOffset = 8 + 4 + 4;  // after magic, version, crc32c

absl::Status Errno(const char* what, const std::string& path) { return ErrnoStatus(what, path); }

// `newest`: kStateFormatVersion for chunk logs, kSessionRecordVersion for
// session records; versions 2 up to it are read.
absl::Status CheckVersion(uint32_t version, uint32_t newest, const std::string& path) {
  if (version == 1) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s %s", path, kStateFormatVersion1Refusal));
  }
  if (version == 0 || version > newest) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s has format version %d; this server reads %s (written by a newer drt-server?)", path,
        version,
        newest == 2 ? std::string("version 2") : absl::StrFormat("versions 2 to %d", newest)));
  }
  return absl::OkStatus();
}

// The defaults a version-3 record adds after seed: f32 min_p, f32
// presence_penalty, f32 frequency_penalty, i64 count, then count (i32 id,
// f32 bias) pairs in ascending id order (std::map's order).
void PutLaterSampling(const SamplingParams& p, ByteWriter& w) {
  w.Put(p.min_p);
  w.Put(p.presence_penalty);
  w.Put(p.frequency_penalty);
  w.I64(static_cast<int64_t>(p.logit_bias.size()));
  for (const auto& [id, bias] : p.logit_bias) {
    w.Put(id);
    w.Put(bias);
  }
}

absl::Status GetLaterSampling(ByteReader& r, SamplingParams& p) {
  absl::Status s = r.Get(p.min_p, "min_p");
  if (s.ok()) s = r.Get(p.presence_penalty, "presence_penalty");
  if (s.ok()) s = r.Get(p.frequency_penalty, "frequency_penalty");
  int64_t count = 0;
  if (s.ok()) s = r.I64(count, "logit_bias count");
  if (s.ok() && (count < 0 || count > kMaxLogitBiasEntries)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("logit_bias count %d, not in [0, %d]", count, kMaxLogitBiasEntries));
  }
  for (int64_t i = 0; s.ok() && i < count; ++i) {
    int32_t id = 0;
    float bias = 0.f;
    s = r.Get(id, "logit_bias id");
    if (s.ok()) s = r.Get(bias, "logit_bias bias");
    if (s.ok() && !p.logit_bias.empty() && id <= p.logit_bias.rbegin()->first) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "logit_bias ids not in ascending order (%d after %d)", id, p.logit_bias.rbegin()->first));
    }
    if (s.ok()) p.logit_bias.emplace(id, bias);
  }
  return s;
}

}  // namespace

absl::Status WriteAll(int fd, std::string_view bytes, const char* what, const std::string& path) {
  const char* data = bytes.data();
  size_t size = bytes.size();
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(what, path);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ErrnoStatus(const char* what, const std::string& path) {
  const int e = errno;
  const std::string text = absl::StrFormat("%s %s: %s", what, path, std::strerror(e));
  if (e == ENOSPC || e == EDQUOT) return absl::ResourceExhaustedError(text);
  if (e == ENOENT) return absl::NotFoundError(text);
  if (e == EACCES || e == EPERM || e == EROFS) return absl::PermissionDeniedError(text);
  return absl::InternalError(text);
}

uint64_t SessionRecordBodyBytes(std::string_view header) {
  uint64_t body = 0;
  std::memcpy(&body, header.data() + kBodyLengthOffset, sizeof body);
  return body;
}

absl::Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open directory", dir);
  const int rc = ::fsync(fd);
  absl::Status s = rc == 0 ? absl::OkStatus() : Errno("cannot fsync directory", dir);
  ::close(fd);
  return s;
}

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(const std::string& path) {
  const std::filesystem::path p(path);
  std::string temp = (p.parent_path() / ("." + p.filename().string() + ".tmp-XXXXXX")).string();
  const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) return Errno("cannot create a temporary file for", path);
  if (::fchmod(fd, 0644) != 0) {
    absl::Status s = Errno("cannot set the mode of", temp);
    ::close(fd);
    ::unlink(temp.c_str());
    return s;
  }
  return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(path, std::move(temp), fd));
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string temp, int fd)
    : path_(std::move(path)), temp_(std::move(temp)), fd_(fd) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

absl::Status AtomicFileWriter::Append(std::string_view bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrFormat("%s is closed", temp_));
  if (absl::Status s = WriteAll(fd_, bytes, "cannot write", temp_); !s.ok()) return s;
  written_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Sync() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrFormat("%s is closed", temp_));
  absl::Status s;
  if (::fdatasync(fd_) != 0) s = Errno("cannot fsync", temp_);
  if (::close(fd_) != 0 && s.ok()) s = Errno("cannot close", temp_);
  fd_ = -1;
  synced_ = s.ok();
  return s;  // on failure the destructor deletes the temporary file
}

absl::Status AtomicFileWriter::Commit() {
  if (!synced_) {
    if (absl::Status s = Sync(); !s.ok()) return s;
  }
  if (committed_) return absl::FailedPreconditionError(absl::StrFormat("%s is committed", path_));
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    return Errno("cannot rename over", path_);  // the destructor deletes the temporary file
  }
  committed_ = true;
  return FsyncDir(std::filesystem::path(path_).parent_path().string());
}

bool IsTemporaryFileName(std::string_view name) {
  if (name.size() >= 4 && name.substr(name.size() - 4) == ".tmp") return true;
  return !name.empty() && name[0] == '.' && name.find(".tmp-") != std::string_view::npos;
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  auto writer = AtomicFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = (*writer)->Append(bytes); !s.ok()) return s;
  return (*writer)->Commit();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  std::string out;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = Errno("cannot read", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buffer, n);
  }
  ::close(fd);
  return out;
}

bool IsNewerSessionRecord(std::string_view bytes) {
  if (bytes.size() < kStateHeaderBytes || std::memcmp(bytes.data(), kStateMagic, 8) != 0) {
    return false;
  }
  ByteReader h(bytes.substr(8, 4));
  uint32_t version = 0;
  return h.Get(version, "version").ok() && version > kSessionRecordVersion;
}

absl::Status CheckSessionRecordForModel(const SessionRecord& record, const ModelConfig& config,
                                        const std::string& path) {
  absl::Status s = ValidateLogitBiasIds(record.settings.sampling, config.vocab_size,
                                        config.chunk_id, config.pad_id);
  if (s.ok()) return s;
  return absl::DataLossError(absl::StrFormat("%s is corrupt: %s", path, s.message()));
}

uint32_t SessionRecordVersionFor(const SessionSettings& settings) {
  if (!settings.appended_since_generate) return 4;
  const SamplingParams& p = settings.sampling;
  const bool later_off = p.min_p == 0.f && p.presence_penalty == 0.f &&
                         p.frequency_penalty == 0.f && p.logit_bias.empty();
  return later_off ? 2 : 3;
}

std::string EncodeSessionRecord(const SessionRecord& record) {
  const uint32_t version = SessionRecordVersionFor(record.settings);
  std::string body;
  ByteWriter w(body);
  w.Str(record.id);
  w.Put(record.settings.sampling.temperature);
  w.Put(record.settings.sampling.top_k);
  w.Put(record.settings.sampling.top_p);
  w.Put(record.settings.sampling.seed);
  if (version >= 3) PutLaterSampling(record.settings.sampling, w);
  w.I64(record.settings.max_context_tokens);
  w.I64(record.settings.idle_ttl_seconds);
  if (version >= 4) w.Put<uint8_t>(record.settings.appended_since_generate ? 1 : 0);
  w.I64(static_cast<int64_t>(record.segments.size()));
  for (const ChunkSegment& s : record.segments) {
    w.Str(s.log);
    w.I64(s.chunks);
  }
  w.Str(record.state);
  std::string out;
  ByteWriter h(out);
  h.Raw(kStateMagic, sizeof kStateMagic);
  h.Put<uint32_t>(version);
  h.Put<uint32_t>(Crc32c(body.data(), body.size()));
  h.Put<uint64_t>(body.size());
  out += body;
  return out;
}

absl::StatusOr<SessionRecord> DecodeSessionRecord(std::string_view bytes, const std::string& path) {
  // (`bytes` may be only the header a reader read first, not the file: the
  // message names what was checked, not a file size.)
  if (bytes.size() < kStateHeaderBytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s is not a drt session state file (it ends after %d bytes, before the %d-byte "
        "DRTSTATE header does)",
        path, bytes.size(), kStateHeaderBytes));
  }
  if (std::memcmp(bytes.data(), kStateMagic, 8) != 0) {
    return absl::DataLossError(absl::StrFormat(
        "%s is not a drt session state file (its first %d bytes are not a DRTSTATE header)",
        path, kStateHeaderBytes));
  }
  ByteReader h(bytes.substr(8));
  uint32_t version = 0, crc = 0;
  uint64_t length = 0;
  h.Get(version, "version").IgnoreError();
  h.Get(crc, "crc").IgnoreError();
  h.Get(length, "length").IgnoreError();
  if (absl::Status s = CheckVersion(version, kSessionRecordVersion, path); !s.ok()) return s;
  const std::string_view body = bytes.substr(kStateHeaderBytes);
  if (body.size() != length) {
    return absl::DataLossError(absl::StrFormat(
        "%s is truncated or padded: its header announces %d bytes of state, the file holds %d",
        path, length, body.size()));
  }
  if (Crc32c(body.data(), body.size()) != crc) {
    return absl::DataLossError(absl::StrFormat("%s is corrupt: its CRC-32C does not match", path));
  }
  SessionRecord record;
  ByteReader r(body);
  int64_t segments = 0;
  absl::Status s = r.Str(record.id, "id");
  if (s.ok()) s = r.Get(record.settings.sampling.temperature, "temperature");
  if (s.ok()) s = r.Get(record.settings.sampling.top_k, "top_k");
  if (s.ok()) s = r.Get(record.settings.sampling.top_p, "top_p");
  if (s.ok()) s = r.Get(record.settings.sampling.seed, "seed");
  if (s.ok() && version >= 3) s = GetLaterSampling(r, record.settings.sampling);
  if (s.ok()) s = r.I64(record.settings.max_context_tokens, "max_context_tokens");
  if (s.ok()) s = r.I64(record.settings.idle_ttl_seconds, "idle_ttl_seconds");
  // A server writes a session's resolved limits, at least 1 each (0 in
  // CreateSession means the server's; the flags are at least 1). Below
  // that the record is not one it wrote: read as a limit of 1, the session
  // expired within a second and its files were deleted, or refused every
  // token (review-durable F3).
  if (s.ok() && record.settings.max_context_tokens < 1) {
    s = absl::InvalidArgumentError(absl::StrFormat(
        "max_context_tokens %d is below 1 (a server writes the session's resolved limit)",
        record.settings.max_context_tokens));
  }
  if (s.ok() && record.settings.idle_ttl_seconds < 1) {
    s = absl::InvalidArgumentError(absl::StrFormat(
        "idle_ttl_seconds %d is below 1 (a server writes the session's resolved TTL)",
        record.settings.idle_ttl_seconds));
  }
  if (s.ok() && version >= 4) {
    uint8_t appended = 0;
    s = r.Get(appended, "appended_since_generate");
    if (s.ok() && appended > 1) {
      s = absl::InvalidArgumentError(
          absl::StrFormat("appended_since_generate is %d, not 0 or 1", appended));
    }
    record.settings.appended_since_generate = appended == 1;
  }
  if (s.ok()) s = r.I64(segments, "segment count");
  if (s.ok() && (segments < 1 || segments > 1 << 20)) {
    s = absl::InvalidArgumentError(absl::StrFormat("%d chunk segments", segments));
  }
  for (int64_t i = 0; s.ok() && i < segments; ++i) {
    ChunkSegment seg;
    s = r.Str(seg.log, "segment log");
    // The name is joined into a path (DIR/chunks/<log>.log): a plain name,
    // as the server makes them (a session id, or a session file's
    // "(inline)"), never one that leaves DIR (review-durable F5).
    if (s.ok() && (seg.log.empty() || seg.log.size() > 128 || seg.log[0] == '.' ||
                   seg.log.find_first_of(std::string_view("/\0", 2)) != std::string::npos)) {
      s = absl::InvalidArgumentError(absl::StrFormat(
          "chunk log name \"%s\" is not a plain file name (1-128 bytes, no '/', no leading '.')",
          absl::CHexEscape(seg.log)));
    }
    if (s.ok()) s = r.I64(seg.chunks, "segment chunks");
    if (s.ok() && seg.chunks < 0) s = absl::InvalidArgumentError("negative segment length");
    record.segments.push_back(std::move(seg));
  }
  if (s.ok()) s = r.Str(record.state, "state");
  if (s.ok() && r.remaining() != 0) s = absl::InvalidArgumentError("trailing bytes");
  // What CreateSession would refuse cannot be a session's default (a
  // CRC-valid record written by something else than this server).
  if (s.ok()) s = ValidateSamplingParams(record.settings.sampling);
  if (!s.ok()) {
    return absl::DataLossError(absl::StrFormat("%s is corrupt: %s", path, s.message()));
  }
  return record;
}

std::string ChunkLogHeader(size_t payload_bytes) {
  std::string out;
  ByteWriter w(out);
  w.Raw(kChunkLogMagic, sizeof kChunkLogMagic);
  w.Put<uint32_t>(kStateFormatVersion);
  w.Put<uint32_t>(static_cast<uint32_t>(payload_bytes));
  return out;
}

void AppendChunkRecord(std::string_view payload, std::string& out) {
  ByteWriter w(out);
  w.Put<uint32_t>(static_cast<uint32_t>(payload.size()));
  w.Put<uint32_t>(Crc32c(payload.data(), payload.size()));
  w.Raw(payload.data(), payload.size());
}

namespace {

// Reads up to `size` bytes at `offset`; fewer only at the end of the file.
absl::StatusOr<size_t> ReadAt(int fd, const std::string& path, char* out, size_t size,
                              uint64_t offset) {
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::pread(fd, out + got, size - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read", path);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  return got;
}

}  // namespace

absl::StatusOr<ChunkLogScan> ScanChunkLog(const std::string& path, size_t payload_bytes,
                                          const std::function<void(uint64_t bytes)>& on_read) {
  // Read in pieces of whole records: a log of a long context is larger than
  // memory (the disk tier).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Errno("cannot stat", path);
  ChunkLogScan scan;
  scan.file_bytes = static_cast<uint64_t>(st.st_size);
  char header[kChunkLogHeaderBytes];
  auto got = ReadAt(fd, path, header, sizeof header, 0);
  if (!got.ok()) return got.status();
  if (on_read) on_read(*got);
  if (*got < kChunkLogHeaderBytes || std::memcmp(header, kChunkLogMagic, 8) != 0) {
    return absl::DataLossError(
        absl::StrFormat("%s is not a drt chunk log (no DRTCHLOG header)", path));
  }
  ByteReader h(std::string_view(header, sizeof header).substr(8, 8));
  uint32_t version = 0, size = 0;
  h.Get(version, "version").IgnoreError();
  h.Get(size, "payload size").IgnoreError();
  if (absl::Status s = CheckVersion(version, kStateFormatVersion, path); !s.ok()) return s;
  if (size != payload_bytes) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s holds chunks of %d bytes; this model's chunks take %d", path, size, payload_bytes));
  }
  const size_t record = kChunkRecordHeaderBytes + payload_bytes;
  constexpr size_t kRecordsPerRead = 64;
  std::string buffer(kRecordsPerRead * record, '\0');
  for (uint64_t at = kChunkLogHeaderBytes; at < scan.file_bytes;) {
    const size_t want =
        static_cast<size_t>(std::min<uint64_t>(buffer.size(), scan.file_bytes - at));
    auto read = ReadAt(fd, path, buffer.data(), want, at);
    if (!read.ok()) return read.status();
    if (on_read) on_read(*read);
    size_t used = 0;
    for (; used + record <= *read; used += record, at += record) {
      uint32_t length = 0, crc = 0;
      std::memcpy(&length, buffer.data() + used, 4);
      std::memcpy(&crc, buffer.data() + used + 4, 4);
      if (length != payload_bytes || Crc32c(buffer.data() + used + 8, payload_bytes) != crc) {
        scan.tail_problem =
            absl::StrFormat("a damaged record (bad length or CRC-32C) at offset %d", at);
        return scan;
      }
      ++scan.whole_records;
    }
    if (*read < want || used < *read) {  // what is left is less than a record
      scan.tail_problem = absl::StrFormat("a torn record of %d bytes at offset %d",
                                          scan.file_bytes - at, at);
      return scan;
    }
  }
  return scan;
}

absl::Status ReadExactlyAt(int fd, const std::string& path, char* out, size_t size,
                           uint64_t offset) {
  auto got = ReadAt(fd, path, out, size, offset);
  if (!got.ok()) return got.status();
  if (*got < size) {
    return absl::DataLossError(absl::StrFormat("%s ends at byte %d, inside what it announces",
                                               path, offset + *got));
  }
  return absl::OkStatus();
}

absl::Status ReadChunkRecordAt(int fd, const std::string& path, uint64_t offset, int64_t index,
                               size_t payload_bytes, std::string& payload) {
  const size_t record = kChunkRecordHeaderBytes + payload_bytes;
  std::string bytes(record, '\0');
  auto got = ReadAt(fd, path, bytes.data(), record, offset);
  if (!got.ok()) return got.status();
  if (*got < record) {
    return absl::DataLossError(absl::StrFormat("%s ends inside chunk record %d", path, index));
  }
  uint32_t length = 0, crc = 0;
  std::memcpy(&length, bytes.data(), 4);
  std::memcpy(&crc, bytes.data() + 4, 4);
  if (length != payload_bytes || Crc32c(bytes.data() + 8, payload_bytes) != crc) {
    return absl::DataLossError(
        absl::StrFormat("%s: chunk record %d is damaged (bad length or CRC-32C)", path, index));
  }
  payload.assign(bytes, 8, payload_bytes);
  return absl::OkStatus();
}

absl::Status ReadChunkRecord(int fd, const std::string& path, int64_t index, size_t payload_bytes,
                             std::string& payload) {
  return ReadChunkRecordAt(fd, path, ChunkRecordOffset(index, payload_bytes), index,
                           payload_bytes, payload);
}

}  // namespace drt::server
