// LoadSession's host-memory accounting: the chunks' reservation is
// released in the same step as the loaded session enters the table, so the
// budget counts the session once, also while its chunks are written to
// --state_dir (which takes a while for a large session). It used to be
// released only after that write: until then the budget counted the
// session twice and refused requests that fit.
#include <atomic>
#include <chrono>
#include <thread>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "server/session_manager.h"
#include "server/state_store.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

constexpr int64_t kBudget = 1LL << 30;

ServiceOptions LoadOptions(const std::string& files_dir) {
  ServiceOptions options = SmallOptions();
  options.session_files_dir = files_dir;
  options.host_memory_budget_bytes = kBudget;
  return options;
}

// A session of 15 closed chunks and 20 more tokens, saved as "saved".
void SaveOne(InProcessServer& server) {
  const int64_t chunk = FixtureModel::Get().chunk_size();
  const std::string id = NewSession(server.stub());
  const auto prompt = RandomTokens(15 * chunk + 20, 1);
  REQUIRE(AppendTokens(server.stub(), id, prompt, EvenPieces(prompt.size(), 300)).status.ok());
  grpc::Status saved = SaveSession(server.stub(), id, "saved");
  INFO(saved.error_message());
  REQUIRE(saved.ok());
}

// What the budget has left is exactly what a reservation may take: one of
// that size is granted, one byte more is refused.
void CheckBudgetLeftIs(SessionManager& sessions, int64_t left) {
  INFO("budget left " << left);
  REQUIRE(left > 0);
  auto fits = sessions.Reserve(left, "the rest of the budget");
  CHECK(fits.ok());
  fits->Release();
  auto over = sessions.Reserve(left + 1, "one byte more than the rest");
  CHECK(over.status().code() == absl::StatusCode::kResourceExhausted);
}

TEST_CASE("a session being loaded is counted once while it is written to the state directory",
          "[server][session_file][memory]") {
  drt::testing::TempDir files, state;
  // What the hook sees (on the server's thread; checked here afterwards).
  std::atomic<bool> armed{false};
  SessionManager* sessions = nullptr;
  int calls = 0;
  int64_t base = 0;
  int64_t reserved_during = -1, total_during = -1, loaded_during = -1;
  absl::Status rest_during = absl::UnknownError("not run"), over_during = rest_during;
  StateStoreOptions store_options;
  store_options.dir = state.path();
  store_options.chunks_written_for_test = [&](const std::string& id) {
    if (!armed.load()) return;
    ++calls;
    reserved_during = sessions->ReservedHostBytes();
    total_during = sessions->TotalHostBytes();
    auto entry = sessions->Find(id);
    if (!entry.ok()) return;
    loaded_during = (*entry)->host_bytes();
    // A request for what is left beside the session counted once fits;
    // one byte more does not.
    const int64_t left = kBudget - base - loaded_during;
    rest_during = sessions->Reserve(left, "the rest of the budget").status();
    over_during = sessions->Reserve(left + 1, "one byte more than the rest").status();
  };
  // The store outlives the server's sessions.
  auto store = StateStore::Open(store_options, FixtureModel::Get().model->config());
  REQUIRE(store.ok());
  REQUIRE((*store)->RestoreAll(*FixtureModel::Get().backend).ok());
  InProcessServer server(LoadOptions(files.path()));
  sessions = &server.service().session_manager();
  sessions->AttachStateStore(store->get());

  SaveOne(server);
  base = sessions->TotalHostBytes();
  REQUIRE(sessions->ReservedHostBytes() == 0);
  armed = true;
  InfoResult loaded = LoadSession(server.stub(), "saved");
  armed = false;
  INFO(loaded.status.error_message());
  REQUIRE(loaded.status.ok());
  // The hook ran for the loaded session's first write (its 15 chunks).
  REQUIRE(calls == 1);
  REQUIRE(loaded_during > 0);
  // While it was written, it was in the table and counted there, and
  // nothing was reserved for it any more (the old code still held the
  // reservation of its 15 chunks here, and refused the rest of the budget).
  CHECK(reserved_during == 0);
  CHECK(total_during == base + loaded_during);
  INFO("the rest: " << rest_during.message());
  CHECK(rest_during.ok());
  CHECK(over_during.code() == absl::StatusCode::kResourceExhausted);
  // After the load: the same, with the figure the session has now (the
  // disk tier may have mapped its chunks since).
  auto entry = sessions->Find(loaded.info.session_id());
  REQUIRE(entry.ok());
  CHECK(sessions->ReservedHostBytes() == 0);
  CHECK(sessions->TotalHostBytes() == base + (*entry)->host_bytes());
  CheckBudgetLeftIs(*sessions, kBudget - base - (*entry)->host_bytes());
}

TEST_CASE("a loaded session deleted during its first write is counted until it is freed",
          "[server][session_file][memory]") {
  // DeleteSession during LoadSession's first write: the entry leaves the
  // table at once, but the engine session is freed only when the write
  // returns. Until then the budget must still count it (it used to count
  // it nowhere: a concurrent request could be granted memory in use).
  drt::testing::TempDir files, state;
  std::atomic<bool> armed{false};
  SessionManager* sessions = nullptr;
  int calls = 0;
  int64_t loaded_during = -1, counted_after_delete = -1;
  bool gone_from_table = false;
  std::thread deleter;
  StateStoreOptions store_options;
  store_options.dir = state.path();
  store_options.chunks_written_for_test = [&](const std::string& id) {
    if (!armed.load()) return;
    ++calls;
    auto entry = sessions->Find(id);
    if (!entry.ok()) return;
    loaded_during = (*entry)->host_bytes();
    // The delete erases the entry, then waits in StateStore::Remove for
    // this write (whose lock the hook runs under).
    deleter = std::thread([&, id] { sessions->Delete(id).IgnoreError(); });
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (sessions->Find(id).ok() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    gone_from_table = !sessions->Find(id).ok();
    counted_after_delete = sessions->TotalHostBytes() + sessions->ReservedHostBytes();
  };
  auto store = StateStore::Open(store_options, FixtureModel::Get().model->config());
  REQUIRE(store.ok());
  REQUIRE((*store)->RestoreAll(*FixtureModel::Get().backend).ok());
  InProcessServer server(LoadOptions(files.path()));
  sessions = &server.service().session_manager();
  sessions->AttachStateStore(store->get());

  SaveOne(server);
  const int64_t base = sessions->TotalHostBytes();
  REQUIRE(sessions->ReservedHostBytes() == 0);
  armed = true;
  InfoResult loaded = LoadSession(server.stub(), "saved");
  armed = false;
  if (deleter.joinable()) deleter.join();
  // The load reports the delete (its session is gone).
  CHECK_FALSE(loaded.status.ok());
  REQUIRE(calls == 1);
  REQUIRE(loaded_during > 0);
  REQUIRE(gone_from_table);
  // Out of the table, still allocated, still counted.
  CHECK(counted_after_delete == base + loaded_during);
  // Freed once the write returned: counted no more.
  CHECK(sessions->TotalHostBytes() == base);
  CHECK(sessions->ReservedHostBytes() == 0);
  CheckBudgetLeftIs(*sessions, kBudget - base);
}

TEST_CASE("without a state directory, a loaded session is counted once after the load",
          "[server][session_file][memory]") {
  drt::testing::TempDir files;
  InProcessServer server(LoadOptions(files.path()));
  SessionManager& sessions = server.service().session_manager();
  SaveOne(server);
  const int64_t base = sessions.TotalHostBytes();
  InfoResult loaded = LoadSession(server.stub(), "saved");
  INFO(loaded.status.error_message());
  REQUIRE(loaded.status.ok());
  auto entry = sessions.Find(loaded.info.session_id());
  REQUIRE(entry.ok());
  REQUIRE((*entry)->host_bytes() > 0);
  CHECK(sessions.ReservedHostBytes() == 0);
  CHECK(sessions.TotalHostBytes() == base + (*entry)->host_bytes());
  CheckBudgetLeftIs(sessions, kBudget - base - (*entry)->host_bytes());
}

}  // namespace
}  // namespace drt::server
