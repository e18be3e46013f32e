// Group commit (SchedulerOptions::concurrent_writes): the durable sessions
// of one engine step that owe a write are written at once, so the step
// costs one write latency, not one per session; each item's result still
// comes only after its own write.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <set>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "server/scheduler.h"
#include "server/session_manager.h"
#include "server/state_store.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/scheduler_items.h"
#include "tests/server/test_util/waiting.h"
#include "tests/test_util/temp_dir.h"
#include "tests/test_util/wrapping_backend.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

TEST_CASE("durable sessions whose writes fall in one step are written at once",
          "[server][scheduler][state_store][group_commit]") {
  drt::testing::TempDir dir;
  // Each write of A and B, once its chunks are on disk, waits (at most 5 s)
  // until the other's write is there too. Written one after another, the
  // first waits the whole 5 s and is counted as alone.
  std::mutex mutex;
  std::condition_variable changed;
  int entered = 0, alone = 0;
  std::atomic<bool> armed{false};
  StateStoreOptions options = DurableOptions(dir.path());
  options.chunks_written_for_test = [&](const std::string&) {
    if (!armed.load()) return;
    std::unique_lock<std::mutex> lock(mutex);
    ++entered;
    changed.notify_all();
    if (!changed.wait_for(lock, std::chrono::seconds(5), [&] { return entered >= 2; })) ++alone;
  };
  DurableServer server(options);
  // Step 1 holds only C's one token and waits, formed, until A's and B's
  // items are queued too: step 2 then holds both, whole (200 tokens each,
  // none following), so both owe a write after it.
  SchedulerOptions scheduler_options;
  scheduler_options.step_tokens = 4032;
  Scheduler* running = nullptr;
  scheduler_options.on_step_formed = [&](const StepRecord& step) {
    // (No REQUIRE on the engine thread: the test's own waits below fail.)
    const auto start = Clock::now();
    while (step.index == 1 && running->queued() < 3 && SecondsSince(start) < 30) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  Scheduler scheduler(*FixtureModel::Get().backend, scheduler_options);
  running = &scheduler;
  auto a = NewEntry(*server.sessions), b = NewEntry(*server.sessions),
       c = NewEntry(*server.sessions);
  const auto a_tokens = RandomTokens(200, 31), b_tokens = RandomTokens(200, 32);
  const std::vector<int32_t> c_token = {5};
  armed = true;  // (C's one token closes no chunk: only A and B reach the hook)
  auto c_done = std::async(std::launch::async, [&] { return scheduler.Run(Prefill(*c, c_token)); });
  WaitFor([&] { return scheduler.steps_formed() == 1; }, 30, "C's step formed");
  auto a_done = std::async(std::launch::async, [&] { return scheduler.Run(Prefill(*a, a_tokens)); });
  auto b_done = std::async(std::launch::async, [&] { return scheduler.Run(Prefill(*b, b_tokens)); });
  const WorkResult ra = a_done.get(), rb = b_done.get(), rc = c_done.get();
  CHECK(rc.status.ok());
  REQUIRE(ra.status.ok());
  REQUIRE(rb.status.ok());
  CHECK(ra.steps_ran == 1);
  CHECK(rb.steps_ran == 1);
  {
    std::lock_guard<std::mutex> lock(mutex);
    CHECK(entered == 2);
    CHECK(alone == 0);  // each write saw the other's inside
  }
  // Each was written whole before its result came back.
  CHECK(TokensOnDisk(dir.path(), a->id()) == 200);
  CHECK(TokensOnDisk(dir.path(), b->id()) == 200);
  for (auto* e : {a.get(), b.get(), c.get()}) e->End();
}

TEST_CASE("in a group commit a failed write fails only its own session's item",
          "[server][scheduler][state_store][group_commit]") {
  drt::testing::TempDir dir;
  DurableServer server(DurableOptions(dir.path()));
  SchedulerOptions scheduler_options;
  scheduler_options.step_tokens = 4032;
  Scheduler* running = nullptr;
  std::atomic<int64_t> both_in_step{0};
  // As above: step 1 (C's token) waits until A's and B's items are queued.
  scheduler_options.on_step_formed = [&](const StepRecord& step) {
    const auto start = Clock::now();
    while (step.index == 1 && running->queued() < 3 && SecondsSince(start) < 30) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (step.index == 2) both_in_step = static_cast<int64_t>(step.pieces.size());
  };
  Scheduler scheduler(*FixtureModel::Get().backend, scheduler_options);
  running = &scheduler;
  auto a = NewEntry(*server.sessions), b = NewEntry(*server.sessions),
       c = NewEntry(*server.sessions);
  // A's chunk log cannot be opened (a directory stands at its path): its
  // first write with chunks fails; B's is untouched.
  REQUIRE(std::filesystem::create_directory(dir.path() + "/chunks/" + a->id() + ".log"));
  const auto a_tokens = RandomTokens(200, 33), b_tokens = RandomTokens(200, 34);
  const std::vector<int32_t> c_token = {5};
  auto c_done = std::async(std::launch::async, [&] { return scheduler.Run(Prefill(*c, c_token)); });
  WaitFor([&] { return scheduler.steps_formed() == 1; }, 30, "C's step formed");
  auto a_done = std::async(std::launch::async, [&] { return scheduler.Run(Prefill(*a, a_tokens)); });
  auto b_done = std::async(std::launch::async, [&] { return scheduler.Run(Prefill(*b, b_tokens)); });
  const WorkResult ra = a_done.get(), rb = b_done.get();
  CHECK(c_done.get().status.ok());
  CHECK(both_in_step.load() == 2);
  INFO(ra.status.message());
  CHECK_FALSE(ra.status.ok());
  CHECK_THAT(std::string(ra.status.message()), Catch::Matchers::Contains(a->id() + ".log"));
  CHECK(rb.status.ok());
  CHECK(TokensOnDisk(dir.path(), b->id()) == 200);
  CHECK(TokensOnDisk(dir.path(), a->id()) == 0);  // its creation's state, nothing after
  for (auto* e : {a.get(), b.get(), c.get()}) e->End();
}

// The service turns group commit on by the backend's capability
// (Backend::exports_sessions_concurrently), which a wrapping backend
// forwards: before, it asked for the name "cpu", so the service tests' wrapped
// CPU backend ("wrapped cpu") wrote one session after another and no service
// test ran the path production runs.
TEST_CASE("through the service, a wrapped CPU backend's durable sessions of one step are written "
          "at once",
          "[server][state_store][group_commit]") {
  drt::testing::TempDir dir;
  FixtureModel& f = FixtureModel::Get();
  drt::testing::WrappingBackend backend(MakeCpuBackend(f.model->config(), f.model->weights()));
  REQUIRE(backend.exports_sessions_concurrently());
  // As in the first test: each of A's and B's writes, once its chunks are
  // on disk, waits (at most 5 s) for the other's to be there too.
  std::mutex mutex;
  std::condition_variable changed;
  std::set<std::string> writers;  // A's and B's ids, once known
  int entered = 0, alone = 0;
  StateStoreOptions store_options = DurableService::StoreOptions(dir.path(), StateSync::kStep);
  store_options.chunks_written_for_test = [&](const std::string& id) {
    std::unique_lock<std::mutex> lock(mutex);
    if (!writers.contains(id)) return;
    ++entered;
    changed.notify_all();
    if (!changed.wait_for(lock, std::chrono::seconds(5), [&] { return entered >= 2; })) ++alone;
  };
  // The step holding C's one token waits, formed, until A's and B's Appends
  // are queued too, so the next step holds both whole.
  std::string c_id;
  std::atomic<bool> c_step_formed{false};
  std::atomic<int> steps_with_a_and_b{0};
  ServiceOptions options = SmallOptions();
  options.step_tokens = 4032;
  options.on_step_formed_for_test = [&](const StepRecord& step, const Scheduler& scheduler) {
    // (No REQUIRE on the engine thread: the test's own waits below fail.)
    std::set<std::string> ids;
    for (const StepPiece& piece : step.pieces) ids.insert(piece.entry->id());
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (ids == writers) ++steps_with_a_and_b;
    }
    if (ids != std::set<std::string>{c_id}) return;
    c_step_formed = true;
    const auto start = Clock::now();
    while (scheduler.queued() < 3 && SecondsSince(start) < 30) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  std::unique_ptr<StateStore> store;  // outlives the server, which writes to it
  {
    auto opened = StateStore::Open(store_options, f.model->config());
    REQUIRE(opened.ok());
    store = *std::move(opened);
  }
  InProcessServer server(*f.model, backend, options);
  server.service().session_manager().AttachStateStore(store.get());
  const std::string a = NewSession(server.stub()), b = NewSession(server.stub());
  c_id = NewSession(server.stub());
  {
    std::lock_guard<std::mutex> lock(mutex);
    writers = {a, b};
  }
  const auto a_tokens = RandomTokens(200, 35), b_tokens = RandomTokens(200, 36);
  auto c_done = std::async(std::launch::async,
                           [&] { return AppendOnce(server.stub(), c_id, {5}); });
  WaitFor([&] { return c_step_formed.load(); }, 30, "C's step formed");
  auto a_done = std::async(std::launch::async,
                           [&] { return AppendOnce(server.stub(), a, a_tokens); });
  auto b_done = std::async(std::launch::async,
                           [&] { return AppendOnce(server.stub(), b, b_tokens); });
  const grpc::Status ra = a_done.get(), rb = b_done.get(), rc = c_done.get();
  CHECK(rc.ok());
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  CHECK(steps_with_a_and_b.load() == 1);  // one step held both, and nothing else
  {
    std::lock_guard<std::mutex> lock(mutex);
    CHECK(entered == 2);
    CHECK(alone == 0);  // each write saw the other's inside (serially: 1)
  }
  CHECK(TokensOnDisk(dir.path(), a) == 200);
  CHECK(TokensOnDisk(dir.path(), b) == 200);
}

}  // namespace
}  // namespace drt::server
