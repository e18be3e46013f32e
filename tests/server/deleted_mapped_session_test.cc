// review-writecap W1: with the disk tier (on by default), a durable session's
// closed chunks are read from its chunk logs through mmap, and a mapped log
// lives on after its unlink until the last munmap, which the session's
// destruction does. So for a session deleted during its group-commit write,
// handing the unlink to the store's deleter thread is not enough: freeing
// the session (the munmaps, which free the unlinked logs' blocks) must not
// run on the engine thread either, before the step's other results are
// delivered. The scheduler hands it to the item's own caller
// (SessionEntry::ReleaseStep's free_later, server/scheduler.h step 5).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
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

// Whether this process maps `path` (also once unlinked: "path (deleted)").
bool ProcessMaps(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find(path) != std::string::npos) return true;
  }
  return false;
}

TEST_CASE("a mapped session deleted during its group-commit write is freed, and its logs "
          "unmapped, on its caller's thread after the other's result is delivered",
          "[server][scheduler][state_store][group_commit][delete][disk_tier]") {
  drt::testing::TempDir dir;
  FixtureModel& f = FixtureModel::Get();
  const int64_t chunk = f.chunk_size();
  drt::testing::WrappingBackend backend(MakeCpuBackend(f.model->config(), f.model->weights()));
  std::string a_id;
  std::mutex mutex;
  std::condition_variable changed;
  bool a_parked = false, a_released = false, b_returned = false;
  // Set by the free of A's engine session (declared before the manager,
  // which frees it if the test stops early).
  bool b_back_before_free = false, a_freed = false;
  std::thread::id free_thread;
  StateStoreOptions options = DurableOptions(dir.path());
  REQUIRE(options.disk_tier);
  std::atomic<bool> armed{false};
  // A's write parks once its chunks are on disk, until the test releases it.
  options.chunks_written_for_test = [&](const std::string& id) {
    if (!armed.load() || id != a_id) return;
    std::unique_lock<std::mutex> lock(mutex);
    a_parked = true;
    changed.notify_all();
    changed.wait_for(lock, std::chrono::seconds(30), [&] { return a_released; });
  };
  auto opened = StateStore::Open(options, f.model->config());
  REQUIRE(opened.ok());
  std::unique_ptr<StateStore> store = *std::move(opened);  // outlives the manager
  SessionManager manager(backend, DurableLimits());
  manager.AttachStateStore(store.get());

  auto a = NewEntry(manager), b = NewEntry(manager), c = NewEntry(manager);
  a_id = a->id();
  std::string a_log;  // as /proc/self/maps names it
  // A holds 70 chunks, written step by step (200 tokens each, as the
  // service runs them): its first block of 64 is mapped from its log.
  const auto a_first = RandomTokens(70 * chunk, 51);
  for (size_t done = 0; done < a_first.size(); done += 200) {
    const auto piece = absl::MakeConstSpan(a_first).subspan(
        done, std::min<size_t>(200, a_first.size() - done));
    REQUIRE(a->RunStep([&](Session& s) { return s.Append(piece).status(); }).ok());
  }
  REQUIRE(a->mapped_bytes() > 0);
  a_log = std::filesystem::canonical(store->LogPath(a_id)).string();
  REQUIRE(ProcessMaps(a_log));

  // A's engine session, freed when A's item ends: its destructor waits (at
  // most 10 s) for B's result of the same step. Freed on the engine thread
  // before the step's results are delivered (as before schedproof), B's
  // result cannot come while it waits: the wait runs out.
  drt::testing::WrappedSession* a_session = nullptr;
  REQUIRE(a->RunStep([&](Session& s) {
             a_session = &static_cast<drt::testing::WrappedSession&>(s.backend_session());
             return absl::OkStatus();
           })
              .ok());
  a_session->on_destroyed = [&] {
    std::unique_lock<std::mutex> lock(mutex);
    b_back_before_free = changed.wait_for(lock, std::chrono::seconds(10), [&] { return b_returned; });
    free_thread = std::this_thread::get_id();
    a_freed = true;
  };

  // Step 1 holds C's one token until A's and B's items are queued; step 2
  // holds both (200 tokens each, whole), so both owe a write after it.
  std::atomic<int> steps_with_a_and_b{0};
  std::thread::id engine_thread;  // written by the engine thread before any result
  SchedulerOptions scheduler_options;
  scheduler_options.step_tokens = 4032;
  Scheduler* running = nullptr;
  scheduler_options.on_step_formed = [&](const StepRecord& step) {
    engine_thread = std::this_thread::get_id();
    // (No REQUIRE on the engine thread: the test's own waits below fail.)
    const auto start = Clock::now();
    while (step.index == 1 && running->queued() < 3 && SecondsSince(start) < 30) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    int both = 0;
    for (const StepPiece& piece : step.pieces) both += piece.entry == a.get() || piece.entry == b.get();
    if (both == 2) ++steps_with_a_and_b;
  };
  Scheduler scheduler(backend, scheduler_options);
  running = &scheduler;
  armed = true;
  const auto a_tokens = RandomTokens(200, 52), b_tokens = RandomTokens(200, 53);
  const std::vector<int32_t> c_token = {5};
  auto c_done = std::async(std::launch::async, [&] { return scheduler.Run(Prefill(*c, c_token)); });
  WaitFor([&] { return scheduler.steps_formed() == 1; }, 30, "C's step formed");
  std::thread::id a_caller;
  auto a_done = std::async(std::launch::async, [&] {
    a_caller = std::this_thread::get_id();
    return scheduler.Run(Prefill(*a, a_tokens));
  });
  bool a_log_mapped_when_b_back = false;
  auto b_done = std::async(std::launch::async, [&] {
    WorkResult result = scheduler.Run(Prefill(*b, b_tokens));
    const bool mapped = ProcessMaps(a_log);
    std::lock_guard<std::mutex> lock(mutex);
    a_log_mapped_when_b_back = mapped;
    b_returned = true;
    changed.notify_all();
    return result;
  });
  {
    std::unique_lock<std::mutex> lock(mutex);
    REQUIRE(changed.wait_for(lock, std::chrono::seconds(30), [&] { return a_parked; }));
  }
  // Deleted while its write is parked: the write's end hands the logs to
  // the deleter, and the step's release hands the session to A's caller.
  REQUIRE(manager.Delete(a_id).ok());
  {
    std::lock_guard<std::mutex> lock(mutex);
    a_released = true;
    changed.notify_all();
  }
  const WorkResult ra = a_done.get(), rb = b_done.get();
  CHECK(c_done.get().status.ok());
  CHECK(ra.status.code() == absl::StatusCode::kAborted);  // deleted while it ran
  REQUIRE(rb.status.ok());
  // One group commit held both writes.
  CHECK(ra.steps_ran == 1);
  CHECK(rb.steps_ran == 1);
  CHECK(steps_with_a_and_b.load() == 1);
  CHECK(TokensOnDisk(dir.path(), b->id()) == 200);
  {
    std::lock_guard<std::mutex> lock(mutex);
    REQUIRE(a_freed);
    CHECK(b_back_before_free);
    // B's result came while A's log was still mapped: its munmap (where an
    // unlinked log's blocks are freed) had not run before the delivery.
    CHECK(a_log_mapped_when_b_back);
    CHECK(free_thread == a_caller);
    CHECK(free_thread != engine_thread);
  }
  CHECK_FALSE(a->engine_session_alive());
  store->WaitForLogDeletions();
  CHECK_FALSE(std::filesystem::exists(a_log));
  CHECK_FALSE(ProcessMaps(a_log));  // unmapped by the free
  for (auto* e : {b.get(), c.get()}) e->End();
}

}  // namespace
}  // namespace drt::server
