// An in-process drt-server (the fixture model) with the OpenAI HTTP API in
// front of it on a free 127.0.0.1 port, and an HTTP client for it: the
// set-up the OpenAI API's tests share.
#pragma once

#include <httplib.h>

#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_http_server.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server::testing {

struct OpenAiServer {
  explicit OpenAiServer(ServiceOptions service = SmallOptions(), OpenAiHttpOptions options = {})
      : grpc(service) {
    options.model_name = "two_groups";
    options.bearer_token = service.bearer_token;  // as drt-server's main does
    api = std::make_unique<OpenAiHttpServer>(grpc.server().InProcessChannel(grpc::ChannelArguments()),
                                             options);
    const absl::Status started = api->Start("127.0.0.1", 0);
    if (!started.ok()) throw std::runtime_error(std::string(started.message()));
    client = std::make_unique<httplib::Client>("127.0.0.1", api->port());
    client->set_read_timeout(120, 0);
  }
  ~OpenAiServer() { api->Stop(); }

  // POST /v1/completions.
  httplib::Result Post(const nlohmann::json& body, const httplib::Headers& headers = {}) {
    return client->Post("/v1/completions", headers, body.dump(), "application/json");
  }

  InProcessServer grpc;
  std::unique_ptr<OpenAiHttpServer> api;
  std::unique_ptr<httplib::Client> client;
};

}  // namespace drt::server::testing
