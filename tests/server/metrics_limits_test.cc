// What alerts need from /metrics (review-deploy #9): the limits sessions are
// refused at, as gauges; a drt_errors_total series per code from the start;
// latency buckets above 10 s.
#include <catch2/catch.hpp>
#include <string>

#include "server/metrics.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

bool Contains(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST_CASE("Metrics export the session limits once set, and every error code from the start",
          "[server][metrics]") {
  Metrics metrics;
  std::string text = metrics.RenderPrometheus();
  CHECK_FALSE(Contains(text, "drt_host_memory_budget_bytes"));  // not set yet
  // A series per code at 0 before any error, so rate() sees the first burst.
  for (const char* code : {"RESOURCE_EXHAUSTED", "NOT_FOUND", "UNAVAILABLE", "INVALID_ARGUMENT",
                           "UNAUTHENTICATED", "DEADLINE_EXCEEDED", "CANCELLED", "INTERNAL"}) {
    CHECK(Contains(text, std::string("drt_errors_total{code=\"") + code + "\"} 0\n"));
  }
  metrics.CountError("NOT_FOUND");
  metrics.SetLimits(3LL << 30, 17);
  text = metrics.RenderPrometheus();
  CHECK(Contains(text, "drt_errors_total{code=\"NOT_FOUND\"} 1\n"));
  CHECK(Contains(text, "drt_errors_total{code=\"UNAVAILABLE\"} 0\n"));
  CHECK(Contains(text, "# TYPE drt_host_memory_budget_bytes gauge\ndrt_host_memory_budget_bytes 3221225472\n"));
  CHECK(Contains(text, "# TYPE drt_max_sessions gauge\ndrt_max_sessions 17\n"));
}

TEST_CASE("latency histograms resolve first tokens above 10 s", "[server][metrics]") {
  Metrics metrics;
  metrics.ObserveTimeToFirstToken(25.0);
  metrics.ObserveTimeToFirstToken(45.0);
  metrics.ObserveTimeToFirstToken(500.0);
  const std::string text = metrics.RenderPrometheus();
  CHECK(Contains(text, "drt_time_to_first_token_seconds_bucket{le=\"10\"} 0\n"));
  CHECK(Contains(text, "drt_time_to_first_token_seconds_bucket{le=\"30\"} 1\n"));
  CHECK(Contains(text, "drt_time_to_first_token_seconds_bucket{le=\"60\"} 2\n"));
  CHECK(Contains(text, "drt_time_to_first_token_seconds_bucket{le=\"120\"} 2\n"));
  CHECK(Contains(text, "drt_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
}

TEST_CASE("the service exports its session limits", "[server][metrics]") {
  ServiceOptions options = SmallOptions();
  options.max_sessions = 5;
  options.host_memory_budget_bytes = 1LL << 30;
  InProcessServer server(options);
  const std::string text = server.metrics().RenderPrometheus();
  CHECK(Contains(text, "drt_host_memory_budget_bytes 1073741824\n"));
  CHECK(Contains(text, "drt_max_sessions 5\n"));
}

}  // namespace
}  // namespace drt::server
