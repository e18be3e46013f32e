// What clients see while drt-server drains after SIGTERM: calls made during
// the grace period, on an open channel or a new one, and a Generate still
// running when the grace period ends, all get UNAVAILABLE saying that the
// server is shutting down (not gRPC's transport messages "Cancelling all
// calls" or "Connection refused").
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/server/test_util/grpc_harness.h"
#include "tests/server/test_util/waiting.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;
using Catch::Matchers::Contains;

TEST_CASE("during a drain new and running calls get UNAVAILABLE 'shutting down'",
          "[server][process]") {
  constexpr int64_t kGrace = 3;
  ServerProcess server(drt::testing::ServerBinary(), ServerProcessArgs(kGrace, /*http_listen=*/""));
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = drt::v1::Drt::NewStub(channel);
  const std::string id = NewSession(*stub);
  const auto prompt = RandomTokens(300, 1);
  REQUIRE(AppendTokens(*stub, id, prompt, EvenPieces(prompt.size(), 100)).status.ok());

  // A Generate far longer than the grace period.
  BackgroundGenerate generator(*stub, id, 60);
  WaitFor([&] { return generator.generated() >= 5; }, 20, "generated tokens");

  const auto signalled = Clock::now();
  server.Signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  // Within the grace period: a new call on the open channel, and one on a
  // fresh channel (a client that connects only now).
  const std::string shutting_down = "server is shutting down";
  {
    const grpc::Status status = CreateSession(*stub).status;
    INFO("open channel: " << status.error_code() << " " << status.error_message());
    CHECK(status.error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK_THAT(status.error_message(), Contains(shutting_down));
  }
  {
    auto fresh = drt::v1::Drt::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    SetDeadline(context, 2);
    drt::v1::GetModelInfoRequest request;
    drt::v1::ModelInfo info;
    const grpc::Status status = fresh->GetModelInfo(&context, request, &info);
    INFO("fresh channel: " << status.error_code() << " " << status.error_message());
    CHECK(status.error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK_THAT(status.error_message(), Contains(shutting_down));
  }
  CHECK(SecondsSince(signalled) < kGrace);

  // The Generate still running when the grace period ends.
  generator.Join();
  const grpc::Status& gen_status = generator.status();
  INFO("Generate: " << gen_status.error_code() << " '" << gen_status.error_message() << "' after "
                    << SecondsSince(signalled) << " s");
  CHECK(gen_status.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK_THAT(gen_status.error_message(), Contains(shutting_down));
  CHECK(SecondsSince(signalled) > kGrace - 0.5);

  std::optional<int> wait_status = server.WaitExit(kGrace + 10);
  REQUIRE(wait_status.has_value());
  CHECK(WIFEXITED(*wait_status));
  CHECK(WEXITSTATUS(*wait_status) == 0);
}

}  // namespace
}  // namespace drt::server
