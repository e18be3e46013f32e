// The host-memory budget is reserved, not only checked (SessionManager::
// Reserve): concurrent requests that each fit alone cannot all pass, and a
// refusal names the budget and what is reserved.
#include <atomic>
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
