// ForkSession and SaveSession only read their session, so they share it (a
// reader claim): concurrent forks of one parent all succeed and equal a
// serial fork, and an Append or Generate meanwhile is refused with a
// message that names what holds the session (review-api F1).
#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "server/session_manager.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

// Forks `parent` (700 tokens of `prompt`) 8 times at once and checks each
// fork, returning their ids. A ForkSession claim held here for the whole
// time makes every fork overlap another fork's claim by construction (on a
// loaded machine the 8 calls could otherwise run one after another): with
// the old exclusive claim all 8 failed with "busy with a ForkSession".
std::vector<std::string> ForkEightAtOnce(InProcessServer& server, const std::string& parent,
                                         const std::vector<int32_t>& expected) {
  auto entry = server.service().session_manager().Find(parent);
  REQUIRE(entry.ok());
  REQUIRE((*entry)->BeginRead(ReadKind::kFork).ok());
  constexpr int kForks = 8;
  std::vector<InfoResult> forks(kForks);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kForks; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);  // started together (a spin barrier): they overlap each other too
      while (ready.load() < kForks) std::this_thread::yield();
      forks[i] = ForkSession(server.stub(), parent);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(GetSession(server.stub(), parent).info.busy());  // the claim held here
  (*entry)->EndRead(ReadKind::kFork);

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
  return ids;
}

TEST_CASE("concurrent forks of one parent all succeed and equal a serial fork",
          "[server][fork]") {
  InProcessServer server;
  const auto prompt = RandomTokens(700, 31);  // 11 closed chunks + 7 open tokens
  const std::string parent = NewSession(server.stub());
  REQUIRE(AppendTokens(server.stub(), parent, prompt, EvenPieces(prompt.size(), 700)).status.ok());
  const auto expected = EngineGreedy(prompt, 8);
  ForkEightAtOnce(server, parent, expected);
  // The parent is untouched and idle again: it generates the same.
  GenerateResult gp = GenerateGreedy(server.stub(), parent, 8);
  REQUIRE(gp.status.ok());
  CHECK(gp.tokens == expected);
}

TEST_CASE("concurrent forks of a durable parent are all written whole and restored",
          "[server][fork][state_store]") {
  // With --state_dir each fork forces the parent's write and records the
  // fork (StateStore), from 8 threads at once here.
  drt::testing::TempDir dir;
  const auto prompt = RandomTokens(700, 34);
  const auto expected = EngineGreedy(prompt, 8);
  std::string parent;
  std::vector<std::string> ids;
  std::map<std::string, int64_t> held;  // each fork's tokens before the restart
  {
    DurableService durable(dir.path(), SmallOptions());
    parent = NewSession(durable.server.stub());
    REQUIRE(AppendTokens(durable.server.stub(), parent, prompt, EvenPieces(prompt.size(), 700))
                .status.ok());
    ids = ForkEightAtOnce(durable.server, parent, expected);  // each fork generated 8 more
    for (const std::string& id : ids) held[id] = GetSession(durable.server.stub(), id).info.tokens();
  }
  // A restart restores the parent and every fork whole.
  DurableService restarted(dir.path(), SmallOptions());
  auto& stub = restarted.server.stub();
  CHECK(restarted.server.service().session_manager().count() == 9);
  InfoResult p = GetSession(stub, parent);
  REQUIRE(p.status.ok());
  CHECK(p.info.tokens() == 700);
  GenerateResult gp = GenerateGreedy(stub, parent, 8);
  REQUIRE(gp.status.ok());
  CHECK(gp.tokens == expected);
  for (const std::string& id : ids) {
    InfoResult f = GetSession(stub, id);
    INFO(id << ": " << f.status.error_message());
    REQUIRE(f.status.ok());
    CHECK(f.info.tokens() > 700);
    CHECK(f.info.tokens() == held[id]);
  }
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
