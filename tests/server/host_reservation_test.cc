// The host-memory budget is reserved, not only checked (SessionManager::
// Reserve): concurrent requests that each fit alone cannot all pass, and a
// refusal names the budget and what is reserved.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_format.h"
#include "server/session_manager.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

TEST_CASE("concurrent reservations never pass the budget together and are released",
          "[server][memory]") {
  FixtureModel& f = FixtureModel::Get();
  SessionLimits limits;
  SessionManager probe(*f.backend, limits);
  const int64_t each = probe.HostBytesForTokens(10000);
  REQUIRE(each > 0);
  // Room for three and a half: exactly three of eight fit.
  limits.host_memory_budget_bytes = 3 * each + each / 2;
  SessionManager sessions(*f.backend, limits);
  constexpr int kThreads = 8;
  std::vector<absl::StatusOr<HostReservation>> results;
  for (int i = 0; i < kThreads; ++i) results.emplace_back(absl::InternalError("not run"));
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) {}
      results[i] = sessions.ReserveForTokens(10000);
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  int granted = 0;
  for (const auto& r : results) {
    if (r.ok()) {
      ++granted;
      CHECK(r->bytes() == each);
      continue;
    }
    CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK_THAT(std::string(r.status().message()), Contains("host memory budget exhausted"));
    CHECK_THAT(std::string(r.status().message()),
               Contains(absl::StrFormat("of %d MiB", limits.host_memory_budget_bytes >> 20)));
    CHECK_THAT(std::string(r.status().message()), Contains("reserved"));
    CHECK_THAT(std::string(r.status().message()), Contains("10000 more tokens"));
  }
  CHECK(granted == 3);
  CHECK(sessions.ReservedHostBytes() == 3 * each);
  results.clear();  // releases them
  CHECK(sessions.ReservedHostBytes() == 0);
  // Released room is there again; a moved reservation is released once.
  auto again = sessions.ReserveForTokens(10000);
  REQUIRE(again.ok());
  HostReservation moved = *std::move(again);
  CHECK(sessions.ReservedHostBytes() == each);
  moved.Release();
  moved.Release();
  CHECK(sessions.ReservedHostBytes() == 0);
}

TEST_CASE("concurrent Appends that each fit the host budget alone do not all run",
          "[server][memory]") {
  constexpr int kSessions = 4;
  // Large messages (hundreds of milliseconds each on the fixture), so that
  // the others' checks come while the first runs.
  constexpr size_t kTokens = 20000;
  int64_t base = 0, each = 0;
  {
    InProcessServer sizing;
    for (int i = 0; i < kSessions; ++i) NewSession(sizing.stub());
    base = sizing.service().session_manager().TotalHostBytes();
    each = sizing.service().session_manager().HostBytesForTokens(kTokens);
  }
  ServiceOptions options = SmallOptions();
  // The empty sessions and one message, not two.
  options.host_memory_budget_bytes = base + each + each / 2;
  InProcessServer server(options);
  std::vector<std::string> ids;
  for (int i = 0; i < kSessions; ++i) ids.push_back(NewSession(server.stub()));
  REQUIRE(server.service().session_manager().TotalHostBytes() == base);
  std::vector<grpc::Status> statuses(kSessions);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      const auto tokens = RandomTokens(kTokens, 100 + i);
      while (!go.load()) {}
      statuses[i] = AppendOnce(server.stub(), ids[i], tokens);
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  int ran = 0;
  for (const grpc::Status& s : statuses) {
    if (s.ok()) {
      ++ran;
      continue;
    }
    INFO(s.error_message());
    CHECK(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK_THAT(s.error_message(), Contains("host memory budget exhausted"));
    CHECK_THAT(s.error_message(), Contains("20000 more tokens"));
  }
  // Without the reservation every check saw only what the sessions held so
  // far and all four ran, holding about four messages' memory.
  CHECK(ran == 1);
  CHECK(server.service().session_manager().ReservedHostBytes() == 0);
}

TEST_CASE("an Append's reservation shrinks as its session grows, so the budget counts it once",
          "[server][memory]") {
  // Session A's message has run in the engine, but its handler has not yet
  // returned (held in before_progress, as a descheduled thread is): A holds
  // the message's memory, and what is left of its reservation is only what
  // A has not allocated. B's message fits the budget beside A's memory
  // counted once, not twice; the reservation used to stay whole until A's
  // handler returned and B was refused.
  const int64_t chunk = FixtureModel::Get().chunk_size();
  const auto prompt_a = RandomTokens(40 * chunk, 31);
  const auto prompt_b = RandomTokens(2 * chunk, 32);
  ServiceOptions options = SmallOptions();
  options.step_tokens = 4 * chunk;  // A's message takes ten steps
  int64_t base = 0, held = 0, reserve_a = 0, reserve_b = 0, one_chunk = 0, covered_growth = 0;
  {
    InProcessServer sizing(options);
    const std::string a = NewSession(sizing.stub());
    NewSession(sizing.stub());
    SessionManager& m = sizing.service().session_manager();
    base = m.TotalHostBytes();
    auto entry = m.Find(a);
    REQUIRE(entry.ok());
    const int64_t covered_before = (*entry)->covered_bytes();
    REQUIRE(AppendOnce(sizing.stub(), a, prompt_a).ok());
    held = m.TotalHostBytes();
    covered_growth = (*entry)->covered_bytes() - covered_before;
    reserve_a = m.HostBytesForTokens(static_cast<int64_t>(prompt_a.size()));
    reserve_b = m.HostBytesForTokens(static_cast<int64_t>(prompt_b.size()));
    one_chunk = m.HostBytesForTokens(0);
  }
  const int64_t growth = held - base;
  INFO("A grows by " << growth << " bytes (" << covered_growth
                     << " in chunks and landmarks); its message reserves " << reserve_a
                     << ", a chunk " << one_chunk);
  REQUIRE(covered_growth > one_chunk);  // else counting it twice would not matter
  // What is left of A's reservation once A grew: the reservation covers the
  // chunks (store and landmarks) only, and the chunk store allocates in
  // blocks, so their growth may pass the per-chunk estimate.
  const int64_t left_a = std::max<int64_t>(0, reserve_a - covered_growth);

  std::mutex mutex;
  std::condition_variable changed;
  bool held_in_progress = false, release = false;
  std::atomic<int> progress_calls{0};
  // Room for A's memory, what is left of its reservation, B's reservation
  // and half a chunk: counting A's growth twice passes it.
  options.host_memory_budget_bytes = held + left_a + reserve_b + one_chunk / 2;
  options.before_progress_for_test = [&] {
    if (progress_calls.fetch_add(1) != 0) return;  // A's first progress only
    std::unique_lock<std::mutex> lock(mutex);
    held_in_progress = true;
    changed.notify_all();
    changed.wait(lock, [&] { return release; });
  };
  InProcessServer server(options);
  SessionManager& sessions = server.service().session_manager();
  const std::string a = NewSession(server.stub());
  const std::string b = NewSession(server.stub());
  REQUIRE(sessions.TotalHostBytes() == base);
  grpc::Status status_a;
  std::thread append_a([&] { status_a = AppendOnce(server.stub(), a, prompt_a); });
  auto release_a = [&] {
    {
      std::lock_guard<std::mutex> lock(mutex);
      release = true;
    }
    changed.notify_all();
    append_a.join();
  };
  {
    std::unique_lock<std::mutex> lock(mutex);
    const bool entered =
        changed.wait_for(lock, std::chrono::seconds(60), [&] { return held_in_progress; });
    if (!entered) {
      lock.unlock();
      release_a();
      FAIL("A's handler never reported progress");
    }
  }
  // The engine runs A's message to its end while the handler is held.
  auto entry_a = sessions.Find(a);
  REQUIRE(entry_a.ok());
  const auto start = std::chrono::steady_clock::now();
  while ((*entry_a)->tokens() < static_cast<int64_t>(prompt_a.size()) &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK((*entry_a)->tokens() == static_cast<int64_t>(prompt_a.size()));
  CHECK(sessions.TotalHostBytes() == held);  // (same step size as the sizing run)
  // Budget = what the sessions hold + what the running work has not yet
  // allocated, exactly.
  CHECK(sessions.ReservedHostBytes() == left_a);
  const grpc::Status status_b = AppendOnce(server.stub(), b, prompt_b);
  release_a();
  INFO(status_b.error_message());
  CHECK(status_b.ok());
  CHECK(status_a.ok());
  CHECK(sessions.ReservedHostBytes() == 0);
}

TEST_CASE("Generate checks the host budget before each token that completes a chunk",
          "[server][memory]") {
  const int64_t chunk = FixtureModel::Get().chunk_size();
  const auto prompt = RandomTokens(5 * chunk + 10, 21);
  int64_t held = 0, one_chunk = 0;
  {
    InProcessServer sizing;
    const std::string id = NewSession(sizing.stub());
    REQUIRE(AppendOnce(sizing.stub(), id, prompt).ok());
    held = sizing.service().session_manager().TotalHostBytes();
    one_chunk = sizing.service().session_manager().HostBytesForTokens(1);
  }
  ServiceOptions options = SmallOptions();
  // What the session holds and half a chunk: no room for one more chunk.
  options.host_memory_budget_bytes = held + one_chunk / 2;
  InProcessServer server(options);
  const std::string id = NewSession(server.stub());
  REQUIRE(AppendOnce(server.stub(), id, prompt).ok());
  REQUIRE(server.service().session_manager().TotalHostBytes() == held);
  drt::v1::GenerateRequest request = GreedyRequest(id, 200);
  request.set_pad_to_chunk_boundary(false);
  request.set_ignore_eos(true);
  GenerateResult g = Generate(server.stub(), request);
  // Token k leaves 5 chunk + 10 + k tokens: k = chunk - 10 completes the
  // sixth chunk, so the tokens before it run and it is refused.
  const size_t before = static_cast<size_t>(chunk - 11);
  INFO(g.status.error_message());
  CHECK(g.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK_THAT(g.status.error_message(),
             Contains(absl::StrFormat("Generate stopped after %d generated tokens", before)));
  CHECK_THAT(g.status.error_message(), Contains("host memory budget exhausted"));
  CHECK(g.tokens.size() == before);
  const std::vector<int32_t> alone = EngineGreedy(prompt, static_cast<int32_t>(before));
  CHECK(g.tokens == alone);
  CHECK(GetSession(server.stub(), id).info.tokens() ==
        static_cast<int64_t>(prompt.size() + before));
  CHECK(server.service().session_manager().ReservedHostBytes() == 0);
}

}  // namespace
}  // namespace drt::server
