#include "server/scheduler.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <set>

#include "absl/strings/str_format.h"
#include "engine/batch_step.h"
#include "engine/session.h"
#include "server/concurrent_calls.h"
#include "server/session_manager.h"
#include "server/stop_status.h"

namespace drt::server {

// An item in the queue; lives on its caller's stack for the duration of Run.
struct Scheduler::Queued {
  const WorkItem* item = nullptr;
  int64_t enqueued_after = 0;  // steps_formed_ when it was queued
  int64_t done = 0;            // tokens appended so far
  WorkResult result;
  bool finished = false;
  // Some rows of its pieces skipped the upper layers.
  bool skipped = false;
  // Rows skipped, or the last piece got no logits, and its last piece had
  // tokens following (StepEntry::tokens_following): the session's
  // upper-layer state or its last logits may be short until a piece with
  // none following runs. (Without rows skipped, every row ran every layer
  // and only the last logits can be short.)
  bool owed = false;
  // Its session's state was short when it began (an earlier item failed
  // after a piece with tokens following, SessionEntry::CheckStateWhole):
  // counted as skipped, and only a piece with none following that ends at
  // least the reach + 1 of its tokens in makes the state whole (the closing
  // piece's argument, engine/model_rules.h, UpperLayerReach).
  bool inherited_debt = false;
  // Stopped while owed: the item is cut short to its closing stretch, the
  // tokens up to closing_end, and ends with this status once they ran. The
  // stretch is prefill like any other (shares, the decode-step allowance);
  // its pieces count their tokens following up to closing_end, so the last
  // has none and leaves the state whole.
  absl::Status closing;
  int64_t closing_end = 0;
  // The stop came from should_stop (not a Refuse): its message is rebuilt
  // with the count the item ends with, whatever stopped the queue later.
  bool closing_by_caller = false;
  // Steps formed in a row, since the cut, that gave its closing stretch no
  // tokens; at kClosingStretchMaxWaitSteps the stretch runs whatever the
  // decode-step allowance (server/scheduler.h).
  int64_t closing_starved = 0;
  // Where the item ends: its size, or closing_end once it is stopped.
  int64_t end() const {
    return closing.ok() ? static_cast<int64_t>(item->tokens.size()) : closing_end;
  }
  int64_t remaining() const { return end() - done; }
  // Tokens its caller may be told are done (on_progress): all of `done`,
  // except for a durable session, whose tokens count only once a step left
  // its state whole and so wrote them (SessionEntry::EndStep).
  int64_t acknowledged = 0;
  // Its session, deleted during the item's last step, taken out of the
  // entry by the engine (SessionEntry::ReleaseStep): freed by the caller in
  // Run once the item ended.
  std::optional<DeletedSession> deleted_session;
  // With WorkItem::score_top_logprobs: made when its first piece runs (from
  // the session's last logits then); `scores` holds those not yet handed
  // to on_scores, of the tokens from `scores_delivered` on.
  std::optional<TokenScorer> scorer;
  std::vector<TokenScore> scores;
  int64_t scores_delivered = 0;
};

// One item's piece of the step being formed.
struct Scheduler::Planned {
  Queued* queued = nullptr;
  int64_t offset = 0;  // into the item's tokens
  int64_t count = 0;
  Session* session = nullptr;  // set once claimed
  absl::Status claim;          // not OK: the claim failed, the piece does not run
  int64_t tokens_following = 0;  // of the item, after this piece
  int64_t rows_skipped = 0;      // of its rows, once run
  bool whole = true;             // it left the session's state whole (once run)
  // A scored item's piece: its rows' logits, then their scores (engine thread).
  std::vector<float> logits;
  std::vector<TokenScore> scores;

  // The item's next `count` tokens.
  static Planned Next(Queued* item, int64_t count) {
    Planned piece;
    piece.queued = item;
    piece.offset = item->done;
    piece.count = count;
    return piece;
  }
};

namespace {

absl::Status StoppedByCaller(int64_t done, int64_t size) {
  return absl::CancelledError(absl::StrFormat(
      "stopped by its caller (cancelled, or past its deadline) after %d of %d tokens", done,
      size));
}

int64_t NowNanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int64_t StepRecord::tokens() const {
  int64_t total = 0;
  for (const StepPiece& piece : pieces) total += piece.tokens;
  return total;
}

Scheduler::Scheduler(Backend& backend, SchedulerOptions options)
    : backend_(backend),
      step_tokens_(std::max<int64_t>(1, options.step_tokens)),
      options_(std::move(options)),
      decode_budget_(DecodeStepBudgetOptions{options_.decode_slowdown_limit,
                                             options_.decode_step_prefill_tokens}),
      engine_([this] { EngineLoop(); }) {}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  if (options_.on_stopping) options_.on_stopping();
  work_ready_.notify_all();
  engine_.join();  // ends the queued items
  std::unique_lock<std::mutex> lock(mutex_);
  callers_gone_.wait(lock, [&] { return callers_ == 0; });
}

WorkResult Scheduler::Run(const WorkItem& item) {
  WorkResult refused;
  if (item.entry == nullptr || item.tokens.empty()) {
    refused.status = absl::InvalidArgumentError(
        "a scheduler work item needs a session and at least one token");
    return refused;
  }
  if (item.score_top_logprobs.has_value()) {
    if (auto checked = TokenScorer::Create(*item.score_top_logprobs, {}, {}); !checked.ok()) {
      refused.status = checked.status();
      return refused;
    }
  }
  Queued queued;
  queued.item = &item;
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_) {
    refused.status = ServerStoppingError("the server is shutting down");
    return refused;
  }
  if (!refusal_.ok()) {
    refused.status = refusal_;
    return refused;
  }
  ++callers_;
  queued.enqueued_after = steps_formed_;
  queue_.push_back(&queued);
  RecountRunnableLocked();
  work_ready_.notify_one();
  int64_t reported = 0;
  // Under the lock: hands the scores of the tokens before `upto` to
  // on_scores, without the lock (the caller writes them to its client).
  auto deliver_scores = [&](int64_t upto) {
    if (!item.on_scores) return;
    const int64_t count =
        std::min<int64_t>(upto - queued.scores_delivered, queued.scores.size());
    if (count <= 0) return;
    std::vector<TokenScore> batch(std::make_move_iterator(queued.scores.begin()),
                                  std::make_move_iterator(queued.scores.begin() + count));
    queued.scores.erase(queued.scores.begin(), queued.scores.begin() + count);
    queued.scores_delivered += count;
    // The engine may be waiting for this item's scores to be taken
    // (max_undelivered_scores): it goes on while they are written, and a
    // parked item that can run again restarts the progress clock.
    RecountRunnableLocked();
    work_ready_.notify_all();
    lock.unlock();
    item.on_scores(std::move(batch));
    lock.lock();
  };
  while (true) {
    item_changed_.wait(lock,
                       [&] { return queued.finished || queued.acknowledged != reported; });
    if (queued.finished) break;
    reported = queued.acknowledged;
    deliver_scores(reported);
    if (item.on_progress) {
      lock.unlock();  // the caller may write to its client; the engine goes on
      if (options_.before_progress) options_.before_progress();
      item.on_progress(reported);
      lock.lock();
    }
  }
  deliver_scores(queued.done);
  WorkResult result = queued.result;
  result.tokens_done = queued.done;
  if (queued.deleted_session.has_value()) {
    // Freed here, on this caller's thread and after the step's results were
    // delivered: freeing a large session takes a while, and on the engine
    // thread it held up every other session's result and the next step
    // (review of the scheduler, finding 3). Before callers_ drops, so the
    // backend outlives it.
    lock.unlock();
    queued.deleted_session.reset();
    lock.lock();
  }
  if (--callers_ == 0) callers_gone_.notify_all();
  return result;
}

void Scheduler::Refuse(absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    refusal_ = std::move(status);
  }
  work_ready_.notify_all();
}

bool Scheduler::refused() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !refusal_.ok();
}

Scheduler::Generating::Generating(Scheduler& scheduler, const SessionEntry* entry)
    : scheduler_(scheduler), entry_(entry) {
  std::lock_guard<std::mutex> lock(scheduler_.mutex_);
  GeneratingSession& session = scheduler_.generating_[entry_];
  // Its handler is about to submit its first token: it counts as turning
  // one around from now.
  if (session.scopes++ == 0) session.last_ended = std::chrono::steady_clock::now();
}

Scheduler::Generating::~Generating() {
  {
    std::lock_guard<std::mutex> lock(scheduler_.mutex_);
    auto it = scheduler_.generating_.find(entry_);
    if (--it->second.scopes == 0) scheduler_.generating_.erase(it);
  }
  scheduler_.work_ready_.notify_all();  // the engine may be waiting for it
}

bool Scheduler::QueuedLocked(const SessionEntry* entry) const {
  return std::any_of(queue_.begin(), queue_.end(),
                     [&](const Queued* q) { return q->item->entry == entry; });
}

std::optional<Scheduler::TimePoint> Scheduler::ResubmitDeadlineLocked(TimePoint now) const {
  std::optional<TimePoint> until;
  for (const auto& [entry, session] : generating_) {
    // A deleted session generates no more: its handler's scope lasts only
    // while it frees the session (Run), which no step waits for.
    if (entry->deleted()) continue;
    const TimePoint deadline = session.last_ended + options_.decode_resubmit_wait;
    if (deadline <= now || QueuedLocked(entry)) continue;
    if (!until.has_value() || deadline > *until) until = deadline;
  }
  return until;
}

int64_t Scheduler::ActiveGeneratingLocked(TimePoint now) const {
  const auto stall_after = std::max(options_.decode_stall_after, options_.decode_resubmit_wait);
  int64_t active = 0;
  for (const auto& [entry, session] : generating_) {
    if (entry->deleted()) continue;  // as in ResubmitDeadlineLocked
    active += now < session.last_ended + stall_after || QueuedLocked(entry);
  }
  return active;
}

void Scheduler::RecountRunnableLocked() {
  const int runnable = static_cast<int>(
      std::count_if(queue_.begin(), queue_.end(),
                    [&](const Queued* q) { return !WaitsForScoreCallerLocked(*q); }));
  // Work the engine can run, arriving at an engine that had none (idle, or
  // every item parked waiting for its caller), is progress too: the time
  // to the next step finished counts from here, not from the last step an
  // hour ago. Stored before the count, so that a reader that sees the new
  // count sees this time.
  if (runnable > 0 && queued_items_.load() == 0) progress_ns_.store(NowNanoseconds());
  queued_items_.store(runnable);
}

Scheduler::EngineProgress Scheduler::engine_progress() const {
  EngineProgress progress;
  progress.queued = queued_items_.load();
  progress.since = std::chrono::steady_clock::time_point(
      std::chrono::nanoseconds(progress_ns_.load()));
  return progress;
}

int Scheduler::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(queue_.size());
}

int64_t Scheduler::steps_formed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return steps_formed_;
}

void Scheduler::CompleteLocked(Queued& item, absl::Status status) {
  item.result.status = std::move(status);
  item.finished = true;
  queue_.remove(&item);
  RecountRunnableLocked();
  // A generating session's handler turns the next token around from now.
  if (auto it = generating_.find(item.item->entry); it != generating_.end()) {
    it->second.last_ended = std::chrono::steady_clock::now();
  }
}

std::vector<Scheduler::Planned> Scheduler::FormStepLocked(StepRecord& record) {
  // 1. Items that must not run any more leave the queue; one whose session
  // is owed its upper-layer state is cut short to a closing stretch first.
  for (Queued* item : std::vector<Queued*>(queue_.begin(), queue_.end())) {
    if (item->item->entry->deleted()) {
      // Its claim would fail (step 4): it takes no share of the step from
      // the others (review of the scheduler, finding 9). Nothing reads a
      // deleted session, so a closing stretch it owed is moot.
      CompleteLocked(*item, item->item->entry->DeletedError());
      continue;
    }
    if (!item->closing.ok()) continue;  // cut short already: running its closing stretch
    const int64_t size = static_cast<int64_t>(item->item->tokens.size());
    absl::Status stop;
    bool by_caller = false;
    if (!refusal_.ok()) {
      stop = refusal_;
    } else if (item->item->should_stop && item->item->should_stop()) {
      stop = StoppedByCaller(item->done, size);
      by_caller = true;
    }
    if (stop.ok()) continue;
    if (item->owed) {
      // A closing stretch of at least the upper-layer reach (a token is at
      // least one position) whose last piece has none following makes the
      // state whole (engine/model_rules.h, UpperLayerReach). An item none of
      // whose rows skipped the upper layers is owed only its last logits
      // (drt::RunStepSkipsLastLogits): one token, none following, makes them.
      const int64_t owed = item->skipped ? backend_.upper_layer_reach() + 1 : 1;
      item->closing = std::move(stop);
      item->closing_by_caller = by_caller;
      item->closing_end = std::min(size, item->done + owed);
    } else {
      CompleteLocked(*item, std::move(stop));
    }
  }
  std::vector<Planned> plan;
  if (queue_.empty()) return plan;
  record.index = ++steps_formed_;
  int64_t left = step_tokens_;
  // A session at most once per step (engine/batch_step.h); the caller's
  // activity claim makes a second item of one session impossible anyway.
  std::set<const SessionEntry*> in_step;

  // 2. Decode first, oldest first.
  int64_t decode_tokens = 0;
  for (Queued* item : queue_) {
    if (left == 0) break;
    if (item->item->kind != WorkKind::kDecode) continue;
    if (WaitsForScoreCallerLocked(*item)) continue;
    if (!in_step.insert(item->item->entry).second) continue;
    const int64_t count = std::min(item->remaining(), left);
    plan.push_back(Planned::Next(item, count));
    left -= count;
    decode_tokens += count;
  }

  // 3. Prefill shares the rest equally; whoever needs less leaves the
  // remainder to the others. An item cut short to its closing stretch is
  // one of them (it needs only the stretch): under the same allowance, so
  // a step that carries decode stays within its limit, and its cap of 0
  // holds (a closing stretch then waits for a step without decode, as all
  // prefill does, but for kClosingStretchMaxWaitSteps steps at most: below).
  std::vector<Queued*> prefill;  // every prefill item of the step
  for (Queued* item : queue_) {
    if (item->item->kind == WorkKind::kPrefill && !WaitsForScoreCallerLocked(*item) &&
        in_step.insert(item->item->entry).second) {
      prefill.push_back(item);
    }
  }
  // A closing stretch that the allowance gave no tokens for
  // kClosingStretchMaxWaitSteps steps in a row runs all it has left now,
  // outside the allowance (as in a step without decode): with
  // --decode_step_prefill_tokens=0 and a session generating without pause
  // it would otherwise wait, its handler blocked and its session busy, for
  // as long as anyone generates (review of schedfix, S1). The others share
  // out what is left as usual.
  std::vector<Queued*> sharing;
  for (Queued* item : prefill) {
    const bool overdue =
        !item->closing.ok() && item->closing_starved >= kClosingStretchMaxWaitSteps;
    if (!overdue || left == 0) {
      sharing.push_back(item);
      continue;
    }
    const int64_t count = std::min(item->remaining(), left);
    plan.push_back(PrefillPiece(item, count));
    left -= count;
  }
  if (!sharing.empty() && left > 0) {
    for (const Planned& piece : SharePrefillLocked(std::move(sharing), left, decode_tokens)) {
      plan.push_back(piece);
    }
  }
  // Counts the steps in a row that gave a closing stretch nothing. Once
  // overdue it stays so: a step whose room (step_tokens less the decode
  // tokens) held only part of it goes on in the next.
  for (Queued* item : prefill) {
    if (item->closing.ok() || item->closing_starved >= kClosingStretchMaxWaitSteps) continue;
    const bool ran = std::any_of(plan.begin(), plan.end(),
                                 [&](const Planned& p) { return p.queued == item; });
    item->closing_starved = ran ? 0 : item->closing_starved + 1;
  }
  return plan;
}

std::vector<Scheduler::Planned> Scheduler::SharePrefillLocked(std::vector<Queued*> items,
                                                              int64_t left,
                                                              int64_t decode_tokens) {
  // The item served first takes the odd tokens (and all of a budget too
  // small for everyone); that turn rotates step by step.
  std::rotate(items.begin(), items.begin() + rotation_++ % items.size(), items.end());
  auto share_out = [&](int64_t tokens) {
    std::vector<Planned> pieces;
    std::vector<int64_t> share(items.size(), 0);
    while (tokens > 0) {
      int64_t open = 0;
      for (size_t i = 0; i < items.size(); ++i) open += share[i] < items[i]->remaining();
      if (open == 0) break;
      const int64_t quota = std::max<int64_t>(1, tokens / open);
      for (size_t i = 0; i < items.size() && tokens > 0; ++i) {
        const int64_t give = std::min({quota, items[i]->remaining() - share[i], tokens});
        share[i] += give;
        tokens -= give;
      }
    }
    for (size_t i = 0; i < items.size(); ++i) {
      if (share[i] > 0) pieces.push_back(PrefillPiece(items[i], share[i]));
    }
    return pieces;
  };

  // A step that carries decode stays within the slowdown limit of a
  // decode-only step (server/decode_step_budget.h). So does one formed while
  // sessions generate but none of their tokens came in time: a token
  // arriving meanwhile waits for this step. (Not for stalled handlers: one
  // blocked writing to a client that stopped reading would otherwise hold
  // every step short for as long as its connection lives.) Lower-only
  // tokens cost a fraction of full ones: the step takes the lower-only
  // allowance when its pieces are predicted to fit with it (every piece
  // lower-only, the usual case inside a long message), else the full one.
  int64_t limited_for = 0;  // decode tokens (or generating sessions) the limit is for
  if (decode_tokens > 0) {
    limited_for = decode_tokens;
  } else if (const int64_t active = ActiveGeneratingLocked(std::chrono::steady_clock::now());
             active > 0) {
    limited_for = active;
  }
  if (limited_for == 0) return share_out(left);
  auto allowance = [&](PrefillRate rate) {
    return decode_tokens > 0 ? decode_budget_.PrefillTokens(limited_for, rate)
                             : decode_budget_.GapPrefillTokens(limited_for, rate);
  };
  const int64_t full = std::min(left, allowance(PrefillRate::kFull));
  // The lower-only allowance is worked out, and a share-out formed with
  // it, only where a piece can be predicted lower-only. Elsewhere every
  // piece counts full, and a share-out of T tokens that Fits would also
  // fit the full allowance (T <= it: Fits bounds T by the same growth
  // bound and time limit, and the cap bounds both), so it would be the
  // share-out of the full allowance over the same items: formed twice
  // per step for nothing.
  const bool may_run_lower_only =
      options_.skip_upper_layers && backend_.runs_mixed_lower_only_forwards();
  const int64_t cheap =
      may_run_lower_only ? std::min(left, allowance(PrefillRate::kLowerOnly)) : 0;
  if (cheap > full) {
    std::vector<Planned> pieces = share_out(cheap);
    int64_t full_tokens = 0, lower_only_tokens = 0;
    for (const Planned& piece : pieces) {
      (PredictedLowerOnly(piece) ? lower_only_tokens : full_tokens) += piece.count;
    }
    if (decode_budget_.Fits(limited_for, full_tokens, lower_only_tokens)) return pieces;
  }
  return share_out(full);
}

Scheduler::Planned Scheduler::PrefillPiece(Queued* item, int64_t count) const {
  Planned piece = Planned::Next(item, count);
  // The item's tokens after this piece are already here: rows far from
  // them may skip the upper layers.
  if (options_.skip_upper_layers) piece.tokens_following = TokensFollowing(*item, count);
  return piece;
}

bool Scheduler::WaitsForScoreCallerLocked(const Queued& item) const {
  return item.item->score_top_logprobs.has_value() && item.item->on_scores &&
         item.acknowledged - item.scores_delivered >= std::max<int64_t>(1, options_.max_undelivered_scores);
}

bool Scheduler::PredictedLowerOnly(const Planned& piece) const {
  // RunStep's test (engine/batch_step.cc, LowerOnlyTokens) counts positions,
  // landmarks included, so at least as many as tokens: a piece with more
  // than the reach in tokens following lies more than the reach before its
  // entry's end. (It may still run every layer: an entry with a retrieval
  // observer never skips. The budget then learns from what ran.)
  // A scored item's piece asks for its logits, so every row runs every layer
  // (RunStep's all_logits): never lower-only, whatever follows it.
  if (piece.queued->item->score_top_logprobs.has_value()) return false;
  return backend_.runs_mixed_lower_only_forwards() &&
         piece.tokens_following > backend_.upper_layer_reach();
}

int64_t Scheduler::TokensFollowing(const Queued& item, int64_t count) const {
  const int64_t end = item.done + count;
  const int64_t following = item.end() - end;
  // A closing stretch lies within the reach: its pieces run every layer
  // where needed, and its last, none following, leaves the state whole
  // (written, for a durable session).
  if (!item.closing.ok() || !item.item->entry->durable()) return following;
  // A durable session is written only at whole states, so its item is cut
  // into stretches of durable_ack_tokens: a piece that reaches the end of
  // its stretch has none following (it runs every layer where needed and
  // leaves the state whole, written and acknowledged); the pieces before it
  // count only the tokens up to that end.
  const int64_t stretch = options_.durable_ack_tokens;
  if (stretch <= 0) return 0;
  const int64_t stretch_end = (item.done / stretch + 1) * stretch;
  return end >= stretch_end ? 0 : std::min(following, stretch_end - end);
}

void Scheduler::EngineLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    // A scored item waiting for its caller to take its scores does not wake
    // the engine (it would form empty steps); its caller's delivery does.
    work_ready_.wait(lock, [&] {
      return stopping_ || std::any_of(queue_.begin(), queue_.end(), [&](const Queued* q) {
               return !WaitsForScoreCallerLocked(*q);
             });
    });
    // Generating sessions are between two tokens: let them rejoin first
    // (each for at most decode_resubmit_wait after its last item ended, so
    // a stalled handler is not waited for at all).
    // Deleting a generating session, or cancelling its call, does not wake
    // this wait, and need not: the wait for that session ends
    // decode_resubmit_wait (1 ms; an option, not a flag) after its last
    // item ended, as it would for a live one, so at most that long is spent
    // on a token that will not come. Its handler usually ends it sooner: it
    // sees the deletion at its next RunStep or Run, the cancellation at its
    // next IsCancelled() (the synchronous gRPC API tells nobody else), and
    // then either ends its Generating scope or queues an item, each of which
    // wakes this wait; ResubmitDeadlineLocked then skips a deleted session.
    // A handler that notices later (blocked writing to its client) is past
    // the wait anyway.
    while (!stopping_) {
      const std::optional<TimePoint> until =
          ResubmitDeadlineLocked(std::chrono::steady_clock::now());
      if (!until.has_value()) break;
      work_ready_.wait_until(lock, *until);
    }
    if (stopping_) {
      while (!queue_.empty()) {
        CompleteLocked(*queue_.front(), ServerStoppingError("the server is shutting down"));
      }
      item_changed_.notify_all();
      return;
    }
    StepRecord record;
    std::vector<Planned> plan = FormStepLocked(record);
    item_changed_.notify_all();  // items that were stopped
    if (plan.empty()) continue;
    lock.unlock();

    // 4. Claim each session; a deleted one is not run.
    std::vector<StepEntry> entries;
    std::vector<Planned*> running;
    for (Planned& piece : plan) {
      absl::StatusOr<Session*> session = piece.queued->item->entry->BeginStep();
      if (!session.ok()) {
        piece.claim = session.status();
        continue;
      }
      piece.session = *session;
      if (piece.offset == 0 && !piece.queued->item->entry->state_whole()) {
        piece.queued->inherited_debt = true;
        piece.queued->skipped = true;
      }
      const WorkItem& item = *piece.queued->item;
      std::vector<float>* logits = nullptr;
      if (item.score_top_logprobs.has_value()) {
        // Scored: the piece's logits (its rows run every layer); the first
        // token is scored from the session's last logits, if it has them.
        if (!piece.queued->scorer.has_value()) {
          piece.queued->scorer.emplace(*TokenScorer::Create(
              *item.score_top_logprobs, piece.session->last_logits(),
              {static_cast<int32_t>(piece.session->config().chunk_id),
               static_cast<int32_t>(piece.session->config().pad_id)}));
        }
        logits = &piece.logits;
      }
      entries.push_back({piece.session, item.tokens.subspan(piece.offset, piece.count),
                         item.allow_pad, logits, piece.tokens_following});
      running.push_back(&piece);
      record.pieces.push_back({item.entry, piece.count, item.kind});
    }

    // 5. Run the step, release the claims.
    std::vector<absl::Status> results;
    double seconds = 0;
    if (!entries.empty()) {
      if (options_.on_step_formed) options_.on_step_formed(record);
      auto skipped = [&](size_t i) {
        return entries[i].session->backend_session().stats().upper_rows_skipped;
      };
      for (size_t i = 0; i < running.size(); ++i) running[i]->rows_skipped = -skipped(i);
      const auto start = options_.clock();
      results = drt::RunStep(backend_, entries);
      seconds = std::chrono::duration<double>(options_.clock() - start).count();
      for (size_t i = 0; i < running.size(); ++i) {
        running[i]->rows_skipped += skipped(i);
        record.upper_rows_skipped += running[i]->rows_skipped;
      }
      // Scored pieces become scores here, on the engine thread, and their
      // logits go (docs/api.md, "Prompt logprobs": why here and its cost).
      // A scoring failure (non-finite logits) fails the item once the step
      // is noted and written: its tokens were applied and its state is as
      // whole as the step left it, so it is not marked otherwise.
      std::vector<absl::Status> score_failures(running.size());
      for (size_t i = 0; i < running.size(); ++i) {
        Planned& piece = *running[i];
        if (entries[i].all_logits == nullptr || !results[i].ok()) continue;
        score_failures[i] = piece.queued->scorer->Score(
            entries[i].tokens, piece.logits, piece.session->config().vocab_size, &piece.scores);
        std::vector<float>().swap(piece.logits);
      }
      // Which sessions owe a write now (SessionEntry::NoteStep); they are
      // written together (group commit), then every claim is released.
      std::vector<std::function<absl::Status()>> writes;
      std::vector<size_t> writers;
      for (size_t i = 0; i < running.size(); ++i) {
        // The state is short while rows of the item skipped the upper
        // layers and its tokens after this piece still owe them, and when
        // the step computed no logits for this piece (its last logits are
        // the ones before it): both are made whole by a piece with none
        // following.
        // A failed piece leaves it whole only if it changed nothing (EndStep
        // then keeps the state as it was): tokens of an earlier forward of
        // it may be applied.
        const Planned& piece = *running[i];
        const bool closes =
            piece.tokens_following == 0 &&
            (!piece.queued->inherited_debt ||
             piece.offset + piece.count > backend_.upper_layer_reach());
        running[i]->whole =
            results[i].ok() &&
            (closes || (!piece.queued->skipped && piece.rows_skipped == 0 &&
                        !drt::RunStepSkipsLastLogits(backend_, entries[i])));
        SessionEntry* entry = running[i]->queued->item->entry;
        if (entry->NoteStep(results[i], running[i]->whole)) {
          writes.push_back([entry] { return entry->WriteStep(); });
          writers.push_back(i);
        }
      }
      // Every result is delivered only after its own write returned (below,
      // under the lock); a failed write fails only its own item.
      const std::vector<absl::Status> written =
          RunConcurrently(writes, options_.concurrent_writes);
      for (size_t k = 0; k < writers.size(); ++k) results[writers[k]] = written[k];
      for (size_t i = 0; i < running.size(); ++i) {
        if (results[i].ok()) results[i] = score_failures[i];
      }
      for (size_t i = 0; i < running.size(); ++i) {
        // A session deleted during the step goes to its caller to free
        // (Run), once the step's results are delivered.
        Queued& queued = *running[i]->queued;
        results[i] = queued.item->entry->ReleaseStep(std::move(results[i]),
                                                     &queued.deleted_session);
      }
      // The budget learns the full and the lower-only prefill tokens'
      // costs apart (server/decode_step_budget.h): a piece's tokens whose
      // rows skipped the upper layers count as lower-only (rows are at least
      // as many as tokens).
      int64_t decode = 0, full = 0, lower_only = 0;
      for (size_t i = 0; i < record.pieces.size(); ++i) {
        const StepPiece& piece = record.pieces[i];
        if (piece.kind == WorkKind::kDecode) {
          decode += piece.tokens;
          continue;
        }
        const int64_t skipped_tokens = std::min(piece.tokens, running[i]->rows_skipped);
        lower_only += skipped_tokens;
        full += piece.tokens - skipped_tokens;
      }
      decode_budget_.Observe(decode, full, lower_only, seconds);
      if (options_.on_step_done) options_.on_step_done(record, seconds);
    }
    progress_ns_.store(NowNanoseconds());

    lock.lock();
    size_t next_result = 0;
    for (Planned& piece : plan) {
      Queued& item = *piece.queued;
      if (!piece.claim.ok()) {
        CompleteLocked(item, piece.claim);
        continue;
      }
      const absl::Status& status = results[next_result++];
      if (item.result.steps_waited < 0) {
        item.result.steps_waited = record.index - 1 - item.enqueued_after;
      }
      ++item.result.steps_ran;
      if (!status.ok()) {
        // Tokens of the step's forwards before the failing one stay applied
        // (engine/batch_step.h), as do all of them when only the write after
        // the step failed: counted as the session grew (0 once deleted).
        item.done += std::min(item.item->entry->tokens_added_in_step(), piece.count);
        CompleteLocked(item, status);
        continue;
      }
      item.done += piece.count;
      item.scores.insert(item.scores.end(), std::make_move_iterator(piece.scores.begin()),
                         std::make_move_iterator(piece.scores.end()));
      item.skipped |= piece.rows_skipped > 0;
      item.owed = !piece.whole;
      if (piece.whole || !item.item->entry->durable()) item.acknowledged = item.done;
      const int64_t size = static_cast<int64_t>(item.item->tokens.size());
      if (item.done == size) {
        CompleteLocked(item, absl::OkStatus());
      } else if (item.done == item.end()) {  // the end of its closing stretch
        absl::Status closing = std::move(item.closing);
        if (item.closing_by_caller) {  // even if a Refuse came after
          closing = StoppedByCaller(item.done, size);  // the count it ends with
        }
        CompleteLocked(item, std::move(closing));
      }
    }
    // Scored items whose callers now owe max_undelivered_scores are parked.
    RecountRunnableLocked();
    item_changed_.notify_all();
  }
}

}  // namespace drt::server
