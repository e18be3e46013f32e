// The state store keeps nothing in memory of a session once it is removed
// (server/state_store.h, Register / Remove): it used to keep every removed
// id in a set for the life of the process, so that a write racing with the
// delete could be dropped. Now the store writes only registered sessions,
// and that write is still dropped.
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include "server/session_manager.h"
#include "server/state_store.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

namespace fs = std::filesystem;
using testing::DurableServer;
using testing::FixtureModel;
using testing::RandomTokens;

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
  // Only the session still there (the old store also held 40 + 10 removed ids).
  CHECK(server.store->sessions_registered() == 1);
  CHECK(server.sessions->count() == 1);
  // And on disk, only its files.
  int state_files = 0, logs = 0;
  for (const auto& e : fs::directory_iterator(dir.path() + "/sessions")) state_files += e.is_regular_file();
  for (const auto& e : fs::directory_iterator(dir.path() + "/chunks")) logs += e.is_regular_file();
  CHECK(state_files == 1);
  CHECK(logs == 1);
  CHECK(fs::exists(server.store->StatePath(kept)));
}

TEST_CASE("a write after its session was removed writes nothing; one without a registration "
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
