// A session deleted while a step runs on it is freed by its own caller, on
// the caller's thread, once the step's results are delivered
// (server/scheduler.h, step 5). Before, the engine thread freed it as the
// step returned, before it delivered any result of the step: freeing a
// large session (hundreds of MB of chunk store and K/V) held up every other
// session's result of that step, and the next step (review of the
// scheduler, finding 3). Until then the budget counts its memory, and a
// deleted generating session's handler, freeing it, holds up no step
// (review of schedproof, F1 and F2). The free is watched by a hook in the
// wrapped backend session's destructor (tests/test_util/wrapping_backend.h).
#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "engine/session.h"
#include "server/scheduler.h"
#include "server/session_manager.h"
#include "tests/server/test_util/scheduler_items.h"
#include "tests/server/test_util/scheduler_steps.h"
#include "tests/server/test_util/waiting.h"
#include "tests/test_util/random_model.h"
#include "tests/test_util/wrapping_backend.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

TEST_CASE("a session deleted during a step is freed on its own caller's thread after the "
          "step's other results are delivered",
          "[server][scheduler][delete]") {
  const ModelConfig config = drt::testing::TinyConfig();
  const ModelWeights weights = drt::testing::RandomWeights(config, 43);
  drt::testing::WrappingBackend backend(MakeCpuBackend(config, weights, CpuBackendOptions{}));
  SessionManager manager(backend, SessionLimits{});
  auto g = NewEntry(manager);
  auto a = NewEntry(manager);
  auto b = NewEntry(manager);
  drt::testing::WrappedSession* b_session = nullptr;
  REQUIRE(b->RunStep([&](Session& s) {
             b_session = &static_cast<drt::testing::WrappedSession&>(s.backend_session());
             return absl::OkStatus();
           })
              .ok());

  // Set by A's caller once its Run returned: A's result was delivered.
  std::promise<void> a_returned;
  const std::shared_future<void> a_delivered = a_returned.get_future().share();
  // Written by the thread that frees B, read here once B's caller joined.
  bool delivered_before_free = false;
  std::atomic<bool> freed{false};
  std::thread::id free_thread;
  // Read as B is freed, before its memory goes: what the engine says B
  // holds, B's figure, A's and G's, and the budget's total.
  int64_t b_memory_at_free = -1, b_figure_at_free = -1, others_at_free = -1,
          total_at_free = -1;
  b_session->on_destroyed = [&] {
    // Waits (a generous 5 s) for A's result. Freed by the engine thread
    // before the results are delivered, as before, A's result cannot come
    // while this waits: the wait runs out.
    delivered_before_free =
        a_delivered.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    b_memory_at_free = static_cast<int64_t>(b_session->memory().total());
    b_figure_at_free = b->host_bytes();
    others_at_free = a->host_bytes() + g->host_bytes();
    total_at_free = manager.TotalHostBytes();
    free_thread = std::this_thread::get_id();
    freed = true;
  };

  // Step 1 holds a one-token gate item until A and B are queued; step 2
  // holds all of A and B (20 + 20 tokens of a 64 budget), and B is deleted
  // while it is formed and claimed, so the step still runs it.
  StepLog log(/*park_at=*/1);
  SchedulerOptions options = log.Options(64);
  std::thread::id engine_thread;
  absl::Status deleted = absl::UnknownError("not deleted");  // checked on this thread
  log.also = [&](const StepRecord& step) {
    engine_thread = std::this_thread::get_id();
    if (step.index == 2) deleted = manager.Delete(b->id());
  };
  Scheduler scheduler(backend, options);
  const std::vector<int32_t> g_tokens = drt::testing::RandomTokens(config, 1, 1);
  const std::vector<int32_t> a_tokens = drt::testing::RandomTokens(config, 20, 2);
  const std::vector<int32_t> b_tokens = drt::testing::RandomTokens(config, 20, 3);
  Background gate{Prefill(*g, g_tokens)};
  gate.Start(scheduler);
  log.WaitUntilParked();
  WorkResult ra, rb;
  std::thread::id b_caller;
  std::thread a_thread([&] {
    ra = scheduler.Run(Prefill(*a, a_tokens));
    a_returned.set_value();
  });
  WaitFor([&] { return scheduler.queued() == 2; }, 10, "A queued");
  std::thread b_thread([&] {
    b_caller = std::this_thread::get_id();
    rb = scheduler.Run(Prefill(*b, b_tokens));
  });
  WaitFor([&] { return scheduler.queued() == 3; }, 10, "B queued");
  log.Release();
  a_thread.join();
  b_thread.join();
  REQUIRE(gate.result.get().status.ok());
  REQUIRE(deleted.ok());

  const auto steps = log.steps();
  REQUIRE(steps.size() == 2);
  auto shares = Shares(steps[1]);
  CHECK((shares[a.get()] == 20 && shares[b.get()] == 20));
  CHECK(ra.status.ok());
  CHECK(a->tokens() == 20);
  CHECK(rb.status.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(rb.status.message()), Contains("was deleted while"));
  // Freed once Run returned to B's caller, by that caller, after A's result
  // was delivered.
  REQUIRE(freed.load());
  CHECK(delivered_before_free);
  CHECK(free_thread == b_caller);
  CHECK(free_thread != engine_thread);
  CHECK_FALSE(b->engine_session_alive());
  CHECK(b->host_bytes() == 0);
  // Until it was freed, B kept its figure and the budget counted its memory
  // (review of schedproof, F1): before, ReleaseStep zeroed the figure as it
  // handed the session over, so the budget counted nothing for memory still
  // held until B's caller freed it.
  REQUIRE(b_memory_at_free > 0);
  CHECK(b_figure_at_free == b_memory_at_free);
  CHECK(total_at_free == others_at_free + b_memory_at_free);
  g->End();
  a->End();
  b->End();
}

TEST_CASE("a deleted generating session's handler, while it frees the session, neither holds "
          "up the next step nor bounds its prefill",
          "[server][scheduler][delete][decode_budget]") {
  const ModelConfig config = drt::testing::TinyConfig();
  const ModelWeights weights = drt::testing::RandomWeights(config, 44);
  drt::testing::WrappingBackend backend(MakeCpuBackend(config, weights, CpuBackendOptions{}));
  SessionManager manager(backend, SessionLimits{});
  auto g = NewEntry(manager, Activity::kGenerating);
  auto p = NewEntry(manager);
  const std::vector<int32_t> prompt = drt::testing::RandomTokens(config, 10, 5);
  drt::testing::WrappedSession* g_session = nullptr;
  REQUIRE(g->RunStep([&](Session& s) {
             g_session = &static_cast<drt::testing::WrappedSession&>(s.backend_session());
             return s.Append(prompt).status();
           })
              .ok());

  // Set on the engine thread once a step holding P is formed.
  std::promise<void> p_formed;
  const std::shared_future<void> p_step = p_formed.get_future().share();
  bool p_formed_set = false;  // engine thread only
  // Written by the thread that frees G, read here once it joined.
  bool formed_before_free = false;
  std::atomic<bool> freed{false};
  g_session->on_destroyed = [&] {
    // G's handler frees it inside its Generating scope. Waits (a generous
    // 5 s) for P's step: were G still waited for (decode_resubmit_wait
    // below), no step would be formed until the scope ends after this.
    formed_before_free =
        p_step.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    freed = true;
  };

  // Step 1 holds G's token alone, and is held until G is deleted (while
  // claimed, so the step still runs it) and P's 100 tokens are queued.
  StepLog log(/*park_at=*/1);
  SchedulerOptions options = log.Options(64);
  // Long enough that a wait for G's next token outlasts the hook's 5 s.
  options.decode_resubmit_wait = std::chrono::seconds(10);
  // A step formed while G counted as generating would take at most this
  // much prefill (DecodeStepBudget::GapPrefillTokens): less than P's 64.
  options.decode_step_prefill_tokens = 8;
  log.also = [&](const StepRecord& step) {
    if (!p_formed_set && Shares(step).contains(p.get())) {
      p_formed_set = true;
      p_formed.set_value();
    }
  };
  Scheduler scheduler(backend, options);
  const int32_t token = drt::testing::RandomTokens(config, 1, 6)[0];
  WorkResult rg;
  std::thread g_thread([&] {
    Scheduler::Generating scope(scheduler, g.get());
    rg = RunDecode(scheduler, *g, token);
  });
  log.WaitUntilParked();
  REQUIRE(manager.Delete(g->id()).ok());
  const std::vector<int32_t> p_tokens = drt::testing::RandomTokens(config, 100, 7);
  Background pb{Prefill(*p, p_tokens)};
  pb.Start(scheduler);
  WaitFor([&] { return scheduler.queued() == 2; }, 10, "P queued");
  log.Release();
  g_thread.join();
  const WorkResult rp = pb.result.get();

  CHECK(rg.status.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(rg.status.message()), Contains("was deleted while"));
  REQUIRE(freed.load());
  CHECK(formed_before_free);
  const auto steps = log.steps();
  REQUIRE(steps.size() >= 2);
  auto first = Shares(steps[0]);
  CHECK((first.size() == 1 && first[g.get()] == 1));
  // P's first step: the whole budget, not a gap step's 8 tokens.
  auto second = Shares(steps[1]);
  CHECK((second.size() == 1 && second[p.get()] == 64));
  CHECK(rp.status.ok());
  CHECK(p->tokens() == 100);
  CHECK_FALSE(g->engine_session_alive());
  g->End();
  p->End();
}

}  // namespace
}  // namespace drt::server
