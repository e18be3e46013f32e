// Group commit (SchedulerOptions::concurrent_writes): the durable sessions
// of one engine step that owe a write are written at once, so the step
// costs one write latency, not one per session; each item's result still
// comes only after its own write.
#include <atomic>
#include <chrono>
#include <condition_variable>
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

}  // namespace
}  // namespace drt::server
