// The --state_dir restore's progress (server/restore_progress.h), which the
// HTTP endpoint serves while the restore runs (review-deploy F5): what
// RestoreAll reports, what /livez says when it stalls, and the endpoint's
// answers while starting.
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>

#include "server/http_endpoint.h"
#include "server/metrics.h"
#include "server/restore_progress.h"
#include "server/state_store.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using testing::DurableOptions;
using testing::DurableServer;
using testing::FixtureModel;
using testing::RandomTokens;

TEST_CASE("RestoreAll reports the chunk log bytes it checks and the sessions it restores",
          "[state_store][restore_progress]") {
  FixtureModel& f = FixtureModel::Get();
  const int64_t chunk = f.chunk_size();
  drt::testing::TempDir dir;
  {
    DurableServer server(dir.path());
    const std::string a = server.Create();
    server.Append(a, RandomTokens(3 * chunk + 5, 61));
    server.Append(server.Create(), RandomTokens(2 * chunk, 62));
    server.Append(server.Fork(a), RandomTokens(chunk + 1, 63));  // shares a's log
    server.Create();  // no chunks, no log
  }
  // The bytes to check: every chunk log in the directory, each once (the
  // fork's parent's log is named by two sessions).
  int64_t log_bytes = 0;
  for (const auto& entry : fs::directory_iterator(dir.path() + "/chunks")) {
    log_bytes += static_cast<int64_t>(fs::file_size(entry.path()));
  }
  REQUIRE(log_bytes > 0);

  RestoreProgress progress;
  CHECK_FALSE(progress.running());
  auto store = StateStore::Open(DurableOptions(dir.path()), f.model->config());
  REQUIRE(store.ok());
  auto report = (*store)->RestoreAll(*f.backend, 100, int64_t{4} << 30, &progress);
  REQUIRE(report.ok());
  CHECK(report->sessions.size() == 4);
  CHECK_FALSE(progress.running());
  CHECK(progress.bytes_to_check() == log_bytes);
  CHECK(progress.bytes_checked() == log_bytes);
  CHECK(progress.sessions_to_restore() == 4);
  CHECK(progress.sessions_restored() == 4);

  const std::string text = RenderRestoreMetrics(progress);
  CHECK_THAT(text, Contains("# TYPE drt_restore_running gauge\ndrt_restore_running 0\n"));
  CHECK_THAT(text, Contains("\ndrt_restore_log_bytes_checked " + std::to_string(log_bytes) + "\n"));
  CHECK_THAT(text, Contains("\ndrt_restore_log_bytes_to_check " + std::to_string(log_bytes) + "\n"));
  CHECK_THAT(text, Contains("\ndrt_restore_sessions_restored 4\n"));
  CHECK_THAT(text, Contains("\ndrt_restore_sessions_to_restore 4\n"));
}

TEST_CASE("restore liveness fails only when a running restore made no progress past the limit",
          "[restore_progress]") {
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  RestoreProgress progress;
  const auto later = [&](seconds s) { return progress.last_progress() + s; };
  // No restore: live whatever the time.
  CHECK(RestoreLiveness(progress, std::chrono::steady_clock::now() + seconds(10'000),
                        milliseconds(1000))
            .ok());
  progress.Begin();
  progress.AddBytesToCheck(1000);
  progress.AddBytesChecked(400);
  progress.SetSessionsToRestore(3);
  CHECK(RestoreLiveness(progress, later(seconds(300)), seconds(300)).ok());
  const absl::Status stalled = RestoreLiveness(progress, later(seconds(301)), seconds(300));
  CHECK(stalled.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(stalled.message()),
             Contains("the --state_dir restore made no progress for 301 s (400 of 1000 chunk log "
                      "bytes checked, 0 of 3 sessions restored)"));
  CHECK(RestoreLiveness(progress, later(seconds(10'000)), seconds(0)).ok());  // 0: never fails
  // A step that moves on starts the clock again.
  const auto before = progress.last_progress();
  std::this_thread::sleep_for(milliseconds(2));
  progress.AddSessionRestored();
  CHECK(progress.last_progress() > before);
  CHECK(RestoreLiveness(progress, before + seconds(300) + milliseconds(1), seconds(300)).ok());
  progress.End();
  CHECK(RestoreLiveness(progress, later(seconds(10'000)), seconds(300)).ok());
}

TEST_CASE("while starting the HTTP endpoint answers /livez 200 and /healthz and /readyz 503",
          "[server][http][restore_progress]") {
  Metrics metrics;
  HttpEndpoint http(metrics, {});
  http.SetStarting("restoring");
  REQUIRE(http.Start("127.0.0.1", 0).ok());
  httplib::Client client("127.0.0.1", http.port());
  const auto get = [&](const char* path) {
    auto response = client.Get(path);
    REQUIRE(response);
    return std::make_pair(response->status, response->body);
  };
  CHECK(get("/livez") == std::make_pair(200, std::string("restoring")));
  CHECK(get("/healthz") == std::make_pair(503, std::string("restoring")));
  CHECK(get("/readyz") == std::make_pair(503, std::string("restoring")));
  CHECK(get("/metrics").first == 200);
  http.SetServing();
  CHECK(get("/livez") == std::make_pair(200, std::string("ok")));
  CHECK(get("/healthz") == std::make_pair(200, std::string("ok")));
  CHECK(get("/readyz") == std::make_pair(200, std::string("ok")));
  http.StartDraining();
  CHECK(get("/readyz") == std::make_pair(503, std::string("draining")));
  http.Stop();
}

}  // namespace
}  // namespace drt::server
