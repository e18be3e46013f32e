// SessionEntry and SessionManager under DeleteSession: a busy session's
// engine session (its memory) is freed at once when no step runs on it, or
// when the running step returns; later steps and Begin are refused.
// (delete_cancels_test.cc checks the same through the gRPC service.)
#include <condition_variable>
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

// Holds a step inside RunStep until the test releases it: the step calls
// Park(), the test WaitUntilParked() and later Release().
class StepGate {
 public:
  void Park() {
    std::unique_lock<std::mutex> lock(mutex_);
    parked_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return released_; });
  }
  void WaitUntilParked() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return parked_; });
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      released_ = true;
    }
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool parked_ = false, released_ = false;
};

TEST_CASE("a deleted session frees its engine session now, or after the running step",
          "[server][delete]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  auto created = manager.Create({});
  REQUIRE(created.ok());
  std::shared_ptr<SessionEntry> entry = *created;
  REQUIRE(entry->Begin(Activity::kAppending).ok());
  const auto tokens = RandomTokens(200, 5);
  auto append = [&](Session& session) { return session.Append(tokens).status(); };
  REQUIRE(entry->RunStep(append).ok());
  REQUIRE(entry->tokens() == 200);
  REQUIRE(entry->host_bytes() > 0);
  REQUIRE(entry->engine_session_alive());

  SECTION("deleted between steps: freed at once, the next step is refused") {
    REQUIRE(manager.Delete(entry->id()).ok());
    CHECK_FALSE(entry->engine_session_alive());
    CHECK(entry->host_bytes() == 0);
    CHECK(entry->tokens() == 0);
    bool ran = false;
    absl::Status s = entry->RunStep([&](Session&) {
      ran = true;
      return absl::OkStatus();
    });
    CHECK(s.code() == absl::StatusCode::kAborted);
    CHECK_THAT(std::string(s.message()),
               Contains("session " + entry->id() + " was deleted while an Append was running"));
    CHECK_FALSE(ran);
  }

  SECTION("deleted during a step: freed when the step returns") {
    StepGate gate;
    absl::Status step_status;
    std::thread worker([&] {
      step_status = entry->RunStep([&](Session& session) {
        gate.Park();
        return session.Append(tokens).status();
      });
    });
    gate.WaitUntilParked();
    REQUIRE(manager.Delete(entry->id()).ok());  // does not wait for the step
    CHECK(entry->deleted());
    CHECK(entry->engine_session_alive());  // the step still uses it
    gate.Release();
    worker.join();
    CHECK(step_status.code() == absl::StatusCode::kAborted);
    CHECK_FALSE(entry->engine_session_alive());
    CHECK(entry->host_bytes() == 0);
  }

  SECTION("deleted during a step: the engine session is not read while the step changes it") {
    // The step changes the engine session, then waits, still running, while
    // the session is deleted. Reading the engine then (for the figures)
    // would race with the step; the figures must stay those from before it.
    StepGate gate;
    absl::Status step_status;
    const auto more = RandomTokens(64, 6);
    std::thread worker([&] {
      step_status = entry->RunStep([&](Session& session) {
        absl::Status appended = session.Append(more).status();
        gate.Park();
        return appended;
      });
    });
    gate.WaitUntilParked();
    REQUIRE(manager.Delete(entry->id()).ok());
    CHECK(entry->tokens() == 200);  // not 264: the engine was left alone
    gate.Release();
    worker.join();
    CHECK(step_status.code() == absl::StatusCode::kAborted);
    CHECK_FALSE(entry->engine_session_alive());
    CHECK(entry->tokens() == 0);
    CHECK(entry->host_bytes() == 0);
  }

  entry->End();
  // A call that found the entry before the delete cannot start on it.
  absl::Status begin = entry->Begin(Activity::kGenerating);
  CHECK(begin.code() == absl::StatusCode::kNotFound);
  CHECK(entry->activity() == Activity::kIdle);
}

// review-writecap W3: EndAndReport decides whether its failed end write goes
// out wrapped and logged, or as the session's DeletedError, by what its own
// release reports (ReleaseStep hands it the session it freed), not by
// engine_session_alive(): a DeleteSession just after the release frees the
// session too, and the write's error must not pass as a delete's then.
TEST_CASE("ReleaseStep hands over the engine session only when it was deleted during the step",
          "[server][delete]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  auto created = manager.Create({});
  REQUIRE(created.ok());
  std::shared_ptr<SessionEntry> entry = *created;
  REQUIRE(entry->Begin(Activity::kAppending).ok());
  const absl::Status write_failed = absl::ResourceExhaustedError("no space left on device");

  SECTION("not deleted: the step's status, nothing handed over") {
    REQUIRE(entry->BeginStep().ok());
    std::optional<DeletedSession> freed;
    CHECK(entry->ReleaseStep(write_failed, &freed) == write_failed);
    CHECK_FALSE(freed.has_value());
    CHECK(entry->engine_session_alive());
  }

  SECTION("deleted during the step: ABORTED, and the session is handed over, alive until freed") {
    REQUIRE(entry->BeginStep().ok());
    REQUIRE(manager.Delete(entry->id()).ok());
    CHECK(entry->engine_session_alive());  // the step still holds it
    std::optional<DeletedSession> freed;
    const absl::Status s = entry->ReleaseStep(write_failed, &freed);
    CHECK(s.code() == absl::StatusCode::kAborted);
    REQUIRE(freed.has_value());
    CHECK(entry->engine_session_alive());  // not freed until the holder frees it
    freed.reset();
    CHECK_FALSE(entry->engine_session_alive());
  }

  SECTION("deleted just after the release: the release reported its own status, and the delete "
          "freed the session") {
    REQUIRE(entry->BeginStep().ok());
    std::optional<DeletedSession> freed;
    const absl::Status s = entry->ReleaseStep(write_failed, &freed);
    REQUIRE(manager.Delete(entry->id()).ok());
    // engine_session_alive() now says freed, as the old check read it; the
    // release's own report still says it did not free it.
    CHECK_FALSE(entry->engine_session_alive());
    CHECK(s == write_failed);
    CHECK_FALSE(freed.has_value());
  }
  entry->End();
}

TEST_CASE("eviction frees idle sessions past their TTL and keeps busy ones", "[server][delete]") {
  FixtureModel& f = FixtureModel::Get();
  SessionManager manager(*f.backend, SessionLimits{});
  SessionSettings settings;
  settings.idle_ttl_seconds = 1;  // the shortest TTL
  auto parent = manager.Create(settings);
  REQUIRE(parent.ok());
  REQUIRE((*parent)->Begin(Activity::kAppending).ok());
  const auto tokens = RandomTokens(200, 7);
  REQUIRE((*parent)->RunStep([&](Session& s) { return s.Append(tokens).status(); }).ok());
  (*parent)->End();
  // The fork (same TTL) shares the parent's chunks and stays busy.
  auto fork = manager.Fork((*parent)->id());
  REQUIRE(fork.ok());
  REQUIRE((*fork)->Begin(Activity::kGenerating).ok());
  REQUIRE((*fork)->shared_bytes() > 0);

  // EvictIdle takes the entry out of the table, then (outside the manager's
  // lock) marks it deleted and frees it: wait for the end of both.
  WaitFor([&] { return manager.count() == 1 && (*parent)->deleted() &&
                       !(*parent)->engine_session_alive(); },
          10.0, "the idle parent to be evicted and freed");
  CHECK((*parent)->deleted());
  CHECK_FALSE((*parent)->engine_session_alive());
  CHECK((*parent)->host_bytes() == 0);
  CHECK_FALSE((*fork)->deleted());
  CHECK(manager.Find((*fork)->id()).ok());
  // The fork's figures are refreshed when its activity ends: it shares
  // nothing any more. (The parent's memory is released just after it stops
  // being alive, outside its lock, so a refresh may still see it once.)
  (*fork)->End();
  WaitFor([&] {
    (*fork)->RefreshFiguresIfIdle();
    return (*fork)->shared_bytes() == 0;
  }, 10.0, "the fork to share nothing");
  CHECK((*fork)->tokens() == 200);
}

}  // namespace
}  // namespace drt::server
