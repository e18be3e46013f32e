#include "server/drt_service.h"

#include <algorithm>
#include <functional>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <grpcpp/support/method_handler.h>

#include "absl/strings/str_format.h"
#include "engine/model_rules.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/top_logprobs.h"
#include "engine/tokenizer/streaming_encoder.h"
#include "server/bearer_token.h"
#include "server/concurrent_calls.h"
#include "server/engine_watchdog.h"
#include "server/limits.h"
#include "server/prefix_cache.h"
#include "server/prompt_logprobs.h"
#include "server/request_parsing.h"
#include "server/scheduler.h"
#include "server/session_id.h"
#include "server/session_file.h"
#include "server/session_manager.h"
#include "server/status_util.h"
#include "server/stop_status.h"
#include "server/tokenize_calls.h"

namespace drt::server {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The scheduler's step token budget: --step_tokens (which main also gives
// the backend as its forward size), or else the tokens that fill the
// backend's step, Backend::max_step_positions (the one step-size knob):
// positions hold one landmark per enc_chunk_size tokens.
int64_t StepTokens(const Backend& backend, int64_t requested) {
  if (requested > 0) return requested;
  return StepTokensForPositions(backend.config(), backend.max_step_positions());
}

// Progress messages at most this often (plus one per message received).
constexpr double kProgressIntervalSeconds = 0.1;
// Generate ends itself (FINISH_REASON_DEADLINE) this long plus two of its
// slowest steps before the call's deadline, so that every generated token
// and the final message reach the client (docs/api.md, "Generate").
constexpr double kDeadlineMarginSeconds = 0.2;

// `scheduler`: the service's, set before any step is formed.
SchedulerOptions SchedulerOptionsFor(const Backend& backend, const ServiceOptions& service,
                                     Metrics& metrics,
                                     const std::unique_ptr<Scheduler>& scheduler) {
  SchedulerOptions options;
  options.step_tokens = StepTokens(backend, service.step_tokens);
  options.decode_slowdown_limit = service.decode_slowdown_limit;
  options.decode_step_prefill_tokens = service.decode_step_prefill_tokens;
  options.durable_ack_tokens = service.durable_ack_tokens;
  // Group commit reads sessions' state from one thread per session: only
  // where the backend says it may (the CPU backend, and one wrapping it).
  options.concurrent_writes = backend.exports_sessions_concurrently();
  options.before_progress = service.before_progress_for_test;
  if (service.on_step_formed_for_test) {
    options.on_step_formed = [hook = service.on_step_formed_for_test,
                              &scheduler](const StepRecord& step) {
      hook(step, *scheduler);
    };
  }
  options.on_step_done = [&metrics](const StepRecord& step, double seconds) {
    int64_t decode = 0, prefill = 0;
    for (const StepPiece& piece : step.pieces) {
      (piece.kind == WorkKind::kDecode ? decode : prefill) += piece.tokens;
    }
    metrics.ObserveEngineStep(decode, prefill, seconds);
  };
  return options;
}

// The engine's parameters for drt.v1's; ValidateSamplingParams checks them,
// except top_p, whose range here differs from the engine's (0, 1]: the
// proto's 0 means off (engine 1), so its message states [0, 1].
absl::StatusOr<SamplingParams> FromProto(const drt::v1::SamplingParams& p) {
  if (!(p.top_p() >= 0.f && p.top_p() <= 1.f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_p must be in [0, 1] (0 or 1: off), got %g", p.top_p()));
  }
  SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = p.top_k();
  s.top_p = p.top_p() == 0.f ? 1.f : p.top_p();
  s.seed = p.seed();
  s.min_p = p.min_p();
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  s.logit_bias.insert(p.logit_bias().begin(), p.logit_bias().end());
  return s;
}

// Where one Append's or Complete's prompt pieces go: tokenizes text pieces
// in a stream, checks limits, runs the engine in bounded steps, reports.
class PromptIngest {
 public:
  // `chunk_size`: the model's enc_chunk_size (the chunks reported).
  // `entry`: the session the prompt goes to, claimed by the caller; null
  // for a Complete with the prefix cache (set_prefix_hold), whose session
  // is chosen once the tokens held decide it.
  PromptIngest(grpc::ServerContext* context, SessionEntry* entry, const Tokenizer& tokenizer,
               int64_t chunk_size, SessionManager& sessions, Scheduler& scheduler,
               Metrics& metrics)
      : context_(context),
        entry_(entry),
        chunk_size_(chunk_size),
        acknowledged_tokens_(entry != nullptr ? entry->tokens() : 0),
        encoder_(tokenizer),
        sessions_(sessions),
        scheduler_(scheduler),
        metrics_(metrics),
        start_(Clock::now()),
        last_progress_(start_),
        tokenizer_(tokenizer) {}

  // Adds the piece of an AppendRequest or CompleteRequest, the
  // `index`-th message of its stream (named in INVALID_ARGUMENT messages).
  template <typename Request>
  absl::Status AddMessage(const Request& request, int64_t index) {
    absl::Status status;
    if (request.has_tokens()) {
      status = AddTokens(request.tokens().ids());
    } else if (request.piece_case() == Request::kText) {
      status = AddText(request.text());
    } else if (request.piece_case() == Request::kTextBytes) {
      status = AddText(request.text_bytes());
    }
    if (status.code() == absl::StatusCode::kInvalidArgument) {
      return absl::InvalidArgumentError(absl::StrFormat("message %d: %s", index, status.message()));
    }
    return status;
  }

  absl::Status AddText(const std::string& text) {
    // Text is tokenized a word behind: the ids may include text held back
    // from earlier pieces and leave this piece's last word for later. That
    // earlier text belongs to the earlier messages: when this one is
    // refused before any of it ran, it is withdrawn and the earlier text
    // runs alone (KeepEarlier), as when a later message does not parse.
    auto ids = encoder_.Push(text);
    if (!ids.ok()) return ids.status();
    // The last word held back now runs later (with the next piece, or at
    // the end of the stream), after the rest of this message: it is checked
    // against the context limit now, with the rest, so that a message that
    // does not fit is refused before any of it runs.
    // It is encoded only when a bound from its bytes would not fit (so not
    // again on every piece of a long text without whitespace).
    const int64_t room =
        context_limit() - session_tokens() - static_cast<int64_t>(ids->size());
    auto tail_ids = encoder_.PendingIdsWithin(room);
    if (!tail_ids.ok()) return tail_ids.status();
    const int64_t tail = *tail_ids;
    const int64_t ingested_before = ingested_;
    absl::Status status = CheckContextLimit(
        static_cast<int64_t>(ids->size()) + tail,
        absl::StrFormat("the text so far brings %d more: %d now and %d of the last word, which "
                        "waits for the next piece or the end of the stream",
                        static_cast<int64_t>(ids->size()) + tail, ids->size(), tail));
    if (status.ok()) {
      status = Run(*ids, absl::StrFormat("the text so far completes %d more (%d bytes of an "
                                         "unfinished word wait for the next piece or the end "
                                         "of the stream)",
                                         ids->size(), encoder_.pending_bytes()));
    }
    const bool refused = status.code() == absl::StatusCode::kResourceExhausted ||
                         status.code() == absl::StatusCode::kInvalidArgument;
    if (refused && ingested_ == ingested_before) {
      encoder_.Withdraw();
      return KeepEarlier(status);
    }
    return status;
  }
  absl::Status AddTokens(const google::protobuf::RepeatedField<int32_t>& tokens) {
    // Text before these ids is complete now.
    if (absl::Status s = Flush(); !s.ok()) return s;
    return Run(std::vector<int32_t>(tokens.begin(), tokens.end()),
               absl::StrFormat("this piece brings %d more", tokens.size()));
  }
  // The end of the prompt: Flush, then the tokens still held for the
  // prefix cache (set_prefix_hold) run.
  absl::Status FinishPrompt() {
    if (absl::Status s = Flush(); !s.ok()) return s;
    if (holding_) return Release();
    return absl::OkStatus();
  }
  absl::Status Flush() {
    const size_t pending = encoder_.pending_bytes();
    auto ids = encoder_.Finish();
    if (!ids.ok()) return ids.status();
    return Run(*ids, absl::StrFormat("the text held back so far (the last word, %d byte%s) "
                                     "brings %d more",
                                     pending, pending == 1 ? "" : "s", ids->size()));
  }
  // For a message refused with nothing of it run, after which the call
  // ends: the earlier messages are kept whole, so the text they left held
  // back (their last word) runs now. Returns `refused`, naming also why
  // that text could not run when it could not (`earlier_kept` false then).
  absl::Status KeepEarlier(const absl::Status& refused, bool* earlier_kept = nullptr) {
    const absl::Status flushed = FlushAtStreamEnd();
    if (earlier_kept != nullptr) *earlier_kept = flushed.ok();
    if (flushed.ok()) return refused;
    return absl::Status(refused.code(),
                        absl::StrFormat("%s (the text of the earlier messages was not completed "
                                        "either: %s)",
                                        refused.message(), flushed.message()));
  }

  // For the end of the stream between messages, each of which ran whole:
  // the text they hold back (their last word) runs now, also when the call
  // was cut (the client's cancel or deadline, a transport error, a message
  // gRPC refused itself as over its receive limit, which cancels the call),
  // so that every message received is kept whole. (A cut during a message
  // ends it at a step: that message is not whole, and its last word, held
  // back, is dropped.)
  absl::Status FlushAtStreamEnd() {
    ended_between_messages_ = true;
    return Flush();
  }

  // Called after every engine step (Append sends progress from it, so a
  // large message still shows progress while it is ingested).
  void set_on_step(std::function<void()> on_step) { on_step_ = std::move(on_step); }
  // Score every token from now on with `top` alternatives (checked by the
  // caller: [0, kMaxTopLogprobs]); `on_scores` gets each batch's event, on
  // this call's thread, before the progress that covers it.
  void set_scoring(int32_t top, std::function<void(const drt::v1::PromptLogprobs&)> on_scores) {
    score_top_ = top;
    on_scores_ = std::move(on_scores);
  }

  // Where a Complete with the prefix cache starts (set_prefix_hold).
  struct PrefixStart {
    SessionEntry* entry = nullptr;  // the call's session, claimed (kAppending)
    int64_t reused = 0;             // of the tokens held, those it holds already
    // The snapshot's scores (one per reused token at least), for a scored
    // call that reused tokens; its first `reused` are sent as the prompt's.
    const std::vector<TokenScore>* stored_scores = nullptr;
    // > reused: run the held tokens up to here, call `snapshot`, then the rest.
    int64_t snapshot_at = 0;
  };
  // Prefix reuse (server/prefix_cache.h): the prompt's tokens are held in
  // `matcher` while a snapshot could still match them (PrefixMatcher::open),
  // then `decide` picks the session (a fork of the hit, or a new one) and
  // the held tokens it does not hold run. `snapshot` keeps a snapshot of the
  // session at PrefixStart::snapshot_at (prompt_ids() and kept_scores() are
  // the snapshot's then). Also records the prompt's ids and, when scored,
  // its scores (for the snapshot at the prompt's end).
  void set_prefix_hold(PrefixMatcher* matcher, std::function<absl::StatusOr<PrefixStart>()> decide,
                       std::function<void()> snapshot) {
    matcher_ = matcher;
    decide_ = std::move(decide);
    snapshot_ = std::move(snapshot);
    holding_ = true;
    record_ = true;
  }
  // With set_prefix_hold: the prompt's ids so far, and their scores when
  // the call is scored (set_scoring).
  const std::vector<int32_t>& prompt_ids() const { return prompt_ids_; }
  std::vector<TokenScore>& kept_scores() { return kept_scores_; }
  // Prompt tokens the session held already (a prefix-cache hit).
  int64_t reused() const { return reused_; }
  SessionEntry* entry() const { return entry_; }

  bool progress_due() const { return SecondsSince(last_progress_) >= kProgressIntervalSeconds; }
  // What the scheduler acknowledged (WorkItem::on_progress), not the live
  // figures of the session: the engine runs ahead of the acknowledgement,
  // and for a durable session (--state_dir) only acknowledged tokens are on
  // disk, so a client that resends from session_tokens after a crash loses
  // nothing.
  drt::v1::AppendProgress Progress() {
    last_progress_ = Clock::now();
    drt::v1::AppendProgress p;
    p.set_tokens_ingested(ingested_);
    p.set_chunks_ingested(acknowledged_tokens_ / chunk_size_);
    p.set_session_tokens(acknowledged_tokens_);
    p.set_elapsed_seconds(SecondsSince(start_));
    return p;
  }
  drt::v1::AppendSummary Summary() const {
    drt::v1::AppendSummary s;
    const double elapsed = SecondsSince(start_);
    s.set_tokens_ingested(ingested_);
    s.set_session_tokens(entry_->tokens());
    s.set_session_chunks(entry_->chunks());
    s.set_elapsed_seconds(elapsed);
    s.set_tokens_per_second(elapsed > 0 ? ingested_ / elapsed : 0.0);
    s.set_scored_tokens(scored_tokens_);
    s.set_logprob_sum(logprob_sum_);
    return s;
  }
  int64_t ingested() const { return ingested_; }
  double engine_seconds() const { return engine_seconds_; }

 private:
  // RESOURCE_EXHAUSTED when `tokens` more would pass the session's context
  // limit; `brings` says where they come from. (SessionManager::
  // IsContextLimitRefusal knows it by kContextLimitWords.)
  absl::Status CheckContextLimit(int64_t tokens, const std::string& brings) const {
    const int64_t limit = context_limit();
    if (session_tokens() + tokens > limit) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "session %s would exceed %s of %d tokens (it holds %d, %s)",
          entry_ != nullptr ? entry_->id() : std::string("of this Complete"),
          SessionManager::kContextLimitWords, limit, session_tokens(), brings));
    }
    return absl::OkStatus();
  }
  // The session's context limit (a Complete's session, not made yet while
  // its tokens are held: the server's, which CreateEphemeral gives it).
  int64_t context_limit() const {
    return entry_ != nullptr ? entry_->settings().max_context_tokens
                             : sessions_.limits().max_context_tokens;
  }
  // The tokens the session holds, those held for the prefix cache included.
  int64_t session_tokens() const {
    return (entry_ != nullptr ? entry_->tokens() : 0) + (holding_ ? matcher_->held() : 0);
  }

  absl::Status Run(const std::vector<int32_t>& ids, const std::string& brings) {
    if (ids.empty()) return absl::OkStatus();
    // Limits are checked for the whole message before any of it runs, so a
    // refused message leaves nothing of itself behind.
    if (absl::Status s = CheckContextLimit(static_cast<int64_t>(ids.size()), brings); !s.ok()) {
      return s;
    }
    if (holding_) {
      matcher_->Push(ids);
      if (matcher_->open()) return absl::OkStatus();
      return Release();
    }
    return RunNow(ids);
  }

  // The decision of set_prefix_hold, and the held tokens' run.
  absl::Status Release() {
    holding_ = false;
    const std::vector<int32_t> held = matcher_->TakeHeld();
    absl::StatusOr<PrefixStart> start = decide_();
    if (!start.ok()) return start.status();
    entry_ = start->entry;
    acknowledged_tokens_ = entry_->tokens();
    reused_ = start->reused;
    prompt_ids_.assign(held.begin(), held.begin() + reused_);
    if (score_top_.has_value() && reused_ > 0 && start->stored_scores != nullptr) {
      // The snapshot's scores of the reused tokens, as they were sent to the
      // call that made it (at its top-N, at least this call's: cut to it).
      std::vector<TokenScore> stored(start->stored_scores->begin(),
                                     start->stored_scores->begin() + reused_);
      for (TokenScore& score : stored) {
        if (static_cast<int32_t>(score.top.size()) > *score_top_) score.top.resize(*score_top_);
      }
      DeliverScores(std::move(stored));
    }
    auto run = [&](int64_t from, int64_t to) {
      return RunNow(std::vector<int32_t>(held.begin() + from, held.begin() + to));
    };
    const int64_t end = static_cast<int64_t>(held.size());
    if (start->snapshot_at > reused_ && start->snapshot_at < end) {
      if (absl::Status s = run(reused_, start->snapshot_at); !s.ok()) return s;
      snapshot_();
      return run(start->snapshot_at, end);
    }
    return run(reused_, end);
  }

  // Scores of the next prompt tokens, in order: counted, kept (with the
  // prefix cache) and sent to on_scores_.
  void DeliverScores(std::vector<TokenScore> scores) {
    for (const TokenScore& score : scores) {
      if (!score.scored) continue;
      ++scored_tokens_;
      logprob_sum_ += score.logprob;
    }
    if (on_scores_) {
      // Split into bounded events (server/prompt_logprobs.h): a batch
      // holds every score the engine made while this thread was writing.
      for (const drt::v1::PromptLogprobs& event :
           PromptLogprobsEvents(scores, scores_sent_, *score_top_, tokenizer_)) {
        on_scores_(event);
      }
    }
    scores_sent_ += static_cast<int64_t>(scores.size());
    if (record_) {
      kept_scores_.insert(kept_scores_.end(), std::make_move_iterator(scores.begin()),
                          std::make_move_iterator(scores.end()));
    }
  }

  absl::Status RunNow(const std::vector<int32_t>& ids) {
    if (ids.empty()) return absl::OkStatus();
    SessionEntry& entry = *entry_;  // (the session is chosen by now)
    // The memory the message may take is reserved until its item ends, so
    // that concurrent messages cannot all pass one check of the budget; as
    // the session grows, the growth moves out of the reservation (attached
    // below), so that the budget counts it once.
    auto reservation = sessions_.ReserveForTokens(static_cast<int64_t>(ids.size()));
    if (!reservation.ok()) return reservation.status();
    ScopedGrowthReservation growth(entry, *reservation);
    if (absl::Status s = entry.RunStep([&](Session& session) { return session.ValidateTokens(ids); });
        !s.ok()) {
      return s;
    }
    // The whole message is one work item: the scheduler runs it in pieces
    // over as many steps as it takes, alongside other sessions' work.
    const int64_t ingested_before = ingested_;
    const int64_t session_before = entry.tokens();  // still: this call holds the activity
    // Retrievals the forwards made (lower-only ones make none).
    int64_t retrievals_seen = entry.retrievals();
    auto account = [&](int64_t tokens_done) {
      metrics_.AddTokensIngested(ingested_before + tokens_done - ingested_);
      ingested_ = ingested_before + tokens_done;
      acknowledged_tokens_ = session_before + tokens_done;
      const int64_t retrievals = entry.retrievals();
      metrics_.AddRetrievals(retrievals - retrievals_seen);
      retrievals_seen = retrievals;
    };
    // A Generate that leaves pad_to_chunk_boundary unset pads again (a new
    // prompt's answer). Set before the item's first step, which may write
    // the session to the state directory; put back below when no step ran
    // (then nothing was written either, and a restart would not have it).
    const bool appended_before = entry.settings().appended_since_generate;
    entry.set_appended_since_generate(true);
    WorkItem item;
    item.entry = &entry;
    item.tokens = ids;
    item.kind = WorkKind::kPrefill;
    // A DeleteSession ends the item too: its next step finds the session gone.
    item.should_stop = [this] { return !ended_between_messages_ && context_->IsCancelled(); };
    item.on_progress = [&](int64_t tokens_done) {
      account(tokens_done);
      if (on_step_) on_step_();
    };
    if (score_top_.has_value()) {
      // Scored on the engine thread right after each step (server/scheduler.h);
      // here they are only counted and written out.
      item.score_top_logprobs = *score_top_;
      item.on_scores = [&](std::vector<TokenScore> scores) { DeliverScores(std::move(scores)); };
    }
    const auto t0 = Clock::now();
    const WorkResult result = scheduler_.Run(item);
    engine_seconds_ += SecondsSince(t0);
    if (entry.tokens() == session_before) entry.set_appended_since_generate(appended_before);
    account(result.tokens_done);
    if (record_) {
      prompt_ids_.insert(prompt_ids_.end(), ids.begin(), ids.begin() + result.tokens_done);
    }
    if (result.status.code() == absl::StatusCode::kCancelled) {
      return absl::CancelledError("the Append was cancelled");
    }
    if (!result.status.ok()) return result.status;
    if (on_step_) on_step_();
    return absl::OkStatus();
  }

  grpc::ServerContext* context_;
  SessionEntry* entry_;
  const int64_t chunk_size_;
  // The session's tokens as of the last acknowledgement (WorkItem::on_progress).
  int64_t acknowledged_tokens_;
  StreamingEncoder encoder_;
  SessionManager& sessions_;
  Scheduler& scheduler_;
  Metrics& metrics_;
  Clock::time_point start_, last_progress_;
  int64_t ingested_ = 0;
  double engine_seconds_ = 0;
  std::function<void()> on_step_;
  bool ended_between_messages_ = false;  // FlushAtStreamEnd
  const Tokenizer& tokenizer_;
  std::optional<int32_t> score_top_;
  std::function<void(const drt::v1::PromptLogprobs&)> on_scores_;
  int64_t scores_sent_ = 0;  // tokens whose scores went to on_scores_
  int64_t scored_tokens_ = 0;
  double logprob_sum_ = 0.0;
  // set_prefix_hold's.
  PrefixMatcher* matcher_ = nullptr;
  std::function<absl::StatusOr<PrefixStart>()> decide_;
  std::function<void()> snapshot_;
  bool holding_ = false;  // tokens go to matcher_ until it closes
  bool record_ = false;   // prompt_ids_ and kept_scores_ are kept
  std::vector<int32_t> prompt_ids_;
  std::vector<TokenScore> kept_scores_;
  int64_t reused_ = 0;
};

struct GenerationPlan {
  int32_t max_tokens = kDefaultMaxTokens;
  SamplingParams sampling;
  std::vector<std::string> stop;
  // pad_to_chunk_boundary as the request set it. Unset: the model's default
  // (model_pads), and that only when prompt tokens were appended since the
  // session's last Generate (SessionSettings::appended_since_generate): a
  // new prompt's answer is padded, a continuation is not (RunGeneration).
  std::optional<bool> pad;
  bool model_pads = false;
  bool logprobs = false;
  bool ignore_eos = false;
  int32_t top_logprobs = 0;  // alternatives per generated token (engine/top_logprobs.h)
};

absl::StatusOr<GenerationPlan> PlanGeneration(const drt::v1::GenerateRequest& request,
                                              const SessionSettings& settings,
                                              const GenerationDefaults& model_defaults,
                                              const ModelConfig& config) {
  GenerationPlan plan;
  if (request.max_tokens() < 0 || request.max_tokens() > kMaxTokensLimit) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_tokens must be in [0, %d] (0: %d), got %d", kMaxTokensLimit, kDefaultMaxTokens,
        request.max_tokens()));
  }
  if (request.max_tokens() > 0) plan.max_tokens = request.max_tokens();
  if (request.has_sampling()) {
    absl::StatusOr<SamplingParams> sampling = FromProto(request.sampling());
    if (!sampling.ok()) return sampling.status();
    plan.sampling = *std::move(sampling);
  } else {
    plan.sampling = settings.sampling;
  }
  if (absl::Status s = ValidateSamplingParams(plan.sampling); !s.ok()) return s;
  if (absl::Status s = ValidateLogitBiasIds(plan.sampling, config.vocab_size, config.chunk_id,
                                            config.pad_id);
      !s.ok()) {
    return s;
  }
  for (const std::string& stop : request.stop()) {
    if (stop.empty()) return absl::InvalidArgumentError("stop sequences must not be empty");
    plan.stop.push_back(stop);
  }
  if (request.has_pad_to_chunk_boundary()) plan.pad = request.pad_to_chunk_boundary();
  plan.model_pads = model_defaults.pad_to_chunk_boundary;
  plan.logprobs = request.return_logprobs();
  plan.ignore_eos = request.ignore_eos();
  if (request.top_logprobs() < 0 || request.top_logprobs() > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "top_logprobs must be in [0, %d] (0: none), got %d", kMaxTopLogprobs,
        request.top_logprobs()));
  }
  plan.top_logprobs = request.top_logprobs();
  return plan;
}

// A Complete's options (generate, n, prompt_logprobs, prompt_only) come in
// its first message: the `index`-th (> 0) setting one is refused, naming
// it, as an Append refuses prompt_logprobs there, rather than ignored (a
// client would get other choices, scores or generation than it asked for).
absl::Status CheckNoCompleteOptions(const drt::v1::CompleteRequest& request, int64_t index) {
  const char* field = request.has_generate()          ? "generate"
                      : request.n() != 0              ? "n"
                      : request.has_prompt_logprobs() ? "prompt_logprobs"
                      : request.prompt_only()         ? "prompt_only"
                                                      : nullptr;
  if (field == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "message %d sets %s, which only the first message of a Complete may set; nothing was "
      "generated",
      index, field));
}

// The index of the drt.v1.Drt method `name` among the generated service's
// methods, which it adds in the order of the proto file, as the
// descriptor's method index gives.
int MethodIndex(const char* name) {
  return drt::v1::AppendRequest::descriptor()
      ->file()
      ->FindServiceByName("Drt")
      ->FindMethodByName(name)
      ->index();
}

}  // namespace

template <typename Stream>
std::optional<grpc::Status> DrtService::ReadSingleRequest(grpc::ServerContext* context,
                                                          Stream& stream, const char* method,
                                                          google::protobuf::Message* request) {
  grpc::ByteBuffer bytes;
  absl::Status parsed;
  if (stream.Read(&bytes)) {
    parsed = ParseRequest(bytes, absl::StrFormat("the %s request", method),
                          options_.max_message_bytes, request);
  } else if (context->IsCancelled()) {  // gRPC has already given the client its status
    parsed = absl::CancelledError(absl::StrFormat("the %s call ended before its request came",
                                                  method));
  } else {
    parsed = absl::InvalidArgumentError(absl::StrFormat(
        "the %s call ended without sending its request message", method));
  }
  if (parsed.ok()) return std::nullopt;
  if (grpc::Status s = Admit(context, method); !s.ok()) return s;
  return Finish(ToGrpc(parsed));
}

template <typename Request, typename Response>
void DrtService::ServeUnaryFromBytes(
    const char* name,
    grpc::Status (DrtService::*typed)(grpc::ServerContext*, const Request*, Response*)) {
  MarkMethodStreamed(
      MethodIndex(name),
      new grpc::internal::BidiStreamingHandler<DrtService, grpc::ByteBuffer, Response>(
          [name, typed](DrtService* self, grpc::ServerContext* context,
                        grpc::ServerReaderWriter<Response, grpc::ByteBuffer>* stream) {
            Request request;
            if (std::optional<grpc::Status> refused =
                    self->ReadSingleRequest(context, *stream, name, &request)) {
              return *refused;
            }
            Response response;
            const grpc::Status status = (self->*typed)(context, &request, &response);
            if (status.ok()) stream->Write(response);
            return status;
          },
          this));
}

DrtService::DrtService(const Model& model, Backend& backend, Metrics& metrics,
                       ServiceOptions options)
    : model_(model),
      backend_(backend),
      metrics_(metrics),
      options_(std::move(options)),
      sessions_(std::make_unique<SessionManager>(
          backend, SessionLimits{options_.max_sessions, options_.max_context_tokens,
                                 options_.idle_ttl_seconds, options_.host_memory_budget_bytes})),
      scheduler_(std::make_unique<Scheduler>(
          backend, SchedulerOptionsFor(backend, options_, metrics, scheduler_))),
      prefix_cache_(
          std::make_unique<PrefixCache>(*sessions_, options_.prefix_cache, metrics)) {
  // Every method's requests arrive as raw bytes (the header says why).
  // Marked "streamed", as gRPC's own generated WithStreamedUnaryMethod_ and
  // WithSplitStreamingMethod_ do: the wire is the same for every kind of
  // call, so clients still call them as unary or server-streaming methods.
  MarkMethodStreamed(
      MethodIndex("Append"),
      new grpc::internal::BidiStreamingHandler<DrtService, grpc::ByteBuffer,
                                               drt::v1::AppendResponse>(
          &DrtService::AppendStream, this));
  MarkMethodStreamed(
      MethodIndex("Generate"),
      new grpc::internal::BidiStreamingHandler<DrtService, grpc::ByteBuffer,
                                               drt::v1::GenerateResponse>(
          &DrtService::GenerateStream, this));
  MarkMethodStreamed(
      MethodIndex("Complete"),
      new grpc::internal::BidiStreamingHandler<DrtService, grpc::ByteBuffer,
                                               drt::v1::GenerateResponse>(
          &DrtService::CompleteStream, this));
  ServeUnaryFromBytes("CreateSession", &DrtService::CreateSession);
  ServeUnaryFromBytes("ForkSession", &DrtService::ForkSession);
  ServeUnaryFromBytes("GetSession", &DrtService::GetSession);
  ServeUnaryFromBytes("ListSessions", &DrtService::ListSessions);
  ServeUnaryFromBytes("DeleteSession", &DrtService::DeleteSession);
  ServeUnaryFromBytes("GetModelInfo", &DrtService::GetModelInfo);
  ServeUnaryFromBytes("SaveSession", &DrtService::SaveSession);
  ServeUnaryFromBytes("LoadSession", &DrtService::LoadSession);
  ServeUnaryFromBytes("Tokenize", &DrtService::Tokenize);
  ServeUnaryFromBytes("Detokenize", &DrtService::Detokenize);
  // The session gauges are read from the sessions at each scrape: idle
  // expiry and sessions restored at start-up change them without a call.
  metrics_.SetSessionGaugeSource([sessions = sessions_.get(), cache = prefix_cache_.get()] {
    Metrics::SessionGauges gauges;
    gauges.active_sessions = sessions->count();
    // The budget's own sum: sessions deleted mid-step count until freed.
    gauges.chunk_store_bytes = sessions->TotalHostBytes();
    gauges.prefix_cache_entries = cache->entries();
    gauges.prefix_cache_bytes = cache->bytes();
    return gauges;
  });
  metrics_.SetLimits(options_.host_memory_budget_bytes, options_.max_sessions);
  metrics_.SetEngineGaugeSource([scheduler = scheduler_.get()] {
    const Scheduler::EngineProgress progress = scheduler->engine_progress();
    Metrics::EngineGauges gauges;
    gauges.queued_items = progress.queued;
    gauges.last_step_age_seconds =
        EngineStalledSeconds(progress, std::chrono::steady_clock::now());
    return gauges;
  });
}

// Cleared before the sessions and the scheduler go (it waits for a scrape
// reading them).
DrtService::~DrtService() {
  metrics_.SetSessionGaugeSource(nullptr);
  metrics_.SetEngineGaugeSource(nullptr);
}

Scheduler::EngineProgress DrtService::engine_progress() const {
  return scheduler_->engine_progress();
}

void DrtService::StartDraining() {
  draining_.store(true);
  sessions_->StopExpiringDurable();
}

bool DrtService::WaitForRunningCalls(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(running_mutex_);
  return running_changed_.wait_until(lock, deadline, [&] { return running_calls_ == 0; });
}

void DrtService::StopRunningCalls() {
  scheduler_->Refuse(ServerStoppingError(
      "the server is shutting down: this call was still running when the grace period for "
      "running calls ended; retry on another replica, or on this one once it is back if it "
      "keeps sessions (--state_dir)"));
}

grpc::Status DrtService::Admit(grpc::ServerContext* context, const char* method) {
  {
    std::lock_guard<std::mutex> lock(running_mutex_);
    ++running_calls_;  // until Finish
  }
  metrics_.CountRequest(method);
  if (draining_.load()) {
    return Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "the server is shutting down; retry on another replica, or on "
                               "this one once it is back if it keeps sessions (--state_dir)"));
  }
  if (!options_.bearer_token.empty()) {
    const auto& metadata = context->client_metadata();
    auto it = metadata.find("authorization");
    // In constant time: a plain != stops at the first byte that differs.
    if (it == metadata.end() ||
        !BearerTokenMatches(std::string_view(it->second.data(), it->second.size()),
                            options_.bearer_token)) {
      return Finish(grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          "missing or wrong credentials: send metadata 'authorization: Bearer <token>'"));
    }
  }
  return grpc::Status::OK;
}

grpc::Status DrtService::Finish(const grpc::Status& status) {
  if (!status.ok()) metrics_.CountError(GrpcCodeName(status.error_code()));
  {
    std::lock_guard<std::mutex> lock(running_mutex_);
    --running_calls_;
  }
  running_changed_.notify_all();
  return status;
}

grpc::Status DrtService::CreateSession(grpc::ServerContext* context,
                                       const drt::v1::CreateSessionRequest* request,
                                       drt::v1::CreateSessionResponse* response) {
  if (grpc::Status s = Admit(context, "CreateSession"); !s.ok()) return s;
  // Every sampling field is a default (checked in SessionManager, as a
  // Generate's): written with the session to --state_dir and to SaveSession
  // files (docs/state_format.md, session record version 3).
  SessionSettings settings;
  absl::StatusOr<SamplingParams> sampling = FromProto(request->sampling());
  if (!sampling.ok()) return Finish(ToGrpc(sampling.status()));
  settings.sampling = *std::move(sampling);
  settings.max_context_tokens = request->max_context_tokens();
  settings.idle_ttl_seconds = request->idle_ttl_seconds();
  auto entry = sessions_->Create(settings);
  if (!entry.ok()) return Finish(ToGrpc(entry.status()));
  response->set_session_id((*entry)->id());
  return Finish(grpc::Status::OK);
}

grpc::Status DrtService::AppendStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<drt::v1::AppendResponse, grpc::ByteBuffer>* stream) {
  if (grpc::Status s = Admit(context, "Append"); !s.ok()) return s;
  drt::v1::AppendRequest request;
  absl::StatusOr<bool> read = ReadRequest(*stream, 0, options_.max_message_bytes, &request);
  if (!read.ok()) return Finish(ToGrpc(read.status()));
  if (!*read) {
    return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               "Append needs at least one message naming the session"));
  }
  if (request.session_id().empty()) {
    return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               "the first Append message must set session_id"));
  }
  if (absl::Status s = CheckPromptLogprobs(request.has_prompt_logprobs(),
                                           request.prompt_logprobs(), "nothing was appended");
      !s.ok()) {
    return Finish(ToGrpc(s));
  }
  auto entry = sessions_->Find(request.session_id());
  if (!entry.ok()) return Finish(ToGrpc(entry.status()));
  if (absl::Status s = (*entry)->Begin(Activity::kAppending); !s.ok()) return Finish(ToGrpc(s));

  PromptIngest ingest(context, entry->get(), *model_.tokenizer, model_.config().enc_chunk_size,
                      *sessions_, *scheduler_, metrics_);
  if (request.has_prompt_logprobs()) {
    ingest.set_scoring(request.prompt_logprobs(), [&](const drt::v1::PromptLogprobs& scores) {
      drt::v1::AppendResponse event;
      *event.mutable_prompt_logprobs() = scores;
      stream->Write(event);
    });
  }
  // Progress at most every kProgressIntervalSeconds during a message, and
  // always once a message is ingested (the client may wait for it before
  // sending the next).
  auto send_progress = [&](bool message_done) {
    if (!message_done && !ingest.progress_due()) return;
    drt::v1::AppendResponse progress;
    *progress.mutable_progress() = ingest.Progress();
    stream->Write(progress);
  };
  ingest.set_on_step([&] { send_progress(false); });
  absl::Status status;
  int64_t message_index = 0;
  do {
    if (!request.session_id().empty() && request.session_id() != (*entry)->id()) {
      status = CheckSessionIdLength(request.session_id());
      status = absl::InvalidArgumentError(
          status.ok() ? absl::StrFormat("message %d names session %s but this Append is for %s",
                                        message_index, PrintableId(request.session_id()),
                                        (*entry)->id())
                      : absl::StrFormat("message %d: %s", message_index, status.message()));
      // Nothing of the message is kept; the earlier ones are, whole (their
      // held-back last word too), as when a message does not parse.
      status = ingest.KeepEarlier(status);
      break;
    }
    if (message_index > 0 && request.has_prompt_logprobs()) {
      // The first message decides whether the call is scored (the proto:
      // "First message only"); a later one asking is refused, not ignored.
      status = ingest.KeepEarlier(absl::InvalidArgumentError(absl::StrFormat(
          "message %d sets prompt_logprobs, which only the first message of an Append may "
          "set; nothing of message %d was appended",
          message_index, message_index)));
      break;
    }
    status = ingest.AddMessage(request, message_index);
    if (!status.ok()) break;
    send_progress(true);
    ++message_index;
    read = ReadRequest(*stream, message_index, options_.max_message_bytes, &request);
    if (!read.ok()) {
      // A message that does not parse or is over --max_message_bytes:
      // nothing of it is kept, the earlier messages are, whole (their
      // held-back last word too).
      bool earlier_kept = false;
      status = ingest.KeepEarlier(absl::InvalidArgumentError(read.status().message()),
                                  &earlier_kept);
      if (earlier_kept) {
        status = absl::InvalidArgumentError(absl::StrFormat(
            "%s; nothing of it was kept and nothing after it was read; the earlier messages "
            "of this Append were kept (%d tokens)",
            status.message(), ingest.ingested()));
      }
      break;
    }
  } while (*read);
  // The stream ended between messages (closed by the client, or cut): the
  // messages received are kept whole.
  if (status.ok()) status = ingest.FlushAtStreamEnd();
  if (status.ok() && (*entry)->deleted()) status = (*entry)->DeletedError();
  if (status.ok() && context->IsCancelled()) status = absl::CancelledError("the Append was cancelled");
  // With --state_sync=interval the last tokens are written here: the summary
  // (and OK) only once they are on disk.
  if (absl::Status ended = (*entry)->EndAndReport(); status.ok()) status = ended;
  if (ingest.ingested() > 0) metrics_.ObservePrefill(ingest.ingested(), ingest.engine_seconds());
  if (!status.ok()) return Finish(ToGrpc(status));

  drt::v1::AppendResponse last;
  *last.mutable_progress() = ingest.Progress();
  stream->Write(last);
  drt::v1::AppendResponse summary;
  *summary.mutable_summary() = ingest.Summary();
  stream->Write(summary);
  return Finish(grpc::Status::OK);
}

// Generates on an entry the caller has claimed; writes pieces through
// `write` and leaves the final message in `done` for the caller, who sends
// it once the activity ended and, for a durable session, all of it was
// written (its steps are written only then, SessionEntry::
// WritesAtActivityEnd). Shared by Generate and Complete.
static absl::Status RunGeneration(grpc::ServerContext* context, SessionEntry& entry,
                                  const GenerationPlan& plan, const Model& model,
                                  SessionManager& sessions, Scheduler& scheduler, Metrics& metrics,
                                  const std::function<bool(const drt::v1::GenerateResponse&)>& write,
                                  drt::v1::GenerateTimings timings,
                                  drt::v1::GenerateResponse& done) {
  const auto start = Clock::now();
  Sampler sampler(plan.sampling);
  const int32_t eos = model.tokenizer->eos_id();
  bool empty = false;
  if (absl::Status s = entry.CheckStateWhole(); !s.ok()) return s;
  if (absl::Status s = entry.RunStep([&](Session& session) {
        empty = session.last_logits().empty();
        return absl::OkStatus();
      });
      !s.ok()) {
    return s;
  }
  if (empty) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "session %s holds no tokens yet: Append a prompt before Generate", entry.id()));
  }
  // Padding and at least one token must fit in the context limit, else the
  // call is refused with the session unchanged. (Both messages say "its
  // context limit": SessionManager::IsContextLimitRefusal.)
  const int64_t limit = entry.settings().max_context_tokens;
  const int64_t held = entry.tokens();
  const int64_t chunk = model.config().enc_chunk_size;
  const auto deadline = context->deadline();  // far in the future when none
  const auto seconds_left = [&] {
    return std::chrono::duration<double>(deadline - std::chrono::system_clock::now()).count();
  };
  // A call whose deadline leaves no time for one token changes nothing: it
  // ends with FINISH_REASON_DEADLINE before its padding runs too (which
  // would otherwise be added at every such call, with nothing generated).
  const bool no_time = seconds_left() < kDeadlineMarginSeconds;
  const bool pad = plan.pad.value_or(plan.model_pads && entry.settings().appended_since_generate);
  const int64_t padding = !no_time && pad && held % chunk != 0 ? chunk - held % chunk : 0;
  if (held + padding + 1 > limit) {
    if (padding > 0) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "session %s holds %d tokens of %s of %d: padding to the chunk boundary "
          "needs %d more and generating at least 1, so nothing was added (without "
          "pad_to_chunk_boundary there is room for %d tokens)",
          entry.id(), held, SessionManager::kContextLimitWords, limit, padding,
          std::max<int64_t>(0, limit - held)));
    }
    return absl::ResourceExhaustedError(absl::StrFormat(
        "session %s holds %d tokens, %s: there is no room to generate, and "
        "nothing was added",
        entry.id(), held, SessionManager::kContextLimitWords));
  }
  // The retrievals its steps make (padding's and generated tokens'), however
  // the call ends.
  struct RetrievalCount {
    const SessionEntry& entry;
    Metrics& metrics;
    const int64_t before = entry.retrievals();
    ~RetrievalCount() { metrics.AddRetrievals(entry.retrievals() - before); }
  } retrieval_count{entry, metrics};
  if (padding > 0) {
    // Padding completes a chunk: its memory is reserved (and checked
    // against the budget) until the padding ran, as an Append's is.
    auto reservation = sessions.ReserveForTokens(padding);
    if (!reservation.ok()) return reservation.status();
    ScopedGrowthReservation growth(entry, *reservation);
    // Padding is prompt work: it shares the step budget like a prefill.
    const std::vector<int32_t> pads(padding, static_cast<int32_t>(model.config().pad_id));
    WorkItem item;
    item.entry = &entry;
    item.tokens = pads;
    item.kind = WorkKind::kPrefill;
    item.allow_pad = true;
    item.should_stop = [context] { return context->IsCancelled(); };
    if (absl::Status s = scheduler.Run(item).status; !s.ok()) return s;
    // The prompt is padded: a later Generate continues this one's answer
    // (and a Generate cut before its first token pads no more).
    entry.set_appended_since_generate(false);
  }
  double slowest_step = 0;
  Utf8Streamer utf8;
  std::string text_so_far;
  drt::v1::FinishReason reason = drt::v1::FINISH_REASON_LENGTH;
  double first_token_at = 0, last_token_at = 0;
  int32_t generated = 0;
  // Between two tokens the engine waits for this session's next one rather
  // than start a prefill step without it (server/scheduler.h).
  Scheduler::Generating generating(scheduler, &entry);
  while (generated < plan.max_tokens) {
    if (context->IsCancelled()) {
      reason = drt::v1::FINISH_REASON_CANCELLED;
      break;
    }
    if (no_time || seconds_left() < kDeadlineMarginSeconds + 2 * slowest_step) {
      reason = drt::v1::FINISH_REASON_DEADLINE;
      break;
    }
    if (entry.tokens() >= entry.settings().max_context_tokens) break;  // LENGTH
    const auto step_start = Clock::now();
    // Sampling runs here, on the handler's thread (under the entry's claim,
    // between the engine's steps on this session); the token then joins the
    // next engine step as a decode item, batched with other sessions'.
    Session::GeneratedToken step{};
    std::vector<TokenLogProb> alternatives;
    absl::Status s = entry.RunStep([&](Session& session) -> absl::Status {
      auto next = session.SampleNext(sampler);
      if (!next.ok()) return next.status();
      step = *next;
      if (plan.top_logprobs > 0) {
        // From the logits SampleNext drew from (its own check passed), less
        // the ids the engine never emits, as Sampler::LogProb normalises.
        const int32_t never[] = {static_cast<int32_t>(model.config().chunk_id),
                                 static_cast<int32_t>(model.config().pad_id)};
        auto top = TopLogProbs(session.last_logits(), plan.top_logprobs, never);
        if (!top.ok()) return top.status();
        alternatives = *std::move(top);
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    // A token that completes a chunk adds the chunk's memory: it is reserved
    // against the host-memory budget until the token ran (then the session
    // holds it), and a generation that would pass the budget ends here.
    HostReservation chunk_memory;
    if ((entry.tokens() + 1) % chunk == 0) {
      auto reserved = sessions.Reserve(
          sessions.HostBytesForTokens(1),
          absl::StrFormat("generated token %d and the chunk it completes", generated + 1));
      if (!reserved.ok()) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "Generate stopped after %d generated tokens (they stay in session %s): %s", generated,
            entry.id(), reserved.status().message()));
      }
      chunk_memory = *std::move(reserved);
    }
    const int32_t token[] = {step.token};
    WorkItem item;
    item.entry = &entry;
    item.tokens = token;
    item.kind = WorkKind::kDecode;
    item.should_stop = [context] { return context->IsCancelled(); };
    {
      ScopedGrowthReservation growth(entry, chunk_memory);
      s = scheduler.Run(item).status;
    }
    if (s.code() == absl::StatusCode::kCancelled) {  // the token was not appended
      reason = drt::v1::FINISH_REASON_CANCELLED;
      break;
    }
    if (!s.ok()) return s;
    ++generated;
    if (generated == 1) entry.set_appended_since_generate(false);
    last_token_at = SecondsSince(start);
    if (generated == 1) first_token_at = last_token_at;
    // An id the tokenizer has no text for (the model's vocabulary is larger
    // than the tokenizer's) is streamed with empty text, not an error.
    const std::string bytes = model.tokenizer->Decode({step.token}).value_or("");
    drt::v1::GenerateResponse response;
    auto* piece = response.mutable_piece();
    piece->add_token_ids(step.token);
    piece->set_text(utf8.Push(bytes));
    if (plan.logprobs) piece->add_logprobs(step.logprob);
    if (plan.top_logprobs > 0) {
      drt::v1::TokenTopLogprobs* top = piece->add_top_logprobs();
      top->set_token_bytes(bytes);
      for (const TokenLogProb& alternative : alternatives) {
        drt::v1::TokenLogprob* entry_proto = top->add_alternatives();
        entry_proto->set_token_id(alternative.token);
        entry_proto->set_logprob(alternative.logprob);
        entry_proto->set_token_bytes(model.tokenizer->Decode({alternative.token}).value_or(""));
      }
    }
    text_so_far += piece->text();
    bool stop_now = false;
    if (!plan.ignore_eos && step.token == eos) {
      reason = drt::v1::FINISH_REASON_END_OF_TEXT;
      stop_now = true;
    }
    for (const std::string& stop : plan.stop) {
      const size_t from = text_so_far.size() > stop.size() + piece->text().size()
                              ? text_so_far.size() - stop.size() - piece->text().size()
                              : 0;
      if (text_so_far.find(stop, from) != std::string::npos) {
        reason = drt::v1::FINISH_REASON_STOP_SEQUENCE;
        stop_now = true;
      }
    }
    if (stop_now) piece->set_text(piece->text() + utf8.Flush());
    if (!write(response)) {
      reason = drt::v1::FINISH_REASON_CANCELLED;
      break;
    }
    slowest_step = std::max(slowest_step, SecondsSince(step_start));
    if (stop_now) break;
  }
  if (const std::string rest = utf8.Flush(); !rest.empty()) {
    drt::v1::GenerateResponse response;
    response.mutable_piece()->set_text(rest);
    write(response);
  }
  timings.set_generated_tokens(generated);
  timings.set_time_to_first_token_seconds(first_token_at);
  timings.set_time_per_output_token_seconds(
      generated > 1 ? (last_token_at - first_token_at) / (generated - 1) : 0.0);
  if (generated > 0) metrics.ObserveTimeToFirstToken(first_token_at);
  if (generated > 1) metrics.ObserveTimePerOutputToken(timings.time_per_output_token_seconds());
  metrics.AddGeneratedTokens(generated);
  done.mutable_done()->set_finish_reason(reason);
  // (Not a Complete's temporary session, which no call can use.)
  if (!entry.hidden()) done.mutable_done()->set_session_id(entry.id());
  done.mutable_done()->set_padding_tokens(padding);
  done.mutable_done()->set_tokens_appended(padding + generated);
  done.mutable_done()->set_session_tokens(entry.tokens());
  *done.mutable_done()->mutable_timings() = timings;
  return absl::OkStatus();
}

grpc::Status DrtService::GenerateStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<drt::v1::GenerateResponse, grpc::ByteBuffer>* stream) {
  drt::v1::GenerateRequest request;
  if (std::optional<grpc::Status> refused =
          ReadSingleRequest(context, *stream, "Generate", &request)) {
    return *refused;
  }
  return GenerateTo(context, request,
                    [stream](const drt::v1::GenerateResponse& r) { return stream->Write(r); });
}

grpc::Status DrtService::GenerateTo(
    grpc::ServerContext* context, const drt::v1::GenerateRequest& request,
    const std::function<bool(const drt::v1::GenerateResponse&)>& write) {
  if (grpc::Status s = Admit(context, "Generate"); !s.ok()) return s;
  auto entry = sessions_->Find(request.session_id());
  if (!entry.ok()) return Finish(ToGrpc(entry.status()));
  auto plan = PlanGeneration(request, (*entry)->settings(), model_.generation,
                             model_.config());
  if (!plan.ok()) return Finish(ToGrpc(plan.status()));
  if (absl::Status s = (*entry)->Begin(Activity::kGenerating); !s.ok()) return Finish(ToGrpc(s));
  drt::v1::GenerateResponse done;
  absl::Status status = RunGeneration(context, **entry, *plan, model_, *sessions_, *scheduler_,
                                      metrics_, write, {}, done);
  // With --state_dir the whole Generate (padding and tokens) is written
  // here, also when it ended early (an error, the client's cancel or
  // deadline): `done` only once it is on disk, and a failed write fails the
  // call. Except when it was cut because the server is stopping (a drain):
  // then nothing of it is written, so the restart restores the session as
  // it was before it and the client can send it again, as after a crash
  // (docs/api.md, "Durable sessions").
  // (Told by the stop's own status, not by UNAVAILABLE during a drain: an
  // UNAVAILABLE of another origin is an error, and is written.) Also cut by
  // the stop: a Generate that ended cancelled (its call cancelled, or a
  // write to its client failed) once the scheduler refuses work. Its handler
  // may never have seen the stop's status: blocked writing to a client that
  // stopped reading when the grace period ended, it is released only by
  // gRPC's shutdown cancelling the call, and ends with FINISH_REASON_CANCELLED
  // and OK (review-server F3: it was written then, tokens its client never
  // saw made durable, and the client's retry after the restart found the
  // session changed).
  const bool cancelled =
      absl::IsCancelled(status) ||
      (status.ok() && done.done().finish_reason() == drt::v1::FINISH_REASON_CANCELLED);
  const bool cut_by_stop = IsServerStopping(status) || (cancelled && scheduler_->refused());
  if (cut_by_stop && !IsServerStopping(status)) {
    status = ServerStoppingError("the server is shutting down: the Generate was cut by its stop");
  }
  if (absl::Status ended = (*entry)->EndAndReport(/*write=*/!cut_by_stop); status.ok()) {
    status = ended;
  }
  if (status.ok()) write(done);
  return Finish(ToGrpc(status));
}

// Complete's choices (CompleteRequest.n > 1), one per entry (the prompt's
// session and its forks), generated concurrently.
static absl::Status RunChoices(
    grpc::ServerContext* context, const std::vector<std::shared_ptr<SessionEntry>>& entries,
    const GenerationPlan& plan, const Model& model, SessionManager& sessions, Scheduler& scheduler,
    Metrics& metrics, const drt::v1::GenerateTimings& timings,
    grpc::ServerReaderWriter<drt::v1::GenerateResponse, grpc::ByteBuffer>& stream,
    const std::function<absl::Status(int32_t, int64_t)>& piece_for_test) {
  // One writer at a time; once a choice failed, the others' writes fail, so
  // they end at their next token (RunGeneration: CANCELLED) and the call
  // reports the first error (in time, not the first choice's).
  std::mutex write_mutex;
  bool failed = false;
  // The failure that stopped the others (theirs then are CANCELLED, by
  // their refused writes: the call reports the cause, whichever choice).
  absl::Status first_failure;
  auto run = [&](size_t i) -> absl::Status {
    SessionEntry& entry = *entries[i];
    GenerationPlan choice_plan = plan;
    choice_plan.sampling.seed += i;  // choice i: seed + i (docs/api.md, "Complete")
    absl::Status status = entry.Begin(Activity::kGenerating);
    drt::v1::GenerateResponse done;
    absl::Status injected;  // piece_for_test's failure
    int64_t tokens_sent = 0;
    if (status.ok()) {
      status = RunGeneration(
          context, entry, choice_plan, model, sessions, scheduler, metrics,
          [&](const drt::v1::GenerateResponse& response) {
            if (piece_for_test) {
              injected = piece_for_test(static_cast<int32_t>(i), tokens_sent);
              if (!injected.ok()) return false;
            }
            tokens_sent += response.piece().token_ids_size();
            drt::v1::GenerateResponse tagged = response;
            tagged.mutable_piece()->set_choice(static_cast<int32_t>(i));
            std::lock_guard<std::mutex> lock(write_mutex);
            return !failed && stream.Write(tagged);
          },
          timings, done);
      if (!injected.ok()) status = injected;
      entry.End();  // (an ephemeral session: nothing is written)
    }
    std::lock_guard<std::mutex> lock(write_mutex);
    if (!status.ok()) {
      if (!failed) first_failure = status;
      failed = true;
    } else if (!failed) {
      done.mutable_done()->set_choice(static_cast<int32_t>(i));
      stream.Write(done);
    }
    return status;
  };
  // Concurrently: each choice's tokens join the scheduler's steps as any
  // session's, batched with the others'. A thread that cannot be started
  // (the process at its thread limit) does not end the server: that choice
  // runs on this thread, in turn (RunConcurrently).
  std::vector<std::function<absl::Status()>> calls;
  for (size_t i = 0; i < entries.size(); ++i) calls.push_back([&run, i] { return run(i); });
  RunConcurrently(calls);  // (each choice's status is in first_failure if it failed first)
  return first_failure;
}

grpc::Status DrtService::CompleteStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<drt::v1::GenerateResponse, grpc::ByteBuffer>* stream) {
  if (grpc::Status s = Admit(context, "Complete"); !s.ok()) return s;
  drt::v1::CompleteRequest request;
  absl::StatusOr<bool> read = ReadRequest(*stream, 0, options_.max_message_bytes, &request);
  if (!read.ok()) return Finish(ToGrpc(read.status()));
  if (!*read) {
    return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               "Complete needs a first message with the generation options"));
  }
  const drt::v1::GenerateRequest options = request.generate();
  if (request.n() < 0 || request.n() > kMaxCompleteChoices) {
    return Finish(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrFormat("n must be in [0, %d] (0 or 1: one choice), got %d", kMaxCompleteChoices,
                        request.n())));
  }
  if (absl::Status s = CheckPromptLogprobs(request.has_prompt_logprobs(),
                                           request.prompt_logprobs(), "nothing was run");
      !s.ok()) {
    return Finish(ToGrpc(s));
  }
  const bool prompt_only = request.prompt_only();
  const int32_t choices = std::max(1, request.n());
  // Each choice holds a session slot of its own for the whole call (the
  // prompt's session and n - 1 forks): more choices than --max_sessions
  // could never run, so say so now, by name, rather than as the session
  // limit (a load to wait out) after taking every free slot.
  if (choices > sessions_->limits().max_sessions) {
    return Finish(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrFormat("n must be at most %d here (--max_sessions: each choice holds a "
                        "session for the whole call), got %d",
                        sessions_->limits().max_sessions, request.n())));
  }
  SessionSettings settings;
  if (options.has_sampling()) {
    absl::StatusOr<SamplingParams> sampling = FromProto(options.sampling());
    if (!sampling.ok()) return Finish(ToGrpc(sampling.status()));
    settings.sampling = *std::move(sampling);
  }
  auto plan = PlanGeneration(options, settings, model_.generation, model_.config());
  if (!plan.ok()) return Finish(ToGrpc(plan.status()));
  // The temporary sessions (the prompt's and its forks for further
  // choices) go when the call ends, whatever happens.
  // Then the prefix cache's bytes are checked again: its snapshots' shares
  // of the chunks they shared with them grew (PrefixCache::Trim).
  struct Cleanup {
    SessionManager& sessions;
    PrefixCache& cache;
    std::vector<std::string> ids;
    ~Cleanup() {
      for (const std::string& id : ids) sessions.Delete(id, /*hidden_too=*/true).IgnoreError();
      cache.Trim();
    }
  } cleanup{*sessions_, *prefix_cache_, {}};
  // The call's session. Not written to --state_dir: it lives only as long
  // as this call. With the prefix cache it is made once the prompt's first
  // tokens decide whether it starts from a snapshot (a fork of it).
  std::shared_ptr<SessionEntry> entry;
  const bool reuse = prefix_cache_->enabled();
  if (reuse) {
    // The session is made only once the prompt's first tokens decide its
    // start, which can be after the whole prompt arrived (held while a
    // snapshot matches): a server at --max_sessions refuses now, before
    // reading it, as without the cache (review-prefix finding 7). It takes
    // no slot: the session's creation checks again.
    if (absl::Status s = sessions_->CheckSessionRoom(); !s.ok()) return Finish(ToGrpc(s));
  }
  if (!reuse) {
    auto created = sessions_->CreateEphemeral(settings);
    if (!created.ok()) return Finish(ToGrpc(created.status()));
    entry = *std::move(created);
    cleanup.ids.push_back(entry->id());
    if (absl::Status s = entry->Begin(Activity::kAppending); !s.ok()) return Finish(ToGrpc(s));
  }

  PromptIngest ingest(context, entry.get(), *model_.tokenizer, model_.config().enc_chunk_size,
                      *sessions_, *scheduler_, metrics_);
  const std::optional<int32_t> score_top =
      request.has_prompt_logprobs() ? std::optional<int32_t>(request.prompt_logprobs())
                                    : std::nullopt;
  // A scored prompt may start only from a snapshot whose stored scores have
  // as many alternatives (PrefixCache::Candidates).
  PrefixMatcher matcher(reuse ? prefix_cache_->Candidates(score_top)
                              : std::vector<std::shared_ptr<const PrefixEntry>>{});
  // Where this call's last snapshot is (a hit's, or its common-prefix one):
  // the prompt-end snapshot is taken only kMinCommonPrefixTokens past it.
  int64_t snapshotted_at = 0;
  if (reuse) {
    ingest.set_prefix_hold(
        &matcher,
        [&]() -> absl::StatusOr<PromptIngest::PrefixStart> {
          PromptIngest::PrefixStart start;
          if (matcher.hit() != nullptr) {
            // A snapshot evicted since it matched (or no memory for the
            // fork's copy): the call starts cold instead.
            auto fork = prefix_cache_->Fork(*matcher.hit());
            if (fork.ok()) {
              entry = *std::move(fork);
              start.reused = matcher.hit_tokens();
              if (score_top.has_value()) start.stored_scores = &matcher.hit()->scores;
            }
          }
          if (entry == nullptr) {
            auto created = sessions_->CreateEphemeral(settings);
            if (!created.ok()) return created.status();
            entry = *std::move(created);
          }
          cleanup.ids.push_back(entry->id());
          if (start.reused > 0) {
            metrics_.AddPrefixCacheHit(start.reused);
          } else {
            metrics_.AddPrefixCacheMiss();
          }
          if (absl::Status s = entry->Begin(Activity::kAppending); !s.ok()) return s;
          // The longest prefix shared with a snapshot, when it is well past
          // the hit: a snapshot there serves the next prompt that shares it
          // (lm-eval's third choice, the next question on one document).
          const int64_t common = matcher.common_tokens();
          if (common - start.reused >= kMinCommonPrefixTokens) start.snapshot_at = common;
          start.entry = entry.get();
          snapshotted_at = start.reused;
          return start;
        },
        [&] {
          entry->End();  // (an ephemeral session: nothing is written)
          snapshotted_at = static_cast<int64_t>(ingest.prompt_ids().size());
          prefix_cache_->Add(entry, ingest.prompt_ids(), score_top,
                             score_top.has_value() ? ingest.kept_scores()
                                                   : std::vector<TokenScore>{});
          // Hidden: no other call can claim it meanwhile.
          entry->Begin(Activity::kAppending).IgnoreError();
        });
  }
  // The prompt's scores, held until the whole prompt is in, then written,
  // before the first piece and once whatever n (the prompt is ingested
  // once, before the forks). Not written during the ingest: a client that
  // writes its whole prompt before reading (the OpenAI adapter does, over
  // the in-process channel) would block in its Write while this handler
  // blocks in its Write of scores, both for good (review-echo E1). Append
  // streams them, for documents of any length.
  std::vector<drt::v1::PromptLogprobs> held_scores;
  if (request.has_prompt_logprobs()) {
    ingest.set_scoring(request.prompt_logprobs(), [&](const drt::v1::PromptLogprobs& scores) {
      held_scores.push_back(scores);
    });
  }
  absl::Status status;
  int64_t message_index = 0;
  do {
    if (message_index > 0) {
      status = CheckNoCompleteOptions(request, message_index);
      if (!status.ok()) break;
    }
    status = ingest.AddMessage(request, message_index);
    if (!status.ok()) break;
    ++message_index;
    read = ReadRequest(*stream, message_index, options_.max_message_bytes, &request);
    // A message that does not parse or is over --max_message_bytes ends the
    // call: no answer to part of a prompt.
    if (!read.ok()) status = read.status();
  } while (status.ok() && *read);
  if (status.ok()) status = ingest.FinishPrompt();
  if (entry != nullptr) entry->End();  // (an ephemeral session: nothing is written)
  if (ingest.ingested() > 0) metrics_.ObservePrefill(ingest.ingested(), ingest.engine_seconds());
  if (!status.ok()) return Finish(ToGrpc(status));
  // (FinishPrompt made the session by now.)

  // (RunGeneration's "holds no tokens yet" would name a session the caller
  // never saw and an RPC it did not call.)
  if (entry->tokens() == 0) {
    return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               "Complete needs a prompt: its messages brought no tokens (send "
                               "text, text_bytes or tokens in them)"));
  }
  // A snapshot of the whole prompt, before anything is generated, when it
  // is at least kMinCommonPrefixTokens past this call's hit or common-prefix
  // snapshot (a prompt that was a snapshot's tokens exactly only marks that
  // one used). Shorter ones are not kept: each would cost a window copy to
  // save less prefill than that, and under --prefix_cache_entries many
  // short one-off prompts would push a long document's snapshot out
  // (review-prefix finding 3).
  if (reuse && entry->tokens() - snapshotted_at >= kMinCommonPrefixTokens) {
    prefix_cache_->Add(entry, ingest.prompt_ids(), score_top,
                       score_top.has_value() ? std::move(ingest.kept_scores())
                                             : std::vector<TokenScore>{});
  }
  for (drt::v1::PromptLogprobs& scores : held_scores) {
    drt::v1::GenerateResponse event;
    *event.mutable_prompt_logprobs() = std::move(scores);
    if (!stream->Write(event)) {
      return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the Complete was cancelled"));
    }
  }
  held_scores.clear();
  drt::v1::GenerateTimings timings;
  timings.set_prefill_seconds(ingest.engine_seconds());
  // The prompt's tokens, those a snapshot held included (OpenAI's usage
  // counts them too, and reports them as cached_tokens).
  timings.set_prompt_tokens(ingest.reused() + ingest.ingested());
  timings.set_cached_prompt_tokens(ingest.reused());
  if (prompt_only) {
    // Nothing generated: each choice's done (no forks needed), then the
    // call's session goes with `cleanup`.
    for (int32_t i = 0; i < choices; ++i) {
      drt::v1::GenerateResponse done;
      done.mutable_done()->set_finish_reason(drt::v1::FINISH_REASON_LENGTH);
      done.mutable_done()->set_session_tokens(entry->tokens());
      done.mutable_done()->set_choice(i);
      *done.mutable_done()->mutable_timings() = timings;
      if (!stream->Write(done)) break;
    }
    return Finish(grpc::Status::OK);
  }
  if (choices > 1) {
    std::vector<std::shared_ptr<SessionEntry>> entries = {entry};
    for (int32_t i = 1; i < choices; ++i) {
      auto fork = sessions_->ForkEphemeral(entry);
      if (!fork.ok()) return Finish(ToGrpc(fork.status()));
      cleanup.ids.push_back((*fork)->id());
      entries.push_back(*std::move(fork));
    }
    return Finish(ToGrpc(RunChoices(context, entries, *plan, model_, *sessions_, *scheduler_,
                                    metrics_, timings, *stream,
                                    options_.choice_piece_for_test)));
  }
  if (absl::Status s = entry->Begin(Activity::kGenerating); !s.ok()) return Finish(ToGrpc(s));
  drt::v1::GenerateResponse done;
  status = RunGeneration(
      context, *entry, *plan, model_, *sessions_, *scheduler_, metrics_,
      [&](const drt::v1::GenerateResponse& r) { return stream->Write(r); }, timings, done);
  entry->End();  // (an ephemeral session: nothing is written)
  if (status.ok()) stream->Write(done);
  return Finish(ToGrpc(status));
}

static void FillInfo(const SessionEntry& entry, drt::v1::SessionInfo* info) {
  info->set_session_id(entry.id());
  info->set_tokens(entry.tokens());
  info->set_chunks(entry.chunks());
  info->set_host_bytes(entry.host_bytes());
  info->set_shared_bytes(entry.shared_bytes());
  info->set_mapped_bytes(entry.mapped_bytes());
  info->set_busy(entry.activity() != Activity::kIdle);
  info->set_max_context_tokens(entry.settings().max_context_tokens);
  info->set_idle_ttl_seconds(entry.settings().idle_ttl_seconds);
  info->set_idle_seconds(entry.idle_seconds());
}

grpc::Status DrtService::ForkSession(grpc::ServerContext* context,
                                     const drt::v1::ForkSessionRequest* request,
                                     drt::v1::SessionInfo* response) {
  if (grpc::Status s = Admit(context, "ForkSession"); !s.ok()) return s;
  auto fork = sessions_->Fork(request->session_id());
  if (!fork.ok()) return Finish(ToGrpc(fork.status()));
  FillInfo(**fork, response);
  return Finish(grpc::Status::OK);
}

grpc::Status DrtService::GetSession(grpc::ServerContext* context,
                                    const drt::v1::GetSessionRequest* request,
                                    drt::v1::SessionInfo* response) {
  if (grpc::Status s = Admit(context, "GetSession"); !s.ok()) return s;
  auto entry = sessions_->Find(request->session_id());
  if (!entry.ok()) return Finish(ToGrpc(entry.status()));
  FillInfo(**entry, response);
  return Finish(grpc::Status::OK);
}

grpc::Status DrtService::ListSessions(grpc::ServerContext* context,
                                      const drt::v1::ListSessionsRequest* request,
                                      drt::v1::ListSessionsResponse* response) {
  if (grpc::Status s = Admit(context, "ListSessions"); !s.ok()) return s;
  for (const auto& entry : sessions_->List()) FillInfo(*entry, response->add_sessions());
  return Finish(grpc::Status::OK);
}

grpc::Status DrtService::DeleteSession(grpc::ServerContext* context,
                                       const drt::v1::DeleteSessionRequest* request,
                                       drt::v1::DeleteSessionResponse* response) {
  if (grpc::Status s = Admit(context, "DeleteSession"); !s.ok()) return s;
  return Finish(ToGrpc(sessions_->Delete(request->session_id())));
}

grpc::Status DrtService::GetModelInfo(grpc::ServerContext* context,
                                      const drt::v1::GetModelInfoRequest* request,
                                      drt::v1::ModelInfo* response) {
  if (grpc::Status s = Admit(context, "GetModelInfo"); !s.ok()) return s;
  const ModelConfig& c = model_.config();
  response->set_name(options_.model_name);
  response->set_device(options_.device);
  response->set_precision(options_.precision);
  response->set_vocab_size(c.vocab_size);
  response->set_hidden_size(c.hidden_size);
  response->set_num_attention_heads(c.num_attention_heads);
  for (int64_t n : c.decoder_layers) response->add_decoder_layers(n);
  response->set_encoder_layers(c.encoder_layers);
  response->set_enc_chunk_size(c.enc_chunk_size);
  response->set_chunk_topk(c.chunk_topk);
  response->set_slide_window(c.slide_window);
  response->set_chunk_id(static_cast<int32_t>(c.chunk_id));
  response->set_pad_id(static_cast<int32_t>(c.pad_id));
  response->set_eos_id(model_.tokenizer->eos_id());
  response->set_max_context_tokens(options_.max_context_tokens);
  response->set_tokenizer(model_.tokenizer->one_id_per_byte() ? "bytes" : "gpt2-bpe");
  response->set_pad_to_chunk_boundary(model_.generation.pad_to_chunk_boundary);
  // The limits a client must respect, from where each is enforced.
  response->set_max_message_bytes(options_.max_message_bytes);
  response->set_max_sessions(sessions_->limits().max_sessions);
  response->set_max_idle_ttl_seconds(sessions_->limits().idle_ttl_seconds);
  response->set_max_tokens_limit(kMaxTokensLimit);
  response->set_default_max_tokens(kDefaultMaxTokens);
  response->set_max_complete_choices(static_cast<int32_t>(
      std::min<int64_t>(kMaxCompleteChoices, sessions_->limits().max_sessions)));
  response->set_max_top_logprobs(kMaxTopLogprobs);
  response->set_max_logit_bias_entries(kMaxLogitBiasEntries);
  response->set_max_session_id_bytes(static_cast<int32_t>(kMaxSessionIdBytes));
  return Finish(grpc::Status::OK);
}

// SaveSession / LoadSession: one session as one file in --session_files_dir
// (server/session_file.h).
grpc::Status DrtService::SaveSession(grpc::ServerContext* context,
                                     const drt::v1::SaveSessionRequest* request,
                                     drt::v1::SaveSessionResponse* response) {
  if (grpc::Status s = Admit(context, "SaveSession"); !s.ok()) return s;
  if (options_.session_files_dir.empty()) {
    return Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               "SaveSession needs the server to run with --session_files_dir"));
  }
  if (absl::Status s = CheckSessionFileName(request->file_name()); !s.ok()) {
    return Finish(ToGrpc(s));
  }
  auto entry = sessions_->Find(request->session_id());
  if (!entry.ok()) return Finish(ToGrpc(entry.status()));
  // A reader claim keeps the engine state still while it is written (other
  // saves and forks may share it).
  if (absl::Status s = (*entry)->BeginRead(ReadKind::kSave); !s.ok()) return Finish(ToGrpc(s));
  const std::string path = options_.session_files_dir + "/" + request->file_name();
  int64_t bytes = 0, tokens = 0;
  bool written_whole = false;
  absl::Status status = (*entry)->RunReadStep([&](Session& session) -> absl::Status {
    if (absl::Status s = (*entry)->CheckStateWhole(); !s.ok()) return s;
    auto written = SaveSessionFile(path, (*entry)->id(), (*entry)->settings(), session);
    if (!written.ok()) return written.status();
    bytes = *written;
    tokens = session.num_tokens();
    written_whole = true;
    if (options_.after_session_file_saved_for_test) {
      options_.after_session_file_saved_for_test((*entry)->id());
    }
    return absl::OkStatus();
  });
  (*entry)->EndRead(ReadKind::kSave);
  // A DeleteSession that came while the file was written: the file is
  // whole and in place (a snapshot of the session as the delete found it),
  // so the save succeeded and says so, instead of ABORTED beside a file
  // that exists (docs/api.md).
  if (written_whole && absl::IsAborted(status)) status = absl::OkStatus();
  if (!status.ok()) return Finish(ToGrpc(status));
  response->set_file_name(request->file_name());
  response->set_bytes(bytes);
  response->set_tokens(tokens);
  return Finish(grpc::Status::OK);
}

grpc::Status DrtService::LoadSession(grpc::ServerContext* context,
                                     const drt::v1::LoadSessionRequest* request,
                                     drt::v1::SessionInfo* response) {
  if (grpc::Status s = Admit(context, "LoadSession"); !s.ok()) return s;
  if (options_.session_files_dir.empty()) {
    return Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               "LoadSession needs the server to run with --session_files_dir"));
  }
  if (absl::Status s = CheckSessionFileName(request->file_name()); !s.ok()) {
    return Finish(ToGrpc(s));
  }
  // The chunks' memory is reserved against the host-memory budget before
  // any is read, and held until the session is in the table (then it
  // counts itself, and AddLoaded releases the reservation in the same
  // step): a file too large for the budget is refused with the server
  // unchanged.
  HostReservation reservation;
  auto loaded = LoadSessionFile(
      options_.session_files_dir + "/" + request->file_name(), backend_,
      [&](int64_t chunks) -> absl::Status {
        // Checked before any chunk is read (the insert checks again): a full
        // server refuses at once instead of after reading a whole file.
        if (absl::Status s = sessions_->CheckSessionRoom(); !s.ok()) {
          return absl::Status(s.code(),
                              absl::StrFormat("%s (nothing of %s was read past its header)",
                                              s.message(), request->file_name()));
        }
        auto reserved = sessions_->Reserve(
            chunks * backend_.host_bytes_per_chunk(),
            absl::StrFormat("the %d chunks of %s", chunks, request->file_name()));
        if (!reserved.ok()) return reserved.status();
        reservation = *std::move(reserved);
        return absl::OkStatus();
      });
  if (!loaded.ok()) return Finish(ToGrpc(loaded.status()));
  auto entry = sessions_->AddLoaded(loaded->settings, std::move(loaded->session), reservation);
  if (!entry.ok()) return Finish(ToGrpc(entry.status()));
  FillInfo(**entry, response);
  return Finish(grpc::Status::OK);
}

grpc::Status DrtService::Tokenize(grpc::ServerContext* context,
                                  const drt::v1::TokenizeRequest* request,
                                  drt::v1::TokenizeResponse* response) {
  if (grpc::Status s = Admit(context, "Tokenize"); !s.ok()) return s;
  absl::StatusOr<drt::v1::TokenizeResponse> answer =
      TokenizeText(*model_.tokenizer, *request, options_.max_context_tokens);
  if (!answer.ok()) return Finish(ToGrpc(answer.status()));
  *response = std::move(*answer);
  return Finish(grpc::Status::OK);
}

grpc::Status DrtService::Detokenize(grpc::ServerContext* context,
                                    const drt::v1::DetokenizeRequest* request,
                                    drt::v1::DetokenizeResponse* response) {
  if (grpc::Status s = Admit(context, "Detokenize"); !s.ok()) return s;
  absl::StatusOr<drt::v1::DetokenizeResponse> answer =
      DetokenizeIds(*model_.tokenizer, model_.config(), *request);
  if (!answer.ok()) return Finish(ToGrpc(answer.status()));
  *response = std::move(*answer);
  return Finish(grpc::Status::OK);
}

}  // namespace drt::server
