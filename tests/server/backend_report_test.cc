// The real drt-server started with --device auto says which backend it chose,
// the same one in all three places (docs/api.md): the start-up log, GetModelInfo
// and the drt_backend_info gauge on /metrics. The expected choice is what
// ResolveDevice(auto) makes in this process, on this machine: cpu here without
// a GPU, cuda on a machine with one.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <httplib.h>
#include <catch2/catch.hpp>

#include "engine/backend_factory.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/build_paths.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The port of "..., 127.0.0.1:PORT (http), ..." in the listening line.
int HttpPort(const std::string& listening) {
  const size_t http = listening.find(" (http)");
  if (http == std::string::npos) return -1;
  const size_t colon = listening.rfind(':', http);
  if (colon == std::string::npos) return -1;
  return std::stoi(listening.substr(colon + 1, http - colon - 1));
}

TEST_CASE("drt-server --device auto names its backend in the log, GetModelInfo and /metrics",
          "[server][process]") {
  auto expected = ResolveDevice(Device::kAuto, 0);
  REQUIRE(expected.ok());
  const std::string device = DeviceName(expected->device);
  // The CUDA backend's default precision is bf16; the CPU's storage is fp32.
  const std::string precision = expected->device == Device::kCuda ? "bf16" : "fp32";
  INFO("expected " << device << " / " << precision << ": " << expected->note);

  const std::string log_path =
      "/tmp/drt_backend_report_" + std::to_string(getpid()) + ".stderr";
  std::vector<std::string> args = ServerProcessArgs(1);
  args.push_back("--device=auto");
  std::string log;
  {
    ServerProcess server(drt::testing::ServerBinary(), args, 60, log_path);

    auto stub = drt::v1::Drt::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    SetDeadline(context, 10);
    drt::v1::ModelInfo info;
    grpc::Status status = stub->GetModelInfo(&context, {}, &info);
    INFO(status.error_message());
    REQUIRE(status.ok());
    CHECK(info.device() == device);
    CHECK(info.precision() == precision);

    const int http_port = HttpPort(server.startup_output());
    INFO(server.startup_output());
    REQUIRE(http_port > 0);
    httplib::Client client("127.0.0.1", http_port);
    client.set_connection_timeout(5);
    client.set_read_timeout(5);
    auto scrape = client.Get("/metrics");
    REQUIRE(scrape);
    CHECK(scrape->status == 200);
    CHECK(scrape->body.find("drt_backend_info{device=\"" + device + "\",precision=\"" +
                            precision + "\"} 1\n") != std::string::npos);
    // One backend, so one series.
    size_t series = 0;
    for (size_t at = scrape->body.find("\ndrt_backend_info{"); at != std::string::npos;
         at = scrape->body.find("\ndrt_backend_info{", at + 1)) {
      ++series;
    }
    CHECK(series == 1);

    // Everything before "listening" has been written by now (stderr is
    // unbuffered).
    log = ReadWholeFile(log_path);
  }
  std::remove(log_path.c_str());
  INFO("stderr: " << log);
  CHECK(log.find("drt-server: " + expected->note + "\n") != std::string::npos);
  CHECK(log.find("drt-server: backend " + device + ", " + precision + " storage\n") !=
        std::string::npos);
}

}  // namespace
}  // namespace drt::server
