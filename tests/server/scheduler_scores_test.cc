// Scored work items (WorkItem::score_top_logprobs, server/scheduler.h): the
// scheduler gives a scored item's pieces their logits and scores them after
// each step. Expectations come from Session::Append with
// AppendOptions::score on a session of its own (engine/token_scores.h, itself
// checked against a brute-force log-softmax), and, for the unscored session
// stepped beside it, from the same tokens appended alone.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/batch_step.h"
#include "engine/model_rules.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "server/engine_watchdog.h"
#include "server/scheduler.h"
#include "server/session_manager.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/scheduler_items.h"
#include "tests/server/test_util/scheduler_steps.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

constexpr int64_t kStepTokens = 630;  // 10 chunks: a long item takes many steps

// Scores of `tokens` appended to a fresh session after `prefix` (engine API).
std::vector<TokenScore> EngineScores(const std::vector<int32_t>& prefix,
                                     const std::vector<int32_t>& tokens, int32_t top) {
  auto session = Session::Create(*FixtureModel::Get().backend);
  REQUIRE(session.ok());
  if (!prefix.empty()) REQUIRE((*session)->Append(prefix).ok());
  AppendOptions options;
  options.score = true;
  options.score_top_logprobs = top;
  auto result = (*session)->Append(tokens, options);
  REQUIRE(result.ok());
  return result->scores;
}

std::vector<float> LastLogits(SessionEntry& entry, int64_t* skipped = nullptr) {
  std::vector<float> logits;
  REQUIRE(entry
              .RunStep([&](Session& s) {
                logits.assign(s.last_logits().begin(), s.last_logits().end());
                if (skipped) *skipped = s.backend_session().stats().upper_rows_skipped;
                return absl::OkStatus();
              })
              .ok());
  return logits;
}

// Scores and progress in the order the caller saw them: a progress call's
// count must never pass the scores delivered before it.
struct Seen {
  std::vector<TokenScore> scores;
  std::vector<int64_t> progress;
  bool progress_ahead_of_scores = false;
};

void Watch(WorkItem& item, int32_t top, Seen& seen) {
  item.score_top_logprobs = top;
  item.on_scores = [&seen](std::vector<TokenScore> scores) {
    seen.scores.insert(seen.scores.end(), scores.begin(), scores.end());
  };
  item.on_progress = [&seen](int64_t done) {
    seen.progress.push_back(done);
    if (static_cast<int64_t>(seen.scores.size()) < done) seen.progress_ahead_of_scores = true;
  };
}

void CheckScores(const std::vector<TokenScore>& got, const std::vector<TokenScore>& want,
                 double margin) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("token " << i);
    CHECK(got[i].token == want[i].token);
    CHECK(got[i].scored == want[i].scored);
    CHECK(got[i].logprob == Approx(want[i].logprob).margin(margin));
    REQUIRE(got[i].top.size() == want[i].top.size());
    for (size_t k = 0; k < got[i].top.size(); ++k) CHECK(got[i].top[k].token == want[i].top[k].token);
  }
}

TEST_CASE("a scored item beside an unscored one in the same steps: scores as the engine's, "
          "the other session still skips the upper layers",
          "[server][scheduler][score]") {
  Backend& backend = *FixtureModel::Get().backend;
  REQUIRE(backend.runs_mixed_lower_only_forwards());
  SessionManager manager(backend, SessionLimits{});
  auto scored_entry = NewEntry(manager);
  auto plain_entry = NewEntry(manager);
  const std::vector<int32_t> prefix = RandomTokens(100, 11);
  const std::vector<int32_t> scored_tokens = RandomTokens(1500, 12);
  const std::vector<int32_t> plain_tokens = RandomTokens(3000, 13);

  std::mutex mutex;
  std::condition_variable changed;
  bool parked = false, released = false;
  int64_t shared_steps = 0;
  // Steps holding both items whose rows skipped the upper layers: the scored
  // piece skips none (checked below), so the unscored one skipped in them.
  std::atomic<int64_t> shared_skipping_steps{0};
  SchedulerOptions options;
  options.step_tokens = kStepTokens;
  options.on_step_done = [&](const StepRecord& step, double) {
    if (step.pieces.size() == 2 && step.upper_rows_skipped > 0) ++shared_skipping_steps;
  };
  options.on_step_formed = [&](const StepRecord& step) {
    if (step.pieces.size() == 2) ++shared_steps;
    if (step.index != 2) return;  // step 1 is the prefix alone
    std::unique_lock<std::mutex> lock(mutex);
    parked = true;
    changed.notify_all();
    changed.wait(lock, [&] { return released; });
  };
  Scheduler scheduler(backend, options);
  REQUIRE(scheduler.Run(Prefill(*scored_entry, prefix)).status.ok());

  WorkItem scored = Prefill(*scored_entry, scored_tokens);
  Seen seen;
  Watch(scored, 4, seen);
  WorkItem plain = Prefill(*plain_entry, plain_tokens);
  auto scored_run = std::async(std::launch::async, [&] { return scheduler.Run(scored); });
  {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return parked; });
  }
  auto plain_run = std::async(std::launch::async, [&] { return scheduler.Run(plain); });
  while (scheduler.queued() < 2) std::this_thread::yield();
  {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
  }
  changed.notify_all();
  const WorkResult scored_result = scored_run.get();
  const WorkResult plain_result = plain_run.get();
  REQUIRE(scored_result.status.ok());
  REQUIRE(plain_result.status.ok());
  CHECK(shared_steps >= 2);

  // The scored session's pieces shared forwards with slices that ran
  // lower-only, and the steps cut it other than Session::Append does, so
  // its GEMMs had other rows than alone: measured here (2026-11-25) at most
  // 1.5e-5 from the engine's scores alone (logprobs of magnitude ~5);
  // 1e-4 leaves 6x.
  CheckScores(seen.scores, EngineScores(prefix, scored_tokens, 4), 1e-4);
  CHECK(seen.scores.front().scored);  // from the prefix's last logits
  CHECK_FALSE(seen.progress_ahead_of_scores);
  int64_t scored_skipped = -1, plain_skipped = -1;
  LastLogits(*scored_entry, &scored_skipped);
  const std::vector<float> plain_logits = LastLogits(*plain_entry, &plain_skipped);
  CHECK(scored_skipped == 0);  // a scored item's rows run every layer
  CHECK(plain_skipped > 0);    // the other still skips where it may
  CHECK(shared_skipping_steps.load() >= 1);  // and does so in a step shared with the scored one
  // The unscored session ends as the same tokens appended alone, within the
  // mixed-step bound (docs/batching.md, "Lower-only slices in mixed steps"):
  // measured 8.2e-6 absolute here (logits of magnitude ~10).
  auto alone = Session::Create(backend);
  REQUIRE(alone.ok());
  REQUIRE((*alone)->Append(plain_tokens).ok());
  REQUIRE(plain_logits.size() == (*alone)->last_logits().size());
  double worst = 0;
  for (size_t i = 0; i < plain_logits.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(plain_logits[i]) -
                                     (*alone)->last_logits()[i]));
  }
  CHECK(worst < 1e-4);
}

TEST_CASE("a scored item cancelled midway scores exactly the tokens it kept",
          "[server][scheduler][score]") {
  Backend& backend = *FixtureModel::Get().backend;
  SessionManager manager(backend, SessionLimits{});
  auto entry = NewEntry(manager);
  const std::vector<int32_t> tokens = RandomTokens(3000, 14);
  SchedulerOptions options;
  options.step_tokens = kStepTokens;
  Scheduler scheduler(backend, options);
  WorkItem item = Prefill(*entry, tokens);
  Seen seen;
  Watch(item, 0, seen);
  std::atomic<bool> stop{false};
  item.should_stop = [&] { return stop.load(); };
  auto progress = item.on_progress;
  item.on_progress = [&](int64_t done) {
    progress(done);
    stop = true;
  };
  const WorkResult result = scheduler.Run(item);
  CHECK(result.status.code() == absl::StatusCode::kCancelled);
  REQUIRE(result.tokens_done > 0);
  REQUIRE(result.tokens_done < 3000);
  const int64_t held = [&] {
    int64_t n = 0;
    REQUIRE(entry->RunStep([&](Session& s) { n = s.num_tokens(); return absl::OkStatus(); }).ok());
    return n;
  }();
  CHECK(held == result.tokens_done);
  REQUIRE(static_cast<int64_t>(seen.scores.size()) == result.tokens_done);
  CHECK_FALSE(seen.scores.front().scored);  // an empty session's first token
  const std::vector<int32_t> kept(tokens.begin(), tokens.begin() + result.tokens_done);
  // Measured 2.4e-5 (pieces cut otherwise than Session::Append's): 1e-4.
  CheckScores(seen.scores, EngineScores({}, kept, 0), 1e-4);
}

TEST_CASE("a scored item whose caller is slow to take its scores waits: the engine stops "
          "at max_undelivered_scores plus a step, then goes on",
          "[server][scheduler][score]") {
  Backend& backend = *FixtureModel::Get().backend;
  SessionManager manager(backend, SessionLimits{});
  auto entry = NewEntry(manager);
  const std::vector<int32_t> tokens = RandomTokens(4000, 16);
  constexpr int64_t kMaxUndelivered = 700;
  SchedulerOptions options;
  options.step_tokens = kStepTokens;
  options.max_undelivered_scores = kMaxUndelivered;
  std::atomic<int64_t> ran{0};  // tokens of the steps run (engine thread)
  options.on_step_done = [&](const StepRecord& step, double) {
    for (const StepPiece& piece : step.pieces) ran += piece.tokens;
  };
  Scheduler scheduler(backend, options);
  WorkItem item = Prefill(*entry, tokens);
  item.score_top_logprobs = 2;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<TokenScore> got;
  std::atomic<int64_t> taken{0};
  item.on_scores = [&](std::vector<TokenScore> scores) {
    got.insert(got.end(), scores.begin(), scores.end());
    taken = static_cast<int64_t>(got.size());
    released.wait();  // the first batch's writer blocks (a client that does not read)
  };
  auto run = std::async(std::launch::async, [&] { return scheduler.Run(item); });
  // Until the engine has stopped forming steps (no step for 0.5 s).
  int64_t last = -1;
  for (int i = 0; i < 120 && (ran.load() != last || taken.load() == 0); ++i) {
    last = ran.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const int64_t held_ran = ran.load(), held_taken = taken.load();
  INFO("ran " << held_ran << " tokens with " << held_taken << " scores taken");
  REQUIRE(held_taken > 0);
  // Waiting: at most the limit of scores not taken, plus the step that
  // reached it (measured: 1890 ran, 630 taken, as step 3 reached 1260).
  CHECK(held_ran < static_cast<int64_t>(tokens.size()));
  CHECK(held_ran - held_taken <= kMaxUndelivered + kStepTokens);
  release.set_value();
  const WorkResult result = run.get();
  REQUIRE(result.status.ok());
  REQUIRE(got.size() == tokens.size());
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i].token == tokens[i]);
}

// review-server F1: a scored item parked because its caller does not take
// its scores (a client that stopped reading) left it counted as queued work
// with no step finishing, so liveness called a healthy engine stuck once
// --engine_stall_seconds passed, and Kubernetes would restart the pod. The
// liveness figures are read at a time far past the limit (EngineLiveness
// takes the time to judge at), so the test needs no long wait.
TEST_CASE("a scored item parked for its caller is not stuck work: liveness stays OK past the "
          "limit, and the progress clock restarts when it can run again",
          "[server][scheduler][score][health]") {
  Backend& backend = *FixtureModel::Get().backend;
  SessionManager manager(backend, SessionLimits{});
  auto entry = NewEntry(manager);
  const std::vector<int32_t> tokens = RandomTokens(4000, 17);
  SchedulerOptions options;
  options.step_tokens = kStepTokens;
  options.max_undelivered_scores = 700;
  std::atomic<int64_t> ran{0};  // tokens of the steps run (engine thread)
  options.on_step_done = [&](const StepRecord& step, double) {
    for (const StepPiece& piece : step.pieces) ran += piece.tokens;
  };
  // The first step formed after the caller is released: what liveness read
  // then, before that step ran (a step's end refreshes the clock anyway).
  std::atomic<bool> released_flag{false};
  std::promise<Scheduler::EngineProgress> after_release;
  std::atomic<bool> after_release_set{false};
  Scheduler* scheduler_ptr = nullptr;
  options.on_step_formed = [&](const StepRecord&) {
    if (released_flag.load() && !after_release_set.exchange(true)) {
      after_release.set_value(scheduler_ptr->engine_progress());
    }
  };
  Scheduler scheduler(backend, options);
  scheduler_ptr = &scheduler;
  WorkItem item = Prefill(*entry, tokens);
  item.score_top_logprobs = 2;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int64_t> taken{0};
  item.on_scores = [&](std::vector<TokenScore> scores) {
    taken += static_cast<int64_t>(scores.size());
    released.wait();  // the first batch's writer blocks (a client that does not read)
  };
  auto run = std::async(std::launch::async, [&] { return scheduler.Run(item); });
  // Until the engine has stopped forming steps (no step for 0.5 s): parked.
  int64_t last = -1;
  for (int i = 0; i < 120 && (ran.load() != last || taken.load() == 0); ++i) {
    last = ran.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  REQUIRE(taken.load() > 0);
  REQUIRE(ran.load() < static_cast<int64_t>(tokens.size()));  // parked, not done
  REQUIRE(scheduler.queued() == 1);  // still in the queue, waiting for its caller
  const Scheduler::EngineProgress parked = scheduler.engine_progress();
  const std::chrono::milliseconds limit(1000);
  const auto an_hour_later = std::chrono::steady_clock::now() + std::chrono::hours(1);
  // Before the fix: 1 item queued, stalled for an hour, "engine stuck".
  CHECK(parked.queued == 0);
  CHECK(EngineStalledSeconds(parked, an_hour_later) == 0.0);
  CHECK(EngineLiveness(parked, an_hour_later, limit).ok());

  // Released: runnable again, counted again, and the clock counts from
  // the release, not from the step before the item was parked.
  const auto released_at = std::chrono::steady_clock::now();
  released_flag.store(true);
  release.set_value();
  auto progress = after_release.get_future();
  REQUIRE(progress.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  const Scheduler::EngineProgress resumed = progress.get();
  CHECK(resumed.queued == 1);
  CHECK(resumed.since >= released_at);
  CHECK(EngineLiveness(resumed, released_at + limit, limit).ok());
  const WorkResult result = run.get();
  REQUIRE(result.status.ok());
  CHECK(taken.load() == static_cast<int64_t>(tokens.size()));
  CHECK(scheduler.engine_progress().queued == 0);
}

TEST_CASE("the decode budget counts a scored piece as running every layer: the steps beside "
          "decode stay within the limit (fake step clock, prefill tokens of two costs)",
          "[server][scheduler][score]") {
  FixtureModel& f = FixtureModel::Get();
  REQUIRE(f.backend->runs_mixed_lower_only_forwards());
  SessionManager manager(*f.backend, SessionLimits{});
  const int64_t reach = f.backend->upper_layer_reach();
  // As in scheduler_test.cc's "learns lower-only and full prefill tokens
  // apart": decode 1 s, a lower-only prefill token 0.125 s, a full one 0.5 s,
  // limit 2: 8 lower-only or 2 full tokens fit beside a decode token. First
  // an unscored message (3 x the reach: its first 2 x reach lower-only) so
  // that the budget learns the lower-only rate, then a scored one of the
  // same size, every token of which runs every layer.
  const int64_t size = 3 * reach;
  const auto plain_message = RandomTokens(size, 73), scored_message = RandomTokens(size, 74);
  auto plain = NewEntry(manager, Activity::kAppending);
  auto scored = NewEntry(manager, Activity::kAppending);
  FakeStepClock clock(1'000'000'000, 125'000'000, 500'000'000);
  int64_t formed = 0;  // tokens of the plain message formed so far (engine thread)
  const ModelConfig& config = f.backend->config();
  const int64_t lower_only_end = DecoderPositionsFor(config, size) - reach;
  clock.lower_only_tokens = [&](const StepPiece& piece) -> int64_t {
    if (piece.entry == scored.get()) return 0;
    if (piece.entry != plain.get()) return piece.tokens;
    const int64_t end = formed + piece.tokens;
    formed = end;
    return DecoderPositionsFor(config, end) <= lower_only_end ? piece.tokens : 0;
  };
  StepLog log;
  SchedulerOptions options = log.Options(630);
  clock.Install(log, options);
  options.decode_slowdown_limit = 2.0;
  options.decode_resubmit_wait = std::chrono::seconds(30);
  Scheduler scheduler(*f.backend, options);

  auto generating = NewEntry(manager, Activity::kGenerating);
  const auto prompt = RandomTokens(100, 75);
  REQUIRE(generating->RunStep([&](Session& s) { return s.Append(prompt).status(); }).ok());
  Sampler sampler(SamplingParams{});
  std::vector<TokenScore> scores;
  {
    Scheduler::Generating scope(scheduler, generating.get());
    REQUIRE(RunDecode(scheduler, *generating, SampleToken(*generating, sampler)).status.ok());
    for (SessionEntry* entry : {plain.get(), scored.get()}) {
      Background append;
      append.item = Prefill(*entry, entry == plain.get() ? plain_message : scored_message);
      if (entry == scored.get()) {
        append.item.score_top_logprobs = 0;
        append.item.on_scores = [&](std::vector<TokenScore> batch) {
          scores.insert(scores.end(), batch.begin(), batch.end());
        };
      }
      append.Start(scheduler);
      while (append.result.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        REQUIRE(RunDecode(scheduler, *generating, SampleToken(*generating, sampler)).status.ok());
      }
      REQUIRE(append.result.get().status.ok());
    }
  }
  CHECK(scores.size() == scored_message.size());
  int64_t largest_plain = 0, largest_scored = 0;
  for (const StepRecord& step : log.steps()) {
    auto shares = Shares(step);
    if (!shares.contains(generating.get())) continue;
    INFO("step " << step.index << ": " << shares[plain.get()] << " plain, "
                 << shares[scored.get()] << " scored tokens, " << clock.Seconds(step.index)
                 << " s");
    CHECK(clock.Seconds(step.index) <= 2.0);  // within 2 x the decode-only 1 s
    largest_plain = std::max(largest_plain, shares[plain.get()]);
    largest_scored = std::max(largest_scored, shares[scored.get()]);
  }
  CHECK(largest_plain == 8);   // the lower-only allowance was learned and used
  CHECK(largest_scored == 2);  // the scored pieces took the full one
  plain->End();
  scored->End();
  generating->End();
}

TEST_CASE("a scored item on a durable session whose state is not whole: its first token "
          "unscored, scores handed over only with the acknowledged tokens",
          "[server][scheduler][score]") {
  Backend& backend = *FixtureModel::Get().backend;
  drt::testing::TempDir dir;
  DurableServer server(DurableOptions(dir.path()));
  auto entry = NewEntry(*server.sessions);
  REQUIRE(entry->durable());
  const int64_t reach = backend.upper_layer_reach();
  // A piece with tokens following (as the scheduler runs one mid-item):
  // upper-layer rows skipped, no last logits, the state not whole.
  const std::vector<int32_t> prefix = RandomTokens(100, 17);
  {
    auto session = entry->BeginStep();
    REQUIRE(session.ok());
    StepEntry step{*session, prefix, false, nullptr, 10 * reach};
    REQUIRE(drt::RunStep(backend, {&step, 1})[0].ok());
    REQUIRE((*session)->last_logits().empty());
    REQUIRE(entry->EndStep(absl::OkStatus(), /*state_whole=*/false).ok());
  }
  REQUIRE_FALSE(entry->state_whole());

  // Stretches shorter than the reach: the item's first stretch ends do not
  // make the inherited state whole (its first reach + 1 tokens must run
  // first), so they are not acknowledged, and their scores must wait.
  const int64_t stretch = std::max<int64_t>(1, reach / 3);
  SchedulerOptions options;
  options.step_tokens = kStepTokens;
  options.durable_ack_tokens = stretch;
  Scheduler scheduler(backend, options);
  const std::vector<int32_t> tokens = RandomTokens(3 * reach + 10, 18);
  WorkItem item = Prefill(*entry, tokens);
  item.score_top_logprobs = 3;
  std::vector<TokenScore> scores;
  std::vector<int64_t> delivered, progress;  // after each on_scores / on_progress call
  item.on_scores = [&](std::vector<TokenScore> batch) {
    scores.insert(scores.end(), batch.begin(), batch.end());
    delivered.push_back(static_cast<int64_t>(scores.size()));
  };
  item.on_progress = [&](int64_t done) { progress.push_back(done); };
  const WorkResult result = scheduler.Run(item);
  REQUIRE(result.status.ok());
  REQUIRE(scores.size() == tokens.size());
  INFO("reach " << reach << ", stretch " << stretch);
  REQUIRE_FALSE(delivered.empty());
  REQUIRE_FALSE(progress.empty());
  // Nothing before the first acknowledged count, past the reach; every
  // batch before the last ends at a count then acknowledged.
  CHECK(delivered.front() > reach);
  CHECK(progress.front() > reach);
  for (size_t i = 0; i + 1 < delivered.size(); ++i) {
    INFO("batch " << i << " ends at " << delivered[i]);
    CHECK(std::find(progress.begin(), progress.end(), delivered[i]) != progress.end());
  }
  // No last logits to score token 0 from.
  CHECK_FALSE(scores.front().scored);
  // Past the reach the state is as a full computation's: the scores are
  // those of the same tokens after the prefix appended in full (a token
  // within the reach was computed beside the prefix's skipped upper-layer
  // rows, so it is not compared).
  const std::vector<TokenScore> want = EngineScores(prefix, tokens, 3);
  double worst = 0;
  for (size_t i = static_cast<size_t>(reach) + 1; i < tokens.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(scores[i].logprob) - want[i].logprob));
    CHECK(scores[i].token == want[i].token);
  }
  INFO("worst past the reach " << worst);
  CHECK(worst < 1e-4);  // measured below; as the other cases' 1e-4
}

TEST_CASE("a scored item with top alternatives outside [0, 20] is refused before it runs",
          "[server][scheduler][score]") {
  Backend& backend = *FixtureModel::Get().backend;
  SessionManager manager(backend, SessionLimits{});
  auto entry = NewEntry(manager);
  Scheduler scheduler(backend, SchedulerOptions{});
  const std::vector<int32_t> tokens = RandomTokens(10, 15);
  WorkItem item = Prefill(*entry, tokens);
  item.score_top_logprobs = 21;
  const WorkResult result = scheduler.Run(item);
  CHECK(result.status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(result.tokens_done == 0);
  CHECK(result.steps_ran == 0);
}

}  // namespace
}  // namespace drt::server
