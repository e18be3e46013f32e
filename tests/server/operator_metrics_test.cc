// Metrics an operator alerts on from a fresh pod (review-deploy F9): every
// drt.v1.Drt method has its drt_requests_total series at 0 from the start,
// and the OpenAI API's 401s are counted.
#include <httplib.h>

#include <string>

#include <catch2/catch.hpp>

#include "drt/v1/drt.pb.h"
#include "google/protobuf/descriptor.h"
#include "server/metrics.h"
#include "server/openai_http_server.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/openai_server.h"

namespace drt::server {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("drt_requests_total has a series at 0 for every drt.v1.Drt method from the start",
          "[server][metrics]") {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName("drt.v1.Drt");
  REQUIRE(service != nullptr);
  REQUIRE(service->method_count() >= 13);
  Metrics metrics;
  const std::string text = metrics.RenderPrometheus();
  int series = 0;
  for (size_t at = text.find("\ndrt_requests_total{"); at != std::string::npos;
       at = text.find("\ndrt_requests_total{", at + 1)) {
    ++series;
  }
  CHECK(series == service->method_count());  // no other method names
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string name = service->method(i)->name();
    INFO(name);
    CHECK(Contains(text, "\ndrt_requests_total{method=\"" + name + "\"} 0\n"));
  }
  metrics.CountRequest("Append");
  CHECK(Contains(metrics.RenderPrometheus(), "\ndrt_requests_total{method=\"Append\"} 1\n"));
}

TEST_CASE("openai http: requests refused 401 are counted in drt_openai_unauthenticated_total",
          "[openai][server][metrics]") {
  ServiceOptions service = testing::SmallOptions();
  service.bearer_token = "Zq9-token";
  testing::OpenAiServer server(service);  // the API takes the service's token, as main does
  OpenAiHttpServer& api = *server.api;
  CHECK(Contains(api.RenderMetrics(), "\ndrt_openai_unauthenticated_total 0\n"));

  httplib::Client client("127.0.0.1", api.port());
  auto none = client.Get("/v1/models");
  REQUIRE(none);
  CHECK(none->status == 401);
  auto wrong = client.Post("/v1/completions", {{"Authorization", "Bearer nope"}},
                           "{\"prompt\": \"x\"}", "application/json");
  REQUIRE(wrong);
  CHECK(wrong->status == 401);
  auto health = client.Get("/health");  // needs no token: not a refusal
  REQUIRE(health);
  CHECK(health->status == 200);
  auto right = client.Get("/v1/models", {{"Authorization", "Bearer Zq9-token"}});
  REQUIRE(right);
  CHECK(right->status == 200);
  CHECK(Contains(api.RenderMetrics(), "\ndrt_openai_unauthenticated_total 2\n"));
}

}  // namespace
}  // namespace drt::server
