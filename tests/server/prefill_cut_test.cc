// Lower-only prefill steps in the server (server/scheduler.h; docs/batching.md,
// "Lower-only prefill steps"): the scheduler tells the engine how many
// tokens of an item follow each prefill piece, so that rows far from the
// item's end skip the upper layers. The expectation is always a run that
// computes everything (the scheduler's skip_upper_layers off, or a backend
// without lower-only forwards) over the same steps: its logits must be equal
// bit for bit, and rows must really have been skipped (so the test fails if
// the cut silently stops happening). Cancellation and Refuse mid-item, and
// durable sessions (written and acknowledged only at whole states), are
// covered too.
#include <algorithm>
#include <cmath>
#include <map>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/model_rules.h"
#include "engine/session.h"
#include "engine/session_state.h"
#include "server/scheduler.h"
#include "server/session_manager.h"
#include "server/state_files.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/scheduler_items.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

// 10 chunks of 63 tokens: 640 positions, one forward of the fixture backend
// (1024 positions), and about twice the fixture's upper-layer reach (330).
constexpr int64_t kStepTokens = 630;

// What a session holds, read under the caller's claim.
struct Held {
  int64_t tokens = 0;
  int64_t chunks = 0;
  int64_t skipped = 0;  // BackendSessionStats::upper_rows_skipped
  std::vector<float> logits;
};

Held Read(SessionEntry& entry) {
  Held held;
  REQUIRE(entry
              .RunStep([&](Session& s) {
                held.tokens = s.num_tokens();
                held.chunks = s.num_chunks();
                held.skipped = s.backend_session().stats().upper_rows_skipped;
                held.logits.assign(s.last_logits().begin(), s.last_logits().end());
                return absl::OkStatus();
              })
              .ok());
  return held;
}

// Runs `prompts` as one prefill item per session, all queued before the
// second step forms (the first is held until they are), so the steps formed
// depend only on the scheduler's rules; then `more` on each session alone.
struct Interleaved {
  std::vector<std::vector<int64_t>> steps;  // tokens per piece, step by step
  int64_t skipped_in_steps = 0;             // StepRecord::upper_rows_skipped, summed
  std::vector<Held> after_prompt, after_more;
};

Interleaved RunInterleaved(Backend& backend, bool skip_upper_layers,
                           const std::vector<std::vector<int32_t>>& prompts,
                           const std::vector<int32_t>& more) {
  SessionManager manager(backend, SessionLimits{});
  std::vector<std::shared_ptr<SessionEntry>> entries;
  for (size_t i = 0; i < prompts.size(); ++i) entries.push_back(NewEntry(manager));

  Interleaved out;
  std::mutex mutex;
  std::condition_variable changed;
  bool parked = false, released = false;
  SchedulerOptions options;
  options.step_tokens = kStepTokens;
  options.skip_upper_layers = skip_upper_layers;
  options.on_step_formed = [&](const StepRecord& step) {
    if (step.index != 1) return;
    std::unique_lock<std::mutex> lock(mutex);
    parked = true;
    changed.notify_all();
    changed.wait(lock, [&] { return released; });
  };
  options.on_step_done = [&](const StepRecord& step, double) {
    std::vector<int64_t> pieces;
    for (const StepPiece& piece : step.pieces) pieces.push_back(piece.tokens);
    out.steps.push_back(pieces);
    out.skipped_in_steps += step.upper_rows_skipped;
  };
  Scheduler scheduler(backend, options);

  std::vector<WorkItem> items;
  for (size_t i = 0; i < prompts.size(); ++i) items.push_back(Prefill(*entries[i], prompts[i]));
  std::vector<std::future<WorkResult>> results;
  for (size_t i = 0; i < items.size(); ++i) {
    results.push_back(std::async(std::launch::async, [&, i] { return scheduler.Run(items[i]); }));
    if (i == 0) {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return parked; });
    } else {
      while (scheduler.queued() < static_cast<int>(i) + 1) std::this_thread::yield();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
  }
  changed.notify_all();
  for (auto& r : results) {
    const WorkResult result = r.get();
    INFO(result.status.message());
    REQUIRE(result.status.ok());
  }
  for (auto& entry : entries) out.after_prompt.push_back(Read(*entry));
  for (auto& entry : entries) {
    REQUIRE(scheduler.Run(Prefill(*entry, more)).status.ok());
    out.after_more.push_back(Read(*entry));
  }
  return out;
}

// The fixture's model on a CPU backend that skips the upper layers only in
// forwards whose every slice may (no mixed lower-only forwards).
Backend& WholeForwardSkipBackend() {
  static std::unique_ptr<Backend> backend = [] {
    CpuBackendOptions options;
    options.mixed_lower_only_forwards = false;
    const Model& model = *FixtureModel::Get().model;
    return MakeCpuBackend(model.config(), model.weights(), options);
  }();
  return *backend;
}

double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

TEST_CASE("interleaved prefill skips the upper layers where tokens follow and leaves every "
          "session as full computation does, bit for bit",
          "[server][scheduler][upper_cut]") {
  // Bit for bit on a backend that skips only whole forwards: each forward
  // holds the same rows either way. (With per-slice skipping, the next test,
  // a step whose slices differ leaves the rows that run the upper layers
  // fewer rows to share GEMMs with, and not bit for bit.)
  Backend& backend = WholeForwardSkipBackend();
  REQUIRE(!backend.runs_mixed_lower_only_forwards());
  const std::vector<std::vector<int32_t>> prompts = {RandomTokens(2500, 1), RandomTokens(1900, 2),
                                                     RandomTokens(1300, 3)};
  const std::vector<int32_t> more = RandomTokens(40, 4);
  const Interleaved cut = RunInterleaved(backend, true, prompts, more);
  const Interleaved full = RunInterleaved(backend, false, prompts, more);

  // The same steps either way, several of them shared by all three sessions.
  REQUIRE(cut.steps == full.steps);
  REQUIRE(std::count_if(cut.steps.begin(), cut.steps.end(),
                        [](const auto& pieces) { return pieces.size() == 3; }) >= 3);
  // Rows really skipped, and only where allowed.
  CHECK(cut.skipped_in_steps > 0);
  CHECK(full.skipped_in_steps == 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("session " << i);
    const int64_t n = static_cast<int64_t>(prompts[i].size());
    CHECK(cut.after_prompt[i].skipped > 0);
    CHECK(full.after_prompt[i].skipped == 0);
    CHECK(cut.after_prompt[i].tokens == n);
    CHECK(cut.after_prompt[i].chunks == n / 63);
    CHECK(full.after_prompt[i].tokens == n);
    // The last logits, and the upper-layer state behind them (windows,
    // selections: the next tokens read them), equal exactly.
    CHECK(cut.after_prompt[i].logits == full.after_prompt[i].logits);
    CHECK(cut.after_more[i].logits == full.after_more[i].logits);
    CHECK(cut.after_more[i].skipped == cut.after_prompt[i].skipped);  // a short item: no cut
  }
}

TEST_CASE("interleaved prefill with per-slice skipping skips more rows and leaves every session "
          "within the batching bound of full computation",
          "[server][scheduler][upper_cut][mixed_lower_only]") {
  // The fixture's backend skips per slice (Backend::runs_mixed_lower_only_
  // forwards): in a step where one session's piece is near its item's end
  // and another's is not, only the first runs the upper layers, so it
  // shares those GEMMs with fewer rows than full computation gives it, and
  // the slices may be reordered (the lower-only ones go last). Its floats
  // may then differ in the last bits: bounded like a session's logits in a
  // batch against alone (issue 11, 1e-5 relative). Measured here
  // (2026-11-24): worst 4.2e-7 after the prompts and 9.8e-7 after 40 more
  // tokens, over the three sessions.
  Backend& backend = *FixtureModel::Get().backend;
  REQUIRE(backend.runs_mixed_lower_only_forwards());
  const std::vector<std::vector<int32_t>> prompts = {RandomTokens(2500, 1), RandomTokens(1900, 2),
                                                     RandomTokens(1300, 3)};
  const std::vector<int32_t> more = RandomTokens(40, 4);
  const Interleaved cut = RunInterleaved(backend, true, prompts, more);
  const Interleaved whole_forwards = RunInterleaved(WholeForwardSkipBackend(), true, prompts, more);
  const Interleaved full = RunInterleaved(backend, false, prompts, more);
  REQUIRE(cut.steps == full.steps);
  // More rows skipped than whole forwards alone skip: the steps where the
  // shortest item's last pieces share the step with the others' earlier ones.
  CHECK(cut.skipped_in_steps > whole_forwards.skipped_in_steps);
  CHECK(full.skipped_in_steps == 0);
  double worst_prompt = 0, worst_more = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("session " << i);
    CHECK(cut.after_prompt[i].tokens == static_cast<int64_t>(prompts[i].size()));
    worst_prompt = std::max(worst_prompt,
                            RelativeDifference(cut.after_prompt[i].logits,
                                               full.after_prompt[i].logits));
    worst_more = std::max(worst_more, RelativeDifference(cut.after_more[i].logits,
                                                         full.after_more[i].logits));
  }
  INFO("after the prompts " << worst_prompt << ", after more " << worst_more);
  CHECK(worst_prompt < 1e-5);
  CHECK(worst_more < 1e-5);
}

TEST_CASE("an item stopped after a step that skipped the upper layers first runs a closing "
          "piece that makes the session whole",
          "[server][scheduler][upper_cut]") {
  const bool refuse = GENERATE(false, true);
  INFO((refuse ? "Refuse" : "should_stop"));
  const std::vector<int32_t> prompt = RandomTokens(5000, 5);
  const std::vector<int32_t> more = RandomTokens(30, 6);
  Backend& backend = *FixtureModel::Get().backend;
  const int64_t closing = backend.upper_layer_reach() + 1;
  REQUIRE(closing < kStepTokens);

  // Stopped when step 3 is formed: step 4 is the closing piece.
  SessionManager manager(backend, SessionLimits{});
  auto entry = NewEntry(manager);
  std::atomic<bool> stop{false};
  std::vector<StepRecord> steps;
  Scheduler* running = nullptr;
  SchedulerOptions options;
  options.step_tokens = kStepTokens;
  options.on_step_formed = [&](const StepRecord& step) {
    if (step.index != 3) return;
    if (refuse) {
      running->Refuse(absl::UnavailableError("refused by the test"));
    } else {
      stop = true;
    }
  };
  options.on_step_done = [&](const StepRecord& step, double) { steps.push_back(step); };
  Scheduler scheduler(backend, options);
  running = &scheduler;
  WorkItem item = Prefill(*entry, prompt);
  item.should_stop = [&] { return stop.load(); };
  const WorkResult result = scheduler.Run(item);
  CHECK(result.status.code() ==
        (refuse ? absl::StatusCode::kUnavailable : absl::StatusCode::kCancelled));
  const Held held = Read(*entry);
  CHECK(held.tokens == result.tokens_done);

  // Expected: the same steps on a session that computes everything. (Without
  // the closing piece the session would hold the first three steps with the
  // upper-layer state of the step before them, and differ from this.)
  SessionManager reference_manager(backend, SessionLimits{});
  auto reference = NewEntry(reference_manager);
  SchedulerOptions full;
  full.step_tokens = kStepTokens;
  full.skip_upper_layers = false;
  Scheduler reference_scheduler(backend, full);
  int64_t fed = 0;
  for (const StepRecord& step : steps) {
    const std::vector<int32_t> piece(prompt.begin() + fed,
                                     prompt.begin() + fed + step.pieces[0].tokens);
    REQUIRE(reference_scheduler.Run(Prefill(*reference, piece)).status.ok());
    fed += step.pieces[0].tokens;
  }
  const Held want = Read(*reference);
  CHECK(want.skipped == 0);
  CHECK(held.logits == want.logits);

  REQUIRE(steps.size() == 4);
  CHECK(steps[0].upper_rows_skipped > 0);  // the cut happened before the stop
  CHECK(steps[2].upper_rows_skipped > 0);
  REQUIRE(steps[3].pieces.size() == 1);
  CHECK(steps[3].pieces[0].tokens == closing);
  CHECK(steps[3].upper_rows_skipped == 0);
  CHECK(result.tokens_done == 3 * kStepTokens + closing);
  // The upper-layer state too: the next tokens read it.
  REQUIRE(reference_scheduler.Run(Prefill(*entry, more)).status.ok());
  REQUIRE(reference_scheduler.Run(Prefill(*reference, more)).status.ok());
  CHECK(Read(*entry).logits == Read(*reference).logits);
}

TEST_CASE("an item stopped after a piece that got no logits (no row skipped) first runs a "
          "one-token closing piece",
          "[server][scheduler][upper_cut][mixed_lower_only]") {
  // 300 tokens in pieces of 100: every row within the reach of the item's
  // end, so none skips the upper layers, but the pieces with tokens
  // following get no logits (drt::RunStepSkipsLastLogits): the session's
  // last logits are stale after the first, and a stop must not leave them
  // so. Before the engine skipped those logits, the item ended at once.
  const std::vector<int32_t> prompt = RandomTokens(300, 11);
  Backend& backend = *FixtureModel::Get().backend;
  REQUIRE(backend.runs_mixed_lower_only_forwards());
  REQUIRE(DecoderPositionsFor(backend.config(), 300) < backend.upper_layer_reach());
  SessionManager manager(backend, SessionLimits{});
  auto entry = NewEntry(manager);
  std::atomic<bool> stop{false};
  std::vector<StepRecord> steps;
  SchedulerOptions options;
  options.step_tokens = 100;
  options.on_step_formed = [&](const StepRecord& step) {
    if (step.index == 2) stop = true;  // seen when step 3 is formed
  };
  options.on_step_done = [&](const StepRecord& step, double) { steps.push_back(step); };
  Scheduler scheduler(backend, options);
  WorkItem item = Prefill(*entry, prompt);
  item.should_stop = [&] { return stop.load(); };
  const WorkResult result = scheduler.Run(item);
  CHECK(result.status.code() == absl::StatusCode::kCancelled);
  REQUIRE(steps.size() == 3);
  CHECK(steps[0].pieces[0].tokens == 100);
  CHECK(steps[1].pieces[0].tokens == 100);
  CHECK(steps[2].pieces[0].tokens == 1);  // the closing piece: the logits only
  for (const StepRecord& step : steps) CHECK(step.upper_rows_skipped == 0);
  CHECK(result.tokens_done == 201);
  const Held held = Read(*entry);
  CHECK(held.tokens == 201);

  // Expected: the same pieces on a session whose every piece got logits.
  SessionManager reference_manager(backend, SessionLimits{});
  auto reference = NewEntry(reference_manager);
  SchedulerOptions full;
  full.step_tokens = 100;
  full.skip_upper_layers = false;
  Scheduler reference_scheduler(backend, full);
  int64_t fed = 0;
  for (const StepRecord& step : steps) {
    const std::vector<int32_t> piece(prompt.begin() + fed,
                                     prompt.begin() + fed + step.pieces[0].tokens);
    REQUIRE(reference_scheduler.Run(Prefill(*reference, piece)).status.ok());
    fed += step.pieces[0].tokens;
  }
  CHECK(held.logits == Read(*reference).logits);
}

// What a durable session's state file holds now.
SessionState WrittenState(const std::string& state_dir, const std::string& id) {
  const std::string path = state_dir + "/sessions/" + id + ".state";
  absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  REQUIRE(bytes.ok());
  absl::StatusOr<SessionRecord> record = DecodeSessionRecord(*bytes, path);
  REQUIRE(record.ok());
  absl::StatusOr<SessionState> state =
      DecodeSessionState(record->state, FixtureModel::Get().model->config());
  REQUIRE(state.ok());
  return *std::move(state);
}

TEST_CASE("a durable session's prefill skips the upper layers within stretches, and writes and "
          "acknowledges only whole states",
          "[server][scheduler][upper_cut][durable]") {
  const std::vector<int32_t> prompt = RandomTokens(3000, 7);
  // The expectation: every layer of every row, over the same steps; the
  // session's last logits after each step, by token count.
  std::map<int64_t, std::vector<float>> full;
  {
    SessionManager memory_only(*FixtureModel::Get().backend, SessionLimits{});
    auto entry = NewEntry(memory_only);
    SchedulerOptions options;
    options.step_tokens = kStepTokens;
    options.skip_upper_layers = false;
    options.on_step_done = [&](const StepRecord&, double) {
      const Held held = Read(*entry);
      full[held.tokens] = held.logits;
    };
    Scheduler scheduler(*FixtureModel::Get().backend, options);
    REQUIRE(scheduler.Run(Prefill(*entry, prompt)).status.ok());
    REQUIRE(full.size() == 5);  // 630, 1260, 1890, 2520, 3000
    entry->End();
  }

  // Stretches of two steps: the pieces ending at 630 and 1890 have the
  // rest of their stretch (630 tokens, past the fixture's reach of 330)
  // following and skip; those ending at 1260, 2520 and 3000 end a stretch.
  // With 0, nothing skips and every step is written.
  for (const int64_t ack_tokens : {int64_t{2 * kStepTokens}, int64_t{0}}) {
    INFO("durable_ack_tokens " << ack_tokens);
    const std::vector<int64_t> whole_at =
        ack_tokens > 0 ? std::vector<int64_t>{1260, 2520, 3000}
                       : std::vector<int64_t>{630, 1260, 1890, 2520, 3000};
    drt::testing::TempDir dir;
    const std::string state_dir = dir.File("state");
    DurableServer durable(state_dir);
    auto entry = NewEntry(*durable.sessions);
    REQUIRE(entry->durable());
    // The state file after each step: its token count and last logits.
    std::map<int64_t, std::vector<float>> written;
    int64_t skipped = 0;
    SchedulerOptions options;
    options.step_tokens = kStepTokens;
    options.durable_ack_tokens = ack_tokens;
    options.on_step_done = [&](const StepRecord& step, double) {
      skipped += step.upper_rows_skipped;
      const SessionState state = WrittenState(state_dir, entry->id());
      written[state.num_tokens] = state.last_logits;
    };
    Scheduler scheduler(*FixtureModel::Get().backend, options);
    WorkItem item = Prefill(*entry, prompt);
    std::vector<int64_t> acknowledged;
    item.on_progress = [&](int64_t done) { acknowledged.push_back(done); };
    const WorkResult result = scheduler.Run(item);
    REQUIRE(result.status.ok());
    CHECK(result.tokens_done == 3000);
    CHECK((skipped > 0) == (ack_tokens > 0));

    // Written: exactly the whole states, each the full computation's.
    // (Before the first whole step the file still holds the empty session
    // written at its creation.)
    std::vector<int64_t> written_at;
    for (const auto& [tokens, logits] : written) {
      if (tokens == 0) continue;
      written_at.push_back(tokens);
      INFO("written at " << tokens << " tokens");
      REQUIRE(full.count(tokens) == 1);
      CHECK(logits == full.at(tokens));
    }
    CHECK(written_at == whole_at);
    // Progress reaches the caller only for written tokens (the last one
    // comes with the result).
    for (int64_t done : acknowledged) {
      INFO("acknowledged " << done);
      CHECK(std::count(whole_at.begin(), whole_at.end(), done) == 1);
    }
    CHECK(!acknowledged.empty());
    CHECK(Read(*entry).logits == full.at(3000));
    entry->End();
  }
}

// The fixture model on a backend without lower-only forwards: the server
// that computes everything.
FixtureModel& FullComputeFixture() {
  static FixtureModel* fixture = [] {
    auto* f = new FixtureModel(FixtureModel::Load(FixtureDir()));
    CpuBackendOptions options;
    options.lower_only_forwards = false;
    f->backend = MakeCpuBackend(f->model->config(), f->model->weights(), options);
    return f;
  }();
  return *fixture;
}

int64_t SkippedRows(InProcessServer& server, const std::string& id) {
  auto entry = server.service().session_manager().Find(id);
  REQUIRE(entry.ok());
  REQUIRE((*entry)->Begin(Activity::kAppending).ok());
  const int64_t skipped = Read(**entry).skipped;
  (*entry)->End();
  return skipped;
}

// The server's drt_retrievals_total.
int64_t RetrievalsTotal(InProcessServer& server) {
  const std::string text = server.metrics().RenderPrometheus();
  const std::string name = "\ndrt_retrievals_total ";
  const size_t at = text.find(name);
  REQUIRE(at != std::string::npos);
  return std::stoll(text.substr(at + name.size()));
}

TEST_CASE("an Append streamed in large messages skips upper layers and generates exactly as a "
          "server that computes everything",
          "[server][upper_cut]") {
  InProcessServer cut;
  FixtureModel& f = FullComputeFixture();
  InProcessServer full(*f.model, *f.backend, SmallOptions());
  // Messages of several server steps (1008 tokens each on the fixture).
  const std::vector<int32_t> prompt = RandomTokens(7000, 8);
  const std::vector<size_t> pieces = {2500, 1800, 2700};
  std::vector<GenerateResult> generated;
  for (InProcessServer* server : {&cut, &full}) {
    const std::string id = NewSession(server->stub());
    AppendResult appended = AppendTokens(server->stub(), id, prompt, pieces);
    INFO(appended.status.error_message());
    REQUIRE(appended.status.ok());
    REQUIRE(appended.summary.has_value());
    CHECK(appended.summary->session_tokens() == 7000);
    CHECK(appended.summary->session_chunks() == 7000 / 63);
    CHECK((SkippedRows(*server, id) > 0) == (server == &cut));
    // drt_retrievals_total counts the retrievals made: one per landmark and
    // group through the upper layers, so fewer where forwards skipped them.
    const int64_t every_landmark = (7000 / 63) * f.model->config().num_groups();
    const int64_t retrievals = RetrievalsTotal(*server);
    if (server == &cut) {
      CHECK(retrievals > 0);
      CHECK(retrievals < every_landmark);
    } else {
      CHECK(retrievals == every_landmark);
    }
    drt::v1::GenerateRequest request = GreedyRequest(id, 8);
    request.set_return_logprobs(true);
    request.set_ignore_eos(true);
    generated.push_back(Generate(server->stub(), request));
    REQUIRE(generated.back().status.ok());
  }
  CHECK(generated[0].tokens == generated[1].tokens);
  CHECK(generated[0].logprobs == generated[1].logprobs);
  CHECK(generated[0].tokens == EngineGreedy(prompt, 8));
}

TEST_CASE("concurrent Appends in large messages skip upper layers and each gives the engine's "
          "greedy output",
          "[server][upper_cut]") {
  InProcessServer server;
  constexpr int kSessions = 3;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kSessions; ++i) prompts.push_back(RandomTokens(3000 + 700 * i, 20 + i));
  std::vector<std::string> ids(kSessions), errors(kSessions);
  std::vector<std::vector<int32_t>> tokens(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) ids[i] = NewSession(server.stub());
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      AppendResult a = AppendTokens(server.stub(), ids[i], prompts[i],
                                    EvenPieces(prompts[i].size(), 2000));
      if (!a.status.ok()) {
        errors[i] = "Append: " + a.status.error_message();
        return;
      }
      GenerateResult g = GenerateGreedy(server.stub(), ids[i], 8);
      if (!g.status.ok()) errors[i] = "Generate: " + g.status.error_message();
      tokens[i] = g.tokens;
    });
  }
  for (auto& t : threads) t.join();
  int64_t skipped = 0;
  for (int i = 0; i < kSessions; ++i) {
    INFO("session " << i);
    CHECK(errors[i].empty());
    CHECK(tokens[i] == EngineGreedy(prompts[i], 8));
    skipped += SkippedRows(server, ids[i]);
  }
  CHECK(skipped > 0);
}

}  // namespace
}  // namespace drt::server
