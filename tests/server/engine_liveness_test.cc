// Liveness that sees a stuck engine (server/engine_watchdog.h,
// review-deploy #5): work queued with no engine step finished for longer
// than the limit fails /livez, the engine's grpc.health.v1 status and shows
// in the engine gauges, while readiness (/healthz, "" and drt.v1.Drt) stays
// as the drain has it. The engine is stalled deterministically: a test hook
// holds a formed step before it runs.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "server/engine_watchdog.h"
#include "server/http_endpoint.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/waiting.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using std::chrono::milliseconds;

constexpr int kServing = 1, kNotServing = 2;  // grpc.health.v1 ServingStatus

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The value of an unlabelled sample in Prometheus text; -1 when absent.
double Sample(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + key.size()));
}

TEST_CASE("engine liveness: an idle engine is live however old its last step, and queued work "
          "without progress past the limit is not",
          "[server][health]") {
  const auto t0 = std::chrono::steady_clock::now();
  const milliseconds limit(1000);
  Scheduler::EngineProgress idle{0, t0};
  CHECK(EngineLiveness(idle, t0 + std::chrono::hours(5), limit).ok());
  CHECK(EngineStalledSeconds(idle, t0 + std::chrono::hours(5)) == 0.0);

  Scheduler::EngineProgress queued{3, t0};
  CHECK(EngineLiveness(queued, t0 + milliseconds(1000), limit).ok());  // at the limit: live
  CHECK(EngineStalledSeconds(queued, t0 + milliseconds(2500)) == Approx(2.5));
  const absl::Status stuck = EngineLiveness(queued, t0 + milliseconds(2500), limit);
  CHECK(stuck.code() == absl::StatusCode::kUnavailable);
  CHECK(Contains(std::string(stuck.message()), "3 work items queued"));
  CHECK(Contains(std::string(stuck.message()), "2.5 s"));
  // Limit 0: off.
  CHECK(EngineLiveness(queued, t0 + std::chrono::hours(5), milliseconds(0)).ok());
}

TEST_CASE("a stalled engine step fails /livez, the engine's health status and shows in the "
          "engine gauges, while readiness stays and an idle engine stays live",
          "[server][health][metrics][http]") {
  // The hook holds every formed step while `hold` is set (at most 30 s, so
  // that a failing test still ends).
  std::mutex mutex;
  std::condition_variable changed;
  bool hold = false;
  std::atomic<bool> held{false};  // the hook has begun holding a step
  ServiceOptions options = SmallOptions();
  options.on_step_formed_for_test = [&](const StepRecord&, const Scheduler&) {
    std::unique_lock<std::mutex> lock(mutex);
    if (!hold) return;
    held.store(true);
    changed.wait_for(lock, std::chrono::seconds(30), [&] { return !hold; });
  };
  InProcessServer server(options);
  const milliseconds limit(300);
  grpc::HealthCheckServiceInterface* health = server.server().GetHealthCheckService();
  health->SetServingStatus(kEngineHealthService, true);
  // As main wires them: the watchdog sets the engine's gRPC status, /livez
  // asks on each request.
  EngineWatchdog watchdog([&] { return server.service().engine_progress(); }, limit,
                          milliseconds(20), [health](bool live) {
                            health->SetServingStatus(kEngineHealthService, live);
                          });
  HttpEndpointOptions http_options;
  http_options.liveness = [&] {
    return EngineLiveness(server.service().engine_progress(), Clock::now(), limit);
  };
  HttpEndpoint http(server.metrics(), http_options);
  REQUIRE(http.Start("127.0.0.1", 0).ok());
  httplib::Client client("127.0.0.1", http.port());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  auto status_of = [&](const char* path) {
    auto response = client.Get(path);
    return response ? response->status : -1;
  };
  auto engine_health = [&] { return CheckHealth(*server.channel(), kEngineHealthService).serving_status; };

  // Idle, one step done long before: live.
  const std::string id = NewSession(server.stub());
  REQUIRE(AppendOnce(server.stub(), id, RandomTokens(20, 1)).ok());
  std::this_thread::sleep_for(limit * 2);
  CHECK(status_of("/livez") == 200);
  CHECK(engine_health() == kServing);
  std::string metrics = client.Get("/metrics")->body;
  CHECK(Sample(metrics, "drt_engine_queued_items") == 0);
  CHECK(Sample(metrics, "drt_engine_last_step_age_seconds") == 0);

  // The next step is held: work queued, no step finishing.
  {
    std::lock_guard<std::mutex> lock(mutex);
    hold = true;
  }
  // The stall clock starts when the Append reaches the idle engine, which is
  // after `before` and before the hook runs (by the engine's wake-up and the
  // step's forming: milliseconds, more under load). So "not before the limit"
  // is measured from `before`, a true lower bound; the hook's own time is not.
  const Clock::time_point before = Clock::now();
  auto append = std::async(std::launch::async,
                           [&] { return AppendOnce(server.stub(), id, RandomTokens(20, 2)); });
  WaitFor([&] { return held.load(); }, 30, "the held step");
  WaitFor([&] { return status_of("/livez") == 503; }, 10, "/livez 503");
  CHECK(SecondsSince(before) >= 0.3);  // not before the limit
  auto livez = client.Get("/livez");
  REQUIRE(livez);
  CHECK(Contains(livez->body, "engine stuck: 1 work items queued"));
  WaitFor([&] { return engine_health() == kNotServing; }, 10, "engine health NOT_SERVING");
  // Readiness follows the drain only.
  CHECK(status_of("/healthz") == 200);
  CHECK(CheckHealth(*server.channel(), "").serving_status == kServing);
  CHECK(CheckHealth(*server.channel(), "drt.v1.Drt").serving_status == kServing);
  metrics = client.Get("/metrics")->body;
  CHECK(Sample(metrics, "drt_engine_queued_items") == 1);
  CHECK(Sample(metrics, "drt_engine_last_step_age_seconds") >= 0.3);

  // Released: the step finishes, the Append ends, liveness comes back.
  {
    std::lock_guard<std::mutex> lock(mutex);
    hold = false;
  }
  changed.notify_all();
  CHECK(append.get().ok());
  CHECK(status_of("/livez") == 200);
  WaitFor([&] { return engine_health() == kServing; }, 10, "engine health SERVING again");
  metrics = client.Get("/metrics")->body;
  CHECK(Sample(metrics, "drt_engine_queued_items") == 0);
  CHECK(Sample(metrics, "drt_engine_last_step_age_seconds") == 0);

  // Draining fails readiness only: /livez stays 200 (liveness must not cut a
  // drain; http_endpoint.h).
  http.StartDraining();
  CHECK(status_of("/healthz") == 503);
  CHECK(status_of("/livez") == 200);
  http.Stop();
}

}  // namespace
}  // namespace drt::server
