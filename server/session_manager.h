// The server's sessions: creation under limits, lookup, fork, delete, the
// busy state that keeps an Append and a Generate from overlapping, host
// memory accounting, and eviction of idle sessions.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/backend.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "server/limits.h"
#include "server/share_changes.h"
#include "server/state_registration.h"

namespace drt::server {

struct SessionSettings {
  SamplingParams sampling;
  int64_t max_context_tokens = 0;
  int64_t idle_ttl_seconds = 0;
  // Not a client's setting but the session's own note, kept here because it
  // is forked, saved (SaveSession) and restored (--state_dir, LoadSession)
  // with the settings: whether prompt tokens were appended (Append, or a
  // Complete's prompt) since the last Generate that added tokens. A Generate
  // that leaves pad_to_chunk_boundary unset pads to the chunk boundary only
  // when it is true (before a new prompt's answer, not before a
  // continuation: docs/api.md, "Padding before generation"). True for a new
  // session and for a record written before it existed (session record
  // versions 2 and 3; docs/state_format.md, "Versions").
  bool appended_since_generate = true;
};

struct SessionLimits {
  int64_t max_sessions = 64;
  int64_t max_context_tokens = kDefaultMaxContextTokens;
  int64_t idle_ttl_seconds = 3600;
  int64_t host_memory_budget_bytes = 8LL << 30;
};

// kExpiring: claimed by idle expiry (SessionManager::EvictIdle) just before
// the session leaves the table; it never ends, and Begin answers NOT_FOUND.
// kReading: held by one or more readers (ForkSession, SaveSession; see
// SessionEntry::BeginRead), which only read the engine state and so share
// it. kFirstWrite: a session just inserted, claimed for its first write to
// the state directory (SessionManager::Insert).
enum class Activity { kIdle, kAppending, kGenerating, kExpiring, kReading, kFirstWrite };
// What a reader claim is for (named in "busy" messages).
enum class ReadKind { kFork, kSave };

class SessionEntry;
class SessionManager;
class StateStore;
class HostReservation;
// Writes a session's durable state (server/state_store.h) after a step that
// changed it (force false) and when an activity ends (force true).
using SessionPersister =
    std::function<absl::Status(const SessionEntry& entry, Session& session, bool force)>;

// A deleted session's engine session, taken out of its entry by the step
// that was still using it (SessionEntry::ReleaseStep) and freed when this is
// destroyed: freeing a large session takes a while, so the scheduler has
// the deleted session's own caller free it, after the step's results are
// delivered, instead of its engine thread before them. Until it is freed
// its entry counts the engine session alive (engine_session_alive) and
// keeps its figures, so the budget counts its memory (SessionManager's
// dying sessions); SessionEntry::FreeEngineSession frees it, then zeroes
// them. `entry` must outlive this: the call's handler (whose thread runs
// the scheduler's Run or EndAndReport, which free it) holds a shared_ptr to
// the entry until after that; an activity claim alone keeps no entry.
class DeletedSession {
 public:
  DeletedSession(std::unique_ptr<Session> session, SessionEntry& entry)
      : session_(std::move(session)), entry_(&entry) {}
  DeletedSession(DeletedSession&&) noexcept = default;
  DeletedSession& operator=(DeletedSession&&) = delete;
  ~DeletedSession();

 private:
  std::unique_ptr<Session> session_;  // null once moved from
  SessionEntry* entry_;
};

class SessionEntry {
 public:
  SessionEntry(std::string id, SessionSettings settings, std::unique_ptr<Session> session);

  const std::string& id() const { return id_; }
  const SessionSettings& settings() const { return settings_; }
  // Sets settings().appended_since_generate. For the holder of the activity
  // (whose steps write the settings to the state directory): no other
  // thread reads that field meanwhile.
  void set_appended_since_generate(bool appended) {
    settings_.appended_since_generate = appended;
  }
  // A Complete call's temporary session (SessionManager::CreateEphemeral):
  // no other call can find, list, delete or fork it.
  bool hidden() const { return hidden_; }
  // A prefix-cache snapshot (SessionManager::ForkCacheEntry, server/
  // prefix_cache.h): hidden, read-only, outside --max_sessions.
  bool cache_entry() const { return cache_entry_; }

  // Claims the session for one activity; FAILED_PRECONDITION naming the
  // running one when it is busy, NOT_FOUND once the session was deleted or
  // claimed by idle expiry.
  absl::Status Begin(Activity activity);
  // Ends the activity, refreshes the cached figures and the idle clock. For
  // a durable session, first writes what the activity left unwritten (a
  // Generate's steps, or --state_sync=interval's last ones); a failed write
  // is logged.
  void End() { EndAndReport().IgnoreError(); }
  // End, and returns that failed write, so that a call does not report
  // success for state that is not on disk; the activity ends either way.
  // A Generate's steps are written here, all at once (see
  // WritesAtActivityEnd). The write runs without engine_mutex_ (as EndStep's
  // does): DeleteSession, the idle reaper and RefreshFiguresIfIdle do not
  // wait for it; a delete meanwhile frees the session when it ends, and the
  // call then gets ABORTED. `write` false: ends the activity without that
  // write (a Generate cut by the server stopping: its tokens die with the
  // process, so a restart restores the session as it was before the
  // Generate and a client can send it again; docs/api.md).
  absl::Status EndAndReport(bool write = true);
  Activity activity() const { return activity_.load(); }

  // A reader claim (ForkSession, SaveSession): they only read the engine
  // state, so any number may hold it at once, and an activity that changes
  // the session (Begin) is refused while any does (FAILED_PRECONDITION
  // naming them), as readers are while one runs. Errors as Begin. Every
  // successful BeginRead is followed by exactly one EndRead; the last one
  // makes the session idle. Readers use the engine session through
  // RunReadStep only.
  absl::Status BeginRead(ReadKind kind);
  void EndRead(ReadKind kind);
  // RunStep for the holder of a reader claim. The readers' engine work runs
  // one at a time (a fork writes its parent to the state directory, which
  // may map its chunks, and a CUDA fork uses the device), so a reader may
  // wait for the one before it, but none is refused.
  absl::Status RunReadStep(absl::FunctionRef<absl::Status(Session&)> step);

  // One engine step for the holder of the activity (one thread at a time):
  // runs `step` on the engine session unless the session was deleted, and
  // refreshes the figures. ABORTED ("session ... was deleted while ...")
  // once the session was deleted, before or during the step; the engine
  // session is then gone. BeginStep + step + EndStep.
  absl::Status RunStep(absl::FunctionRef<absl::Status(Session&)> step);
  // The durability hook: EndStep calls it after every step that changed the
  // session (before the step's result can be acknowledged), except the
  // steps of a Generate (WritesAtActivityEnd), and End() before the
  // activity ends.
  absl::Status PersistAfterStep(Session& session, bool force = false) const;
  // Whether the running activity's steps are written only when it ends
  // (EndAndReport), not after each step: a Generate's (its padding and
  // generated tokens). A Generate is then on disk all or nothing: a crash
  // during it restores the session as it was before it, and its final
  // message is sent only once all of it is written (docs/api.md, "Durable
  // sessions"). Per-token writes cost a write latency per token on the
  // engine thread (docs/state_format.md, "Cost").
  bool WritesAtActivityEnd() const { return activity_.load() == Activity::kGenerating; }
  // Whether the session is written to a state store (--state_dir) after its
  // steps: every state written is observable (after a crash), so it must be
  // whole; the scheduler marks the steps that leave it short
  // (server/scheduler.h) and EndStep does not write those.
  bool durable() const { return static_cast<bool>(persister_); }

  // RunStep in two halves, for the scheduler, which claims every session of
  // a batched engine step, runs the step, then releases them all. BeginStep
  // claims the engine session (ABORTED once deleted: nothing may run on it);
  // between the two the caller may use the Session* without any lock, and
  // DeleteSession does not free it. EndStep releases the claim, refreshes
  // the figures and returns `status`, or ABORTED when the session was
  // deleted meanwhile (its engine session is freed then, outside the lock).
  // Every successful BeginStep is followed by exactly one EndStep.
  // state_whole false: the step skipped upper-layer rows that later tokens of
  // the same item still owe (engine/model_rules.h, UpperLayerReach), or
  // computed no logits for its last token (drt::RunStepSkipsLastLogits), so
  // the state is not one a full computation gives and is not written; the
  // next whole step (or End, once whole) writes everything since.
  absl::StatusOr<Session*> BeginStep();
  absl::Status EndStep(absl::Status status, bool state_whole = true);
  // EndStep in three parts, for a scheduler that writes the sessions of one
  // engine step together (group commit, server/concurrent_calls.h):
  // NoteStep records what the step did to the session and returns whether
  // it owes a write now; WriteStep does that write (no lock; WriteStep of
  // different sessions may run at once on different threads); ReleaseStep
  // is EndStep's release. EndStep(s, w) is NoteStep, WriteStep when owed,
  // ReleaseStep. WriteStep's `force` writes also within
  // --state_sync=interval's interval (EndAndReport's write: BeginStep's
  // claim taken there by hand, ReleaseStep after it). A session deleted
  // during the step is freed by ReleaseStep, or, given `free_later`, handed
  // there for its holder to free (free_later set: this release took it).
  bool NoteStep(const absl::Status& status, bool state_whole);
  absl::Status WriteStep(bool force = false);
  absl::Status ReleaseStep(absl::Status status,
                           std::optional<DeletedSession>* free_later = nullptr);
  // Once the step is released: the tokens it added to the session (its
  // growth since BeginStep), also those a failed step kept (a step's
  // forwards before a failing one stay applied, engine/batch_step.h); 0 once
  // the session was deleted. For the holder of the step.
  int64_t tokens_added_in_step() const {
    // (A deleted session keeps its figures until it is freed.)
    if (deleted_.load()) return 0;
    return std::max<int64_t>(0, tokens_.load() - tokens_before_step_);
  }
  // Whether the last step that changed the session left its state whole
  // (EndStep). For the holder of the activity.
  bool state_whole() const { return state_whole_; }
  // OK when the state is whole. FAILED_PRECONDITION naming the cause when
  // an Append failed after a piece with tokens following (its last logits
  // or upper-layer state are those of fewer tokens than it holds): reading
  // it (Generate, Complete, Fork, SaveSession) would give wrong output
  // silently. An Append of at least the upper-layer reach + 1 tokens makes
  // it whole again (server/scheduler.h). For the holder of the activity.
  absl::Status CheckStateWhole() const;

  // Called by SessionManager when the session leaves its table: running
  // work sees deleted() and ends at its next step, and the engine session
  // (its memory) is freed now when no step runs, else once the running
  // step returns (by ReleaseStep or the holder of its free_later).
  void MarkDeleted();
  bool deleted() const { return deleted_.load(); }
  // False once a deleted session's engine session (its memory) is freed;
  // its figures read 0 from then on, not before.
  bool engine_session_alive() const { return !engine_freed_.load(); }
  // ABORTED: the session was deleted while the running activity used it.
  absl::Status DeletedError() const;

  // Figures readable at any time without touching the engine.
  int64_t tokens() const { return tokens_.load(); }
  int64_t chunks() const { return chunks_.load(); }
  // Session::retrievals(): chunk retrievals its forwards made.
  int64_t retrievals() const { return retrievals_.load(); }
  // SessionMemory::total(): shared chunks counted in full (what
  // SessionInfo.host_bytes reports: all the memory the session reads).
  int64_t host_bytes() const { return host_bytes_.load(); }
  int64_t shared_bytes() const { return shared_bytes_.load(); }
  // SessionMemory::own_share_total(): shared chunks at this session's share
  // of them, so that the sum over a session and its forks counts each
  // shared block once. What the host-memory budget counts.
  int64_t budget_bytes() const { return budget_bytes_.load(); }
  // Chunk K/V read from memory-mapped chunk logs (the disk tier); not in
  // host_bytes().
  int64_t mapped_bytes() const { return mapped_bytes_.load(); }
  // ReservationCoveredBytes of the session's memory at the last refresh.
  int64_t covered_bytes() const { return covered_bytes_.load(); }
  double idle_seconds() const;
  // Refreshes the figures unless an activity runs (it refreshes them when
  // it ends): for when another session that shared chunks with this one goes.
  void RefreshFiguresIfIdle();

  // While attached (the holder of the activity attaches it around the work
  // it reserved for, see ScopedGrowthReservation), every refresh of the
  // figures sets what is left of `reservation` to what was reserved at
  // attach less the net growth since attach of what the reservation's
  // estimate covers (ReservationCoveredBytes: chunk store and landmarks),
  // clamped to [0, reserved at attach], in one step with the new figure
  // under the manager's lock (HostReservation::Absorb): the budget's check
  // then counts the chunks the work has already allocated once, in the
  // session, instead of also in the reservation until the work ends, and
  // memory that only fluctuates (the chunk K/V cache) takes nothing from
  // it. nullptr detaches. `reservation` must outlive the attachment.
  void AttachGrowthReservation(HostReservation* reservation);

 private:
  friend class SessionManager;
  friend class DeletedSession;
  // engine_mutex_ held (or not yet shared). Once the engine session is
  // taken out (deleted), it leaves the figures to FreeEngineSession.
  // `after_work`: the session's own work may have changed which blocks it
  // shares (a step: copy-on-write, a K/V cache trim, a block mapped or
  // released): when its shared figures moved, that is noted (ShareChanges)
  // so that the other holders refresh too.
  void RefreshFiguresLocked(bool after_work = false);
  // Frees a deleted session's engine session taken out of session_, then
  // zeroes the figures, then sets engine_freed_: the figures, and so the
  // budget (SessionManager::dying_), count its memory until it is gone.
  // Without engine_mutex_ (the free takes a while): with session_ null no
  // refresh writes the figures.
  void FreeEngineSession(std::unique_ptr<Session> session);

  std::string id_;
  SessionSettings settings_;
  // Guards session_ (null once deleted and freed) and in_step_ (set while a
  // step or EndAndReport's write uses the session without it). Also held by
  // RefreshFiguresIfIdle while it reads the engine; Begin waits for it, so
  // that the engine is never read and changed at once.
  mutable std::mutex engine_mutex_;
  std::unique_ptr<Session> session_;
  SessionPersister persister_;  // empty without --state_dir
  // The session's handle in the state store, which its writes take (empty
  // when it is not durable).
  StateRegistration registration_;
  bool in_step_ = false;
  int64_t tokens_before_step_ = 0;  // the session's tokens when the running step began
  // The last step left a state a full computation gives (see EndStep); read
  // and written only by the holder of the activity.
  bool state_whole_ = true;
  bool hidden_ = false;  // set before it enters the table, then read only
  bool cache_entry_ = false;  // likewise
  // A step changed the session since it was last written.
  bool unwritten_ = false;
  std::atomic<bool> deleted_{false};
  // Deleted and its engine session freed (set after the free and the
  // figures' zeroing, FreeEngineSession): from then on the manager no
  // longer counts it (SessionManager::dying_). Only the entry reads and
  // writes it: a DeletedSession frees through its entry (FreeEngineSession).
  std::atomic<bool> engine_freed_{false};
  std::atomic<Activity> activity_{Activity::kIdle};
  // What holds the session, for "busy" and "deleted while" messages.
  std::string ActivityName(Activity activity) const;
  // Reader claims (BeginRead) held now, by kind; changed, with activity_'s
  // moves to and from kReading, under readers_mutex_.
  std::mutex readers_mutex_;
  std::atomic<int> forks_reading_{0}, saves_reading_{0};
  // Serializes the readers' engine work (RunReadStep).
  std::mutex read_step_mutex_;
  std::atomic<int64_t> tokens_{0}, chunks_{0}, retrievals_{0}, host_bytes_{0}, shared_bytes_{0}, mapped_bytes_{0};
  std::atomic<int64_t> budget_bytes_{0};
  std::atomic<int64_t> last_used_ns_{0};
  // ReservationCoveredBytes at the last refresh.
  std::atomic<int64_t> covered_bytes_{0};
  HostReservation* growth_reservation_ = nullptr;  // guarded by engine_mutex_
  // The engine's shared figures at the last refresh (shared_bytes and
  // shared_elsewhere_bytes), guarded by engine_mutex_: a step that moved
  // them changed the holders of some shared block.
  int64_t last_shared_ = 0, last_shared_elsewhere_ = 0;
  // The manager's (set before the entry is in its table; null for an entry
  // made outside one): noted when this session's holding of shared blocks
  // changes, its engine session's free included.
  std::shared_ptr<ShareChanges> share_changes_;
};

// Host memory promised to work that will allocate it (an Append's message, a
// LoadSession's chunks, a chunk a Generate is about to close): counted
// against the budget with the sessions' own memory until released (by
// Release or the destructor), so that concurrent requests cannot all pass a
// check that each passes alone. Movable; released once.
class HostReservation {
 public:
  HostReservation() = default;
  HostReservation(SessionManager* manager, int64_t bytes) : manager_(manager), bytes_(bytes) {}
  ~HostReservation() { Release(); }
  HostReservation(HostReservation&& other) noexcept;
  HostReservation& operator=(HostReservation&& other) noexcept;
  HostReservation(const HostReservation&) = delete;
  HostReservation& operator=(const HostReservation&) = delete;

  void Release();
  int64_t bytes() const { return bytes_; }
  // Attached to a session whose ReservationCoveredBytes is `covered_bytes`
  // now: later Absorb calls measure growth from here.
  void StartAbsorbing(int64_t covered_bytes);
  // Sets `host_bytes` (a session's figure, SessionEntry::budget_bytes) to
  // `now` and what is left of this reservation to what it held at
  // StartAbsorbing less the net growth of `covered_bytes` since (clamped to
  // [0, that]), both under the manager's lock, so that a budget check sees
  // either neither or both. Without a manager only sets the figure.
  void Absorb(std::atomic<int64_t>& host_bytes, int64_t now, int64_t covered_bytes);

 private:
  friend class SessionManager;
  SessionManager* manager_ = nullptr;
  int64_t bytes_ = 0;
  int64_t attached_bytes_ = 0;    // bytes_ at StartAbsorbing
  int64_t covered_baseline_ = 0;  // covered bytes at StartAbsorbing
};

// The part of a session's host memory that a reservation's estimate
// (SessionManager::HostBytesForTokens: chunk payloads) is taken for: the
// closed chunks' encoder rows and landmarks.
int64_t ReservationCoveredBytes(const SessionMemory& memory);

// Attaches `reservation` to `entry` (SessionEntry::AttachGrowthReservation)
// for its lifetime: around the engine work the reservation was taken for.
class ScopedGrowthReservation {
 public:
  ScopedGrowthReservation(SessionEntry& entry, HostReservation& reservation) : entry_(entry) {
    entry_.AttachGrowthReservation(&reservation);
  }
  ~ScopedGrowthReservation() { entry_.AttachGrowthReservation(nullptr); }
  ScopedGrowthReservation(const ScopedGrowthReservation&) = delete;
  ScopedGrowthReservation& operator=(const ScopedGrowthReservation&) = delete;

 private:
  SessionEntry& entry_;
};

class SessionManager {
 public:
  SessionManager(Backend& backend, SessionLimits limits);
  ~SessionManager();

  const SessionLimits& limits() const { return limits_; }

  // RESOURCE_EXHAUSTED at max_sessions; INVALID_ARGUMENT for settings beyond
  // the server's limits. Zero settings take the server's values.
  absl::StatusOr<std::shared_ptr<SessionEntry>> Create(SessionSettings settings);
  // Create for a session that lives only as long as one call (Complete's):
  // never written to the state store, so it costs no writes and a crash
  // leaves nothing of it to restore; hidden (SessionEntry::hidden): it
  // counts against max_sessions and the memory budget, but Find, List,
  // Delete and Fork do not see it, so no other call can touch it; and it
  // never expires (EvictIdle), so it lives exactly as long as its call.
  absl::StatusOr<std::shared_ptr<SessionEntry>> CreateEphemeral(SessionSettings settings);
  // NOT_FOUND for a hidden session, as for an unknown one.
  absl::StatusOr<std::shared_ptr<SessionEntry>> Find(const std::string& id) const;
  // FAILED_PRECONDITION while the parent is busy.
  absl::StatusOr<std::shared_ptr<SessionEntry>> Fork(const std::string& id);
  // For the call that owns `parent`, a hidden session (CreateEphemeral's):
  // an exact copy of it, hidden and never written, as CreateEphemeral's
  // (Complete's further choices, CompleteRequest.n). The parent must be
  // idle; the same checks and budget as Fork.
  absl::StatusOr<std::shared_ptr<SessionEntry>> ForkEphemeral(
      const std::shared_ptr<SessionEntry>& parent);
  // A prefix-cache snapshot of `parent` (a hidden session, idle or read):
  // ForkEphemeral's copy, but outside --max_sessions (the cache bounds its
  // own entries, --prefix_cache_entries), so no real request is refused a
  // slot because of it. Its memory counts in the budget as any session's.
  absl::StatusOr<std::shared_ptr<SessionEntry>> ForkCacheEntry(
      const std::shared_ptr<SessionEntry>& parent);
  // Called by Reserve, without the manager's lock, when a reservation
  // would pass the host-memory budget: it frees memory it holds
  // (PrefixCache::EvictOne deletes the least recently used snapshot) and
  // returns true, and Reserve checks again; false when it has nothing left
  // to free, and Reserve refuses. Set once before serving, cleared before
  // its owner goes (no Reserve may run then).
  void SetHostMemoryReclaimer(std::function<bool()> reclaim);
  // `hidden_too`: also a hidden session (for the call that owns it).
  absl::Status Delete(const std::string& id, bool hidden_too = false);
  // `hidden_too`: hidden sessions too (for figures over all the memory).
  std::vector<std::shared_ptr<SessionEntry>> List(bool hidden_too = false) const;
  // Every session that holds a slot of max_sessions: hidden ones included,
  // prefix-cache snapshots (SessionEntry::cache_entry) not.
  int64_t count() const;
  // RESOURCE_EXHAUSTED when the server holds max_sessions sessions (the
  // check and message of every insert): for a caller that would do much
  // work before inserting (LoadSession reads a whole file) to refuse at
  // once. It takes no slot: the insert checks again.
  absl::Status CheckSessionRoom() const;
  // Whether `status` is that refusal (also after a trip through gRPC, which
  // keeps the code and the message): the OpenAI API answers it 503 with
  // Retry-After, a load to wait out, unlike the other RESOURCE_EXHAUSTED.
  static bool IsSessionLimitRefusal(const absl::Status& status);
  // The words every refusal of tokens past a session's context limit has in
  // its message (server/drt_service.cc builds them with it), so that
  // IsContextLimitRefusal knows them after a trip through gRPC, which keeps
  // only the code and the message.
  static constexpr char kContextLimitWords[] = "its context limit";
  // Whether `status` refuses tokens past a session's context limit (the
  // RESOURCE_EXHAUSTED of server/drt_service.cc whose message holds
  // kContextLimitWords; also after a trip through gRPC): the OpenAI API answers
  // it 400 context_length_exceeded, as OpenAI does, not 429, which
  // clients retry and which can never succeed (the memory budget, a load
  // that passes, stays 429).
  static bool IsContextLimitRefusal(const absl::Status& status);

  // Durable sessions (--state_dir): from now on every session inserted
  // (created, forked, adopted) is written to `store` after its steps and
  // removed from it on delete. Call before Adopt. The store must outlive
  // the manager.
  void AttachStateStore(StateStore* store);
  // Inserts a session loaded from a SaveSession file under a new id, with
  // its settings clamped to this server's limits; written to the state
  // store (when attached) before it is returned. `reservation` (taken for
  // the session's memory before it was read) is released in the same step,
  // under the manager's lock, as the session enters the table and counts
  // itself: the budget counts the session once, also while its chunks are
  // written to the state store. Left as it was when the session is refused
  // before it is inserted.
  absl::StatusOr<std::shared_ptr<SessionEntry>> AddLoaded(SessionSettings settings,
                                                          std::unique_ptr<Session> session,
                                                          HostReservation& reservation);
  // Inserts a session read back from the store under its old id (start-up),
  // with its settings clamped to this server's limits (logged when changed).
  absl::StatusOr<std::shared_ptr<SessionEntry>> Adopt(const std::string& id, SessionSettings settings,
                                                      std::unique_ptr<Session> session);

  // Host memory of all sessions (SessionEntry::budget_bytes: chunks a
  // session shares with its forks count once over all of them), those
  // deleted whose engine session is not yet freed included. Idle sessions'
  // shares are refreshed first when a shared block's holders changed
  // (RefreshSharesIfChanged), as in Reserve.
  int64_t TotalHostBytes() const;
  // Host memory reserved (HostReservation) and not yet released.
  int64_t ReservedHostBytes() const;
  // The host memory that adding `tokens` to a session may take: a chunk per
  // enc_chunk_size tokens, and one more (the chunk they complete).
  int64_t HostBytesForTokens(int64_t tokens) const;
  // Reserves `bytes` of the host-memory budget, checked and taken at once
  // under the manager's lock: RESOURCE_EXHAUSTED naming the budget, what
  // the sessions hold and what is reserved, when the sessions' memory plus
  // the reservations plus `bytes` would pass it. `what` says what needs the
  // memory ("2000 more tokens"), for the message.
  absl::StatusOr<HostReservation> Reserve(int64_t bytes, const std::string& what);
  // Reserve(HostBytesForTokens(tokens)).
  absl::StatusOr<HostReservation> ReserveForTokens(int64_t tokens);
  // The host memory a fork of a session holding `memory` allocates
  // (SessionMemory::fork_copied_bytes: its window, open chunk and
  // selections; the closed chunks are shared) plus what it may copy on top
  // (`fork_host_bytes_at_most`: the CUDA auto tier's chunks, when the
  // device has no room for the fork's store).
  static int64_t ForkHostBytes(const SessionMemory& memory, int64_t fork_host_bytes_at_most);
  // A fork of `parent`: its copy of the engine session, made under a reader
  // claim (with --state_dir a durable parent is written first, as its child
  // shares its chunk logs) once ForkHostBytes of it is reserved (else
  // RESOURCE_EXHAUSTED naming the budget, and nothing changes), then
  // inserted (the reservation released in the same step as the fork counts
  // itself).
  absl::StatusOr<std::shared_ptr<SessionEntry>> InsertFork(
      const std::shared_ptr<SessionEntry>& parent, bool durable, bool claimed,
      bool cache_entry = false);

  // Deletes sessions idle past their TTL; returns how many. Hidden sessions
  // (a Complete call's, CreateEphemeral) never expire: their call deletes
  // them when it ends. Each is claimed
  // (Activity::kExpiring) under the manager's lock before it leaves the
  // table, so a call that found it just before cannot begin on it (NOT_FOUND,
  // "expired") and one that began first keeps it.
  // From StopExpiringDurable on it expires only sessions that are not
  // durable.
  int EvictIdle();
  // A drain (DrtService::StartDraining): no durable session expires any
  // more. A restart restores every durable session with a fresh idle clock,
  // so expiring one now only deletes what the restart would keep, and a
  // session whose Generate the drain cut (not written, so that its client
  // sends it again after the restart) would lose its files. Sessions that
  // are not durable (no --state_dir) are lost at exit anyway and still
  // expire, so that their memory goes to the calls still running in the
  // grace period. (A Complete's temporary session never expires: its call
  // deletes it, see EvictIdle.)
  void StopExpiringDurable();
  // Tests only: called by EvictIdle for each expired session after it left
  // the table and before it is marked deleted (no lock held).
  void SetEvictPointForTest(std::function<void(const std::string& id)> point);

 private:
  friend class HostReservation;
  void ReleaseHostBytes(int64_t bytes);
  // HostReservation::Release with mutex_ held.
  void ReleaseLocked(HostReservation& reservation);
  // HostReservation::Absorb under mutex_.
  void AbsorbGrowth(HostReservation& reservation, std::atomic<int64_t>& host_bytes, int64_t now,
                    int64_t covered_bytes);
  // Under mutex_: the sessions' host memory, those deleted and not yet
  // freed included (dying_).
  int64_t TotalHostBytesLocked() const;
  // Under mutex_: drops the entries of dying_ whose engine session is freed.
  void PruneDyingLocked() const;
  // CheckSessionRoom under mutex_.
  absl::Status CheckSessionRoomLocked() const;
  std::string NewId();
  // RefreshFiguresIfIdle on every session when the holders of a shared
  // block changed since the last time (ShareChanges): before the budget's
  // figures are added up, and once a second. Without mutex_ or any entry's
  // engine_mutex_ held.
  void RefreshSharesIfChanged() const;
  // `id` empty: a new one. `durable` false: not written to the state store.
  // `claimed`: inserted with an activity claimed (Begin) for the caller, who
  // ends it (End) after writing it to the store, so no call that found the
  // new id meanwhile runs a step on it at the same time. `counted_now`: a
  // reservation for the session's memory, released as it is inserted (in
  // the same step under mutex_, so a budget check sees one or the other).
  absl::StatusOr<std::shared_ptr<SessionEntry>> Insert(SessionSettings settings,
                                                       std::unique_ptr<Session> session,
                                                       std::string id = "", bool durable = true,
                                                       bool claimed = false,
                                                       HostReservation* counted_now = nullptr,
                                                       bool cache_entry = false);
  absl::StatusOr<std::shared_ptr<SessionEntry>> CreateSession(SessionSettings settings,
                                                              bool durable);
  void ReaperLoop();
  // Writes a session just inserted to the state store (when attached);
  // deletes it again when that fails.
  absl::Status PersistNew(const std::shared_ptr<SessionEntry>& entry);

  Backend& backend_;
  SessionLimits limits_;
  const absl::Time started_ = absl::Now();  // named in NOT_FOUND messages
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<SessionEntry>> sessions_;
  // Sessions deleted (Delete, EvictIdle) whose engine session may not be
  // freed yet: one a step was running on is freed only after the step
  // returns (a LoadSession's first write of the whole session, say; a
  // scheduler step's, by the deleted call's handler once the step's results
  // are delivered), and its memory is still in use until then. Put here in
  // the same step under mutex_ as it leaves sessions_, and its entry keeps
  // its figures until the free (SessionEntry::FreeEngineSession), so the
  // budget counts it until its memory is gone; dropped by
  // TotalHostBytesLocked once freed (SessionEntry::engine_freed_).
  mutable std::vector<std::shared_ptr<SessionEntry>> dying_;
  // Noted by the entries (and Fork, Delete, EvictIdle) when the holders of
  // a shared block change; taken by RefreshSharesIfChanged.
  const std::shared_ptr<ShareChanges> share_changes_ = std::make_shared<ShareChanges>();
  int64_t reserved_bytes_ = 0;  // HostReservations not yet released
  int64_t cache_entries_ = 0;   // of sessions_, the cache's (outside max_sessions)
  std::function<bool()> reclaimer_;  // SetHostMemoryReclaimer
  std::condition_variable stop_;
  bool stopping_ = false;
  bool durable_expiry_stopped_ = false;  // StopExpiringDurable; guarded by mutex_
  StateStore* store_ = nullptr;  // set once, before serving
  std::function<void(const std::string& id)> evict_point_for_test_;  // guarded by mutex_
  std::thread reaper_;
};

}  // namespace drt::server
