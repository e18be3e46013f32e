// A drain and durable sessions (review-durablegen's leftovers): a Generate
// cut by the stop is not written (DrtService::Generate), so that the
// restart restores the session as it was before it and the client sends it
// again. Two things could defeat that: idle expiry during the rest of the
// drain deleting the cut session's files, and the skip taking any
// UNAVAILABLE during a drain for the stop.
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/backend.h"
#include "server/session_manager.h"
#include "server/state_store.h"
#include "server/stop_status.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/waiting.h"
#include "tests/test_util/temp_dir.h"
#include "tests/test_util/wrapping_backend.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

std::string SessionWithTtl(drt::v1::Drt::Stub& stub, int64_t idle_ttl_seconds) {
  drt::v1::CreateSessionRequest request;
  request.set_idle_ttl_seconds(idle_ttl_seconds);
  CreateResult created = CreateSession(stub, request);
  REQUIRE(created.status.ok());
  return created.id;
}

// Before: the idle reaper went on during a drain, and a session whose
// Generate the stop had cut (written as before the Generate) expired once
// its TTL passed, its files deleted: the restart had nothing for the
// client to send the Generate to again.
TEST_CASE("a drain expires no durable session: a Generate's session cut by the stop keeps its files",
          "[server][drain][idle][durable_generate]") {
  drt::testing::TempDir dir;
  const auto prompt = RandomTokens(300, 81);
  std::string id;
  {
    DurableService durable(dir.path(), SmallOptions());
    drt::v1::Drt::Stub& stub = durable.server.stub();
    id = SessionWithTtl(stub, 1);
    REQUIRE(AppendOnce(stub, id, prompt).ok());
    BackgroundGenerate generate(stub, id, 60);
    WaitFor([&] { return generate.generated() >= 5; }, 60, "5 generated tokens");
    DrtService& service = durable.server.service();
    service.StartDraining();
    service.StopRunningCalls();  // the grace period is over
    generate.Join();
    INFO("Generate: " << generate.status().error_code() << " "
                      << generate.status().error_message());
    REQUIRE(generate.status().error_code() == grpc::StatusCode::UNAVAILABLE);
    REQUIRE(generate.generated() >= 5);
    // Not written: the files hold the session as before the Generate.
    REQUIRE(TokensOnDisk(dir.path(), id) == static_cast<int64_t>(prompt.size()));
    // Idle past its TTL of 1 s (the reaper looks every second), then
    // expired by hand as well.
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    SessionManager& sessions = service.session_manager();
    REQUIRE(sessions.EvictIdle() == 0);
    REQUIRE(sessions.Find(id).ok());
    REQUIRE(TokensOnDisk(dir.path(), id) == static_cast<int64_t>(prompt.size()));
  }
  // The restart restores it as before the Generate, for the client to send
  // it again.
  DurableService durable(dir.path(), SmallOptions());
  InfoResult info = GetSession(durable.server.stub(), id);
  REQUIRE(info.status.ok());
  REQUIRE(info.info.tokens() == static_cast<int64_t>(prompt.size()));
}

// review-server F3: a Generate whose handler is blocked writing to a client
// that stopped reading when the grace period ends never sees the stop's
// status; the call's cancellation (gRPC's shutdown cancels the calls still
// held; here the client's cancel, which the handler sees the same way: its
// Write fails) ended it with FINISH_REASON_CANCELLED and OK, and it was
// written: tokens its client never received made durable, against the rule
// that a Generate cut by the stop writes nothing.
TEST_CASE("a Generate blocked writing to a client that does not read, cut by the stop, writes "
          "nothing",
          "[server][drain][durable_generate]") {
  drt::testing::TempDir dir;
  const auto prompt = RandomTokens(500, 84);
  std::string id;
  {
    DurableService durable(dir.path(), SmallOptions());
    drt::v1::Drt::Stub& stub = durable.server.stub();
    DrtService& service = durable.server.service();
    id = NewSession(stub);
    REQUIRE(AppendOnce(stub, id, prompt).ok());
    auto entry = service.session_manager().Find(id);
    REQUIRE(entry.ok());
    grpc::ClientContext context;
    SetDeadline(context, 300);
    drt::v1::GenerateRequest request = GreedyRequest(id, 1'000'000);
    request.set_top_logprobs(20);  // large messages: the transport fills within seconds
    auto reader = stub.Generate(&context, request);  // never read
    // Until the session stops growing (1 s without a token): the handler is
    // blocked in its Write.
    int64_t last = -1;
    for (int i = 0; i < 240 && (*entry)->tokens() != last; ++i) {
      last = (*entry)->tokens();
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const int64_t generated = (*entry)->tokens() - static_cast<int64_t>(prompt.size());
    INFO(generated << " tokens generated before the Write blocked");
    REQUIRE(generated > 0);
    REQUIRE((*entry)->activity() == Activity::kGenerating);
    service.StartDraining();
    service.StopRunningCalls();  // the grace period is over
    context.TryCancel();         // as the server's shutdown cancels the call
    WaitFor([&] { return (*entry)->activity() == Activity::kIdle; }, 60, "the Generate's end");
    (void)reader->Finish();
    // Not written: the files hold the session as before the Generate.
    CHECK(TokensOnDisk(dir.path(), id) == static_cast<int64_t>(prompt.size()));
  }
  // The restart restores it as before the Generate, for the client to send
  // it again.
  DurableService durable(dir.path(), SmallOptions());
  InfoResult info = GetSession(durable.server.stub(), id);
  REQUIRE(info.status.ok());
  CHECK(info.info.tokens() == static_cast<int64_t>(prompt.size()));
}

// Only durable sessions are kept through a drain: one that is not durable
// (a server without --state_dir) is lost at exit anyway, and its memory is
// what the calls still running in the grace period may need. Before: no
// session expired during a drain. (This case used a Complete's temporary
// session as the one not durable; those no longer expire at all, their call
// deletes them: review-server F4, complete_expiry_test.cc.)
TEST_CASE("a drain still expires idle sessions that are not durable",
          "[server][drain][idle][durable_generate]") {
  // Expired sessions, whichever expires them: the reaper (every second) or
  // the call below. Declared before the server, so that they outlive a
  // reaper pass still calling the evict point.
  std::mutex mutex;
  std::vector<std::string> expired;
  InProcessServer server(SmallOptions());
  DrtService& service = server.service();
  SessionManager& sessions = service.session_manager();
  const std::string gone = SessionWithTtl(server.stub(), 1);
  REQUIRE(AppendOnce(server.stub(), gone, RandomTokens(50, 83)).ok());
  {
    auto entry = sessions.Find(gone);
    REQUIRE(entry.ok());
    REQUIRE(!(*entry)->durable());
  }
  sessions.SetEvictPointForTest([&](const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex);
    expired.push_back(id);
  });
  service.StartDraining();
  // Idle past its TTL of 1 s.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  sessions.EvictIdle();
  sessions.SetEvictPointForTest(nullptr);
  {
    std::lock_guard<std::mutex> lock(mutex);
    REQUIRE(expired == std::vector<std::string>{gone});
  }
  REQUIRE(!sessions.Find(gone).ok());
}

// Before: the skip took any UNAVAILABLE during a drain for the stop, so a
// Generate that failed during the grace period with an UNAVAILABLE of
// another origin (here a backend's) was not written either, against the
// rule that a Generate ended by an error keeps what it generated.
TEST_CASE("during a drain, a Generate ended by an UNAVAILABLE that is not the stop's is written",
          "[server][drain][durable_generate]") {
  FixtureModel& f = FixtureModel::Get();
  drt::testing::WrappingBackend backend(MakeCpuBackend(f.model->config(), f.model->weights()));
  drt::testing::TempDir dir;
  auto opened =
      StateStore::Open(DurableService::StoreOptions(dir.path(), StateSync::kStep),
                       f.model->config());
  REQUIRE(opened.ok());
  std::unique_ptr<StateStore> store = *std::move(opened);
  InProcessServer server(*f.model, backend, SmallOptions());
  DrtService& service = server.service();
  service.session_manager().AttachStateStore(store.get());
  drt::v1::Drt::Stub& stub = server.stub();

  // A whole number of chunks: the Generate pads nothing, so each of its
  // engine steps is one generated token.
  const auto prompt = RandomTokens(5 * f.chunk_size(), 82);
  const std::string id = NewSession(stub);
  REQUIRE(AppendOnce(stub, id, prompt).ok());
  REQUIRE(TokensOnDisk(dir.path(), id) == static_cast<int64_t>(prompt.size()));
  const BackendSession* engine = nullptr;
  {
    auto entry = service.session_manager().Find(id);
    REQUIRE(entry.ok());
    REQUIRE((*entry)->Begin(Activity::kAppending).ok());
    REQUIRE((*entry)
                ->RunStep([&](Session& s) {
                  engine = &s.backend_session();
                  return absl::OkStatus();
                })
                .ok());
    (*entry)->End();
  }
  // Its steps run for kTokens tokens, then the backend answers UNAVAILABLE
  // (as a device that went away might); the drain starts long before.
  constexpr int kTokens = 2000;
  const absl::Status failure = absl::UnavailableError("injected: the device is unavailable");
  backend.RefuseAfter(engine, kTokens, failure);
  REQUIRE(!IsServerStopping(failure));
  BackgroundGenerate generate(stub, id, 120);
  WaitFor([&] { return generate.generated() >= 1; }, 60, "a generated token");
  service.StartDraining();
  generate.Join();
  INFO("Generate: " << generate.status().error_code() << " "
                    << generate.status().error_message());
  REQUIRE(generate.status().error_code() == grpc::StatusCode::UNAVAILABLE);
  REQUIRE(generate.status().error_message().find("injected") != std::string::npos);
  REQUIRE(generate.generated() == kTokens);
  // Written as it ended, as after any other error.
  REQUIRE(TokensOnDisk(dir.path(), id) == static_cast<int64_t>(prompt.size()) + kTokens);
}

}  // namespace
}  // namespace drt::server
