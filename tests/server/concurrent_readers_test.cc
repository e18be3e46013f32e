// ForkSession and SaveSession only read their session, so they share it (a
// reader claim): concurrent forks of one parent all succeed and equal a
// serial fork, and an Append or Generate meanwhile is refused with a
// message that names what holds the session (review-api F1).
#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "server/session_manager.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

TEST_CASE("concurrent forks of one parent all succeed and equal a serial fork",
          "[server][fork]") {
  InProcessServer server;
  const auto prompt = RandomTokens(700, 31);  // 11 closed chunks + 7 open tokens
  const std::string parent = NewSession(server.stub());
  REQUIRE(AppendTokens(server.stub(), parent, prompt, EvenPieces(prompt.size(), 700)).status.ok());
  const auto expected = EngineGreedy(prompt, 8);

  // Started together (a spin barrier), so the forks overlap: before the
  // reader claim, all but one failed with "busy with an Append".
  constexpr int kForks = 8;
  std::vector<InfoResult> forks(kForks);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kForks; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < kForks) std::this_thread::yield();
      forks[i] = ForkSession(server.stub(), parent);
    });
  }
  for (auto& t : threads) t.join();

  std::vector<std::string> ids;
  for (const InfoResult& f : forks) {
    INFO(f.status.error_message());
    REQUIRE(f.status.ok());
    CHECK(f.info.tokens() == 700);
    ids.push_back(f.info.session_id());
  }
  std::sort(ids.begin(), ids.end());
  CHECK(std::unique(ids.begin(), ids.end()) == ids.end());
  CHECK_FALSE(GetSession(server.stub(), parent).info.busy());
  for (const std::string& id : ids) {
    GenerateResult g = GenerateGreedy(server.stub(), id, 8);
    REQUIRE(g.status.ok());
    CHECK(g.tokens == expected);
  }
  // The parent is untouched and idle again: it generates the same.
  GenerateResult gp = GenerateGreedy(server.stub(), parent, 8);
  REQUIRE(gp.status.ok());
  CHECK(gp.tokens == expected);
}

TEST_CASE("a reader claim admits forks and refuses Append and Generate, naming the fork",
          "[server][fork]") {
  InProcessServer server;
  const auto prompt = RandomTokens(100, 32);
  const std::string parent = NewSession(server.stub());
  REQUIRE(AppendTokens(server.stub(), parent, prompt, EvenPieces(prompt.size(), 100)).status.ok());
  auto entry = server.service().session_manager().Find(parent);
  REQUIRE(entry.ok());

  // A fork in progress (held here): another fork shares the parent.
  REQUIRE((*entry)->BeginRead(ReadKind::kFork).ok());
  InfoResult f = ForkSession(server.stub(), parent);
  REQUIRE(f.status.ok());
  CHECK(f.info.tokens() == 100);

  // Writers are refused while a reader holds it, and told what holds it.
  grpc::Status appended = AppendTokens(server.stub(), parent, prompt, EvenPieces(100, 100)).status;
  CHECK(appended.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(appended.error_message(), Contains("busy with a ForkSession"));
  GenerateResult g = GenerateGreedy(server.stub(), parent, 4);
  CHECK(g.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(g.status.error_message(), Contains("busy with a ForkSession"));
  CHECK(GetSession(server.stub(), parent).info.tokens() == 100);  // nothing of them ran
  CHECK(GetSession(server.stub(), parent).info.busy());

  // A save joins the readers; the message names both kinds.
  REQUIRE((*entry)->BeginRead(ReadKind::kSave).ok());
  CHECK_THAT(std::string((*entry)->Begin(Activity::kAppending).message()),
             Contains("busy with a ForkSession and a SaveSession"));
  (*entry)->EndRead(ReadKind::kFork);
  CHECK_THAT(std::string((*entry)->Begin(Activity::kAppending).message()),
             Contains("busy with a SaveSession"));
  (*entry)->EndRead(ReadKind::kSave);  // the last reader: idle again
  CHECK_FALSE(GetSession(server.stub(), parent).info.busy());
  REQUIRE(AppendTokens(server.stub(), parent, prompt, EvenPieces(100, 100)).status.ok());
  CHECK(GetSession(server.stub(), parent).info.tokens() == 200);

  // And readers are refused while a writer holds it, told which.
  REQUIRE((*entry)->Begin(Activity::kGenerating).ok());
  InfoResult refused = ForkSession(server.stub(), parent);
  CHECK(refused.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(refused.status.error_message(), Contains("busy with a Generate"));
  (*entry)->End();
}

TEST_CASE("a delete during a fork names the fork", "[server][fork]") {
  InProcessServer server;
  const std::string parent = NewSession(server.stub());
  const auto prompt = RandomTokens(80, 33);
  REQUIRE(AppendTokens(server.stub(), parent, prompt, EvenPieces(80, 80)).status.ok());
  auto entry = server.service().session_manager().Find(parent);
  REQUIRE(entry.ok());
  REQUIRE((*entry)->BeginRead(ReadKind::kFork).ok());
  REQUIRE(DeleteSession(server.stub(), parent).ok());
  absl::Status s = (*entry)->RunReadStep([](Session&) { return absl::OkStatus(); });
  CHECK(s.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(s.message()), Contains("deleted while a ForkSession was running"));
  (*entry)->EndRead(ReadKind::kFork);
}

}  // namespace
}  // namespace drt::server
