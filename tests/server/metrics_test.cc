// Metrics' Prometheus text and the HTTP endpoint serving it (loopback only).
#include <httplib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "server/http_endpoint.h"
#include "server/metrics.h"

namespace drt::server {
namespace {

bool Contains(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST_CASE("Metrics render counters, gauges and labels in Prometheus text", "[server][metrics]") {
  Metrics metrics;
  metrics.AddTokensIngested(1000);
  metrics.AddTokensIngested(24);
  metrics.AddGeneratedTokens(7);
  metrics.ObservePrefill(2048, 0.5);
  // The session gauges come from the sessions at each scrape (the service
  // sets this source to its SessionManager's count and TotalHostBytes).
  metrics.SetSessionGaugeSource([] { return Metrics::SessionGauges{3, 123456789}; });
  metrics.AddRetrievals(12);
  metrics.CountRequest("Append");
  metrics.CountRequest("Append");
  metrics.CountError("INVALID_ARGUMENT");
  metrics.CountError("weird\"code\\with\nnewline");
  metrics.ObserveEngineStep(2, 100, 0.01);
  metrics.ObserveEngineStep(1, 0, 0.002);
  metrics.ObserveEngineStep(-1, 5, 0.001);  // ignored

  const std::string text = metrics.RenderPrometheus();
  CHECK(Contains(text, "# HELP drt_tokens_ingested_total "));
  CHECK(Contains(text, "# TYPE drt_tokens_ingested_total counter\ndrt_tokens_ingested_total 1024\n"));
  CHECK(Contains(text, "drt_generated_tokens_total 7\n"));
  CHECK(Contains(text, "drt_prefill_tokens_total 2048\n"));
  CHECK(Contains(text, "drt_prefill_seconds_total 0.5\n"));
  CHECK(Contains(text, "# TYPE drt_prefill_tokens_per_second gauge\ndrt_prefill_tokens_per_second 4096\n"));
  CHECK(Contains(text, "# TYPE drt_active_sessions gauge\ndrt_active_sessions 3\n"));
  CHECK(Contains(text, "drt_chunk_store_bytes 123456789\n"));
  CHECK(Contains(text, "drt_retrievals_total 12\n"));
  CHECK(Contains(text, "drt_requests_total{method=\"Append\"} 2\n"));
  CHECK(Contains(text, "drt_errors_total{code=\"INVALID_ARGUMENT\"} 1\n"));
  CHECK(Contains(text, "drt_errors_total{code=\"weird\\\"code\\\\with\\nnewline\"} 1\n"));
  CHECK(Contains(text, "# TYPE drt_engine_steps_total counter\ndrt_engine_steps_total 2\n"));
  CHECK(Contains(text, "drt_engine_step_tokens_total{kind=\"decode\"} 3\n"));
  CHECK(Contains(text, "drt_engine_step_tokens_total{kind=\"prefill\"} 100\n"));
  CHECK(Contains(text, "drt_engine_step_seconds_count 2\n"));
  CHECK(Contains(text, "drt_engine_step_seconds_bucket{le=\"0.0025\"} 1\n"));
  CHECK(text.back() == '\n');
}

TEST_CASE("Metrics read the session gauges from their source at each scrape, 0 without one",
          "[server][metrics]") {
  Metrics metrics;
  const std::string none = metrics.RenderPrometheus();
  CHECK(Contains(none, "# TYPE drt_active_sessions gauge\ndrt_active_sessions 0\n"));
  CHECK(Contains(none, "drt_chunk_store_bytes 0\n"));
  int64_t sessions = 1;
  metrics.SetSessionGaugeSource([&] { return Metrics::SessionGauges{sessions, 1000 * sessions}; });
  const std::string first = metrics.RenderPrometheus();
  CHECK(Contains(first, "drt_active_sessions 1\n"));
  CHECK(Contains(first, "drt_chunk_store_bytes 1000\n"));
  sessions = 5;  // no call in between: the next scrape asks again
  const std::string later = metrics.RenderPrometheus();
  CHECK(Contains(later, "drt_active_sessions 5\n"));
  CHECK(Contains(later, "drt_chunk_store_bytes 5000\n"));
  metrics.SetSessionGaugeSource(nullptr);  // (the service clears it as it goes)
  const std::string cleared = metrics.RenderPrometheus();
  CHECK(Contains(cleared, "drt_active_sessions 0\n"));
  CHECK(Contains(cleared, "drt_chunk_store_bytes 0\n"));
}

TEST_CASE("Metrics name the backend in use once it is set", "[server][metrics]") {
  Metrics metrics;
  CHECK_FALSE(Contains(metrics.RenderPrometheus(), "drt_backend_info"));
  metrics.SetBackend("cuda", "bf16");
  CHECK(Contains(metrics.RenderPrometheus(),
                 "# TYPE drt_backend_info gauge\ndrt_backend_info{device=\"cuda\",precision=\"bf16\"} 1\n"));
}

TEST_CASE("Metrics histograms are cumulative with +Inf, _sum and _count", "[server][metrics]") {
  Metrics metrics;
  metrics.ObserveTimeToFirstToken(0.0005);  // first bucket
  metrics.ObserveTimeToFirstToken(0.003);   // le 0.005
  metrics.ObserveTimeToFirstToken(42.0);    // le 60 (above 10 s)
  metrics.ObserveTimeToFirstToken(-1.0);    // ignored
  metrics.ObserveTimePerOutputToken(0.02);

  const std::string text = metrics.RenderPrometheus();
  CHECK(Contains(text, "# TYPE drt_time_to_first_token_seconds histogram\n"));
  CHECK(Contains(text, "drt_time_to_first_token_seconds_bucket{le=\"0.001\"} 1\n"));
  CHECK(Contains(text, "drt_time_to_first_token_seconds_bucket{le=\"0.0025\"} 1\n"));
  CHECK(Contains(text, "drt_time_to_first_token_seconds_bucket{le=\"0.005\"} 2\n"));
  CHECK(Contains(text, "drt_time_to_first_token_seconds_bucket{le=\"10\"} 2\n"));
  CHECK(Contains(text, "drt_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
  CHECK(Contains(text, "drt_time_to_first_token_seconds_sum 42.0035\n"));
  CHECK(Contains(text, "drt_time_to_first_token_seconds_count 3\n"));
  CHECK(Contains(text, "drt_time_per_output_token_seconds_bucket{le=\"0.01\"} 0\n"));
  CHECK(Contains(text, "drt_time_per_output_token_seconds_bucket{le=\"0.025\"} 1\n"));
  CHECK(Contains(text, "drt_time_per_output_token_seconds_count 1\n"));
}

TEST_CASE("HttpEndpoint serves /metrics and /healthz, and 503 once draining",
          "[server][http]") {
  Metrics metrics;
  metrics.AddTokensIngested(5);
  HttpEndpoint endpoint(metrics);
  REQUIRE(endpoint.Start("127.0.0.1", 0).ok());
  REQUIRE(endpoint.port() > 0);

  httplib::Client client("127.0.0.1", endpoint.port());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);

  auto scrape = client.Get("/metrics");
  REQUIRE(scrape);
  CHECK(scrape->status == 200);
  CHECK(scrape->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0) == 0);
  CHECK(Contains(scrape->body, "drt_tokens_ingested_total 5\n"));

  auto health = client.Get("/healthz");
  REQUIRE(health);
  CHECK(health->status == 200);
  CHECK(health->body == "ok");

  auto missing = client.Get("/nope");
  REQUIRE(missing);
  CHECK(missing->status == 404);

  endpoint.StartDraining();
  auto draining = client.Get("/healthz");
  REQUIRE(draining);
  CHECK(draining->status == 503);
  CHECK(draining->body == "draining");

  const int port = endpoint.port();
  endpoint.Stop();
  CHECK(endpoint.port() == 0);
  httplib::Client after("127.0.0.1", port);
  after.set_connection_timeout(1);
  CHECK_FALSE(after.Get("/healthz"));
  endpoint.Stop();  // idempotent
}

TEST_CASE("HttpEndpoint reports a port in use and can stop right after starting",
          "[server][http]") {
  Metrics metrics;
  HttpEndpoint first(metrics);
  REQUIRE(first.Start("127.0.0.1", 0).ok());

  HttpEndpoint second(metrics);
  const absl::Status status = second.Start("127.0.0.1", first.port());
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  CHECK(Contains(std::string(status.message()), "cannot listen for HTTP"));

  CHECK(first.Start("127.0.0.1", 0).code() == absl::StatusCode::kFailedPrecondition);
  first.Stop();

  HttpEndpoint quick(metrics);
  REQUIRE(quick.Start("127.0.0.1", 0).ok());
  quick.Stop();  // must not hang
}

}  // namespace
}  // namespace drt::server
