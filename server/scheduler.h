// The continuous-batching scheduler: one engine thread forms engine steps
// over many sessions and runs each as one drt::RunStep (engine/batch_step.h).
//
// Handlers submit work items, "append these tokens to this session" (a
// prompt message, padding, or one generated token), and wait for them.
// Forming a step (docs/api.md, "Scheduling"):
//   1. Items whose caller stopped them (client cancel, deadline), and every
//      item once Refuse() was called, leave the queue without running (one
//      whose rows skipped the upper layers first runs a closing stretch: see
//      "Prefill rows skip the upper layers" below); so do items of deleted
//      sessions, with ABORTED, taking no share of the step.
//   2. Every queued decode item (one generated token) joins the step, oldest
//      first, up to the step's token budget: decode has priority, so a
//      generating session's next token is in the first step formed after it
//      is submitted, whatever prefill is queued, as long as no more than
//      step_tokens generated tokens wait (beyond that the newer ones wait a
//      step, and are the oldest in the next).
//   3. The rest of the budget is shared equally by the queued prefill items
//      (water-filling: an item needing less than its share leaves the rest
//      to the others; the order that gets the odd tokens rotates each step).
//      A long prefill runs as pieces over many steps, so it never holds up
//      decode for more than one step.
//   4. Each session of the step is claimed (SessionEntry::BeginStep): a
//      session deleted meanwhile fails its item with ABORTED and is not run.
//   5. drt::RunStep runs the step; each item's result is its own (one
//      session's error leaves the others untouched); a session deleted
//      during the step gets ABORTED, and its memory is freed by its own
//      caller (in Run, on its thread) once the step's results are delivered,
//      so the others' results and the next step do not wait for the free.
// Sessions join and leave between steps: an item submitted while a step runs
// is in the next one.
//
// Prefill rows skip the upper layers where that cannot change what anyone
// reads (docs/batching.md, "Lower-only prefill steps"): each prefill piece
// tells RunStep how many tokens of its item follow it
// (StepEntry::tokens_following), so a step whose rows all lie more than
// Backend::upper_layer_reach() positions before the end of their items runs
// the lower layers and the chunk encoder only; on a backend that runs mixed
// lower-only forwards (the CPU's), each such piece does so by itself, also
// in a step that carries decode, and a piece with tokens following gets no
// logits (drt::RunStepSkipsLastLogits). Until the item's later
// pieces run, the session's upper-layer state and last logits are short;
// nothing reads them meanwhile, since the caller holds the session's
// activity (no Generate, Fork or Save runs on it) and:
//   - the item's last piece has none following, so an item that ends,
//     ends with the state a full computation gives (bit for bit where the
//     steps are formed the same way either way and no step mixes slices
//     that skip with slices that do not; to the last bits of the rows'
//     GEMMs otherwise, docs/batching.md "Lower-only slices in mixed steps");
//   - an item stopped (should_stop, Refuse) after such a piece is cut short
//     to a closing stretch, then ends: its next reach + 1 tokens when rows
//     of the item skipped the upper layers, one token when only its last
//     logits are owed (or all it has left). The stretch is prefill as any
//     other (step 3 and the decode-step allowance below: a closing stretch
//     does not lengthen a decode step), so it may run over several steps,
//     except that one given no tokens for kClosingStretchMaxWaitSteps steps
//     in a row runs all it has left in the next step whatever the allowance
//     (so with the cap 0 too, a stopped item ends; kClosingStretchMaxWaitSteps
//     says within how many steps);
//     its pieces count their tokens following to the stretch's end, so
//     each lies within the reach of it, and its last has none following
//     and makes the state whole again. The item ends only then;
//   - an item that fails after such a piece (an engine error) leaves the
//     state short: the step is marked not whole (SessionEntry::EndStep),
//     and SessionEntry::CheckStateWhole refuses Generate, Fork and Save by
//     name until a later item's piece with none following, at least the
//     reach + 1 tokens into that item, completes it (Queued::inherited_debt);
//   - a durable session (SessionEntry::durable, --state_dir) is written
//     only after steps that leave its state whole (SessionEntry::EndStep;
//     never after a Generate's steps, which are written when it ends,
//     SessionEntry::WritesAtActivityEnd; the sessions of one step that owe
//     a write are written together, SchedulerOptions::concurrent_writes),
//     and its caller is told of progress (on_progress) only up to those:
//     every state written, and every token acknowledged, is one a full
//     computation gives. Its items are cut into stretches of
//     options.durable_ack_tokens whose last piece has none following, so
//     a durable Append is written and acknowledged at least that often;
//   - a session deleted meanwhile is gone, nothing reads it; so is one whose
//     item ends because the scheduler is destroyed (the server exits).
//
// Two rules keep a generating session's time per token bounded while others
// prefill (issue 11):
//   - A handler samples its next token between steps, so for a moment after
//     each step its decode item is not queued. While a session is marked
//     generating (Generating), the engine waits for its next decode item, at
//     most options.decode_resubmit_wait, before forming a step; otherwise a
//     prefill-only step formed in that gap would hold the token up for a
//     whole step, and generating sessions would fall into separate steps
//     instead of one batch.
//   - A step that holds decode items takes only as much prefill as keeps its
//     predicted time within options.decode_slowdown_limit times a
//     decode-only step of the same decode tokens, and at least one token
//     (server/decode_step_budget.h: the estimates, the arithmetic, the share
//     prefill keeps); options.decode_step_prefill_tokens caps it further.
//     A step formed while a session is marked generating but without its
//     token (its handler was later than the wait) is bounded the same way
//     (DecodeStepBudget::GapPrefillTokens), so the token waits for a short
//     step, not a whole prefill step.
// Both rules apply only to a handler that is turning a token around: one
// whose last item ended within decode_resubmit_wait (the wait) or
// decode_stall_after (the gap bound). A handler away longer, say blocked
// writing to a client that stopped reading, is stalled: the engine neither
// waits for it nor bounds prefill for it, so it costs the other sessions
// nothing until it submits again (its token then goes first, as any decode).
// Neither applies to a deleted session's handler, which generates no more
// (while it frees the session, step 5, its Generating scope still lives).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/token_scores.h"
#include "server/decode_step_budget.h"

namespace drt::server {

class SessionEntry;

// SchedulerOptions::step_tokens for a Scheduler built directly (tests,
// benches): 64 chunks of 63 tokens (4096 positions with their landmarks).
// Not the server's default: drt-server always sets step_tokens, to
// --step_tokens or else to what fills the backend's step (drt_service.cc,
// StepTokens: 1008 tokens, 1024 positions, by default; docs/api.md,
// "Scheduling").
constexpr int64_t kDefaultStepTokens = 4032;

// A handler turns a token around (write it out, sample the next) in tens of
// microseconds; 1 ms bounds what a stalled one can cost the others per step.
constexpr int64_t kDefaultDecodeResubmitWaitUs = 1000;

// A generating session's handler that has not submitted its next token this
// long after its last one was appended is stalled (SchedulerOptions::
// decode_stall_after): a healthy handler turns a token around in tens of
// microseconds, and a gRPC Write blocks only once a client left about 4 MB
// of messages unread, hundreds of thousands of tokens. Until then steps
// formed without its token stay short; 200 ms bounds that cost to a few
// steps, and a handler late by more pays at most one whole prefill step.
constexpr int64_t kDefaultDecodeStallAfterMs = 200;

// A durable session's Append is written and acknowledged at least every this
// many tokens (SchedulerOptions::durable_ack_tokens): about 2 s of ingest at
// the CPU's 15K tokens/s, while the rows that then run every layer (the
// upper-layer reach, a few hundred positions, rounded up to a forward) cost
// a few percent of a stretch.
constexpr int64_t kDefaultDurableAckTokens = 32768;
// SchedulerOptions::max_undelivered_scores: 8192 tokens' scores at top 20
// hold about 8192 * 200 B = 1.6 MB per scored item (TokenScore and its 20
// alternatives), and are 16 events of at most 512 tokens to write.
constexpr int64_t kDefaultMaxUndeliveredScores = 8192;

// A stopped item's closing stretch (below, "Prefill rows skip the upper
// layers") that the decode-step allowance gave no tokens for this many steps
// in a row runs all it has left in the next step, whatever the allowance and
// --decode_step_prefill_tokens (as in a step without decode), and in every
// step after until it ends. The bound this gives (docs/batching.md, "Lower-only
// prefill steps in the server"): a stretch that no step gives tokens under the
// allowance (the cap 0, every step carrying a generated token) ends within this
// many steps + 1 of its stop, where the step's room (step_tokens less its
// decode tokens and the stretches overdue ahead of it) holds it, else in the
// steps after, each giving it all the room. A step that gives it any token
// starts the count again, so where steps give it a few (the time limit's
// allowance, shared with the other prefill; a gap step) it ends within this
// many x its tokens steps, plus what the room then needs; it usually moves
// faster, by the allowance each step. Before this rule, with the cap 0 it
// waited for a pause in generation, its handler blocked and its session busy.
// Why 8: the price is one long step for the generating sessions (decode + at
// most reach + 1 prefill tokens, stretches overdue together sharing it) per
// stop, after 8 steps held to the cap; a larger K makes that rarer only where
// stops come faster than every K steps, while the stopped item's session stays
// busy K + 1 decode steps (a fraction of a second, sooner than a client
// retries).
constexpr int64_t kClosingStretchMaxWaitSteps = 8;

enum class WorkKind {
  kPrefill,  // prompt tokens or padding: shares the step budget, split over steps
  kDecode,   // a generated token: goes first, into the next step whole
};

// One request of a handler: append `tokens` to `entry`'s session.
struct WorkItem {
  // The caller holds the entry's activity (SessionEntry::Begin) for as long
  // as the item runs, so a session has at most one item at a time.
  SessionEntry* entry = nullptr;
  absl::Span<const int32_t> tokens;  // at least one; must outlive Run()
  WorkKind kind = WorkKind::kPrefill;
  bool allow_pad = false;  // the engine's own padding (Generate's pad_to_chunk_boundary)
  // Checked under the scheduler's lock each time a step is formed; true ends
  // the item there with CANCELLED (tokens appended in earlier steps stay).
  // Must be cheap and must not call the scheduler.
  std::function<bool()> should_stop;
  // Called on the caller's thread, between its waits, with the tokens
  // appended so far, after steps that ran part of the item (not after every
  // step when the caller is slower than the engine). The engine goes on
  // meanwhile.
  std::function<void(int64_t tokens_done)> on_progress;
  // Set: score the item's tokens (prompt logprobs, engine/token_scores.h)
  // with this many top alternatives each ([0, kMaxTopLogprobs], else Run
  // refuses the item with INVALID_ARGUMENT before queueing it). Its pieces
  // then ask RunStep for their logits (so they run every layer and never
  // skip to a closing stretch of their own) and the engine thread scores
  // them right after the step, keeping only the scores. Token 0 is scored
  // from the session's last logits when it has them (Session::last_logits).
  std::optional<int32_t> score_top_logprobs;
  // With score_top_logprobs: called on the caller's thread with the scores
  // of the next tokens, in order, before the on_progress call that covers
  // them (a durable session's scores only up to the acknowledged tokens),
  // and once more before Run returns with those of every token appended
  // (tokens of a step that failed get none).
  std::function<void(std::vector<TokenScore> scores)> on_scores;
};

struct WorkResult {
  // OK once every token is appended. Otherwise the reason it ended:
  // CANCELLED (should_stop), ABORTED (session deleted), the engine's error
  // (INVALID_ARGUMENT for tokens it refuses), or Refuse()'s status.
  absl::Status status;
  int64_t tokens_done = 0;  // appended before it ended, also on error
  // Steps formed between the item's submission and the first step it ran
  // in: 0 when it was in the very next step. -1 when it never ran.
  int64_t steps_waited = -1;
  int64_t steps_ran = 0;  // steps it had a piece in
};

// What a formed step holds, for tests and metrics.
struct StepPiece {
  const SessionEntry* entry = nullptr;
  int64_t tokens = 0;
  WorkKind kind = WorkKind::kPrefill;
};
struct StepRecord {
  int64_t index = 0;  // 1 for the first step the scheduler formed
  std::vector<StepPiece> pieces;  // decode items first, in the order run
  // Rows of the step that ran through the lower layers only
  // (BackendSessionStats::upper_rows_skipped); set once the step ran.
  int64_t upper_rows_skipped = 0;
  int64_t tokens() const;
};

struct SchedulerOptions {
  // The step's token budget, shared by decode and prefill items (the
  // server sets it; see kDefaultStepTokens).
  int64_t step_tokens = kDefaultStepTokens;
  // A step that holds decode items takes only as much prefill as keeps its
  // predicted time within this many times a decode-only step (>= 1; 0: no
  // time limit). Trades generating sessions' time per token against prefill
  // throughput while both run (server/decode_step_budget.h, docs/api.md,
  // Scheduling).
  double decode_slowdown_limit = kDefaultDecodeSlowdownLimit;
  // A fixed cap on the prefill tokens of a step that holds decode items, on
  // top of the time limit; kNoPrefillTokenCap: none. 0: such steps carry no
  // prefill.
  int64_t decode_step_prefill_tokens = kNoPrefillTokenCap;
  // How long the engine waits, before forming a step, for a generating
  // session's next decode item (see Generating).
  // Measured from the end of the session's last item (or the start of its
  // Generating scope): a handler later than this is not waited for.
  std::chrono::microseconds decode_resubmit_wait{kDefaultDecodeResubmitWaitUs};
  // A generating session whose handler has not submitted for this long after
  // its last item ended (or its Generating scope began) is stalled: steps
  // formed without its token are no longer bounded for it (nor waited for).
  // Taken as at least decode_resubmit_wait.
  std::chrono::microseconds decode_stall_after{
      std::chrono::milliseconds(kDefaultDecodeStallAfterMs)};
  // Tell the engine how many tokens of an item follow each of its prefill
  // pieces, so that rows far from the item's end skip the upper layers
  // where the backend runs lower-only forwards (see above). Off: every
  // piece is run as if it ended its item (tests compare the two).
  bool skip_upper_layers = true;
  // A durable session's prefill item may skip upper-layer rows only within
  // stretches of this many tokens (counted from the item's start): the piece
  // that ends a stretch leaves the state whole, so it is written and
  // acknowledged then. Bounds the acknowledged tokens' lag (and the chunks
  // held only in memory) to a stretch plus a step. <= 0: a durable session
  // never skips (every step written, as with skip_upper_layers off).
  int64_t durable_ack_tokens = kDefaultDurableAckTokens;
  // A scored item (WorkItem::score_top_logprobs) gets no piece of a step
  // while this many scores or more of its acknowledged tokens wait for its
  // caller to take them (its handler is writing to a slow client): the
  // engine, not the caller, waits, so the scores held for an item stay
  // below this plus a step's and a durable stretch's tokens, whatever the
  // message size (back-pressure; the other items run on). >= 1.
  int64_t max_undelivered_scores = kDefaultMaxUndeliveredScores;
  // Durable sessions of one step that owe a write (their Append stretches
  // end in it) are written at once, one thread each, and the step's results
  // are delivered once all are written (group commit): the step costs one
  // write latency, not one per session. False writes them one after
  // another. drt-server turns it off on the CUDA backend, whose sessions'
  // state reads (device copies) have not been run from other threads.
  bool concurrent_writes = true;
  // Called on the engine thread with each step once formed and its sessions
  // claimed, before it runs (a test may block it to hold the step running).
  std::function<void(const StepRecord&)> on_step_formed;
  // The clock that times steps for the decode budget and on_step_done: read
  // once just before and once just after each step runs (a test injects a
  // fake one that makes a step's duration a function of its contents).
  std::function<std::chrono::steady_clock::time_point()> clock = [] {
    return std::chrono::steady_clock::now();
  };
  // Called on the engine thread after each step ran, with its duration.
  std::function<void(const StepRecord&, double seconds)> on_step_done;
  // Called on a caller's thread in Run() just before item.on_progress, with
  // no lock held (a test delays it there, as a descheduled handler on a
  // loaded machine is delayed, while the engine runs on).
  std::function<void()> before_progress;
  // Called by the destructor once no further step will be formed, before it
  // waits for the running one (a test holding a step releases it then).
  std::function<void()> on_stopping;
};

class Scheduler {
 public:
  // options.step_tokens below 1 is taken as 1.
  Scheduler(Backend& backend, SchedulerOptions options);
  // Ends queued items with UNAVAILABLE, waits for callers still inside
  // Run() to leave, and joins the engine thread.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues the item and waits until it is done (see WorkResult). Once
  // Refuse() was called, returns Refuse's status without queueing.
  // INVALID_ARGUMENT for an item without entry or tokens.
  WorkResult Run(const WorkItem& item);

  // From now on Run() returns `status` (not OK) instead of queueing, and
  // queued items end with it when the next step is formed (keeping what
  // earlier steps appended): every call that runs engine work ends at its
  // next step with it. Used at the end of a drain's grace period.
  void Refuse(absl::Status status);
  // Whether Refuse() was called: the server is stopping, and no call's
  // engine work runs any more. A handler whose call ended CANCELLED from
  // then on (gRPC's shutdown cancels the calls still held, say one blocked
  // writing to a client that stopped reading) was cut by the stop, whatever
  // status it saw (DrtService::Generate).
  bool refused() const;

  // Marks a session as generating for the object's life (Generate's token
  // loop): between its decode items the engine waits for the next one
  // (SchedulerOptions::decode_resubmit_wait) before forming a step, and
  // bounds the prefill of steps formed without it, for as long as its
  // handler is not stalled (SchedulerOptions::decode_stall_after).
  class Generating {
   public:
    Generating(Scheduler& scheduler, const SessionEntry* entry);
    ~Generating();
    Generating(const Generating&) = delete;
    Generating& operator=(const Generating&) = delete;

   private:
    Scheduler& scheduler_;
    const SessionEntry* entry_;
  };

  int queued() const;          // items waiting or partly done

  // What liveness reads (server/engine_watchdog.h): the items waiting or
  // partly done that the engine can run, and when the engine last made
  // progress: a step finished, or an item it can run arrived (or became
  // runnable again) while it had none. A scored item parked because its
  // caller has not taken its scores (max_undelivered_scores: a client that
  // does not read) is not counted: the engine is not stuck, it waits for
  // that client, and liveness failing would restart a healthy server
  // (review-server F1). Lock-free, so that a caller is not held up by an
  // engine that is stuck with the scheduler's lock.
  struct EngineProgress {
    int queued = 0;
    std::chrono::steady_clock::time_point since{};
  };
  EngineProgress engine_progress() const;
  int64_t steps_formed() const;
  int64_t step_tokens() const { return step_tokens_; }

 private:
  struct Queued;
  struct Planned;
  void EngineLoop();
  // Under mutex_: ends stopped items, picks the pieces of the next step.
  std::vector<Planned> FormStepLocked(StepRecord& record);
  // Under mutex_: the pieces of prefill `items` (not empty) sharing `left`
  // (> 0) tokens, under the decode-step allowance when the step holds
  // `decode_tokens` > 0 or sessions generate (step 3 above).
  std::vector<Planned> SharePrefillLocked(std::vector<Queued*> items, int64_t left,
                                          int64_t decode_tokens);
  // The item's next `count` tokens as a prefill piece, with the tokens
  // following it when rows may skip the upper layers.
  Planned PrefillPiece(Queued* item, int64_t count) const;
  // StepEntry::tokens_following of the item's next `count` tokens.
  int64_t TokensFollowing(const Queued& item, int64_t count) const;
  // Whether RunStep is expected to run `piece` lower-only (for the decode
  // budget's prediction only; what ran is what it learns from).
  bool PredictedLowerOnly(const Planned& piece) const;
  void CompleteLocked(Queued& item, absl::Status status);
  using TimePoint = std::chrono::steady_clock::time_point;
  // A session inside a Generating scope.
  struct GeneratingSession {
    int scopes = 0;          // nested scopes are allowed
    TimePoint last_ended{};  // its last item ended, or its first scope began
  };
  // Under mutex_: the latest time until which the engine waits for a
  // generating session without an item queued (its last item ended less
  // than decode_resubmit_wait before); nullopt when it waits for none.
  std::optional<TimePoint> ResubmitDeadlineLocked(TimePoint now) const;
  // Under mutex_: generating sessions whose handlers are not stalled at `now`.
  int64_t ActiveGeneratingLocked(TimePoint now) const;
  bool QueuedLocked(const SessionEntry* entry) const;
  // A scored item whose caller has not yet taken max_undelivered_scores or
  // more scores of acknowledged tokens: it gets no piece until it has.
  bool WaitsForScoreCallerLocked(const Queued& item) const;
  // Under mutex_, wherever the queue or an item's parking changes: sets
  // queued_items_ to the items that can run, and restarts the progress
  // clock when there were none and now are.
  void RecountRunnableLocked();

  Backend& backend_;
  const int64_t step_tokens_;
  SchedulerOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable work_ready_;    // engine thread: an item was queued
  std::condition_variable item_changed_;  // callers: progress or completion
  std::condition_variable callers_gone_;  // destructor: no caller in Run()
  std::list<Queued*> queue_;              // arrival order
  int callers_ = 0;
  bool stopping_ = false;
  absl::Status refusal_;  // OK until Refuse()
  int64_t steps_formed_ = 0;
  size_t rotation_ = 0;  // which prefill item gets the odd tokens first
  // Prefill allowed in steps that hold decode; used by the engine thread only.
  DecodeStepBudget decode_budget_;
  // Sessions inside a Generating scope.
  std::map<const SessionEntry*, GeneratingSession> generating_;
  // engine_progress(): items queued that can run (RecountRunnableLocked)
  // and the time of the last progress, in steady_clock nanoseconds.
  std::atomic<int> queued_items_{0};
  std::atomic<int64_t> progress_ns_{0};
  std::thread engine_;   // last: starts once the members above exist
};

}  // namespace drt::server
