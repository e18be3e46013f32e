// Client keepalive pings on a connection without calls (review-deploy #3):
// the gateway's Envoy pings each upstream connection every 30 s and clients
// may ping every 10 s; with gRPC's default allowance (one ping per 5 min
// without data) the server answered the third such ping with GOAWAY
// "too_many_pings" and the idle connection was cut (the review's run: at 30 s
// with pings every 10 s). Here the server's allowance is scaled down with the
// client's interval so the test runs in seconds: pings every 1.2 s against an
// allowance of 1 s keep one READY connection for 6 s (five pings); with
// gRPC's default allowance the same client is cut at about 3.6 s.
#include <chrono>
#include <memory>

#include <catch2/catch.hpp>
#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include "server/grpc_keepalive.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

// A channel that pings every `interval_ms` whether or not calls run, with no
// limit on pings without data.
std::shared_ptr<grpc::Channel> PingingChannel(const std::string& address, int interval_ms) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, interval_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS, interval_ms);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

TEST_CASE("a client pinging an idle connection at the allowed interval keeps it",
          "[server][keepalive]") {
  // The server's allowance as drt-server's, scaled: 1 s here, 5 s there
  // (kMinClientPingIntervalMs), against pings every 1.2 s here, 10 s and 30 s
  // (clients, the gateway) there.
  REQUIRE(kMinClientPingIntervalMs <= 10'000);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  AddKeepaliveArguments(builder, /*min_client_ping_interval_ms=*/1000);
  grpc::EnableDefaultHealthCheckService(true);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  server->GetHealthCheckService()->SetServingStatus(true);

  auto channel = PingingChannel("127.0.0.1:" + std::to_string(port), 1200);
  // One call to open the connection, then none.
  REQUIRE(CheckHealth(*channel, "").serving_status == 1);
  REQUIRE(channel->GetState(false) == GRPC_CHANNEL_READY);
  const auto until = std::chrono::system_clock::now() + std::chrono::seconds(6);
  // WaitForStateChange returns true when the state left READY before `until`
  // (a GOAWAY takes the channel to IDLE).
  const bool changed = channel->WaitForStateChange(GRPC_CHANNEL_READY, until);
  INFO("channel state now " << channel->GetState(false) << " (2 = READY, 0 = IDLE)");
  CHECK_FALSE(changed);
  CHECK(channel->GetState(false) == GRPC_CHANNEL_READY);
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace drt::server
