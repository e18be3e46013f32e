#include "server/state_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "engine/session_state.h"
#include "server/chunk_log_mapping.h"
#include "server/restore_mapped.h"

namespace drt::server {
namespace fs = std::filesystem;
namespace {

constexpr char kFormatLine[] = "drt-state-dir";
constexpr char kStateSuffix[] = ".state";
constexpr char kLogSuffix[] = ".log";

absl::Status Errno(const char* what, const std::string& path) { return ErrnoStatus(what, path); }

// Deletes `path`: one gone already is fine, any other failure is logged
// (and the removal it belongs to goes on).
void UnlinkOrLog(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    std::fprintf(stderr, "drt-server: cannot delete %s: %s\n", path.c_str(), std::strerror(errno));
  }
}

absl::Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return absl::OkStatus();
  return Errno("cannot create directory", path);
}

// Writes and fsyncs a small probe file, so that an unwritable or full
// directory is found at start-up rather than at the first step.
absl::Status ProbeWritable(const std::string& dir) {
  const std::string path = dir + "/.probe";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot write in the state directory:", path);
  const std::string block(4096, '\0');
  absl::Status s = WriteAll(fd, block, "cannot write in the state directory:", path);
  if (s.ok() && ::fsync(fd) != 0) {
    s = Errno("cannot fsync in the state directory:", path);
  }
  ::close(fd);
  ::unlink(path.c_str());
  return s;
}

// A directory without FORMAT must be empty (but for what an interrupted
// first start leaves): anything else is not ours, and nothing is written in it.
absl::Status CheckForeign(const std::string& dir) {
  if (fs::exists(dir + "/FORMAT")) return absl::OkStatus();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // (".FORMAT.tmp-XXXXXX": the FORMAT write of an interrupted first start.)
    if (name != "LOCK" && name != ".probe" && !absl::StartsWith(name, ".FORMAT.tmp-")) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s is not empty and has no FORMAT file: it is not a drt state directory (found %s); "
          "give an empty or new directory",
          dir, name));
    }
  }
  if (ec) return absl::InternalError(absl::StrFormat("cannot list %s: %s", dir, ec.message()));
  return absl::OkStatus();
}

// FORMAT's version (written as kStateFormatVersion when missing); refuses
// a foreign one, version 1 and any above `newest`, naming the path.
absl::StatusOr<uint32_t> CheckFormatFile(const std::string& dir, uint32_t newest) {
  const std::string path = dir + "/FORMAT";
  if (!fs::exists(path)) {
    absl::Status s =
        WriteFileAtomically(path, absl::StrFormat("%s %d\n", kFormatLine, kStateFormatVersion));
    if (!s.ok()) return s;
    return kStateFormatVersion;
  }
  auto text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  int version = 0;
  char word[32] = {};
  if (std::sscanf(text->c_str(), "%31s %d", word, &version) != 2 ||
      std::string(word) != kFormatLine) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s does not name a drt state directory", path));
  }
  if (version == 1) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s %s", path, kStateFormatVersion1Refusal));
  }
  if (version < 1 || version > static_cast<int>(newest)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s says format version %d; this server reads %s (written by a newer drt-server?)", path,
        version,
        newest == 2 ? std::string("version 2") : absl::StrFormat("versions 2 to %d", newest)));
  }
  return static_cast<uint32_t>(version);
}

// True when the file at `path` has another name as well (a hard link in
// DIR/quarantine/); false when it has one, or cannot be read (the caller's
// own call on it then names the problem).
bool LinkedElsewhere(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && st.st_nlink > 1;
}

int64_t SegmentChunks(const std::vector<ChunkSegment>& segments) {
  int64_t total = 0;
  for (const ChunkSegment& s : segments) total += s.chunks;
  return total;
}

}  // namespace

struct DurableRecord {
  // Held by a write (Persist, RecordFork) for its whole length and by the
  // removal. Remove never waits for it: see writers and publish.
  std::mutex mutex;
  // Held only around publishing the state file (a writer's "check
  // removing, rename, fsync the directory") and by Remove around deleting
  // it, never over a chunk fsync: so Remove deletes the state file itself
  // before it returns, waiting at most for one rename, and no write
  // publishes it after (docs/api.md, DeleteSession).
  std::mutex publish;
  // Guarded by the store's mutex_: writes begun (BeginWrite) and not ended;
  // Remove called (no write begins after it). A write that ends (EndWrite)
  // with removing set began before the Remove, which therefore found
  // writers > 0 and left the removal to the last write to end.
  int writers = 0;
  bool removing = false;
  std::vector<ChunkSegment> segments;  // the last one is the session's own log
  int fd = -1;                         // own log, opened at its first write
  bool removed = false;
  int64_t tokens_written = -1;  // num_tokens in the state file; -1: none yet
  int64_t chunks_mapped = 0;    // the disk tier: leading chunks read from the logs
  bool mapping_failed = false;  // logged once; the session keeps its chunks in memory
  std::chrono::steady_clock::time_point last_write{};
};

absl::StatusOr<StateSync> ParseStateSync(const std::string& text) {
  if (text == "step") return StateSync::kStep;
  if (text == "interval") return StateSync::kInterval;
  return absl::InvalidArgumentError(
      absl::StrFormat("--state_sync=%s: must be step or interval", text));
}

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const StateStoreOptions& options,
                                                             const ModelConfig& config) {
  if (options.dir.empty()) return absl::InvalidArgumentError("the state directory is empty");
  if (options.sync_interval_ms < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--state_sync_interval_ms=%d: must be at least 1", options.sync_interval_ms));
  }
  // The directory itself is created, not its parents: a mistyped parent
  // path is an error rather than a new tree. A new one's entry is fsynced
  // into its parent, or a power loss soon after the first start could lose
  // DIR with the sessions acknowledged in it (review-durable F10).
  const bool created = ::mkdir(options.dir.c_str(), 0755) == 0;
  if (!created) {
    if (absl::Status s = MakeDir(options.dir); !s.ok()) return s;
  } else {
    const std::string parent = fs::path(options.dir).parent_path().string();
    if (absl::Status s = FsyncDir(parent.empty() ? "." : parent); !s.ok()) return s;
  }
  if (absl::Status s = CheckForeign(options.dir); !s.ok()) return s;
  const int lock_fd = ::open((options.dir + "/LOCK").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return Errno("cannot open", options.dir + "/LOCK");
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s/LOCK is held: another drt-server uses the state directory %s", options.dir,
        options.dir));
  }
  absl::Status s = ProbeWritable(options.dir);
  uint32_t dir_format = 0;
  if (s.ok()) {
    const uint32_t newest = options.newest_dir_format_for_test > 0
                                ? options.newest_dir_format_for_test
                                : kNewestStateDirFormat;
    absl::StatusOr<uint32_t> format = CheckFormatFile(options.dir, newest);
    if (format.ok()) {
      dir_format = *format;
    } else {
      s = format.status();
    }
  }
  for (const char* sub : {"/sessions", "/chunks", "/quarantine"}) {
    if (s.ok()) s = MakeDir(options.dir + sub);
  }
  if (s.ok()) s = FsyncDir(options.dir);
  if (!s.ok()) {
    ::close(lock_fd);
    return s;
  }
  return std::unique_ptr<StateStore>(new StateStore(options, config, lock_fd, dir_format));
}

StateStore::StateStore(StateStoreOptions options, const ModelConfig& config, int lock_fd,
                       uint32_t dir_format)
    : options_(std::move(options)),
      config_(config),
      payload_bytes_(ChunkPayloadBytes(config)),
      lock_fd_(lock_fd),
      dir_format_(dir_format),
      deleter_([this](const std::string& path) { DeleteLog(path); }) {}

StateStore::~StateStore() {
  deleter_.Stop();  // its deletions finish while this process holds LOCK
  for (auto& [id, d] : sessions_) {
    if (d->fd >= 0) ::close(d->fd);
  }
  ::close(lock_fd_);
}

std::string StateStore::StatePath(const std::string& id) const {
  return options_.dir + "/sessions/" + id + kStateSuffix;
}
std::string StateStore::LogPath(const std::string& log) const {
  return options_.dir + "/chunks/" + log + kLogSuffix;
}

absl::Status StateStore::CheckRegistration(const StateRegistration& registration,
                                           const char* what) const {
  if (!registration.registered()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "StateStore::%s: the session is not registered (StateStore::Register returns the "
        "handle every write of a durable session takes)",
        what));
  }
  if (registration.store_ != this) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "StateStore::%s: session %s is registered with another state store", what,
        registration.id()));
  }
  return absl::OkStatus();
}

StateRegistration StateStore::Register(const std::string& id) {
  return StateRegistration(this, id, FindOrAdd(id, {ChunkSegment{id, 0}}));
}

int64_t StateStore::sessions_registered() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(sessions_.size());
}

int64_t StateStore::TokensWritten(const StateRegistration& registration) const {
  if (!CheckRegistration(registration, "TokensWritten").ok()) return -1;
  Durable& d = *registration.record_;
  std::lock_guard<std::mutex> lock(d.mutex);
  return d.tokens_written;
}

std::shared_ptr<StateStore::Durable> StateStore::FindOrAdd(const std::string& id,
                                                           std::vector<ChunkSegment> segments) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) return it->second;
  auto d = std::make_shared<Durable>();
  d->segments = std::move(segments);
  for (const ChunkSegment& s : d->segments) ++log_refs_[s.log];
  sessions_[id] = d;
  return d;
}

absl::Status StateStore::Persist(const StateRegistration& registration,
                                 const SessionSettings& settings, Session& session, bool force) {
  if (absl::Status s = CheckRegistration(registration, "Persist"); !s.ok()) return s;
  const std::string& id = registration.id();
  Durable* d = registration.record_.get();
  if (!BeginWrite(*d)) return absl::OkStatus();  // removed: nothing of it is written
  std::lock_guard<std::mutex> lock(d->mutex);
  WriteEnd end(*this, *d, id);
  absl::Status s = absl::OkStatus();
  const auto now = std::chrono::steady_clock::now();
  // (Not removed: RemoveLocked runs only once writers is 0 after a Remove,
  // and no write begins after one.)
  if (session.num_tokens() == d->tokens_written) {
    // nothing to write
  } else if (options_.sync == StateSync::kInterval && !force && d->tokens_written >= 0 &&
             now - d->last_write < std::chrono::milliseconds(options_.sync_interval_ms)) {
    // within the interval
  } else {
    s = PersistLocked(*d, id, settings, session);
  }
  return s;
}

bool StateStore::BeginWrite(Durable& d) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (d.removing) return false;
  ++d.writers;
  return true;
}

void StateStore::EndWriteLocked(Durable& d, const std::string& id) {
  bool remove = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // writers reaches 0 once after a Remove: no write begins after it.
    remove = --d.writers == 0 && d.removing;
  }
  // Remove deleted the state file itself (and no write published it after).
  // The logs go on the deleter's thread: this may be the engine thread,
  // whose step's other sessions would wait for the unlinks of logs of many GB.
  if (remove) deleter_.Delete(RemoveLocked(d, id, /*delete_state_file=*/false));
}

absl::Status StateStore::RaiseDirFormatForRecord(const SessionSettings& settings) {
  const uint32_t version = SessionRecordVersionFor(settings);
  const uint32_t needed = DirFormatForRecordVersion(version);
  std::lock_guard<std::mutex> lock(format_mutex_);
  if (dir_format_ >= needed) return absl::OkStatus();
  // Before any file of the session: a server that reads only older records
  // refuses DIR by its FORMAT and touches nothing, instead of refusing this
  // record alone and deleting the chunk logs that only it names (a fork of
  // a deleted parent: docs/state_format.md, "Versions").
  const std::string path = options_.dir + "/FORMAT";
  if (absl::Status s =
          WriteFileAtomically(path, absl::StrFormat("%s %d\n", kFormatLine, needed));
      !s.ok()) {
    return s;
  }
  dir_format_ = needed;
  std::fprintf(stderr,
               "drt-server: %s now says format version %d: a session record of version %d (%s) "
               "is written; drt-servers that read only records up to version %d refuse this "
               "directory from now on\n",
               path.c_str(), static_cast<int>(needed), static_cast<int>(version),
               version >= 4 ? "a session that generated since its last Append"
                            : "a session with min_p, penalties or logit_bias defaults",
               static_cast<int>(needed) - 1);
  return absl::OkStatus();
}

absl::Status StateStore::PersistLocked(Durable& d, const std::string& id,
                                       const SessionSettings& settings, Session& session) {
  if (absl::Status s = RaiseDirFormatForRecord(settings); !s.ok()) return s;
  ChunkSegment& own = d.segments.back();
  const int64_t on_disk = SegmentChunks(d.segments);
  const int64_t chunks = session.num_chunks();
  if (chunks > on_disk) {
    const std::string path = LogPath(own.log);
    if (d.fd < 0) {
      d.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (d.fd < 0) return Errno("cannot open", path);
      struct stat st {};
      if (::fstat(d.fd, &st) != 0) return Errno("cannot stat", path);
      if (st.st_size == 0) {
        const std::string header = ChunkLogHeader(payload_bytes_);
        absl::Status s = WriteAll(d.fd, header, "cannot write", path);
        if (s.ok() && ::fdatasync(d.fd) != 0) s = Errno("cannot fsync", path);
        if (!s.ok()) {
          ::close(d.fd);
          d.fd = -1;
          ::unlink(path.c_str());
          return s;
        }
        s = FsyncDir(options_.dir + "/chunks");
        if (!s.ok()) return s;
      }
    }
    // Written in batches of at most kChunksPerWrite records: the first write
    // of a loaded session, or a fork's own copy, holds the whole session
    // otherwise.
    constexpr int64_t kChunksPerWrite = 64;
    std::string records;
    ChunkData chunk;
    std::string payload;
    absl::Status s;
    for (int64_t first = on_disk; s.ok() && first < chunks; first += kChunksPerWrite) {
      const int64_t last = std::min(chunks, first + kChunksPerWrite);
      records.clear();
      for (int64_t c = first; c < last; ++c) {
        if (absl::Status r = session.backend_session().ReadChunk(c, chunk); !r.ok()) {
          s = r;
          break;
        }
        payload.clear();
        EncodeChunk(chunk, payload);
        AppendChunkRecord(payload, records);
      }
      if (s.ok()) s = WriteAll(d.fd, records, "cannot append to", path);
    }
    if (s.ok() && ::fdatasync(d.fd) != 0) s = Errno("cannot fsync", path);
    if (!s.ok()) {
      // Cut what this call wrote (a partly written record, or whole ones of
      // a batch that failed later), so that the next write starts whole.
      if (::ftruncate(d.fd, ChunkRecordOffset(own.chunks, payload_bytes_)) != 0) {
        std::fprintf(stderr, "drt-server: cannot truncate %s after a failed write: %s\n",
                     path.c_str(), std::strerror(errno));
      }
      return s;
    }
    own.chunks += chunks - on_disk;
    if (options_.chunks_written_for_test) options_.chunks_written_for_test(id);
  }
  auto state = session.ExportState();
  if (!state.ok()) return state.status();
  SessionRecord record;
  record.id = id;
  record.settings = settings;
  record.segments = d.segments;
  absl::StatusOr<std::string> encoded = EncodeSessionState(*state, session.config());
  if (!encoded.ok()) return encoded.status();
  record.state = *std::move(encoded);
  auto writer = AtomicFileWriter::Create(StatePath(id));
  if (!writer.ok()) return writer.status();
  if (absl::Status s = (*writer)->Append(EncodeSessionRecord(record)); !s.ok()) return s;
  if (absl::Status s = (*writer)->Sync(); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> publish(d.publish);
    bool removing = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      removing = d.removing;
    }
    // Removed during this write: Remove has deleted the state file (or
    // waits for this lock to), so it is not published again; the writer
    // deletes its temporary file and the logs go as the write ends.
    if (removing) return absl::OkStatus();
    if (absl::Status s = (*writer)->Commit(); !s.ok()) return s;
  }
  d.tokens_written = session.num_tokens();
  d.last_write = std::chrono::steady_clock::now();
  if (options_.state_written_for_test) options_.state_written_for_test(id, d.tokens_written);
  MapChunksOnDisk(d, id, session);
  return absl::OkStatus();
}

ChunkMapper StateStore::MapperFor(const std::vector<ChunkSegment>& segments) const {
  std::vector<std::string> paths;
  for (const ChunkSegment& s : segments) paths.push_back(LogPath(s.log));
  return [segments, paths = std::move(paths), this](int64_t first, int64_t count) {
    return MapChunkLogs(segments, paths, first, count, config_);
  };
}

void StateStore::MapChunksOnDisk(Durable& d, const std::string& id, Session& session) {
  BackendSession& backend = session.backend_session();
  const int64_t unit = backend.chunk_map_unit();
  if (!options_.disk_tier || unit <= 0 || d.mapping_failed) return;
  const int64_t on_disk = SegmentChunks(d.segments);
  if (d.chunks_mapped + unit > on_disk) return;
  ChunkMapper map = MapperFor(d.segments);
  if (options_.map_for_test) options_.map_for_test(id, map);
  for (; d.chunks_mapped + unit <= on_disk; d.chunks_mapped += unit) {
    auto mapped = map(d.chunks_mapped, unit);
    absl::Status s = mapped.ok() ? backend.MapChunks(*std::move(mapped)) : mapped.status();
    if (!s.ok()) {
      std::fprintf(stderr,
                   "drt-server: session %s keeps its chunks from %lld on in memory (the disk tier "
                   "could not map them): %s\n",
                   id.c_str(), static_cast<long long>(d.chunks_mapped), std::string(s.message()).c_str());
      d.mapping_failed = true;
      return;
    }
  }
}

absl::Status StateStore::RecordFork(const StateRegistration& parent_registration,
                                    const StateRegistration& child_registration,
                                    const SessionSettings& settings, Session& child) {
  if (absl::Status s = CheckRegistration(child_registration, "RecordFork"); !s.ok()) return s;
  if (parent_registration.registered()) {
    if (absl::Status s = CheckRegistration(parent_registration, "RecordFork"); !s.ok()) return s;
  }
  const std::string& parent_id = parent_registration.id();
  const std::string& child_id = child_registration.id();
  std::vector<ChunkSegment> shared;  // the parent's logs, when the child shares them
  int64_t chunks_mapped = 0;  // of the parent's, which the fork shares already mapped
  // The parent's mapping failed (at run time or at start-up): the fork maps
  // none of the shared chunks either. Its blocks are the parent's, in RAM:
  // mapping them in the fork frees nothing while the parent lives (the
  // parent keeps its copy, ChunkStore::MapBlock) and takes more of the
  // mappings or file descriptors whose lack made the parent's fail, which
  // large allocations (mmap) need as well. As for the parent, the next
  // start maps them.
  bool mapping_failed = false;
  Durable* parent = parent_registration.record_.get();  // null: a parent that is not durable
  if (parent != nullptr) {
    std::lock_guard<std::mutex> lock(parent->mutex);
    // Shares the parent's chunks only while its logs exist and hold all the
    // child's chunks; otherwise the child writes its own copy.
    if (!parent->removed && SegmentChunks(parent->segments) == child.num_chunks()) {
      shared = parent->segments;
      chunks_mapped = parent->chunks_mapped;
      mapping_failed = parent->mapping_failed;
      // Taken under the parent's lock, so a concurrent Remove of the parent
      // cannot delete these logs before the child holds them.
      std::lock_guard<std::mutex> refs(mutex_);
      for (const ChunkSegment& s : shared) ++log_refs_[s.log];
    }
  }
  if (options_.fork_point_for_test) options_.fork_point_for_test("logs shared");
  // The child was deleted since it was inserted (a Remove before this, or
  // between the lookup and the lock below): nothing of it may be written,
  // or it would come back at the next start, and the references taken to
  // its parent's logs go again, through DropLogRefsLocked: when the parent
  // was removed meanwhile (after they were taken), they are the last ones
  // and its log is deleted here.
  auto drop_shared = [&] {
    std::vector<std::string> dead;
    {
      std::lock_guard<std::mutex> refs(mutex_);
      dead = DropLogRefsLocked(shared);
    }
    DeleteLogs(dead);
    return absl::OkStatus();
  };
  Durable* d = child_registration.record_.get();
  if (options_.fork_point_for_test) options_.fork_point_for_test("child registered");
  if (!BeginWrite(*d)) return drop_shared();  // the child was removed
  std::lock_guard<std::mutex> lock(d->mutex);
  // A Remove of the child during the write removes it as this ends, with
  // the segments recorded here (the parent's logs' references go with them).
  WriteEnd end(*this, *d, child_id);
  // (d->removed is false here, as in Persist: a Remove after BeginWrite
  // leaves the removal to this write's end.)
  absl::Status s;
  if (d->tokens_written >= 0 || SegmentChunks(d->segments) > 0) {
    drop_shared().IgnoreError();
    s = absl::InternalError(absl::StrFormat(
        "fork %s of %s: the child was written before its fork record", child_id, parent_id));
  } else {
    {
      // Under the child's lock and the store's, as Remove reads the segments.
      std::lock_guard<std::mutex> refs(mutex_);
      shared.push_back(d->segments.back());  // its own log (Register took its reference)
      d->segments = std::move(shared);
      d->chunks_mapped = chunks_mapped;
      d->mapping_failed = mapping_failed;
    }
    if (mapping_failed && options_.disk_tier) {
      std::fprintf(stderr,
                   "drt-server: session %s, a fork of %s, keeps its chunks from %lld on in memory "
                   "as its parent does (the disk tier could not map them)\n",
                   child_id.c_str(), parent_id.c_str(), static_cast<long long>(chunks_mapped));
    }
    s = PersistLocked(*d, child_id, settings, child);
  }
  return s;
}

void StateStore::Remove(const std::string& id) {
  std::shared_ptr<Durable> d;
  bool owed = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    d = std::move(it->second);
    sessions_.erase(it);
    d->removing = true;  // no write begins from now on
    if (d->writers > 0) {
      // A write of it runs (say, the end of a Generate): it removes the
      // session as it ends (EndWriteLocked) rather than DeleteSession
      // waiting for its fsync here. The record stays alive through the
      // writer's handle.
      owed = true;
    }
  }
  if (owed) {
    // Deletes the state file now, so that an OK answer means a crash cannot
    // bring the session back: waits for a rename under way, never for the
    // write's chunk fsync; a write that had not published it by then does
    // not (PersistLocked). The logs are the writer's to delete.
    std::lock_guard<std::mutex> publish(d->publish);
    DeleteStateFile(id);
    return;
  }
  std::lock_guard<std::mutex> lock(d->mutex);  // (no write holds it: none began)
  DeleteLogs(RemoveLocked(*d, id));
}

void StateStore::DeleteStateFile(const std::string& id) {
  UnlinkOrLog(StatePath(id));
  if (absl::Status s = FsyncDir(options_.dir + "/sessions"); !s.ok()) {
    std::fprintf(stderr, "drt-server: %s\n", std::string(s.message()).c_str());
  }
}

std::vector<std::string> StateStore::RemoveLocked(Durable& record, const std::string& id,
                                                  bool delete_state_file) {
  Durable* d = &record;
  d->removed = true;
  if (d->fd >= 0) ::close(d->fd);
  d->fd = -1;
  // The state file goes first: a crash after it leaves only unreferenced
  // logs, which the next start-up deletes.
  if (delete_state_file) DeleteStateFile(id);
  std::lock_guard<std::mutex> refs(mutex_);
  return DropLogRefsLocked(d->segments);
}

std::vector<std::string> StateStore::DropLogRefsLocked(
    const std::vector<ChunkSegment>& segments) {
  std::vector<std::string> dead;
  for (const ChunkSegment& s : segments) {
    if (--log_refs_[s.log] > 0) continue;
    log_refs_.erase(s.log);
    dead.push_back(LogPath(s.log));
  }
  return dead;
}

void StateStore::DeleteLogs(const std::vector<std::string>& paths) const {
  for (const std::string& log : paths) DeleteLog(log);
}

void StateStore::DeleteLog(const std::string& path) const {
  if (options_.before_log_deleted_for_test) options_.before_log_deleted_for_test(path);
  UnlinkOrLog(path);
}

std::string StateStore::Quarantine(const std::string& id, const std::string& problem,
                                   const std::string& state, const std::vector<std::string>& logs,
                                   bool& moved) {
  // <id>-<unix seconds>, or with ".2", ".3", ... when that is taken (the
  // same id refused twice within a second, or a directory an operator kept:
  // review-durable F7; before, the session then stayed where it was).
  const std::string first = absl::StrFormat("%s/quarantine/%s-%d", options_.dir, id,
                                            absl::ToUnixSeconds(absl::Now()));
  std::string target = first;
  // All or nothing: the logs are hard-linked into the directory (one inode,
  // no copy; a log several refused sessions share is linked into each
  // directory, and one a restored session uses stays in chunks/ too), then
  // the state file is moved. When any of it fails, what was made is undone
  // and the session stays where it is, its logs kept in chunks/ by the
  // caller, to be tried again at the next start.
  std::string failure;
  std::vector<std::string> linked;
  std::error_code ec;
  fs::create_directories(options_.dir + "/quarantine", ec);
  int made = ::mkdir(target.c_str(), 0755);
  for (int n = 2; made != 0 && errno == EEXIST && n <= 1000; ++n) {
    target = absl::StrFormat("%s.%d", first, n);
    made = ::mkdir(target.c_str(), 0755);
  }
  if (made != 0) {
    failure = absl::StrFormat("cannot make %s: %s", target, std::strerror(errno));
  }
  for (size_t i = 0; failure.empty() && i < logs.size(); ++i) {
    const std::string to = target + "/" + fs::path(logs[i]).filename().string();
    if (::link(logs[i].c_str(), to.c_str()) != 0) {
      failure = absl::StrFormat("cannot link %s to %s: %s", logs[i], to, std::strerror(errno));
    } else {
      linked.push_back(to);
    }
  }
  const std::string state_to = target + "/" + fs::path(state).filename().string();
  if (failure.empty() && ::rename(state.c_str(), state_to.c_str()) != 0) {
    failure = absl::StrFormat("cannot move %s to %s: %s", state, state_to, std::strerror(errno));
  }
  moved = failure.empty();
  if (!moved) {
    for (const std::string& link : linked) ::unlink(link.c_str());
    if (made == 0) ::rmdir(target.c_str());
    return absl::StrFormat(
        "session %s refused: %s; it could not be quarantined (%s), so its state file stays in "
        "%s/sessions/ and its chunk logs in %s/chunks/, to be tried again at the next start",
        id, problem, failure, options_.dir, options_.dir);
  }
  FsyncDir(options_.dir + "/sessions").IgnoreError();
  FsyncDir(target).IgnoreError();
  FsyncDir(options_.dir + "/quarantine").IgnoreError();
  return absl::StrFormat(
      "session %s refused: %s; its state file was moved to %s and its chunk logs hard-linked "
      "there (%s); a log no restored session uses then leaves %s/chunks/",
      id, problem, state_to, linked.empty() ? "none" : absl::StrJoin(linked, ", "), options_.dir);
}

absl::StatusOr<StateStore::RestoreReport> StateStore::RestoreAll(Backend& backend,
                                                                 int64_t max_sessions,
                                                                 int64_t host_budget_bytes,
                                                                 RestoreProgress* progress_in) {
  // Progress goes to a local one when none was given, so the code below
  // reports unconditionally; End() runs on every return.
  RestoreProgress unobserved;
  RestoreProgress& progress = progress_in != nullptr ? *progress_in : unobserved;
  progress.Begin();
  struct EndProgress {
    RestoreProgress& progress;
    ~EndProgress() { progress.End(); }
  } end_progress{progress};
  RestoreReport report;
  struct Candidate {
    std::string id;
    std::string path;
    SessionRecord record;
    SessionState state;
  };
  std::vector<Candidate> candidates;
  struct Unreadable {
    std::string id, path, problem;
    // What goes aside with it: the logs its record names when it could be
    // decoded, else its own log (named after the session).
    std::vector<ChunkSegment> segments;
    bool newer = false;  // a record of a newer server (IsNewerSessionRecord)
  };
  std::vector<Unreadable> unreadable;
  // States written for another model (the configuration, not damage).
  struct OtherModel {
    std::string id, path;
    SessionRecord record;
    StateModelMismatch mismatch;
  };
  std::vector<OtherModel> other_model;
  // States of another engine state version (an upgrade or a rollback, not
  // damage): their records decode, their engine states cannot be.
  struct OtherVersion {
    std::string id, path;
    SessionRecord record;
    uint32_t version = 0;
  };
  std::vector<OtherVersion> other_version;
  // Files of writes that never finished: deleted once start-up is not
  // refused (a refusal changes nothing).
  std::vector<std::string> temporary;
  const std::string sessions_dir = options_.dir + "/sessions";
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(sessions_dir, ec)) files.push_back(entry.path());
  if (ec) {
    return absl::InternalError(
        absl::StrFormat("cannot list %s: %s", sessions_dir, ec.message()));
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    const std::string path = file.string();
    const std::string name = file.filename().string();
    if (IsTemporaryFileName(name)) {  // a write that never finished
      temporary.push_back(path);
      continue;
    }
    if (!absl::EndsWith(name, kStateSuffix)) continue;
    const std::string id = name.substr(0, name.size() - std::strlen(kStateSuffix));
    auto bytes = ReadWholeFile(path);
    progress.Touch();
    absl::StatusOr<SessionRecord> record =
        bytes.ok() ? DecodeSessionRecord(*bytes, path) : absl::StatusOr<SessionRecord>(bytes.status());
    absl::StatusOr<SessionState> state = absl::InternalError("unread");
    if (record.ok() && record->id != id) {
      record = absl::DataLossError(
          absl::StrFormat("%s holds the state of session %s", path, record->id));
    }
    std::vector<ChunkSegment> segments = {ChunkSegment{id, 0}};
    if (record.ok()) {
      segments = record->segments;
      // Another engine state version first: neither its model nor its
      // settings can be checked by this server's engine.
      if (std::optional<uint32_t> version = EngineStateVersionOf(record->state);
          version.has_value() && *version != kEngineStateVersion) {
        other_version.push_back({id, path, *std::move(record), *version});
        continue;
      }
      // Another model first: its record's defaults are checked against the
      // model that wrote them, not this one, so a logit_bias id this model
      // lacks must not turn a session of another model into "damage"
      // (review-userfix U2).
      if (std::optional<StateModelMismatch> other = FindStateModelMismatch(record->state, config_)) {
        other_model.push_back({id, path, *std::move(record), *std::move(other)});
        continue;
      }
      // Checked before the session is made: a default CreateSession refuses
      // would fail every Generate that leaves sampling unset.
      if (absl::Status s = CheckSessionRecordForModel(*record, config_, path); !s.ok()) {
        record = s;
      }
    }
    if (record.ok()) {
      state = DecodeSessionState(record->state, config_);
      if (!state.ok()) {
        state = absl::Status(state.status().code(),
                             absl::StrFormat("%s: %s", path, state.status().message()));
      } else if (ClosedChunks(*state, config_) != SegmentChunks(record->segments)) {
        state = absl::DataLossError(absl::StrFormat(
            "%s: the state has %d closed chunks but names %d in its chunk logs", path,
            ClosedChunks(*state, config_), SegmentChunks(record->segments)));
      }
    }
    const absl::Status problem = record.ok() ? state.status() : record.status();
    if (!problem.ok()) {
      unreadable.push_back({id, path, std::string(problem.message()), std::move(segments),
                            bytes.ok() && IsNewerSessionRecord(*bytes)});
      continue;
    }
    candidates.push_back({id, path, *std::move(record), *std::move(state)});
  }

  // Sessions of another engine state version: a server upgraded (or rolled
  // back) across a version meets all of them at once, so quarantining them
  // would lose every session silently. Refused before anything moves,
  // unless the operator said to quarantine them.
  if (!other_version.empty() && !options_.quarantine_other_version_sessions) {
    const int64_t total =
        other_version.size() + other_model.size() + candidates.size() + unreadable.size();
    std::map<uint32_t, int64_t> per_version;
    for (const OtherVersion& o : other_version) ++per_version[o.version];
    std::vector<std::string> versions;
    bool older = false, newer = false;
    for (const auto& [version, count] : per_version) {
      versions.push_back(absl::StrFormat("%d with version %d", count, version));
      (version < kEngineStateVersion ? older : newer) = true;
    }
    std::string why;
    if (older) {
      why = "; version 1 was written before 2026-11-24 and cannot be checked against a model: "
            "its contexts must be re-ingested";
    }
    if (newer) why += "; a newer version was written by a newer drt-server: run that one";
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: %d of its %d sessions (e.g. %s) hold an engine state of another version than "
        "this server's %d (%s)%s. Start the drt-server that wrote them, or pass "
        "--quarantine_other_version_sessions to move them to %s/quarantine/ and start without "
        "them (nothing was restored or changed)",
        options_.dir, other_version.size(), total, other_version.front().id, kEngineStateVersion,
        absl::StrJoin(versions, ", "), why, options_.dir));
  }
  // Sessions of another model: the server's --model is not theirs, so all of
  // them would go, whatever their data. Refused before anything moves,
  // unless the operator said to quarantine them.
  if (!other_model.empty() && !options_.quarantine_other_model_sessions) {
    const StateModelMismatch& first = other_model.front().mismatch;
    const int64_t total =
        other_model.size() + other_version.size() + candidates.size() + unreadable.size();
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: %d of its %d sessions (e.g. %s) were written for another model, not for this "
        "--model%s: %s. Start with the model that wrote them, or pass "
        "--quarantine_other_model_sessions to move them to %s/quarantine/ and start without "
        "them (nothing was restored or changed)",
        options_.dir, other_model.size(), total, other_model.front().id,
        options_.model_dir.empty() ? "" : " " + options_.model_dir,
        DescribeStateModelMismatch(first), options_.dir));
  }
  // Every chunk log a candidate uses, scanned once; its bytes are the
  // restore's progress (a log that is missing counts nothing).
  progress.SetSessionsToRestore(static_cast<int64_t>(candidates.size()));
  std::set<std::string> to_scan;
  for (const Candidate& c : candidates) {
    for (const ChunkSegment& s : c.record.segments) {
      if (s.chunks > 0) to_scan.insert(s.log);
    }
  }
  for (const std::string& log : to_scan) {
    std::error_code size_error;
    const uintmax_t size = fs::file_size(LogPath(log), size_error);
    if (!size_error) progress.AddBytesToCheck(static_cast<int64_t>(size));
  }
  std::map<std::string, absl::StatusOr<ChunkLogScan>> scans;
  for (const std::string& log : to_scan) {
    scans.emplace(log, ScanChunkLog(LogPath(log), payload_bytes_, [&progress](uint64_t bytes) {
                    progress.AddBytesChecked(static_cast<int64_t>(bytes));
                  }));
  }
  // Each candidate's problem with its chunk logs (empty: they are whole).
  std::vector<std::string> log_problems;
  for (const Candidate& c : candidates) {
    std::string problem;
    for (const ChunkSegment& s : c.record.segments) {
      if (s.chunks == 0) continue;
      const auto& scan = scans.at(s.log);
      if (!scan.ok()) {
        problem = std::string(scan.status().message());
      } else if (scan->whole_records < s.chunks) {
        problem = absl::StrFormat("%s holds %d whole chunk records; the session needs %d%s",
                                  LogPath(s.log), scan->whole_records, s.chunks,
                                  scan->tail_problem.empty() ? "" : " (then " + scan->tail_problem + ")");
      }
      if (!problem.empty()) break;
    }
    log_problems.push_back(std::move(problem));
  }
  // Counted before anything is moved, cut or read into memory: a directory
  // with more sessions than the server may hold is refused as it is.
  const int64_t restorable =
      std::count(log_problems.begin(), log_problems.end(), std::string());
  if (restorable > max_sessions) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s holds %d sessions, more than --max_sessions=%d; raise it to restore them (nothing "
        "was restored or changed)",
        options_.dir, restorable, max_sessions));
  }

  for (const std::string& path : temporary) ::unlink(path.c_str());

  std::vector<Candidate> whole;
  // Logs that must stay in chunks/ although no restored session uses them:
  // those of a refused session that could not be quarantined.
  std::set<std::string> keep;
  const auto existing_logs = [&](const std::vector<ChunkSegment>& segments) {
    std::vector<std::string> logs;
    for (const ChunkSegment& s : segments) {
      if (fs::exists(LogPath(s.log)) &&
          std::find(logs.begin(), logs.end(), LogPath(s.log)) == logs.end()) {
        logs.push_back(LogPath(s.log));
      }
    }
    return logs;
  };
  const auto quarantine = [&](const std::string& id, const std::string& problem,
                              const std::string& state, const std::vector<ChunkSegment>& segments) {
    bool moved = false;
    report.quarantined.push_back(Quarantine(id, problem, state, existing_logs(segments), moved));
    if (!moved) {
      for (const ChunkSegment& s : segments) keep.insert(s.log);
    }
  };
  // A state file that cannot be read goes aside with the logs it names, or
  // its own log (named after the session) when it could not be decoded.
  // One of a newer server names logs this server cannot know (a fork's
  // parent's, also of a parent deleted since): every log in chunks/ is
  // linked with it, so none it needs is lost when the sweep below deletes
  // the logs no restored session uses.
  std::vector<ChunkSegment> every_log;
  for (const Unreadable& u : unreadable) {
    if (!u.newer || !every_log.empty()) continue;
    for (const auto& entry : fs::directory_iterator(options_.dir + "/chunks", ec)) {
      const std::string name = entry.path().filename().string();
      if (!absl::EndsWith(name, kLogSuffix)) continue;
      every_log.push_back({name.substr(0, name.size() - std::strlen(kLogSuffix)), 0});
    }
    if (ec) {
      return absl::InternalError(
          absl::StrFormat("cannot list %s/chunks: %s", options_.dir, ec.message()));
    }
    std::sort(every_log.begin(), every_log.end(),
              [](const ChunkSegment& a, const ChunkSegment& b) { return a.log < b.log; });
  }
  for (const Unreadable& u : unreadable) {
    if (u.newer) {
      quarantine(u.id,
                 u.problem + "; its chunk logs cannot be known from it, so every chunk log in " +
                     options_.dir + "/chunks/ is linked with it",
                 u.path, every_log);
    } else {
      quarantine(u.id, u.problem, u.path, u.segments);
    }
  }
  // One of another model (--quarantine_other_model_sessions) with every log
  // it names.
  for (const OtherModel& o : other_model) {
    quarantine(o.id,
               absl::StrFormat("%s: the state was written for another model: %s", o.path,
                               DescribeStateModelMismatch(o.mismatch)),
               o.path, o.record.segments);
  }
  // One of another engine state version (--quarantine_other_version_sessions)
  // with every log it names.
  for (const OtherVersion& o : other_version) {
    quarantine(o.id,
               absl::StrFormat("%s: the state has engine state version %d; this server reads "
                               "version %d",
                               o.path, o.version, kEngineStateVersion),
               o.path, o.record.segments);
  }
  // A damaged one with every log it names that is still there.
  for (size_t i = 0; i < candidates.size(); ++i) {
    Candidate& c = candidates[i];
    const std::string& problem = log_problems[i];
    if (problem.empty()) {
      whole.push_back(std::move(c));
      continue;
    }
    quarantine(c.id, problem, c.path, c.record.segments);
  }

  progress.SetSessionsToRestore(static_cast<int64_t>(whole.size()));
  // Cut every log to what its sessions need: a torn tail, or records of a
  // step whose state file was never written (not acknowledged).
  std::map<std::string, int64_t> needed;
  std::set<std::string> whole_ids;
  for (const Candidate& c : whole) {
    whole_ids.insert(c.id);
    for (const ChunkSegment& s : c.record.segments) {
      needed[s.log] = std::max(needed[s.log], s.chunks);
    }
  }
  for (const auto& [log, count] : needed) {
    const std::string path = LogPath(log);
    if (count == 0) {
      // No session counts a chunk of it yet: whatever it holds (a header, a
      // record of a step that was never acknowledged) goes, and the next
      // write starts it afresh. Left in place, the next chunk would land
      // after a stale record and be read back as that record.
      if (::unlink(path.c_str()) == 0) {
        ++report.torn_tails_truncated;
      } else if (errno != ENOENT) {
        return Errno("cannot delete", path);
      }
      continue;
    }
    const auto& scan = scans.at(log);
    const uint64_t keep = ChunkRecordOffset(count, payload_bytes_);
    if (scan.ok() && scan->file_bytes > keep && !whole_ids.contains(log) &&
        LinkedElsewhere(path)) {
      // A truncate cuts the inode, so every name of it: a log hard-linked
      // into a quarantine directory (now or by an earlier start) whose
      // session, the one it is named after, is not restored here keeps
      // its records past what the restored forks need, or the quarantined
      // session would lose them (review-durable F1). Only that session
      // appends to the log, so a tail it left harms no restored session
      // (they read records by index), and it costs no disk: the
      // quarantine's name keeps the inode anyway. A log whose session is
      // restored is cut, since its next append must follow its last
      // counted record; a quarantined fork of it names no more of its
      // records than its own state counts.
      continue;
    }
    if (scan.ok() && scan->file_bytes > keep) {
      if (::truncate(path.c_str(), keep) != 0) return Errno("cannot truncate", path);
      ++report.torn_tails_truncated;
    }
  }

  // Restore; chunk reads go through each log's open file. A session that
  // fails here passed every check of its files above, so its data is
  // intact and the cause is the environment (the mapping limit, file
  // descriptors, memory): it is quarantined after the loop with every log
  // it needs that no restored session keeps in chunks/, and nothing it
  // needs is deleted below.
  struct Failed {
    const Candidate* candidate;
    std::string problem;
  };
  std::vector<Failed> failed;
  int64_t restored_host_bytes = 0;  // what the sessions restored so far hold
  std::vector<const Candidate*> restored_candidates;
  for (Candidate& c : whole) {
    std::vector<int> fds;
    std::vector<std::string> paths;
    absl::Status opened;
    for (const ChunkSegment& s : c.record.segments) {
      paths.push_back(LogPath(s.log));
      fds.push_back(s.chunks > 0 ? ::open(paths.back().c_str(), O_RDONLY | O_CLOEXEC) : -1);
      if (s.chunks > 0 && fds.back() < 0 && opened.ok()) opened = Errno("cannot open", paths.back());
    }
    std::string payload;
    ChunkReader read = [&](int64_t chunk, ChunkData& out) -> absl::Status {
      for (size_t i = 0; i < c.record.segments.size(); ++i) {
        if (chunk < c.record.segments[i].chunks) {
          if (absl::Status s = ReadChunkRecord(fds[i], paths[i], chunk, payload_bytes_, payload);
              !s.ok()) {
            return s;
          }
          progress.Touch();
          return DecodeChunk(payload, config_, out);
        }
        chunk -= c.record.segments[i].chunks;
      }
      return absl::InternalError("chunk beyond the session's logs");
    };
    ChunkMapper map = options_.disk_tier ? MapperFor(c.record.segments) : nullptr;
    if (options_.restore_io_for_test) options_.restore_io_for_test(c.id, map, read);
    // A mapping that fails (say, at vm.max_map_count) keeps the blocks
    // mapped before it and reads the rest into memory, as the disk tier
    // does at run time, when that fits the budget (restore_mapped.h).
    absl::StatusOr<MappedRestore> restored =
        opened.ok() ? RestoreMappingWhatItCan(backend, c.state, read, map, host_budget_bytes,
                                              restored_host_bytes)
                    : absl::StatusOr<MappedRestore>(opened);
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    if (!restored.ok()) {
      failed.push_back({&c, absl::StrFormat("%s: %s", c.path, restored.status().message())});
      continue;
    }
    if (!restored->map_error.ok()) {
      std::fprintf(stderr,
                   "drt-server: session %s keeps its chunks from %lld on in memory (%lld chunks, "
                   "about %lld MiB; the disk tier could not map them at start-up, the %lld before "
                   "stay mapped): %s\n",
                   c.id.c_str(), static_cast<long long>(restored->chunks_mapped),
                   static_cast<long long>(restored->chunks_read_after_failure),
                   static_cast<long long>(restored->bytes_read_after_failure >> 20),
                   static_cast<long long>(restored->chunks_mapped),
                   std::string(restored->map_error.message()).c_str());
    }
    auto d = FindOrAdd(c.id, c.record.segments);
    d->tokens_written = c.state.num_tokens;
    // As at run time after a failed mapping, this process maps no more of
    // the session's chunks (MapChunksOnDisk); the next start tries again.
    d->mapping_failed = !restored->map_error.ok();
    d->chunks_mapped = restored->chunks_mapped;
    d->last_write = std::chrono::steady_clock::now();
    std::unique_ptr<Session>& session = restored->session;
    restored_host_bytes += static_cast<int64_t>(session->backend_session().memory().total());
    report.sessions.push_back({c.id, c.record.settings, std::move(session)});
    restored_candidates.push_back(&c);
    progress.AddSessionRestored();
  }
  // Forks restored each with its own copy of the chunks they shared.
  std::map<std::string, int64_t> sessions_per_log;
  for (const Candidate* c : restored_candidates) {
    std::set<std::string> logs;
    for (const ChunkSegment& s : c->record.segments) {
      if (s.chunks > 0) logs.insert(s.log);
    }
    for (const std::string& log : logs) ++sessions_per_log[log];
  }
  for (const Candidate* c : restored_candidates) {
    for (const ChunkSegment& s : c->record.segments) {
      if (s.chunks > 0 && sessions_per_log[s.log] > 1) {
        ++report.sessions_sharing_chunk_logs;
        break;
      }
    }
  }

  // A failed session is quarantined with every log it names (hard links:
  // the logs restored sessions use stay in chunks/ as well).
  for (const Failed& f : failed) {
    quarantine(f.candidate->id, f.problem, f.candidate->path, f.candidate->record.segments);
  }
  std::set<std::string> used;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [log, refs] : log_refs_) used.insert(log);
  }

  // Logs no restored session uses: left by a crash inside Remove, or named
  // only by sessions refused above, whose quarantine directories hold them
  // now. A log of a session that could not be quarantined stays.
  for (const auto& entry : fs::directory_iterator(options_.dir + "/chunks", ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::EndsWith(name, kLogSuffix)) continue;
    const std::string log = name.substr(0, name.size() - std::strlen(kLogSuffix));
    if (used.contains(log) || keep.contains(log)) continue;
    // Named, with its size: a log whose state file went missing (a backup
    // restored without it, an operator's mistake) looks like one a crash
    // inside Remove left, and this line is then the only trace of it
    // (review-durable F6). One a refused session's quarantine links stays
    // there.
    std::error_code size_ec;
    const uintmax_t bytes = fs::file_size(entry.path(), size_ec);
    std::fprintf(stderr,
                 "drt-server: deleting %s (%lld bytes): no restored session uses it%s\n",
                 entry.path().c_str(), size_ec ? -1LL : static_cast<long long>(bytes),
                 fs::hard_link_count(entry.path(), size_ec) > 1 && !size_ec
                     ? " (a quarantine directory keeps a link to it)"
                     : " (no session's state file names it)");
    ::unlink(entry.path().c_str());
  }
  FsyncDir(options_.dir + "/chunks").IgnoreError();
  return report;
}

}  // namespace drt::server
