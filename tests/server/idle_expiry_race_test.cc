// Idle expiry against a call that found the session a moment before
// (SessionManager::EvictIdle): the expired id answers NOT_FOUND ("expired"),
// as docs/api.md promises, and not ABORTED ("deleted while an Append was
// running") from a call that began on the session after its TTL had passed.
// The call is made at the worst moment, through the manager's test hook:
// after the session left the table and before it is marked deleted.
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "server/session_manager.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/waiting.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

TEST_CASE("a call that found a session just before it expired gets NOT_FOUND",
          "[server][expiry]") {
  FixtureModel& f = FixtureModel::Get();
  SessionLimits limits;
  limits.idle_ttl_seconds = 1;
  SessionManager manager(*f.backend, limits);
  auto created = manager.Create({});
  REQUIRE(created.ok());
  const std::string id = (*created)->id();
  auto found = manager.Find(id);  // the call has the session in hand
  REQUIRE(found.ok());
  std::shared_ptr<SessionEntry> entry = *found;

  std::mutex mutex;
  std::optional<absl::Status> begun;  // what Begin answered inside the expiry
  manager.SetEvictPointForTest([&](const std::string& expired) {
    if (expired != id) return;
    absl::Status s = entry->Begin(Activity::kAppending);
    std::lock_guard<std::mutex> lock(mutex);
    begun = s;
  });
  // The reaper runs EvictIdle every second; the TTL is 1 s.
  WaitFor([&] {
    std::lock_guard<std::mutex> lock(mutex);
    return begun.has_value();
  }, 10, "the session's expiry");
  std::lock_guard<std::mutex> lock(mutex);
  INFO(begun->message());
  REQUIRE(begun->code() == absl::StatusCode::kNotFound);
  REQUIRE_THAT(std::string(begun->message()), Contains("session " + id + " expired"));
  REQUIRE(entry->deleted());
  REQUIRE_FALSE(entry->engine_session_alive());
  REQUIRE(manager.Find(id).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a session that began before its expiry check is kept", "[server][expiry]") {
  FixtureModel& f = FixtureModel::Get();
  SessionLimits limits;
  limits.idle_ttl_seconds = 1;
  SessionManager manager(*f.backend, limits);
  auto created = manager.Create({});
  REQUIRE(created.ok());
  std::shared_ptr<SessionEntry> entry = *created;
  REQUIRE(entry->Begin(Activity::kAppending).ok());  // busy: never idle past its TTL
  const auto start = Clock::now();
  while (SecondsSince(start) < 2.5) {
    manager.EvictIdle();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(manager.Find(entry->id()).ok());
  REQUIRE(entry->RunStep([](Session& s) { return s.Append(RandomTokens(3, 1)).status(); }).ok());
  entry->End();
}

}  // namespace
}  // namespace drt::server
