// Scored work items (WorkItem::score_top_logprobs, server/scheduler.h): the
// scheduler gives a scored item's pieces their logits and scores them after
// each step. Expectations come from Session::Append with
// AppendOptions::score on a session of its own (engine/token_scores.h, itself
// checked against a brute-force log-softmax), and, for the unscored session
// stepped beside it, from the same tokens appended alone.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/session.h"
#include "server/scheduler.h"
#include "server/session_manager.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/scheduler_items.h"

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
  SchedulerOptions options;
  options.step_tokens = kStepTokens;
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
