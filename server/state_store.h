// The durable state directory (--state_dir; docs/state_format.md): every
// session's small state and closed chunks on disk, written after each step
// (or on an interval), read back at start-up. Damaged sessions are moved to
// DIR/quarantine/ and named; the others restore.
//
// Layout: DIR/FORMAT (directory version), DIR/LOCK (one server at a time),
// DIR/sessions/<id>.state, DIR/chunks/<log>.log, DIR/quarantine/.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/session.h"
#include "server/background_deleter.h"
#include "server/restore_progress.h"
#include "server/session_manager.h"
#include "server/state_files.h"
#include "server/state_registration.h"

namespace drt::server {

enum class StateSync {
  kStep,      // every step that changes a session is on disk before it is acknowledged
  kInterval,  // at most one write per session per interval; a crash may lose that much
};

struct StateStoreOptions {
  std::string dir;
  StateSync sync = StateSync::kStep;
  int64_t sync_interval_ms = 1000;
  // The disk tier (docs/state_format.md, "Disk tier"): once a whole unit of
  // a session's closed chunks is on disk, the session reads them from the
  // memory-mapped log and frees its own copy of their K/V.
  bool disk_tier = true;
  // Sessions whose state names another model (shape or fingerprint) make
  // RestoreAll refuse to start, nothing moved (a wrong --model, or a new
  // model rolled onto the directory); true quarantines them, as damaged ones
  // are (--quarantine_other_model_sessions).
  bool quarantine_other_model_sessions = false;
  // Sessions whose engine state has another version than this server's
  // (kEngineStateVersion: one of before 2026-11-24, or of a newer server)
  // make RestoreAll refuse to start, nothing moved (an upgrade or a
  // rollback across an engine state version); true quarantines them
  // (--quarantine_other_version_sessions).
  bool quarantine_other_version_sessions = false;
  // The --model directory, named in that refusal (may be empty).
  std::string model_dir;
  // Tests only: called by RecordFork with no lock held, at "logs shared"
  // (the child holds references to its parent's logs but is not yet in the
  // store) and at "child registered" (it is, its state not yet written), so
  // that a test can delete sessions at exactly those points.
  std::function<void(std::string_view point)> fork_point_for_test;
  // Tests only: called by a write of session `id` once the chunks it
  // appended are on disk (before its state file), with that session's
  // entry in the store locked (not the store itself), so that a test can
  // read the server's figures while a write runs.
  std::function<void(const std::string& id)> chunks_written_for_test;
  // Tests only: called after each write of session `id`'s state file (so
  // once per write that wrote anything), with the tokens written, that
  // session's entry in the store locked.
  std::function<void(const std::string& id, int64_t tokens)> state_written_for_test;
  // Tests only: called by RestoreAll with each session about to be restored
  // (its files passed every check) and the chunk mapper (null without the
  // disk tier) and reader its restore will use; a test may wrap either to
  // fail as the environment can (vm.max_map_count, EMFILE), data intact.
  std::function<void(std::string_view id, ChunkMapper& map, ChunkReader& read)>
      restore_io_for_test;
  // Tests only: called by each write that maps a session's chunks on disk
  // (the disk tier, after the write) with the mapper it will use; a test may
  // wrap it to see which chunks are mapped, or to fail as the environment
  // can (vm.max_map_count, EMFILE).
  std::function<void(std::string_view id, ChunkMapper& map)> map_for_test;
  // Tests only: called with the path of each chunk log a removal deletes,
  // just before it is unlinked, on the thread that unlinks it (the store's
  // deleter for a removal that a write performs as it ends).
  std::function<void(const std::string& path)> before_log_deleted_for_test;
  // Tests only: the newest FORMAT version Open reads (0: this server's,
  // kNewestStateDirFormat). 2 checks FORMAT as the servers before session
  // record version 3 did, 3 as those before version 4, whose Open was this
  // one's.
  uint32_t newest_dir_format_for_test = 0;
};

class StateStore {
 public:
  // Opens DIR: creates it (not its parent) when missing, checks it is
  // writable (a probe file is written and fsynced), refuses a newer or
  // foreign FORMAT and a directory another drt-server holds (flock on
  // DIR/LOCK). Errors name the path. FORMAT 2 to 4 are read; a new
  // directory gets 2, raised to 3 or 4 by the first session record of that
  // version written (DirFormatForRecordVersion).
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const StateStoreOptions& options,
                                                          const ModelConfig& config);
  ~StateStore();

  struct Restored {
    std::string id;
    SessionSettings settings;
    std::unique_ptr<Session> session;
  };
  struct RestoreReport {
    std::vector<Restored> sessions;
    // One line per damaged session: its path, the problem, where it went.
    std::vector<std::string> quarantined;
    int64_t torn_tails_truncated = 0;
    // Restored sessions that name chunks of a chunk log another restored
    // session names too (a fork and its parent, or forks of one parent):
    // in memory before the restart they shared those chunks, now each holds
    // its own copy of them (restore does not share blocks between
    // sessions), and the host budget counts each copy (review-serverfix F2).
    int64_t sessions_sharing_chunk_logs = 0;
  };
  // Reads every session back (once, before any Persist). A session whose
  // files are damaged is moved to DIR/quarantine/ and reported; chunk log
  // tails past what the sessions need (torn or not yet acknowledged) are cut.
  // A session whose files are whole but whose restore fails (no file
  // descriptor, no memory) is moved there too. A refused session's
  // directory holds hard links to every chunk log it names (a log a
  // restored session uses stays in chunks/ too), so nothing it holds is
  // deleted, also when a restored fork is deleted later (a state file of a
  // newer server, whose logs cannot be known, gets every log in chunks/;
  // one whose logit_bias this model refuses is damaged, as in
  // CheckSessionRecordForModel); when it cannot be
  // quarantined, it stays where it is with its logs. With the disk tier, a
  // session whose chunks cannot all be mapped (vm.max_map_count, EMFILE)
  // keeps the blocks mapped before the first failure and reads the rest
  // into memory, as at run time (server/restore_mapped.h), when those
  // chunks fit `host_budget_bytes` beside the sessions restored before it;
  // otherwise it is quarantined, before any of them is read.
  // RESOURCE_EXHAUSTED, before anything is moved, cut or restored, when
  // more than `max_sessions` sessions would restore (--max_sessions).
  // `progress`, when given, follows the restore as it runs (chunk log bytes
  // checked, sessions restored; server/restore_progress.h).
  absl::StatusOr<RestoreReport> RestoreAll(
      Backend& backend, int64_t max_sessions = std::numeric_limits<int64_t>::max(),
      int64_t host_budget_bytes = std::numeric_limits<int64_t>::max(),
      RestoreProgress* progress = nullptr);

  // Makes `id` a session of the store, with its own chunk log (created at
  // its first write), until Remove, and returns the handle every write of
  // it takes; returns the existing one's handle when `id` is registered
  // already (RestoreAll registers the sessions it restores). The server
  // registers a durable session as it inserts it, before any call can find
  // it (so before any call can delete it). Writes nothing.
  StateRegistration Register(const std::string& id);
  // Writes what changed in `session` since the last call: its new closed
  // chunks (appended to its own log, fsynced), then its small state
  // (atomically). In interval mode a call within the interval of the last
  // write does nothing unless `force`. Writes nothing once the session was
  // removed (a step that was running when its session was deleted writes
  // nothing after the Remove). FAILED_PRECONDITION for an empty handle or
  // one of another store. With the disk tier, the session then reads its
  // chunks on disk from the mapped logs (which changes where they live,
  // not what they are).
  absl::Status Persist(const StateRegistration& registration, const SessionSettings& settings,
                       Session& session, bool force = false);
  // Records a fork: `child`, registered and not yet written, shares the
  // chunks of `parent`, which must have been persisted (force) with all its
  // chunks just before; then writes the child's state. `parent` may be
  // empty (a parent that is not durable): the child then writes its own
  // copy. Writes nothing when the child was removed since it was inserted.
  absl::Status RecordFork(const StateRegistration& parent, const StateRegistration& child,
                          const SessionSettings& settings, Session& child_session);
  // Deletes the session's state file and every chunk log no other session
  // uses (a fork keeps its parent's log alive), and forgets the id: nothing
  // of a removed session stays in memory. Errors are logged, not returned:
  // the session is gone from the server either way. No-op for an id that
  // is not registered. The state file is gone when it returns, also while
  // a write of the session runs (the end write of a Generate, say): it
  // waits at most for that write's rename, never its chunk fsync, and the
  // write does not publish the state file after it; that write hands the
  // session's logs to the store's deleter thread as it ends, so that no
  // writer (the engine thread, in a group commit) waits for their unlinks
  // (a crash before they go leaves them unreferenced, and the next start
  // deletes them).
  void Remove(const std::string& id);
  // Returns once the logs handed to the deleter so far are deleted (tests).
  void WaitForLogDeletions() { deleter_.WaitIdle(); }
  // Sessions registered and not removed (what the store holds in memory).
  int64_t sessions_registered() const;
  // The tokens in the state file of `registration`'s session (what a
  // restart restores); -1 when none was written yet or the handle is not
  // one of this store. Waits for a write of the session under way.
  int64_t TokensWritten(const StateRegistration& registration) const;
  StateSync sync() const { return options_.sync; }
  const std::string& dir() const { return options_.dir; }
  std::string StatePath(const std::string& id) const;
  std::string LogPath(const std::string& log) const;

 private:
  using Durable = DurableRecord;
  StateStore(StateStoreOptions options, const ModelConfig& config, int lock_fd,
             uint32_t dir_format);
  // Before the first write of a version-3 or -4 session record: rewrites
  // FORMAT to the record's version (DirFormatForRecordVersion; atomically,
  // the directory fsynced) when it says less, so that an older server
  // refuses the directory whole.
  absl::Status RaiseDirFormatForRecord(const SessionSettings& settings);
  absl::Status PersistLocked(Durable& d, const std::string& id, const SessionSettings& settings,
                             Session& session);
  // Around every write (Persist, RecordFork's): BeginWrite (before taking
  // d.mutex) returns false once the session is being removed (the write
  // writes nothing); EndWriteLocked (d.mutex held) performs a Remove that
  // came during the write, when it is the last one running. So Remove
  // never waits for a write's chunk fsync: it deletes the state file at once
  // (waiting at most for a rename) and leaves the logs to the writer.
  bool BeginWrite(Durable& d);
  void EndWriteLocked(Durable& d, const std::string& id);
  // Ends a begun write (EndWriteLocked) as it goes out of scope, so an
  // early return or an exception (bad_alloc) cannot leave `writers` up and
  // the removal never run. Declared after the lock_guard of d.mutex, so it
  // ends the write with d.mutex still held.
  class WriteEnd {
   public:
    WriteEnd(StateStore& store, Durable& d, const std::string& id) : store_(store), d_(d), id_(id) {}
    ~WriteEnd() { store_.EndWriteLocked(d_, id_); }
    WriteEnd(const WriteEnd&) = delete;
    WriteEnd& operator=(const WriteEnd&) = delete;

   private:
    StateStore& store_;
    Durable& d_;
    const std::string& id_;
  };
  // Remove's work (d.mutex held): marks the record removed, deletes the
  // state file (unless Remove did already) and returns the logs no other
  // session uses, which the caller deletes (DeleteLogs, or deleter_).
  [[nodiscard]] std::vector<std::string> RemoveLocked(Durable& d, const std::string& id,
                                                      bool delete_state_file = true);
  // Unlinks sessions/<id>.state and fsyncs the directory; errors are logged.
  void DeleteStateFile(const std::string& id);
  // The disk tier: maps every whole unit of `session`'s chunks on disk that
  // it still holds in memory. A failure (say, too many mappings) is logged
  // and leaves the chunks in memory; it loses nothing.
  void MapChunksOnDisk(Durable& d, const std::string& id, Session& session);
  // Drops one reference to each log of `segments` (mutex_ held) and
  // returns the paths of the logs no session references any more, which
  // the caller deletes (DeleteLogs) once mutex_ is released: unlinking a
  // log of many GB can take long, and Register, which the manager calls
  // under its own mutex, waits for mutex_. Every path that gives up
  // references goes through it, so the last one deletes the log.
  [[nodiscard]] std::vector<std::string> DropLogRefsLocked(
      const std::vector<ChunkSegment>& segments);
  // Deletes `paths` (from DropLogRefsLocked; mutex_ not held). Nothing can
  // take a new reference to a log no session references: a fork shares
  // only the logs of a parent not removed, and a new session's own log is
  // named by its new id; so they may also be deleted later, by deleter_.
  void DeleteLogs(const std::vector<std::string>& paths) const;
  // Deletes one log (DeleteLogs, and deleter_ on its thread):
  // before_log_deleted_for_test, then the unlink; a log gone already is
  // fine, any other failure is logged.
  void DeleteLog(const std::string& path) const;
  // Maps chunks [first, first + count) of a session with `segments`.
  ChunkMapper MapperFor(const std::vector<ChunkSegment>& segments) const;
  // OK when `registration` is a handle of this store; the error names `what`.
  absl::Status CheckRegistration(const StateRegistration& registration, const char* what) const;
  // Registers `id` with `segments` unless it is registered already; returns
  // its entry either way.
  std::shared_ptr<Durable> FindOrAdd(const std::string& id, std::vector<ChunkSegment> segments);
  // Moves the state file `state` into DIR/quarantine/<id>-<time>/ and
  // hard-links `logs` there, all or nothing (`moved` says which), and
  // returns the report line.
  std::string Quarantine(const std::string& id, const std::string& problem,
                         const std::string& state, const std::vector<std::string>& logs,
                         bool& moved);

  StateStoreOptions options_;
  const ModelConfig& config_;
  size_t payload_bytes_;
  int lock_fd_;
  mutable std::mutex mutex_;  // guards sessions_ and log_refs_
  std::mutex format_mutex_;   // guards dir_format_ and the FORMAT rewrite
  uint32_t dir_format_;       // what FORMAT says: 2, or 3 once raised
  // The registered sessions. A removed one leaves no trace here: its
  // record is marked removed, so a write through its handle is dropped, and
  // no set of removed ids is kept (it grew for the life of the process).
  std::map<std::string, std::shared_ptr<Durable>> sessions_;
  std::map<std::string, int64_t> log_refs_;  // log -> sessions using it
  // Deletes the logs of removals that writes perform as they end
  // (EndWriteLocked). Stopped first in the destructor, before the LOCK file
  // is released.
  BackgroundDeleter deleter_;
};

absl::StatusOr<StateSync> ParseStateSync(const std::string& text);

}  // namespace drt::server
