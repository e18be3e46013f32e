// No registration with the state store outlives its session
// (server/state_store.h, Register / Remove), whatever path ends it: delete,
// fork and delete, idle eviction, a failed first write, a failed step
// write. A write through a removed session's handle is dropped; a write
// without a handle is refused.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "server/session_manager.h"
#include "server/state_store.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/waiting.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

namespace fs = std::filesystem;
using testing::DurableServer;
using testing::FixtureModel;
using testing::RandomTokens;
using testing::WaitFor;

TEST_CASE("deleted sessions leave nothing in the state store's memory", "[state_store]") {
  drt::testing::TempDir dir;
  const int64_t chunk = FixtureModel::Get().chunk_size();
  DurableServer server(dir.path());
  const std::string kept = server.Create();
  server.Append(kept, RandomTokens(2 * chunk + 1, 1));
  // Created, written (some with chunks), forked and deleted, many times.
  constexpr int kRounds = 40;
  for (int i = 0; i < kRounds; ++i) {
    const std::string id = server.Create();
    if (i % 2 == 0) server.Append(id, RandomTokens(chunk + 3, 10 + i));
    std::string fork;
    if (i % 4 == 0) fork = server.Fork(id);
    REQUIRE(server.sessions->Delete(id).ok());
    if (!fork.empty()) REQUIRE(server.sessions->Delete(fork).ok());
  }
  // No registration outlives its session: only the session still there is
  // registered. (This does not show the store's memory: the removed-id set
  // the store used to keep was not counted here, and cannot be seen from
  // outside. It shows that every path that ends a session also ends its
  // registration.)
  CHECK(server.store->sessions_registered() == 1);
  CHECK(server.sessions->count() == 1);

  // Idle eviction ends registrations too.
  SessionSettings short_lived;
  short_lived.idle_ttl_seconds = 1;
  for (int i = 0; i < 3; ++i) {
    auto entry = server.sessions->Create(short_lived);
    REQUIRE(entry.ok());
  }
  CHECK(server.store->sessions_registered() == 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));  // past the 1 s TTL
  server.sessions->EvictIdle();  // (the reaper may have evicted some already)
  CHECK(server.sessions->count() == 1);
  // The reaper's pass may still be ending its evictions (it takes them out
  // of the table first, then removes them from the store: this EvictIdle
  // then found none and returned at once), so the store is waited for, its
  // registrations and state files both: a removal still under way during
  // the renames below left a state file behind (seen under load).
  const auto state_files_now = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir.path() + "/sessions")) n += e.is_regular_file();
    return n;
  };
  WaitFor([&] { return server.store->sessions_registered() == 1 && state_files_now() == 1; }, 30,
          "the evicted sessions' registrations and state files to go");

  // So do failed writes. With sessions/ a file, not a directory, a new
  // session's first write fails (Create deletes it); with chunks/ a file, a
  // step's write of its first chunk fails, and the session is deleted.
  const std::string sessions_dir = dir.path() + "/sessions";
  const std::string chunks_dir = dir.path() + "/chunks";
  fs::rename(sessions_dir, dir.path() + "/sessions.away");
  { std::ofstream(sessions_dir) << "not a directory"; }
  for (int i = 0; i < 3; ++i) {
    auto entry = server.sessions->Create({});
    CHECK_FALSE(entry.ok());
  }
  fs::remove(sessions_dir);
  fs::rename(dir.path() + "/sessions.away", sessions_dir);
  CHECK(server.sessions->count() == 1);
  CHECK(server.store->sessions_registered() == 1);
  const std::string failing = server.Create();
  fs::rename(chunks_dir, dir.path() + "/chunks.away");
  { std::ofstream(chunks_dir) << "not a directory"; }
  {
    auto entry = server.sessions->Find(failing);
    REQUIRE(entry.ok());
    REQUIRE((*entry)->Begin(Activity::kAppending).ok());
    const std::vector<int32_t> tokens = RandomTokens(chunk + 1, 7);
    CHECK_FALSE((*entry)->RunStep([&](Session& s) { return s.Append(tokens).status(); }).ok());
    (*entry)->End();
  }
  REQUIRE(server.sessions->Delete(failing).ok());
  fs::remove(chunks_dir);
  fs::rename(dir.path() + "/chunks.away", chunks_dir);
  CHECK(server.sessions->count() == 1);
  CHECK(server.store->sessions_registered() == 1);
  // And on disk, only its files.
  int state_files = 0, logs = 0;
  for (const auto& e : fs::directory_iterator(dir.path() + "/sessions")) state_files += e.is_regular_file();
  for (const auto& e : fs::directory_iterator(dir.path() + "/chunks")) logs += e.is_regular_file();
  CHECK(state_files == 1);
  CHECK(logs == 1);
  CHECK(fs::exists(server.store->StatePath(kept)));
}

TEST_CASE("a write after its session was removed writes nothing, and one without a registration "
          "is refused",
          "[state_store]") {
  // The race the removed ids guarded: a step that was running when its
  // session was deleted writes after StateStore::Remove.
  drt::testing::TempDir dir;
  const int64_t chunk = FixtureModel::Get().chunk_size();
  DurableServer server(dir.path());
  auto session = Session::Create(*FixtureModel::Get().backend);
  REQUIRE(session.ok());
  REQUIRE((*session)->Append(RandomTokens(3 * chunk + 2, 4)).ok());
  StateStore& store = *server.store;

  const std::string id = "s-removedwhilewriting";
  const StateRegistration registration = store.Register(id);
  REQUIRE(store.sessions_registered() == 1);
  REQUIRE(store.Persist(registration, SessionSettings{}, **session, /*force=*/true).ok());
  REQUIRE(fs::exists(store.StatePath(id)));
  REQUIRE(fs::exists(store.LogPath(id)));
  store.Remove(id);
  CHECK(store.sessions_registered() == 0);
  CHECK_FALSE(fs::exists(store.StatePath(id)));
  CHECK_FALSE(fs::exists(store.LogPath(id)));
  // The late write (more tokens since) is dropped: no file comes back.
  REQUIRE((*session)->Append(RandomTokens(chunk, 5)).ok());
  CHECK(store.Persist(registration, SessionSettings{}, **session, /*force=*/true).ok());
  CHECK_FALSE(fs::exists(store.StatePath(id)));
  CHECK_FALSE(fs::exists(store.LogPath(id)));
  CHECK(store.sessions_registered() == 0);

  // A write without a registration (the old id-based Persist returned OK
  // and wrote nothing, so a caller that missed Register was silently not
  // durable) is refused, naming the problem, and writes nothing.
  const absl::Status none = store.Persist(StateRegistration{}, SessionSettings{}, **session,
                                          /*force=*/true);
  CHECK(none.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(none.message()), Catch::Contains("not registered"));
  const absl::Status fork =
      store.RecordFork(StateRegistration{}, StateRegistration{}, SessionSettings{}, **session);
  CHECK(fork.code() == absl::StatusCode::kFailedPrecondition);
  // A handle of another store is refused too, and that store writes nothing.
  drt::testing::TempDir other_dir;
  DurableServer other(other_dir.path());
  const std::string never = "s-neverregistered";
  const StateRegistration foreign = other.store->Register(never);
  const absl::Status wrong = store.Persist(foreign, SessionSettings{}, **session, true);
  CHECK(wrong.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(wrong.message()), Catch::Contains("another state store"));
  CHECK_FALSE(fs::exists(store.StatePath(never)));
  CHECK_FALSE(fs::exists(store.LogPath(never)));
  CHECK_FALSE(fs::exists(other.store->StatePath(never)));
  CHECK(store.sessions_registered() == 0);
  // Removing an id twice, or one never registered, changes nothing.
  store.Remove(id);
  store.Remove(never);
  CHECK(store.sessions_registered() == 0);
  // Nothing of either comes back at the next start.
  server.sessions.reset();
  server.store.reset();
  DurableServer restarted(dir.path());
  CHECK(restarted.Tokens().empty());
}

}  // namespace
}  // namespace drt::server
