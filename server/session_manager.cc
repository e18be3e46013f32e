#include "server/session_manager.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "server/session_id.h"
#include "server/state_store.h"
#include "server/state_write_error.h"

namespace drt::server {
namespace {

// A session's sampling defaults are checked as a Generate's sampling is
// (ValidateSamplingParams, then logit_bias's ids against the model):
// INVALID_ARGUMENT naming the field or the id.
absl::Status ValidateDefaults(const SamplingParams& sampling, const ModelConfig& config) {
  if (absl::Status s = ValidateSamplingParams(sampling); !s.ok()) return s;
  return ValidateLogitBiasIds(sampling, config.vocab_size, config.chunk_id, config.pad_id);
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A claim (SessionEntry::Begin, BeginRead) that found the session not idle:
// idle expiry claimed it just before (NOT_FOUND), or `holder` runs on it.
absl::Status ClaimRefused(const std::string& id, bool expiring, int64_t idle_ttl_seconds,
                          const std::string& holder) {
  if (expiring) {
    return absl::NotFoundError(absl::StrFormat(
        "session %s expired: it was idle for more than its idle_ttl_seconds (%d)", id,
        idle_ttl_seconds));
  }
  // Also what the client that just cancelled the holder (or whose deadline
  // passed) meets: the holder ends its current engine step first (and, after
  // a lower-only step, a closing stretch), so the advice covers that too
  // (review-grpc finding 4).
  return absl::FailedPreconditionError(absl::StrFormat(
      "session %s is busy with %s; wait until it ends (GetSession says busy false) and retry: "
      "a call that was cancelled or passed its deadline first ends its current engine step; "
      "to stop a call of yours sooner, cancel it",
      id, holder));
}

}  // namespace

std::string SessionEntry::ActivityName(Activity a) const {
  switch (a) {
    case Activity::kAppending: return "an Append";
    case Activity::kGenerating: return "a Generate";
    case Activity::kIdle: return "nothing";
    case Activity::kExpiring: return "its expiry";
    case Activity::kFirstWrite: return "its first write to the state directory";
    case Activity::kReading: {
      // (Read without readers_mutex_: a reader that ends meanwhile changes
      // only the wording.)
      const int forks = forks_reading_.load(), saves = saves_reading_.load();
      if (forks > 0 && saves > 0) return "a ForkSession and a SaveSession";
      return saves > 0 ? "a SaveSession" : "a ForkSession";
    }
  }
  return "?";
}

SessionEntry::SessionEntry(std::string id, SessionSettings settings, std::unique_ptr<Session> session)
    : id_(std::move(id)), settings_(settings), session_(std::move(session)) {
  last_used_ns_ = NowNs();
  RefreshFiguresLocked();
}

absl::Status SessionEntry::Begin(Activity activity) {
  Activity expected = Activity::kIdle;
  if (!activity_.compare_exchange_strong(expected, activity)) {
    return ClaimRefused(id_, expected == Activity::kExpiring, settings_.idle_ttl_seconds,
                        ActivityName(expected));
  }
  // A call that found the session just before DeleteSession removed it.
  if (deleted_.load()) {
    activity_ = Activity::kIdle;
    return absl::NotFoundError(absl::StrFormat("session %s was deleted", id_));
  }
  // Waits for a RefreshFiguresIfIdle that saw the session idle, so that the
  // engine is never read and changed at once.
  { std::lock_guard<std::mutex> wait_for_refresh(engine_mutex_); }
  last_used_ns_ = NowNs();
  return absl::OkStatus();
}

absl::Status SessionEntry::BeginRead(ReadKind kind) {
  {
    std::lock_guard<std::mutex> lock(readers_mutex_);
    Activity expected = Activity::kIdle;
    // Joins the readers holding it, or claims an idle session for readers.
    if (activity_.load() != Activity::kReading &&
        !activity_.compare_exchange_strong(expected, Activity::kReading)) {
      return ClaimRefused(id_, expected == Activity::kExpiring, settings_.idle_ttl_seconds,
                          ActivityName(expected));
    }
    (kind == ReadKind::kFork ? forks_reading_ : saves_reading_)++;
  }
  if (deleted_.load()) {
    EndRead(kind);
    return absl::NotFoundError(absl::StrFormat("session %s was deleted", id_));
  }
  { std::lock_guard<std::mutex> wait_for_refresh(engine_mutex_); }  // as Begin
  last_used_ns_ = NowNs();
  return absl::OkStatus();
}

void SessionEntry::EndRead(ReadKind kind) {
  std::lock_guard<std::mutex> lock(readers_mutex_);
  (kind == ReadKind::kFork ? forks_reading_ : saves_reading_)--;
  last_used_ns_ = NowNs();
  if (forks_reading_.load() == 0 && saves_reading_.load() == 0) activity_ = Activity::kIdle;
}

absl::Status SessionEntry::RunReadStep(absl::FunctionRef<absl::Status(Session&)> step) {
  std::lock_guard<std::mutex> one_at_a_time(read_step_mutex_);
  return RunStep(step);
}

absl::Status SessionEntry::PersistAfterStep(Session& session, bool force) const {
  if (!persister_) return absl::OkStatus();
  // A failure is StateWriteError's INTERNAL (the persister's): a file of the
  // state directory gone (NOT_FOUND means "no such session" to clients), a
  // full or read-only disk are the server's problems, and the message says
  // how many of the session's tokens are durable (docs/api.md, Errors).
  return persister_(*this, session, force);
}

absl::Status SessionEntry::EndAndReport(bool write_unwritten) {
  absl::Status s = absl::OkStatus();
  bool write = false;
  {
    std::lock_guard<std::mutex> lock(engine_mutex_);
    // Writes what the activity left unwritten: a Generate's steps
    // (WritesAtActivityEnd), or interval sync's last ones (a no-op when the
    // last step was written). A state left short (an item that failed
    // between skipping steps, server/scheduler.h) is never written: the
    // files keep the last whole one.
    if (session_ != nullptr && !deleted_.load() && durable() && write_unwritten) {
      if (state_whole_) {
        // Written without the lock, so that DeleteSession, the idle reaper
        // and figure refreshes do not wait for an fsync; in_step_ keeps a
        // delete meanwhile from freeing the session under the write.
        write = true;
        in_step_ = true;
      } else if (unwritten_) {
        s = absl::DataLossError(
            "its last engine step failed while upper-layer rows were owed; the state directory "
            "keeps its last whole state, and a restart restores that");
      }
    }
    if (!write) RefreshFiguresLocked(/*after_work=*/true);
  }
  // As a step's write and release (a failed write stays owed: the next
  // step retries it); a session deleted during the write is freed by this
  // release (in_step_ kept anyone else from freeing it), and its
  // DeletedError goes out as it is, whatever the write gave. Whether it was
  // is what the release itself reports (it hands the session here), not
  // engine_freed_: a DeleteSession right after the release frees the
  // session and sets that too, and the write's own error must still be
  // logged and explained then (review-writecap W3).
  bool freed_by_release = false;
  if (write) {
    std::optional<DeletedSession> freed;
    s = ReleaseStep(WriteStep(/*force=*/true), &freed);
    freed_by_release = freed.has_value();
    freed.reset();  // here, before the activity ends (as without free_later)
  }
  if (!s.ok() && !freed_by_release) {
    if (!write) {
      // (A write's error is StateWriteError's already, naming the session.)
      s = absl::Status(
          s.code(), absl::StrFormat("session %s: its state could not be written to the state "
                                    "directory (the session in memory holds every token; a "
                                    "restart would restore its last written state): %s",
                                    id_, s.message()));
    }
    std::fprintf(stderr, "drt-server: %s\n", std::string(s.message()).c_str());
  }
  last_used_ns_ = NowNs();
  activity_ = Activity::kIdle;
  return s;
}

absl::Status SessionEntry::CheckStateWhole() const {
  if (state_whole_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "session %s: its last Append failed before its state was completed (its last logits or "
      "upper-layer state cover fewer tokens than the session holds), so it cannot be read; "
      "append more tokens (an Append that succeeds and ends at least the model's upper-layer "
      "reach + 1 tokens after the failure completes it) or delete it",
      id_));
}

absl::Status SessionEntry::DeletedError() const {
  return absl::AbortedError(absl::StrFormat(
      "session %s was deleted while %s was running on it; the call stopped at its next engine "
      "step and the session's memory is freed",
      id_, ActivityName(activity_.load())));
}

absl::Status SessionEntry::RunStep(absl::FunctionRef<absl::Status(Session&)> step) {
  absl::StatusOr<Session*> session = BeginStep();
  if (!session.ok()) return session.status();
  // The engine work runs without the lock, so DeleteSession never waits for it.
  return EndStep(step(**session));
}

absl::StatusOr<Session*> SessionEntry::BeginStep() {
  std::lock_guard<std::mutex> lock(engine_mutex_);
  if (deleted_.load() || session_ == nullptr) return DeletedError();
  in_step_ = true;
  tokens_before_step_ = session_->num_tokens();
  return session_.get();
}

absl::Status SessionEntry::EndStep(absl::Status status, bool state_whole) {
  if (NoteStep(status, state_whole)) status = WriteStep();
  return ReleaseStep(std::move(status));
}

bool SessionEntry::NoteStep(const absl::Status& status, bool state_whole) {
  // in_step_ keeps a concurrent delete from freeing the session, so it is
  // read here without the lock. (A step that changed nothing, say one that
  // only read the session, leaves the state as whole as it was.)
  if (!deleted_.load() && session_->num_tokens() != tokens_before_step_) {
    unwritten_ = true;
    state_whole_ = state_whole;
  }
  // Written before the step's result reaches its caller, so before anything
  // acknowledges it; a Generate's steps wait for its end (EndAndReport).
  return status.ok() && durable() && !deleted_.load() && unwritten_ && state_whole_ &&
         !WritesAtActivityEnd();
}

absl::Status SessionEntry::WriteStep(bool force) {
  absl::Status status = PersistAfterStep(*session_, force);
  if (status.ok()) unwritten_ = false;
  return status;
}

absl::Status SessionEntry::ReleaseStep(absl::Status status,
                                       std::optional<DeletedSession>* free_later) {
  std::unique_ptr<Session> freed;
  {
    std::lock_guard<std::mutex> lock(engine_mutex_);
    in_step_ = false;
    // With the engine session still here: a deleted one keeps these
    // figures until it is freed (FreeEngineSession).
    RefreshFiguresLocked(/*after_work=*/true);
    if (deleted_.load()) freed = std::move(session_);
  }
  if (freed == nullptr) return status;
  // Outside the lock: freeing a large session takes a while (here, as
  // `deleted` goes, or by the holder of free_later).
  DeletedSession deleted(std::move(freed), *this);
  if (free_later != nullptr) free_later->emplace(std::move(deleted));
  return DeletedError();
}

void SessionEntry::MarkDeleted() {
  std::unique_ptr<Session> freed;
  {
    std::lock_guard<std::mutex> lock(engine_mutex_);
    deleted_ = true;
    // A running step (or EndAndReport's write) still uses the engine session
    // without the lock, so it is neither freed nor read here: whoever ends
    // that use frees it and zeroes the figures.
    if (!in_step_) freed = std::move(session_);
  }
  if (freed != nullptr) FreeEngineSession(std::move(freed));
}

void SessionEntry::FreeEngineSession(std::unique_ptr<Session> session) {
  session.reset();
  tokens_ = 0;
  chunks_ = 0;
  retrievals_ = 0;
  host_bytes_ = 0;
  budget_bytes_ = 0;
  shared_bytes_ = 0;
  mapped_bytes_ = 0;
  engine_freed_.store(true);
  // The blocks it shared now have one holder fewer: the others' shares
  // grow (review-serverfix F1: a session deleted during its step is freed
  // here, after Delete's own refresh).
  if (share_changes_ != nullptr) share_changes_->Note();
}

DeletedSession::~DeletedSession() {
  if (session_ != nullptr) entry_->FreeEngineSession(std::move(session_));
}

void SessionEntry::RefreshFiguresLocked(bool after_work) {
  // Deleted and taken out: the figures stay as they are until the engine
  // session is freed (FreeEngineSession zeroes them then), so that the
  // budget counts the memory it still holds (review of schedproof, F1).
  if (session_ == nullptr) return;
  tokens_ = session_->num_tokens();
  chunks_ = session_->num_chunks();
  retrievals_ = session_->retrievals();
  const SessionMemory memory = session_->backend_session().memory();
  host_bytes_ = static_cast<int64_t>(memory.total());
  // The budget counts this session's share of the chunks it shares with
  // forks (each shared block once over all its holders), while the
  // reservation absorbs what the session allocated: the growth of its
  // covered bytes, shared blocks in full, which a share that grows as
  // another holder goes (no allocation) does not move.
  const int64_t budget_bytes = static_cast<int64_t>(memory.own_share_total());
  // (engine_mutex_ then the manager's mutex: the manager never takes an
  // entry's engine_mutex_ under its own.)
  covered_bytes_ = ReservationCoveredBytes(memory);
  if (growth_reservation_ != nullptr) {
    growth_reservation_->Absorb(budget_bytes_, budget_bytes, covered_bytes_.load());
  } else {
    budget_bytes_ = budget_bytes;
  }
  shared_bytes_ = static_cast<int64_t>(memory.shared_bytes);
  mapped_bytes_ = static_cast<int64_t>(memory.mapped_chunk_bytes);
  // A step that stopped holding a shared block (copy-on-write of a shared
  // tail, a K/V cache trim, a block mapped or released) moves these; the
  // other holders' shares grew and they refresh (review-serverfix F3). (A
  // move caused by another holder instead only costs a spare refresh.)
  const auto shared = static_cast<int64_t>(memory.shared_bytes);
  const auto shared_elsewhere = static_cast<int64_t>(memory.shared_elsewhere_bytes);
  if (after_work && share_changes_ != nullptr &&
      (shared != last_shared_ || shared_elsewhere != last_shared_elsewhere_)) {
    share_changes_->Note();
  }
  last_shared_ = shared;
  last_shared_elsewhere_ = shared_elsewhere;
}

void SessionEntry::AttachGrowthReservation(HostReservation* reservation) {
  std::lock_guard<std::mutex> lock(engine_mutex_);
  growth_reservation_ = reservation;
  // The baseline is the figure of the last refresh: the holder of the
  // activity attaches before its work runs, so nothing has changed since.
  if (reservation != nullptr) reservation->StartAbsorbing(covered_bytes_.load());
}

void SessionEntry::RefreshFiguresIfIdle() {
  std::lock_guard<std::mutex> lock(engine_mutex_);
  // An activity that begins from now on waits in Begin until this returns.
  if (activity_.load() == Activity::kIdle) RefreshFiguresLocked();
}

double SessionEntry::idle_seconds() const {
  if (activity_.load() != Activity::kIdle) return 0.0;
  return static_cast<double>(NowNs() - last_used_ns_.load()) * 1e-9;
}

SessionManager::SessionManager(Backend& backend, SessionLimits limits)
    : backend_(backend), limits_(limits), reaper_([this] { ReaperLoop(); }) {}

SessionManager::~SessionManager() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  reaper_.join();
}

std::string SessionManager::NewId() {
  std::random_device random;
  return absl::StrFormat("s-%08x%08x%08x", random(), random(), random());
}

absl::StatusOr<std::shared_ptr<SessionEntry>> SessionManager::Insert(
    SessionSettings settings, std::unique_ptr<Session> session, std::string id, bool durable,
    bool claimed, HostReservation* counted_now, bool cache_entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A cache snapshot takes no slot (ForkCacheEntry).
  if (!cache_entry) {
    if (absl::Status s = CheckSessionRoomLocked(); !s.ok()) return s;
  }
  if (id.empty()) {
    id = NewId();
    while (sessions_.contains(id)) id = NewId();
  } else if (sessions_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrFormat("session %s exists already", id));
  }
  auto entry = std::make_shared<SessionEntry>(id, settings, std::move(session));
  entry->share_changes_ = share_changes_;
  if (store_ != nullptr && durable) {
    // Registered before anyone can find (and so delete) it: the store
    // writes only registered sessions, and forgets a deleted one at once.
    entry->registration_ = store_->Register(id);
    entry->persister_ = [store = store_](const SessionEntry& e, Session& s, bool force) {
      absl::Status status = store->Persist(e.registration_, e.settings(), s, force);
      if (status.ok()) return status;
      return StateWriteError(e.id(), status, s.num_tokens(), store->TokensWritten(e.registration_));
    };
  }
  // Claimed before anyone can find it (ListSessions shows it at once): the
  // caller's first write runs alone on it.
  if (claimed) entry->activity_ = Activity::kFirstWrite;
  entry->hidden_ = !durable;  // only CreateEphemeral's sessions are not durable
  entry->cache_entry_ = cache_entry;
  if (cache_entry) ++cache_entries_;
  sessions_[id] = entry;
  // From here the session counts its own memory (its figures were taken
  // when the entry was made, above).
  if (counted_now != nullptr) ReleaseLocked(*counted_now);
  return entry;
}

absl::StatusOr<std::shared_ptr<SessionEntry>> SessionManager::Create(SessionSettings settings) {
  return CreateSession(settings, /*durable=*/true);
}

absl::StatusOr<std::shared_ptr<SessionEntry>> SessionManager::CreateEphemeral(
    SessionSettings settings) {
  return CreateSession(settings, /*durable=*/false);
}

absl::StatusOr<std::shared_ptr<SessionEntry>> SessionManager::CreateSession(
    SessionSettings settings, bool durable) {
  if (absl::Status s = ValidateDefaults(settings.sampling, backend_.config()); !s.ok()) {
    return s;
  }
  if (settings.max_context_tokens < 0 || settings.max_context_tokens > limits_.max_context_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_context_tokens must be in [0, %d] (0: the server's limit), got %d",
        limits_.max_context_tokens, settings.max_context_tokens));
  }
  // Above the server's TTL is refused, as above its context limit: a
  // client may not hold memory and a session slot longer than the operator
  // allows (--idle_ttl_seconds), and a TTL clamped later (a LoadSession, a
  // restart) would change under it silently.
  if (settings.idle_ttl_seconds < 0 || settings.idle_ttl_seconds > limits_.idle_ttl_seconds) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "idle_ttl_seconds must be in [0, %d] (0: the server's TTL, --idle_ttl_seconds), got %d",
        limits_.idle_ttl_seconds, settings.idle_ttl_seconds));
  }
  if (settings.max_context_tokens == 0) settings.max_context_tokens = limits_.max_context_tokens;
  if (settings.idle_ttl_seconds == 0) settings.idle_ttl_seconds = limits_.idle_ttl_seconds;
  auto session = Session::Create(backend_);
  if (!session.ok()) return session.status();
  auto entry = Insert(settings, *std::move(session), "", durable,
                      /*claimed=*/durable && store_ != nullptr);
  if (!entry.ok()) return entry.status();
  // Written now so that an empty session survives a restart too; it is not
  // handed out until it is on disk.
  if (!durable) return entry;
  if (absl::Status s = PersistNew(*entry); !s.ok()) return s;
  return entry;
}

absl::Status SessionManager::PersistNew(const std::shared_ptr<SessionEntry>& entry) {
  if (store_ == nullptr) return absl::OkStatus();
  absl::Status s = entry->RunStep([&](Session& session) {
    return store_->Persist(entry->registration_, entry->settings(), session, /*force=*/true);
  });
  if (!s.ok()) Delete(entry->id()).IgnoreError();
  entry->End();  // the claim Insert took (nothing is left to write)
  return s;
}

absl::StatusOr<std::shared_ptr<SessionEntry>> SessionManager::AddLoaded(
    SessionSettings settings, std::unique_ptr<Session> session, HostReservation& reservation) {
  if (absl::Status s = ValidateDefaults(settings.sampling, backend_.config()); !s.ok()) {
    return s;
  }
  settings.max_context_tokens = std::clamp<int64_t>(settings.max_context_tokens, 1,
                                                    limits_.max_context_tokens);
  settings.idle_ttl_seconds = std::clamp<int64_t>(settings.idle_ttl_seconds, 1,
                                                  limits_.idle_ttl_seconds);
  if (session->num_tokens() > settings.max_context_tokens) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the saved session holds %d tokens, more than this server's context limit of %d",
        session->num_tokens(), settings.max_context_tokens));
  }
  // The reservation goes as the session enters the table, not after it is
  // written to the store: writing a large session takes a while, and the
  // budget would count it twice until then.
  auto entry = Insert(settings, std::move(session), "", /*durable=*/true,
                      /*claimed=*/store_ != nullptr, &reservation);
  if (!entry.ok()) return entry.status();
  if (absl::Status s = PersistNew(*entry); !s.ok()) return s;
  return entry;
}

void SessionManager::AttachStateStore(StateStore* store) { store_ = store; }

absl::StatusOr<std::shared_ptr<SessionEntry>> SessionManager::Adopt(
    const std::string& id, SessionSettings settings, std::unique_ptr<Session> session) {
  // The limits are this server's, as for a loaded session (AddLoaded): a
  // restart with a lower --max_context_tokens or --idle_ttl_seconds applies
  // them to the restored sessions too. A session already past the new
  // context limit keeps its tokens (it is not refused: that would lose
  // them); only its further Appends and Generates are refused.
  const SessionSettings saved = settings;
  settings.max_context_tokens =
      std::clamp<int64_t>(settings.max_context_tokens, 1, limits_.max_context_tokens);
  settings.idle_ttl_seconds =
      std::clamp<int64_t>(settings.idle_ttl_seconds, 1, limits_.idle_ttl_seconds);
  if (settings.max_context_tokens != saved.max_context_tokens ||
      settings.idle_ttl_seconds != saved.idle_ttl_seconds) {
    std::fprintf(stderr,
                 "drt-server: session %s: its saved max_context_tokens %lld and idle_ttl_seconds "
                 "%lld are clamped to this server's limits: %lld and %lld%s\n",
                 id.c_str(), static_cast<long long>(saved.max_context_tokens),
                 static_cast<long long>(saved.idle_ttl_seconds),
                 static_cast<long long>(settings.max_context_tokens),
                 static_cast<long long>(settings.idle_ttl_seconds),
                 session->num_tokens() > settings.max_context_tokens
                     ? " (it holds more tokens than that context limit: it takes no more)"
                     : "");
  }
  return Insert(settings, std::move(session), id);
}

absl::StatusOr<std::shared_ptr<SessionEntry>> SessionManager::Find(const std::string& id) const {
  if (absl::Status s = CheckSessionIdLength(id); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->hidden()) {
    return SessionNotFound(id, started_, store_ != nullptr ? store_->dir() : "");
  }
  return it->second;
}

int64_t SessionManager::ForkHostBytes(const SessionMemory& memory,
                                      int64_t fork_host_bytes_at_most) {
  return static_cast<int64_t>(memory.fork_copied_bytes()) +
         std::max<int64_t>(0, fork_host_bytes_at_most);
}

absl::StatusOr<std::shared_ptr<SessionEntry>> SessionManager::InsertFork(
    const std::shared_ptr<SessionEntry>& parent, bool durable, bool claimed, bool cache_entry) {
  // A reader claim keeps the parent's engine state still while copied
  // (other forks and saves may share it).
  if (absl::Status s = parent->BeginRead(ReadKind::kFork); !s.ok()) return s;
  std::unique_ptr<Session> forked;
  HostReservation copies;
  // Copied under the claim: once it ends, an Append on the parent may set
  // its appended_since_generate.
  SessionSettings settings;
  absl::Status status = parent->RunReadStep([&](Session& session) -> absl::Status {
    settings = parent->settings();
    if (absl::Status s = parent->CheckStateWhole(); !s.ok()) return s;
    // The child shares the parent's chunk logs, which must hold all of them.
    // A parent that is not durable (a Complete call's temporary session) is
    // never written: RecordFork then gives the child its own copy, and the
    // parent leaves nothing on disk when its call deletes it.
    if (store_ != nullptr && parent->durable()) {
      if (absl::Status s = store_->Persist(parent->registration_, parent->settings(),
                                           session, /*force=*/true);
          !s.ok()) {
        return s;
      }
    }
    // What the fork allocates must fit the budget, on every backend: its
    // own window and open chunk, and on the CUDA auto tier the copy of its
    // chunks it may make (review-server F2: before, only the latter was
    // checked, so a fork on the CPU always went through).
    const BackendSession& engine = session.backend_session();
    auto reserved = Reserve(ForkHostBytes(engine.memory(), engine.fork_host_bytes_at_most()),
                            "the fork's own copy (window, open chunk; on the CUDA auto chunk "
                            "tier, when the device has no room for its store, its chunks)");
    if (!reserved.ok()) return reserved.status();
    copies = *std::move(reserved);
    auto copy = session.Fork();
    if (!copy.ok()) return copy.status();
    forked = *std::move(copy);
    return absl::OkStatus();
  });
  parent->EndRead(ReadKind::kFork);
  absl::StatusOr<std::shared_ptr<SessionEntry>> child =
      status.ok() ? Insert(settings, std::move(forked), "", durable, claimed, &copies, cache_entry)
                  : absl::StatusOr<std::shared_ptr<SessionEntry>>(status);
  // The parent and its other forks now share their chunks with one more
  // session (or, when the insert failed, again with one fewer): their
  // shares, and so the budget's sum, are refreshed (those busy refresh when
  // their activity's next step ends). The parent's was refreshed as its
  // read step ended.
  forked.reset();
  share_changes_->Note();
  RefreshSharesIfChanged();
  return child;
}

absl::StatusOr<std::shared_ptr<SessionEntry>> SessionManager::ForkEphemeral(
    const std::shared_ptr<SessionEntry>& parent) {
  if (parent->durable()) {
    return absl::InternalError("ForkEphemeral of a durable session (use Fork)");
  }
  return InsertFork(parent, /*durable=*/false, /*claimed=*/false);
}

absl::StatusOr<std::shared_ptr<SessionEntry>> SessionManager::ForkCacheEntry(
    const std::shared_ptr<SessionEntry>& parent) {
  if (parent->durable()) {
    return absl::InternalError("ForkCacheEntry of a durable session");
  }
  return InsertFork(parent, /*durable=*/false, /*claimed=*/false, /*cache_entry=*/true);
}

void SessionManager::SetHostMemoryReclaimer(std::function<bool()> reclaim) {
  std::lock_guard<std::mutex> lock(mutex_);
  reclaimer_ = std::move(reclaim);
}

absl::StatusOr<std::shared_ptr<SessionEntry>> SessionManager::Fork(const std::string& id) {
  auto parent = Find(id);
  if (!parent.ok()) return parent.status();
  auto child = InsertFork(*parent, /*durable=*/true, /*claimed=*/store_ != nullptr);
  if (child.ok() && store_ != nullptr) {
    absl::Status s = (*child)->RunStep([&](Session& session) {
      return store_->RecordFork((*parent)->registration_, (*child)->registration_,
                                (*child)->settings(), session);
    });
    // Deleted before the claim Insert took ends (as PersistNew does), so no
    // other call can begin on a child that is going away.
    if (!s.ok()) Delete((*child)->id()).IgnoreError();
    (*child)->End();
    if (!s.ok()) return s;
  }
  return child;
}

absl::Status SessionManager::Delete(const std::string& id, bool hidden_too) {
  if (absl::Status s = CheckSessionIdLength(id); !s.ok()) return s;
  std::shared_ptr<SessionEntry> entry;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || (it->second->hidden() && !hidden_too)) {
      return SessionNotFound(id, started_, store_ != nullptr ? store_->dir() : "");
    }
    entry = std::move(it->second);
    sessions_.erase(it);
    if (entry->cache_entry()) --cache_entries_;
    PruneDyingLocked();
    dying_.push_back(entry);
  }
  // A running Append/Generate ends at its next step (ABORTED); the engine
  // session is freed now, or when the step running on it returns.
  entry->MarkDeleted();
  if (store_ != nullptr && entry->durable()) store_->Remove(id);
  // Chunks the deleted session shared are now held by fewer sessions (when
  // it was freed above; one a step runs on notes it when it is freed).
  RefreshSharesIfChanged();
  return absl::OkStatus();
}

void SessionManager::RefreshSharesIfChanged() const {
  if (!share_changes_->Take()) return;
  for (const auto& entry : List(/*hidden_too=*/true)) entry->RefreshFiguresIfIdle();
}

std::vector<std::shared_ptr<SessionEntry>> SessionManager::List(bool hidden_too) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<SessionEntry>> out;
  for (const auto& [id, entry] : sessions_) {
    if (hidden_too || !entry->hidden()) out.push_back(entry);
  }
  return out;
}

int64_t SessionManager::count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(sessions_.size()) - cache_entries_;
}

absl::Status SessionManager::CheckSessionRoom() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return CheckSessionRoomLocked();
}

namespace {
// The start of the session-limit refusal's message (IsSessionLimitRefusal).
constexpr char kSessionLimitPrefix[] = "the server holds its maximum of ";
}  // namespace

absl::Status SessionManager::CheckSessionRoomLocked() const {
  if (static_cast<int64_t>(sessions_.size()) - cache_entries_ < limits_.max_sessions) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s%d sessions; delete one or wait for idle ones to expire", kSessionLimitPrefix,
      limits_.max_sessions));
}

bool SessionManager::IsSessionLimitRefusal(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         absl::StartsWith(status.message(), kSessionLimitPrefix);
}

bool SessionManager::IsContextLimitRefusal(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         absl::StrContains(status.message(), kContextLimitWords);
}

HostReservation::HostReservation(HostReservation&& other) noexcept
    : manager_(other.manager_),
      bytes_(other.bytes_),
      attached_bytes_(other.attached_bytes_),
      covered_baseline_(other.covered_baseline_) {
  other.manager_ = nullptr;
  other.bytes_ = 0;
}

HostReservation& HostReservation::operator=(HostReservation&& other) noexcept {
  if (this != &other) {
    Release();
    manager_ = other.manager_;
    bytes_ = other.bytes_;
    attached_bytes_ = other.attached_bytes_;
    covered_baseline_ = other.covered_baseline_;
    other.manager_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void HostReservation::Release() {
  if (manager_ != nullptr) manager_->ReleaseHostBytes(bytes_);
  manager_ = nullptr;
  bytes_ = 0;
}

int64_t ReservationCoveredBytes(const SessionMemory& memory) {
  return static_cast<int64_t>(memory.chunk_store_bytes + memory.landmark_bytes);
}

void HostReservation::StartAbsorbing(int64_t covered_bytes) {
  attached_bytes_ = bytes_;
  covered_baseline_ = covered_bytes;
}

void HostReservation::Absorb(std::atomic<int64_t>& host_bytes, int64_t now,
                             int64_t covered_bytes) {
  if (manager_ == nullptr) {
    host_bytes = now;
    return;
  }
  manager_->AbsorbGrowth(*this, host_bytes, now, covered_bytes);
}

void SessionManager::AbsorbGrowth(HostReservation& reservation, std::atomic<int64_t>& host_bytes,
                                  int64_t now, int64_t covered_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  host_bytes = now;
  // What the reserved work has allocated is the net growth, since attach,
  // of what the estimate covers (chunk store and landmarks,
  // ReservationCoveredBytes): not every increase of the session's total,
  // whose other parts (the chunk K/V cache, the window rings) go up and
  // down from step to step and were never reserved for. A chunk-store block
  // may bring more than the per-chunk estimate at once, hence the clamp; a
  // covered part that shrank (chunks mapped from disk) gives the
  // reservation back up to what was attached.
  const int64_t net = std::max<int64_t>(0, covered_bytes - reservation.covered_baseline_);
  const int64_t outstanding =
      std::clamp<int64_t>(reservation.attached_bytes_ - net, 0, reservation.attached_bytes_);
  reserved_bytes_ += outstanding - reservation.bytes_;
  reservation.bytes_ = outstanding;
}

int64_t SessionManager::TotalHostBytesLocked() const {
  int64_t total = 0;
  for (const auto& [id, entry] : sessions_) total += entry->budget_bytes();
  PruneDyingLocked();
  for (const auto& entry : dying_) total += entry->budget_bytes();
  return total;
}

void SessionManager::PruneDyingLocked() const {
  std::erase_if(dying_, [](const std::shared_ptr<SessionEntry>& entry) {
    return entry->engine_freed_.load();
  });
}

int64_t SessionManager::TotalHostBytes() const {
  RefreshSharesIfChanged();
  std::lock_guard<std::mutex> lock(mutex_);
  return TotalHostBytesLocked();
}

int64_t SessionManager::ReservedHostBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_bytes_;
}

int64_t SessionManager::HostBytesForTokens(int64_t tokens) const {
  const int64_t chunks = tokens / backend_.config().enc_chunk_size + 1;
  return chunks * backend_.host_bytes_per_chunk();
}

absl::StatusOr<HostReservation> SessionManager::Reserve(int64_t bytes, const std::string& what) {
  bytes = std::max<int64_t>(0, bytes);
  // Memory the prefix cache holds goes before any request is refused: its
  // snapshots are evicted (the reclaimer, least recently used first) while
  // the reservation does not fit and it has any.
  while (true) {
    std::function<bool()> reclaim;
    RefreshSharesIfChanged();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (TotalHostBytesLocked() + reserved_bytes_ + bytes <= limits_.host_memory_budget_bytes) {
        reserved_bytes_ += bytes;
        return HostReservation(this, bytes);
      }
      reclaim = reclaimer_;
    }
    if (!reclaim || !reclaim()) break;
  }
  RefreshSharesIfChanged();
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t total = TotalHostBytesLocked();
  if (total + reserved_bytes_ + bytes > limits_.host_memory_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "host memory budget exhausted: sessions hold %d MiB of %d MiB, running requests have "
        "reserved %d MiB more, and %s need about %d MiB; wait for running requests, delete "
        "sessions or raise --host_memory_budget_gb",
        total >> 20, limits_.host_memory_budget_bytes >> 20, reserved_bytes_ >> 20, what,
        bytes >> 20));
  }
  reserved_bytes_ += bytes;
  return HostReservation(this, bytes);
}

absl::StatusOr<HostReservation> SessionManager::ReserveForTokens(int64_t tokens) {
  return Reserve(HostBytesForTokens(tokens), absl::StrFormat("%d more tokens", tokens));
}

void SessionManager::ReleaseHostBytes(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_bytes_ -= bytes;
}

void SessionManager::ReleaseLocked(HostReservation& reservation) {
  if (reservation.manager_ == nullptr) return;
  reserved_bytes_ -= reservation.bytes_;
  reservation.manager_ = nullptr;
  reservation.bytes_ = 0;
}

void SessionManager::StopExpiringDurable() {
  std::lock_guard<std::mutex> lock(mutex_);
  durable_expiry_stopped_ = true;
}

int SessionManager::EvictIdle() {
  std::vector<std::shared_ptr<SessionEntry>> evicted;
  std::function<void(const std::string&)> point;
  {
    // The flag is read under the same lock as the table: a pass that runs
    // while StopExpiringDurable is called either ends before it or sees it.
    std::lock_guard<std::mutex> lock(mutex_);
    point = evict_point_for_test_;
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      SessionEntry& e = *it->second;
      // A Complete call's temporary session lives as long as its call, which
      // deletes it: idle between the call's prompt and its generation (its
      // prompt scores written meanwhile, to a client that may be slow to
      // read), it must not expire under the call, which would then fail
      // NOT_FOUND naming a session its client never saw (review-server F4).
      if (e.hidden() || (durable_expiry_stopped_ && e.durable())) {
        ++it;
        continue;
      }
      // Claimed before it leaves the table: a call that found it a moment
      // ago and begins now gets NOT_FOUND ("expired") from Begin, instead of
      // beginning and then failing with ABORTED ("deleted while ...") at its
      // first step; a call that began first keeps it (the claim fails).
      Activity idle = Activity::kIdle;
      if (e.idle_seconds() > e.settings().idle_ttl_seconds &&
          e.activity_.compare_exchange_strong(idle, Activity::kExpiring)) {
        dying_.push_back(it->second);
        evicted.push_back(std::move(it->second));
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (point) {
    for (const auto& entry : evicted) point(entry->id());
  }
  // As in Delete: the engine sessions are freed (which takes a while for a
  // large one) after mutex_ is released, so lookups of other sessions do
  // not wait for it.
  for (const auto& entry : evicted) {
    entry->MarkDeleted();
    if (store_ != nullptr && entry->durable()) store_->Remove(entry->id());
  }
  if (!evicted.empty()) RefreshSharesIfChanged();
  return static_cast<int>(evicted.size());
}

void SessionManager::SetEvictPointForTest(std::function<void(const std::string& id)> point) {
  std::lock_guard<std::mutex> lock(mutex_);
  evict_point_for_test_ = std::move(point);
}

void SessionManager::ReaperLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    stop_.wait_for(lock, std::chrono::seconds(1));
    if (stopping_) return;
    lock.unlock();
    EvictIdle();
    // Bounds the lag of the shares when nothing adds the figures up.
    RefreshSharesIfChanged();
    lock.lock();
  }
}

}  // namespace drt::server
