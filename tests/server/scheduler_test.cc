// The continuous-batching scheduler (server/scheduler.h) driven directly on
// the fixture model: which pieces each formed step holds (decode priority,
// fair prefill shares, joining and leaving between steps), and that one
// session's cancellation, deletion or bad tokens leave the others' results
// equal to running alone. Expected step contents are computed by hand from
// the step budget; the steps are read from the scheduler's on_step_formed
// hook, so nothing here depends on timing.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/model_rules.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "server/scheduler.h"
#include "server/session_manager.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/scheduler_items.h"
#include "tests/server/test_util/scheduler_steps.h"
#include "tests/server/test_util/waiting.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

// Sessions that prefill far more than a test lasts, each on its own thread,
// until Stop(): every step formed meanwhile has prefill to fill it.
class EndlessPrefill {
 public:
  EndlessPrefill(SessionManager& manager, Scheduler& scheduler, int sessions, uint64_t seed) {
    for (int i = 0; i < sessions; ++i) {
      entries_.push_back(NewEntry(manager, Activity::kAppending));
      prompts_.push_back(RandomTokens(63 * 2000, seed + i));
    }
    for (int i = 0; i < sessions; ++i) {
      background_.push_back(std::make_unique<Background>());
      background_[i]->item = Prefill(*entries_[i], prompts_[i]);
      background_[i]->item.should_stop = [this] { return stop_.load(); };
      background_[i]->Start(scheduler);
    }
  }
  ~EndlessPrefill() { Stop(); }
  const std::vector<std::shared_ptr<SessionEntry>>& entries() const { return entries_; }
  // Ends the items (CANCELLED) and returns their results, once.
  std::vector<WorkResult> Stop() {
    stop_ = true;
    std::vector<WorkResult> results;
    for (auto& b : background_) {
      if (b->result.valid()) results.push_back(b->result.get());
    }
    return results;
  }

 private:
  std::vector<std::shared_ptr<SessionEntry>> entries_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<std::unique_ptr<Background>> background_;
  std::atomic<bool> stop_{false};
};

TEST_CASE("a generated token is in the first step formed after it is submitted, whatever "
          "prefill is queued",
          "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  // The prefill shares of a step holding the decode token, smallest first:
  // with budget 63, the other 62 tokens are shared by the three prefills;
  // with budget 2 there is one token left, for one of them (fair sharing
  // alone, without decode priority, would make the token wait there).
  int64_t budget = 0;
  std::vector<int64_t> expected_shares;
  SECTION("budget 63") {
    budget = 63;
    expected_shares = {20, 21, 21};
  }
  SECTION("budget 2, less than the sessions") {
    budget = 2;
    expected_shares = {0, 0, 1};
  }
  StepLog log;
  SchedulerOptions options = log.Options(budget);
  options.decode_slowdown_limit = 0;  // no time limit: the budget alone bounds the step
  Scheduler scheduler(*f.backend, options);

  // Three sessions prefill far more than the test lasts: every step is full.
  EndlessPrefill prefill(manager, scheduler, 3, 10);
  const auto& prefilling = prefill.entries();
  WaitFor([&] { return scheduler.steps_formed() >= 2; }, 30, "prefill steps");

  // Session B generates greedily as the server's Generate does: sample on
  // this thread, submit the token as a decode item.
  auto generating = NewEntry(manager, Activity::kGenerating);
  const auto prompt = RandomTokens(100, 3);
  REQUIRE(generating->RunStep([&](Session& s) { return s.Append(prompt).status(); }).ok());
  Sampler sampler(SamplingParams{});
  constexpr int kTokens = 8;
  std::vector<int32_t> generated;
  std::vector<WorkResult> results;
  for (int t = 0; t < kTokens; ++t) {
    const int32_t token = SampleToken(*generating, sampler);
    results.push_back(RunDecode(scheduler, *generating, token));
    generated.push_back(token);
  }
  const std::vector<WorkResult> prefill_results = prefill.Stop();

  for (int t = 0; t < kTokens; ++t) {
    INFO("token " << t);
    CHECK(results[t].status.ok());
    CHECK(results[t].steps_waited == 0);
    CHECK(results[t].steps_ran == 1);
  }
  // The prefill went on meanwhile and was still queued at the end.
  for (const WorkResult& r : prefill_results) {
    CHECK(r.status.code() == absl::StatusCode::kCancelled);
    CHECK(r.tokens_done > 0);
    CHECK(r.tokens_done < 63 * 2000);
  }
  // Every step holding the decode token was full: 1 decode token, first,
  // and the rest shared by the prefills.
  int decode_steps = 0;
  for (const StepRecord& step : log.steps()) {
    auto shares = Shares(step);
    if (!shares.contains(generating.get())) continue;
    ++decode_steps;
    INFO("step " << step.index);
    CHECK(step.pieces.front().entry == generating.get());  // decode first
    CHECK(step.pieces.front().kind == WorkKind::kDecode);
    CHECK(shares[generating.get()] == 1);
    CHECK(step.tokens() == budget);
    std::vector<int64_t> prefill_shares;
    for (const auto& e : prefilling) prefill_shares.push_back(shares[e.get()]);
    std::sort(prefill_shares.begin(), prefill_shares.end());
    CHECK(prefill_shares == expected_shares);
  }
  CHECK(decode_steps == kTokens);
  // The tokens are those the session generates alone.
  CHECK(generated == EngineGreedy(prompt, kTokens));
  for (auto& e : prefilling) e->End();
  generating->End();
}

TEST_CASE("a generating session keeps its place between tokens, and a step carrying decode "
          "takes at most decode_step_prefill_tokens of prefill",
          "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  StepLog log;
  SchedulerOptions options = log.Options(630);
  options.decode_step_prefill_tokens = 10;
  options.decode_slowdown_limit = 0;  // the fixed cap alone (the time limit: tests below)
  // Long enough that the engine always waits for the generating session
  // here: the test then does not depend on how fast this thread is.
  options.decode_resubmit_wait = std::chrono::seconds(30);
  Scheduler scheduler(*f.backend, options);

  EndlessPrefill prefill(manager, scheduler, 2, 20);
  const auto& prefilling = prefill.entries();
  WaitFor([&] { return scheduler.steps_formed() >= 2; }, 30, "prefill steps");

  auto generating = NewEntry(manager, Activity::kGenerating);
  const auto prompt = RandomTokens(100, 4);
  REQUIRE(generating->RunStep([&](Session& s) { return s.Append(prompt).status(); }).ok());
  Sampler sampler(SamplingParams{});
  constexpr int kTokens = 6;
  std::vector<int32_t> generated;
  {
    Scheduler::Generating scope(scheduler, generating.get());
    for (int t = 0; t < kTokens; ++t) {
      const int32_t token = SampleToken(*generating, sampler);
      // A slow handler: without the wait, prefill-only steps would be
      // formed in this gap and the token would wait behind one.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      REQUIRE(RunDecode(scheduler, *generating, token).status.ok());
      generated.push_back(token);
    }
  }
  // Once the scope is gone the engine no longer waits: full prefill steps.
  const int64_t after_scope = scheduler.steps_formed();
  WaitFor([&] { return scheduler.steps_formed() >= after_scope + 2; }, 30, "prefill steps after");
  prefill.Stop();

  std::vector<int64_t> decode_steps;
  for (const StepRecord& step : log.steps()) {
    auto shares = Shares(step);
    if (!shares.contains(generating.get())) {
      if (step.index > after_scope + 1 && step.index <= after_scope + 2) {
        CHECK(step.tokens() == 630);  // a prefill-only step takes the whole budget
      }
      continue;
    }
    decode_steps.push_back(step.index);
    INFO("step " << step.index);
    CHECK(shares[generating.get()] == 1);
    CHECK(shares[prefilling[0].get()] == 5);  // 10 prefill tokens, shared equally
    CHECK(shares[prefilling[1].get()] == 5);
  }
  REQUIRE(decode_steps.size() == kTokens);
  // No step was formed between two of the session's tokens.
  for (int t = 1; t < kTokens; ++t) CHECK(decode_steps[t] == decode_steps[t - 1] + 1);
  CHECK(generated == EngineGreedy(prompt, kTokens));
  for (auto& e : prefilling) e->End();
  generating->End();
}

// The prefill tokens of each step holding `entry`'s decode token, and by
// prefilling session.
struct DecodeSteps {
  std::vector<int64_t> index, prefill;
  std::vector<std::vector<int64_t>> by_session;
};
DecodeSteps DecodeStepsOf(const StepLog& log, const SessionEntry* entry,
                          const std::vector<std::shared_ptr<SessionEntry>>& prefilling) {
  DecodeSteps out;
  for (const StepRecord& step : log.steps()) {
    auto shares = Shares(step);
    if (!shares.contains(entry)) continue;
    out.index.push_back(step.index);
    out.prefill.push_back(step.tokens() - shares[entry]);
    std::vector<int64_t> split;
    for (const auto& e : prefilling) split.push_back(shares[e.get()]);
    out.by_session.push_back(split);
  }
  return out;
}

// Generates `tokens` tokens greedily without pause, as Generate does.
std::vector<int32_t> GenerateWithoutPause(Scheduler& scheduler, SessionEntry& entry, int tokens) {
  Sampler sampler(SamplingParams{});
  std::vector<int32_t> generated;
  Scheduler::Generating scope(scheduler, &entry);
  for (int t = 0; t < tokens; ++t) {
    const int32_t token = SampleToken(entry, sampler);
    REQUIRE(RunDecode(scheduler, entry, token).status.ok());
    generated.push_back(token);
  }
  return generated;
}

TEST_CASE("a step carrying a generated token takes as much prefill as keeps its time within "
          "decode_slowdown_limit times a decode-only step (fake step clock)",
          "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  // A decode step costs 1 s, a prefill token 0.125 s more: with the limit 2,
  // (2 - 1) x 1 / 0.125 = 8 prefill tokens fit (server/decode_step_budget.h).
  FakeStepClock clock(1'000'000'000, 125'000'000);
  StepLog log;
  SchedulerOptions options = log.Options(630);
  clock.Install(log, options);
  options.decode_slowdown_limit = 2.0;
  // The engine always waits for the generating session here, so every step
  // formed while it generates holds its token.
  options.decode_resubmit_wait = std::chrono::seconds(30);
  Scheduler scheduler(*f.backend, options);

  EndlessPrefill prefill(manager, scheduler, 2, 30);
  WaitFor([&] { return scheduler.steps_formed() >= 2; }, 30, "prefill steps");
  auto generating = NewEntry(manager, Activity::kGenerating);
  const auto prompt = RandomTokens(100, 5);
  REQUIRE(generating->RunStep([&](Session& s) { return s.Append(prompt).status(); }).ok());
  constexpr int kTokens = 8;
  const std::vector<int32_t> generated = GenerateWithoutPause(scheduler, *generating, kTokens);
  prefill.Stop();

  // The first decode step runs alone and measures 1 s; the prefill then
  // grows at most to 2p + 1 (1, 3, 7) until the 8 that fit.
  const std::vector<int64_t> expected = {0, 1, 3, 7, 8, 8, 8, 8};
  const DecodeSteps steps = DecodeStepsOf(log, generating.get(), prefill.entries());
  CHECK(steps.prefill == expected);
  REQUIRE(steps.index.size() == kTokens);
  for (size_t i = 0; i < steps.index.size(); ++i) {
    INFO("decode step " << i << " (step " << steps.index[i] << ")");
    if (i > 0) CHECK(steps.index[i] == steps.index[i - 1] + 1);
    // The scheduler timed it with the fake clock: 1 + 0.125 p seconds,
    // within 2 x the decode-only 1 s.
    CHECK(clock.Seconds(steps.index[i]) == 1.0 + 0.125 * static_cast<double>(steps.prefill[i]));
    CHECK(clock.Seconds(steps.index[i]) <= 2.0);
    // The two prefilling sessions share it equally (the odd token rotates).
    const auto& split = steps.by_session[i];
    CHECK(std::max(split[0], split[1]) - std::min(split[0], split[1]) <= 1);
  }
  CHECK(generated == EngineGreedy(prompt, kTokens));
  for (auto& e : prefill.entries()) e->End();
  generating->End();
}

TEST_CASE("the decode budget learns lower-only and full prefill tokens apart: a step at the "
          "end of a message, whose tokens run every layer, stays within the limit (fake step "
          "clock, prefill tokens of two costs)",
          "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  REQUIRE(f.backend->runs_mixed_lower_only_forwards());
  SessionManager manager(*f.backend, SessionLimits{});
  const int64_t reach = f.backend->upper_layer_reach();
  // One message of 3 x the reach: its first 2 x reach tokens lie more than
  // the reach before its end and run lower-only, its last reach run every
  // layer (engine/batch_step.h).
  const int64_t size = 3 * reach;
  const auto message = RandomTokens(size, 71);
  auto prefilling = NewEntry(manager, Activity::kAppending);
  // A decode step costs 1 s; a lower-only prefill token 0.125 s more, a
  // full one 0.5 s (the CPU measured about 1/3.5, docs/batching.md). With
  // the limit 2, 8 lower-only or 2 full tokens fit beside one decode token.
  FakeStepClock clock(1'000'000'000, 125'000'000, 500'000'000);
  // The cost model's own count of a piece's lower-only tokens: those of its
  // rows more than the reach (in positions, landmarks counted) before the
  // message's end; checked below against what the engine skipped.
  int64_t formed = 0;  // tokens of the message formed so far (engine thread)
  const ModelConfig& config = f.backend->config();
  const int64_t lower_only_end = DecoderPositionsFor(config, size) - reach;
  clock.lower_only_tokens = [&](const StepPiece& piece) -> int64_t {
    if (piece.entry != prefilling.get()) return piece.tokens;
    const int64_t end = formed + piece.tokens;
    formed = end;
    return DecoderPositionsFor(config, end) <= lower_only_end ? piece.tokens : 0;
  };
  StepLog log;
  SchedulerOptions options = log.Options(630);
  clock.Install(log, options);
  std::map<int64_t, int64_t> skipped;  // upper rows skipped by step index
  std::mutex skipped_mutex;
  options.on_step_done = [&](const StepRecord& step, double s) {
    clock.Done(step, s);
    std::lock_guard<std::mutex> lock(skipped_mutex);
    skipped[step.index] = step.upper_rows_skipped;
  };
  options.decode_slowdown_limit = 2.0;
  options.decode_resubmit_wait = std::chrono::seconds(30);
  Scheduler scheduler(*f.backend, options);

  auto generating = NewEntry(manager, Activity::kGenerating);
  const auto prompt = RandomTokens(100, 72);
  REQUIRE(generating->RunStep([&](Session& s) { return s.Append(prompt).status(); }).ok());
  // The message is submitted while the session generates, so (after the
  // first, decode-only step) every step carries a token and some prefill.
  Sampler sampler(SamplingParams{});
  Background append;
  {
    Scheduler::Generating scope(scheduler, generating.get());
    REQUIRE(RunDecode(scheduler, *generating, SampleToken(*generating, sampler)).status.ok());
    append.item = Prefill(*prefilling, message);
    append.Start(scheduler);
    while (append.result.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      REQUIRE(RunDecode(scheduler, *generating, SampleToken(*generating, sampler)).status.ok());
    }
  }
  REQUIRE(append.result.get().status.ok());

  int64_t lower_only_steps = 0, full_steps = 0;
  for (const StepRecord& step : log.steps()) {
    auto shares = Shares(step);
    if (!shares.contains(generating.get())) continue;
    const double seconds = clock.Seconds(step.index);
    INFO("step " << step.index << ": " << shares[prefilling.get()] << " prefill tokens, "
                 << seconds << " s");
    // The cost model agrees with the engine about which pieces skipped.
    {
      std::lock_guard<std::mutex> lock(skipped_mutex);
      const int64_t p = shares[prefilling.get()];
      if (p > 0) {
        const bool cheap = std::abs(seconds - (1.0 + 0.125 * static_cast<double>(p))) < 1e-9;
        CHECK(cheap == (skipped[step.index] > 0));
        (cheap ? lower_only_steps : full_steps) += 1;
      }
    }
    // Every step with decode within 2 x the decode-only 1 s (the first one
    // measures it alone).
    CHECK(seconds <= 2.0);
  }
  // Both kinds ran beside decode, and the cheap stretch was not cut to the
  // full tokens' allowance: it took 8 per step once grown (1, 3, 7, 8).
  CHECK(lower_only_steps > 0);
  CHECK(full_steps > 0);
  int64_t largest = 0;
  for (const StepRecord& step : log.steps()) {
    largest = std::max(largest, Shares(step)[prefilling.get()]);
  }
  CHECK(largest == 8);
  prefilling->End();
  generating->End();
}

TEST_CASE("prefill is never starved by a session generating without pause: one token per "
          "decode step even when it costs more than the limit allows (fake step clock)",
          "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  // A prefill token costs 4 s, four decode steps: none fits the limit.
  FakeStepClock clock(1'000'000'000, 4'000'000'000);
  StepLog log;
  SchedulerOptions options = log.Options(630);
  clock.Install(log, options);
  options.decode_resubmit_wait = std::chrono::seconds(30);
  Scheduler scheduler(*f.backend, options);

  EndlessPrefill prefill(manager, scheduler, 2, 40);
  WaitFor([&] { return scheduler.steps_formed() >= 2; }, 30, "prefill steps");
  auto generating = NewEntry(manager, Activity::kGenerating);
  const auto prompt = RandomTokens(100, 6);
  REQUIRE(generating->RunStep([&](Session& s) { return s.Append(prompt).status(); }).ok());
  constexpr int kTokens = 9;
  const std::vector<int32_t> generated = GenerateWithoutPause(scheduler, *generating, kTokens);
  prefill.Stop();

  // After the decode-only measurement, one prefill token per step, to each
  // prefilling session in turn: 4 each over the 8 steps.
  const DecodeSteps steps = DecodeStepsOf(log, generating.get(), prefill.entries());
  CHECK(steps.prefill == std::vector<int64_t>{0, 1, 1, 1, 1, 1, 1, 1, 1});
  std::vector<int64_t> per_session(2, 0);
  for (const auto& split : steps.by_session) {
    for (size_t s = 0; s < split.size(); ++s) per_session[s] += split[s];
  }
  CHECK(per_session == std::vector<int64_t>{4, 4});
  CHECK(generated == EngineGreedy(prompt, kTokens));
  for (auto& e : prefill.entries()) e->End();
  generating->End();
}

TEST_CASE("while a session generates, a step formed without its token (its handler late) takes "
          "no more prefill than a decode step would (fake step clock)",
          "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  FakeStepClock clock(1'000'000'000, 125'000'000);  // as above: 8 prefill tokens fit
  StepLog log;
  SchedulerOptions options = log.Options(630);
  clock.Install(log, options);
  // The engine never waits for the generating session: each of its tokens
  // below comes only after a step was formed without it.
  options.decode_resubmit_wait = std::chrono::microseconds(0);
  // However slow this thread is, the handler counts as late, not stalled.
  options.decode_stall_after = std::chrono::seconds(30);
  Scheduler scheduler(*f.backend, options);

  EndlessPrefill prefill(manager, scheduler, 2, 60);
  WaitFor([&] { return scheduler.steps_formed() >= 2; }, 30, "prefill steps");
  auto generating = NewEntry(manager, Activity::kGenerating);
  const auto prompt = RandomTokens(100, 8);
  REQUIRE(generating->RunStep([&](Session& s) { return s.Append(prompt).status(); }).ok());
  Sampler sampler(SamplingParams{});
  constexpr int kTokens = 6;
  std::vector<int32_t> generated;
  int64_t first_in_scope = 0, last_in_scope = 0;
  {
    Scheduler::Generating scope(scheduler, generating.get());
    first_in_scope = scheduler.steps_formed() + 1;
    for (int t = 0; t < kTokens; ++t) {
      const int64_t before = scheduler.steps_formed();
      WaitFor([&] { return scheduler.steps_formed() > before; }, 30, "a step without the token");
      const int32_t token = SampleToken(*generating, sampler);
      REQUIRE(RunDecode(scheduler, *generating, token).status.ok());
      generated.push_back(token);
    }
    last_in_scope = scheduler.steps_formed();
  }
  prefill.Stop();

  int gap_steps = 0;
  bool decoded = false;
  for (const StepRecord& step : log.steps()) {
    if (step.index < first_in_scope || step.index > last_in_scope) continue;
    INFO("step " << step.index);
    auto shares = Shares(step);
    const bool decode = shares.contains(generating.get());
    const int64_t prefill_tokens = step.tokens() - (decode ? shares[generating.get()] : 0);
    if (decode) {
      // (Some run alone to measure the decode time: the first, and one each
      // kDecodeEstimateRefreshSteps steps, a count the gap steps here make
      // depend on timing.)
      decoded = true;
      CHECK(prefill_tokens <= 8);
      CHECK(clock.Seconds(step.index) <= 2.0);
      continue;
    }
    ++gap_steps;
    // Nothing measured before the first decode step: one token. Then at
    // most what fits a decode step: a token arriving meanwhile waits at
    // most (2 - 1) x 1 s for this step (0.125 s per token).
    if (!decoded) CHECK(prefill_tokens == 1);
    CHECK(prefill_tokens >= 1);
    CHECK(prefill_tokens <= 8);
    CHECK(clock.Seconds(step.index) <= 1.0);
  }
  CHECK(gap_steps >= kTokens);  // one before each token, at least
  CHECK(generated == EngineGreedy(prompt, kTokens));
  for (auto& e : prefill.entries()) e->End();
  generating->End();
}

TEST_CASE("a generating session whose handler stops submitting (blocked writing to a client "
          "that stopped reading) is neither waited for nor bounds prefill once stalled",
          "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  StepLog log;
  SchedulerOptions options = log.Options(630);
  // Long enough that a step formed while the engine waits for the handler
  // shows: the engine paused this long between two steps.
  options.decode_resubmit_wait = std::chrono::milliseconds(50);
  options.decode_stall_after = std::chrono::milliseconds(100);
  using SteadyClock = std::chrono::steady_clock;
  std::mutex times_mutex;
  std::map<int64_t, SteadyClock::time_point> formed_at, done_at;
  log.also = [&](const StepRecord& step) {
    std::lock_guard<std::mutex> lock(times_mutex);
    formed_at[step.index] = SteadyClock::now();
  };
  options.on_step_done = [&](const StepRecord& step, double) {
    std::lock_guard<std::mutex> lock(times_mutex);
    done_at[step.index] = SteadyClock::now();
  };
  Scheduler scheduler(*f.backend, options);

  EndlessPrefill prefill(manager, scheduler, 1, 70);
  WaitFor([&] { return scheduler.steps_formed() >= 2; }, 30, "prefill steps");
  auto generating = NewEntry(manager, Activity::kGenerating);
  const auto prompt = RandomTokens(100, 9);
  REQUIRE(generating->RunStep([&](Session& s) { return s.Append(prompt).status(); }).ok());
  Sampler sampler(SamplingParams{});
  int64_t stalled_from = 0;
  {
    Scheduler::Generating scope(scheduler, generating.get());
    REQUIRE(RunDecode(scheduler, *generating, SampleToken(*generating, sampler)).status.ok());
    // The handler now stops, as one blocked in Write does, with its scope
    // held. Past decode_stall_after it is stalled: every step formed from
    // then on takes the whole budget, and none waits for it.
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    stalled_from = scheduler.steps_formed() + 1;
    WaitFor([&] { return scheduler.steps_formed() >= stalled_from + 10; }, 60,
            "steps while the handler is stalled");
  }
  prefill.Stop();

  const std::vector<StepRecord> steps = log.steps();
  std::vector<double> pauses_ms;
  for (const StepRecord& step : steps) {
    if (step.index < stalled_from || step.index >= stalled_from + 10) continue;
    INFO("step " << step.index);
    CHECK(Shares(step).count(generating.get()) == 0);
    // The prefilling session needs more than a step: a full budget, not
    // the gap bound (1 token until a decode-only time is measured, at most
    // 2p + 1 after).
    CHECK(step.tokens() == 630);
    std::lock_guard<std::mutex> lock(times_mutex);
    if (done_at.contains(step.index - 1)) {
      pauses_ms.push_back(
          std::chrono::duration<double, std::milli>(formed_at[step.index] - done_at[step.index - 1])
              .count());
    }
  }
  REQUIRE(pauses_ms.size() >= 5);
  // Waiting for the stalled handler would put at least the 50 ms wait
  // between every two steps (condition_variable::wait_until returns no
  // earlier). Without it the engine forms the next step at once: the median
  // pause stays far below, however loaded this machine is.
  std::sort(pauses_ms.begin(), pauses_ms.end());
  INFO("median pause between steps " << pauses_ms[pauses_ms.size() / 2] << " ms");
  CHECK(pauses_ms[pauses_ms.size() / 2] < 50.0);
  for (auto& e : prefill.entries()) e->End();
  generating->End();
}

TEST_CASE("with the default policy and the real clock, a prefilling session makes progress in "
          "every decode step but the first while another generates without pause",
          "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  StepLog log;
  SchedulerOptions options = log.Options(1008);
  options.decode_resubmit_wait = std::chrono::seconds(30);  // as above: only decode steps
  REQUIRE(options.decode_slowdown_limit == kDefaultDecodeSlowdownLimit);
  REQUIRE(options.decode_step_prefill_tokens == kNoPrefillTokenCap);
  Scheduler scheduler(*f.backend, options);

  EndlessPrefill prefill(manager, scheduler, 1, 50);
  WaitFor([&] { return scheduler.steps_formed() >= 2; }, 30, "prefill steps");
  auto generating = NewEntry(manager, Activity::kGenerating);
  const auto prompt = RandomTokens(100, 7);
  REQUIRE(generating->RunStep([&](Session& s) { return s.Append(prompt).status(); }).ok());
  constexpr int kTokens = 16;
  const std::vector<int32_t> generated = GenerateWithoutPause(scheduler, *generating, kTokens);
  const std::vector<WorkResult> results = prefill.Stop();

  // How much prefill each step takes depends on this machine's timings;
  // that it takes some does not: only the first decode step (the
  // decode-only measurement) runs without.
  const DecodeSteps steps = DecodeStepsOf(log, generating.get(), prefill.entries());
  REQUIRE(steps.prefill.size() == kTokens);
  CHECK(steps.prefill[0] == 0);
  for (int t = 1; t < kTokens; ++t) {
    INFO("decode step " << t);
    CHECK(steps.prefill[t] >= 1);
  }
  REQUIRE(results.size() == 1);
  CHECK(results[0].status.code() == absl::StatusCode::kCancelled);
  CHECK(generated == EngineGreedy(prompt, kTokens));
  for (auto& e : prefill.entries()) e->End();
  generating->End();
}

TEST_CASE("prefilling sessions share each step's budget equally", "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  // Step 1 runs a one-token item of session G and is held while A and B
  // queue, so that both are there when step 2 is formed.
  StepLog log(/*park_at=*/1);
  struct Case {
    int64_t budget, a_tokens, b_tokens;
    // (A, B) tokens of steps 2, 3, ...; with `odd_alternates`, in either
    // order, the session with the odd token changing every step.
    std::vector<std::pair<int64_t, int64_t>> steps;
    bool odd_alternates = false;
  };
  const Case cases[] = {
      // Even budget: half each until both are done.
      {64, 160, 160, {{32, 32}, {32, 32}, {32, 32}, {32, 32}, {32, 32}}},
      // Odd budget: 33 + 32, the odd token alternating.
      {65, 130, 130, {{33, 32}, {33, 32}, {33, 32}, {33, 32}}, true},
      // A needs less than half: B takes the rest of the step, then all of it.
      {64, 10, 150, {{10, 54}, {0, 64}, {0, 32}}},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION("budget " << c.budget << ", A " << c.a_tokens << ", B " << c.b_tokens) {
      Scheduler scheduler(*f.backend, log.Options(c.budget));
      auto g = NewEntry(manager, Activity::kAppending);
      auto a = NewEntry(manager, Activity::kAppending);
      auto b = NewEntry(manager, Activity::kAppending);
      const auto g_tokens = RandomTokens(1, 1);
      const auto a_tokens = RandomTokens(c.a_tokens, 2);
      const auto b_tokens = RandomTokens(c.b_tokens, 3);
      Background gate{Prefill(*g, g_tokens)}, first{Prefill(*a, a_tokens)},
          second{Prefill(*b, b_tokens)};
      gate.Start(scheduler);
      log.WaitUntilParked();
      first.Start(scheduler);
      WaitFor([&] { return scheduler.queued() == 2; }, 10, "A queued");
      second.Start(scheduler);
      WaitFor([&] { return scheduler.queued() == 3; }, 10, "B queued");
      log.Release();
      CHECK(gate.result.get().status.ok());
      const WorkResult ra = first.result.get(), rb = second.result.get();
      CHECK(ra.status.ok());
      CHECK(rb.status.ok());
      CHECK(ra.tokens_done == c.a_tokens);
      CHECK(rb.tokens_done == c.b_tokens);

      const auto steps = log.steps();
      REQUIRE(steps.size() == 1 + c.steps.size());
      int64_t previous_a = -1;
      for (size_t i = 0; i < c.steps.size(); ++i) {
        auto shares = Shares(steps[i + 1]);
        INFO("step " << steps[i + 1].index);
        auto got = std::make_pair(shares[a.get()], shares[b.get()]);
        if (c.odd_alternates) {
          CHECK(got.first != previous_a);
          previous_a = got.first;
          if (got.first < got.second) std::swap(got.first, got.second);
        }
        CHECK(got == c.steps[i]);
      }
      CHECK(a->tokens() == c.a_tokens);
      CHECK(b->tokens() == c.b_tokens);
      CHECK(RelativeDifference(LastLogits(*a), AloneLogits(a_tokens)) <= kAloneTolerance);
      CHECK(RelativeDifference(LastLogits(*b), AloneLogits(b_tokens)) <= kAloneTolerance);
      g->End();
      a->End();
      b->End();
    }
  }
}

TEST_CASE("an item submitted while a step runs is in the next step, and a finished one leaves",
          "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  StepLog log(/*park_at=*/1);
  Scheduler scheduler(*f.backend, log.Options(64));
  auto a = NewEntry(manager, Activity::kAppending);
  auto b = NewEntry(manager, Activity::kAppending);
  const auto a_tokens = RandomTokens(256, 4);
  const auto b_tokens = RandomTokens(96, 5);
  Background first{Prefill(*a, a_tokens)}, second{Prefill(*b, b_tokens)};
  first.Start(scheduler);
  log.WaitUntilParked();  // step 1 (A alone) is formed and held
  second.Start(scheduler);
  WaitFor([&] { return scheduler.queued() == 2; }, 10, "B queued");
  log.Release();
  const WorkResult ra = first.result.get(), rb = second.result.get();
  CHECK(ra.status.ok());
  CHECK(rb.status.ok());
  CHECK(rb.steps_waited == 0);  // joined at step 2
  CHECK(rb.steps_ran == 3);
  CHECK(ra.steps_ran == 6);

  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {64, 0}, {32, 32}, {32, 32}, {32, 32}, {64, 0}, {32, 0}};
  const auto steps = log.steps();
  REQUIRE(steps.size() == expected.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    auto shares = Shares(steps[i]);
    INFO("step " << steps[i].index);
    CHECK(std::make_pair(shares[a.get()], shares[b.get()]) == expected[i]);
  }
  CHECK(RelativeDifference(LastLogits(*a), AloneLogits(a_tokens)) <= kAloneTolerance);
  CHECK(RelativeDifference(LastLogits(*b), AloneLogits(b_tokens)) <= kAloneTolerance);
  a->End();
  b->End();
}

TEST_CASE("cancelling, deleting or failing one session of a step leaves the others as alone",
          "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  // Budget 96: step 2 holds A, B, C and E (24 each); E's tokens are refused
  // there. During step 3 (A, B, C: 32 each) A is told to stop and B is
  // deleted. A's pieces lay more than the upper-layer reach before its end,
  // so they skipped the upper layers (per slice, beside C's, which did
  // not): from step 4, A is cut short to its closing stretch of reach + 1
  // tokens, which shares the budget with C as any prefill does.
  StepLog log(/*park_at=*/1);
  Scheduler scheduler(*f.backend, log.Options(96));
  auto g = NewEntry(manager, Activity::kAppending);
  auto a = NewEntry(manager, Activity::kAppending);
  auto b = NewEntry(manager, Activity::kAppending);
  auto c = NewEntry(manager, Activity::kAppending);
  auto e = NewEntry(manager, Activity::kAppending);
  std::atomic<bool> stop_a{false};
  absl::Status deleted;  // checked on this thread (Catch2 asserts are not thread-safe)
  log.also = [&](const StepRecord& step) {
    if (step.index != 3) return;
    stop_a = true;
    deleted = manager.Delete(b->id());  // B is claimed by the step: freed after it
  };
  const auto g_tokens = RandomTokens(1, 1);
  const auto a_tokens = RandomTokens(500, 6);
  const auto b_tokens = RandomTokens(500, 7);
  const auto c_tokens = RandomTokens(24 + 32 + 96 * 2, 8);
  auto e_tokens = RandomTokens(100, 9);
  e_tokens[3] = f.pad_id();  // not allowed without allow_pad
  Background gate{Prefill(*g, g_tokens)}, ia{Prefill(*a, a_tokens)}, ib{Prefill(*b, b_tokens)},
      ic{Prefill(*c, c_tokens)}, ie{Prefill(*e, e_tokens)};
  ia.item.should_stop = [&] { return stop_a.load(); };
  gate.Start(scheduler);
  log.WaitUntilParked();
  int expected_queued = 1;
  for (Background* item : {&ia, &ib, &ic, &ie}) {
    item->Start(scheduler);
    ++expected_queued;
    WaitFor([&] { return scheduler.queued() == expected_queued; }, 10, "items queued");
  }
  log.Release();
  CHECK(gate.result.get().status.ok());
  const WorkResult ra = ia.result.get(), rb = ib.result.get(), rc = ic.result.get(),
                   re = ie.result.get();
  REQUIRE(deleted.ok());

  // A: stopped when step 4 was formed, keeping steps 2 and 3 and its
  // closing stretch (steps 4 to 10).
  REQUIRE(f.backend->runs_mixed_lower_only_forwards());
  const int64_t closing = f.backend->upper_layer_reach() + 1;
  CHECK(ra.status.code() == absl::StatusCode::kCancelled);
  CHECK(ra.tokens_done == 24 + 32 + closing);
  CHECK(a->tokens() == 24 + 32 + closing);
  CHECK(RelativeDifference(LastLogits(*a),
                           AloneLogits(std::vector<int32_t>(
                               a_tokens.begin(), a_tokens.begin() + 56 + closing))) <=
        kAloneTolerance);
  // B: deleted during step 3; ABORTED, its memory freed by its caller (in
  // Run) once the step's results were delivered.
  CHECK(rb.status.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(rb.status.message()), Contains("was deleted while"));
  CHECK(rb.tokens_done == 24);
  CHECK_FALSE(b->engine_session_alive());
  CHECK(b->host_bytes() == 0);
  // E: its tokens refused in step 2, nothing of them kept.
  CHECK(re.status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(re.status.message()), Contains("pad id"));
  CHECK(re.tokens_done == 0);
  CHECK(e->tokens() == 0);
  // C: all of it, as alone.
  CHECK(rc.status.ok());
  CHECK(rc.tokens_done == static_cast<int64_t>(c_tokens.size()));
  CHECK(c->tokens() == static_cast<int64_t>(c_tokens.size()));
  CHECK(RelativeDifference(LastLogits(*c), AloneLogits(c_tokens)) <= kAloneTolerance);

  // Steps 4 to 7 share 96 between A's stretch and C's 192 tokens left, then
  // A's stretch runs alone, 96 a step, until its last piece.
  const int64_t last = closing - 4 * 48 - 2 * 96;
  REQUIRE(last > 0);
  REQUIRE(last <= 96);
  const auto steps = log.steps();
  REQUIRE(steps.size() == 10);
  auto s2 = Shares(steps[1]), s3 = Shares(steps[2]);
  CHECK((s2[a.get()] == 24 && s2[b.get()] == 24 && s2[c.get()] == 24 && s2[e.get()] == 24));
  CHECK((s3[a.get()] == 32 && s3[b.get()] == 32 && s3[c.get()] == 32 && s3[e.get()] == 0));
  for (size_t i = 3; i < 7; ++i) {
    INFO("step " << steps[i].index);
    auto shares = Shares(steps[i]);
    CHECK((shares.size() == 2 && shares[a.get()] == 48 && shares[c.get()] == 48));
  }
  for (size_t i = 7; i < 10; ++i) {
    INFO("step " << steps[i].index);
    auto shares = Shares(steps[i]);
    CHECK((shares.size() == 1 && shares[a.get()] == (i < 9 ? 96 : last)));
  }
  for (auto& entry : {g, a, c, e}) entry->End();
}

TEST_CASE("a session deleted while its item waits is not run and takes no share of a step",
          "[server][scheduler][delete]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  StepLog log(/*park_at=*/1);
  Scheduler scheduler(*f.backend, log.Options(64));
  auto g = NewEntry(manager, Activity::kAppending);
  auto a = NewEntry(manager, Activity::kAppending);
  auto c = NewEntry(manager, Activity::kAppending);
  const auto g_tokens = RandomTokens(1, 1);
  const auto a_tokens = RandomTokens(100, 2);
  const auto c_tokens = RandomTokens(100, 3);
  Background gate{Prefill(*g, g_tokens)}, item{Prefill(*a, a_tokens)},
      other{Prefill(*c, c_tokens)};
  gate.Start(scheduler);
  log.WaitUntilParked();
  item.Start(scheduler);
  WaitFor([&] { return scheduler.queued() == 2; }, 10, "A queued");
  other.Start(scheduler);
  WaitFor([&] { return scheduler.queued() == 3; }, 10, "C queued");
  REQUIRE(manager.Delete(a->id()).ok());
  CHECK_FALSE(a->engine_session_alive());  // no step held it: freed at once
  log.Release();
  const WorkResult r = item.result.get();
  CHECK(r.status.code() == absl::StatusCode::kAborted);
  CHECK(r.tokens_done == 0);
  CHECK(r.steps_ran == 0);
  REQUIRE(other.result.get().status.ok());
  const auto steps = log.steps();
  for (const StepRecord& step : steps) CHECK_FALSE(Shares(step).contains(a.get()));
  // Step 2 is C's alone, all 64 tokens of it (before, A's item was given
  // half of them and ended only when its claim failed: C got 32; review of
  // the scheduler, finding 9).
  REQUIRE(steps.size() >= 2);
  CHECK(Shares(steps[1])[c.get()] == 64);
  g->End();
  a->End();
  c->End();
}

TEST_CASE("after Refuse queued items end with its status at the next step and new ones are "
          "refused",
          "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  StepLog log(/*park_at=*/1);
  Scheduler scheduler(*f.backend, log.Options(64));
  auto a = NewEntry(manager, Activity::kAppending);
  const auto a_tokens = RandomTokens(200, 2);
  Background item{Prefill(*a, a_tokens)};
  item.Start(scheduler);
  log.WaitUntilParked();  // step 1: A's first 64 tokens
  scheduler.Refuse(absl::UnavailableError("the server is shutting down: test"));
  log.Release();
  const WorkResult r = item.result.get();
  CHECK(r.status.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(r.status.message()), Contains("shutting down: test"));
  // Step 1 ran with 136 tokens following, so it got no logits
  // (drt::RunStepSkipsLastLogits); a closing piece of one token makes them,
  // then the item ends: nothing more after it.
  REQUIRE(f.backend->runs_mixed_lower_only_forwards());
  CHECK(r.tokens_done == 64 + 1);
  CHECK(a->tokens() == 64 + 1);
  CHECK(RelativeDifference(LastLogits(*a), AloneLogits(std::vector<int32_t>(
                                               a_tokens.begin(), a_tokens.begin() + 65))) <=
        kAloneTolerance);
  const WorkResult refused = scheduler.Run(Prefill(*a, a_tokens));
  CHECK(refused.status.code() == absl::StatusCode::kUnavailable);
  CHECK(refused.steps_ran == 0);
  CHECK(a->tokens() == 64 + 1);
  a->End();
}

TEST_CASE("a scheduler destroyed with items queued ends them with UNAVAILABLE after the "
          "running step",
          "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  StepLog log(/*park_at=*/1);
  SchedulerOptions options = log.Options(64);
  // The held step is released only once the destructor has stopped forming
  // steps; released earlier, the engine could run A's step first (a race
  // seen about once in 40 runs).
  std::promise<void> stopping;
  options.on_stopping = [&] { stopping.set_value(); };
  auto scheduler = std::make_unique<Scheduler>(*f.backend, options);
  auto g = NewEntry(manager, Activity::kAppending);
  auto a = NewEntry(manager, Activity::kAppending);
  const auto g_tokens = RandomTokens(10, 1);
  const auto a_tokens = RandomTokens(100, 2);
  Background gate{Prefill(*g, g_tokens)}, item{Prefill(*a, a_tokens)};
  gate.Start(*scheduler);
  log.WaitUntilParked();
  item.Start(*scheduler);
  WaitFor([&] { return scheduler->queued() == 2; }, 10, "A queued");
  std::thread destroyer([&] { scheduler.reset(); });  // waits for the held step
  stopping.get_future().wait();
  log.Release();
  destroyer.join();
  const WorkResult rg = gate.result.get(), ra = item.result.get();
  CHECK(rg.status.ok());  // the running step finished
  CHECK(g->tokens() == 10);
  CHECK(ra.status.code() == absl::StatusCode::kUnavailable);
  CHECK(ra.tokens_done == 0);
  CHECK(a->tokens() == 0);
  g->End();
  a->End();
}

TEST_CASE("the scheduler refuses an item without a session or tokens", "[server][scheduler]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  Scheduler scheduler(*f.backend, SchedulerOptions{});
  auto a = NewEntry(manager, Activity::kAppending);
  WorkItem no_tokens;
  no_tokens.entry = a.get();
  CHECK(scheduler.Run(no_tokens).status.code() == absl::StatusCode::kInvalidArgument);
  const auto tokens = RandomTokens(5, 1);
  WorkItem no_entry;
  no_entry.tokens = tokens;
  CHECK(scheduler.Run(no_entry).status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(scheduler.steps_formed() == 0);
  CHECK(a->tokens() == 0);
  a->End();
}

TEST_CASE("the service runs --step_tokens steps and counts Append tokens as prefill, generated "
          "tokens as decode",
          "[server][scheduler]") {
  // Steps of 100 tokens: each 120-token message takes 2 steps (100 + 20),
  // the last 60 tokens 1, each generated token 1.
  ServiceOptions options = SmallOptions();
  options.step_tokens = 100;
  InProcessServer server(options);
  const std::string id = NewSession(server.stub());
  const auto prompt = RandomTokens(300, 11);
  REQUIRE(AppendTokens(server.stub(), id, prompt, EvenPieces(prompt.size(), 120)).status.ok());
  const GenerateResult generated = GenerateGreedy(server.stub(), id, 5);
  REQUIRE(generated.status.ok());
  REQUIRE(generated.done.has_value());
  REQUIRE(generated.done->padding_tokens() == 0);  // the fixture does not pad by default
  CHECK(generated.tokens == EngineGreedy(prompt, 5));
  const std::string text = server.metrics().RenderPrometheus();
  const int64_t prefill = 300;
  CHECK_THAT(text, Contains("drt_engine_step_tokens_total{kind=\"decode\"} 5\n"));
  CHECK_THAT(text, Contains("drt_engine_step_tokens_total{kind=\"prefill\"} " +
                            std::to_string(prefill) + "\n"));
  CHECK_THAT(text, Contains("drt_engine_steps_total " + std::to_string(2 + 2 + 1 + 5) + "\n"));
}

}  // namespace
}  // namespace drt::server
