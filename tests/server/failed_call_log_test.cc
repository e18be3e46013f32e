// server/failed_call_log.h: a log line for each call that ends with a fault
// of the server, rate-limited; the interceptor on a real gRPC server; and
// drt-server itself logging a failed LoadSession.
#include "server/failed_call_log.h"

#include <chrono>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>

#include "drt/v1/drt.grpc.pb.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/build_paths.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

using Catch::Matchers::Contains;
using testing::GetSession;
using testing::InfoResult;
using testing::LoadSession;
using testing::ServerProcess;
using testing::ServerProcessArgs;

struct Lines {
  std::mutex mutex;
  std::vector<std::string> lines;
  FailedCallLog::Sink sink() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex);
      lines.push_back(line);
    };
  }
};

struct FakeClock {
  std::chrono::steady_clock::time_point now{};
  FailedCallLog::Clock clock() {
    return [this] { return now; };
  }
};

TEST_CASE("failed call log: faults of the server are logged, refusals of the input or load are not",
          "[failed_call_log]") {
  for (grpc::StatusCode code : {grpc::StatusCode::INTERNAL, grpc::StatusCode::DATA_LOSS,
                                grpc::StatusCode::UNKNOWN}) {
    CHECK(FailedCallLog::Logs(code));
  }
  for (grpc::StatusCode code :
       {grpc::StatusCode::OK, grpc::StatusCode::CANCELLED, grpc::StatusCode::INVALID_ARGUMENT,
        grpc::StatusCode::DEADLINE_EXCEEDED, grpc::StatusCode::NOT_FOUND,
        grpc::StatusCode::ALREADY_EXISTS, grpc::StatusCode::PERMISSION_DENIED,
        grpc::StatusCode::RESOURCE_EXHAUSTED, grpc::StatusCode::FAILED_PRECONDITION,
        grpc::StatusCode::ABORTED, grpc::StatusCode::OUT_OF_RANGE,
        grpc::StatusCode::UNIMPLEMENTED, grpc::StatusCode::UNAVAILABLE,
        grpc::StatusCode::UNAUTHENTICATED}) {
    CHECK_FALSE(FailedCallLog::Logs(code));
  }
  Lines out;
  FakeClock clock;
  FailedCallLog log(out.sink(), clock.clock());
  log.Record("/drt.v1.Drt/Generate", grpc::Status(grpc::StatusCode::NOT_FOUND, "no session"));
  log.Record("/drt.v1.Drt/Generate", grpc::Status::OK);
  CHECK(out.lines.empty());
  log.Record("/drt.v1.Drt/Append",
             grpc::Status(grpc::StatusCode::INTERNAL, "state could not be written:\nENOSPC"));
  REQUIRE(out.lines.size() == 1);
  // One line: the message's newline becomes a space.
  CHECK(out.lines[0] ==
        "drt-server: call /drt.v1.Drt/Append failed: INTERNAL: state could not be written: ENOSPC");
  // A long message is cut.
  log.Record("/drt.v1.Drt/LoadSession",
             grpc::Status(grpc::StatusCode::DATA_LOSS, std::string(5000, 'x')));
  REQUIRE(out.lines.size() == 2);
  const std::string head = "drt-server: call /drt.v1.Drt/LoadSession failed: DATA_LOSS: ";
  CHECK(out.lines[1] == head + std::string(FailedCallLog::kMaxMessageBytes, 'x') + "...");
}

TEST_CASE("failed call log: at most kMaxLinesPerWindow lines a window, the next line counts the rest",
          "[failed_call_log]") {
  Lines out;
  FakeClock clock;
  FailedCallLog log(out.sink(), clock.clock());
  const grpc::Status internal(grpc::StatusCode::INTERNAL, "boom");
  // 13 faults in the first 59 s: 10 logged, 3 not.
  for (int i = 0; i < 13; ++i) {
    clock.now += std::chrono::seconds(4);  // 4 .. 52 s
    log.Record("/drt.v1.Drt/Append", internal);
  }
  REQUIRE(out.lines.size() == 10);
  for (const std::string& line : out.lines) {
    CHECK(line == "drt-server: call /drt.v1.Drt/Append failed: INTERNAL: boom");
  }
  // Still inside the window (started at the log's making, t = 0): not logged.
  clock.now = std::chrono::steady_clock::time_point{} + std::chrono::seconds(59);
  log.Record("/drt.v1.Drt/Append", internal);
  CHECK(out.lines.size() == 10);
  // A new window: logged, with the 4 not logged before.
  clock.now = std::chrono::steady_clock::time_point{} + std::chrono::seconds(60);
  log.Record("/drt.v1.Drt/Generate", internal);
  REQUIRE(out.lines.size() == 11);
  CHECK(out.lines[10] ==
        "drt-server: call /drt.v1.Drt/Generate failed: INTERNAL: boom (4 earlier failed call(s) "
        "not logged: more than 10 a minute)");
  // The count is reported once.
  log.Record("/drt.v1.Drt/Generate", internal);
  REQUIRE(out.lines.size() == 12);
  CHECK(out.lines[11] == "drt-server: call /drt.v1.Drt/Generate failed: INTERNAL: boom");
}

// A service whose GetModelInfo fails INTERNAL and whose GetSession fails
// NOT_FOUND: what the interceptor sees of calls, whatever the service.
class FailingService final : public drt::v1::Drt::Service {
 public:
  grpc::Status GetModelInfo(grpc::ServerContext*, const drt::v1::GetModelInfoRequest*,
                            drt::v1::ModelInfo*) override {
    return grpc::Status(grpc::StatusCode::INTERNAL, "the weights went away");
  }
  grpc::Status GetSession(grpc::ServerContext*, const drt::v1::GetSessionRequest*,
                          drt::v1::SessionInfo*) override {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such session");
  }
};

// A real gRPC server with FailingService and the call-log interceptor;
// one GetSession (NOT_FOUND) and one GetModelInfo (INTERNAL) through a
// channel, then the server stops (so every line is written).
void RunTwoFailingCalls(FailedCallLog& log, AccessLogSink access = {},
                        FailedCallLog::Clock clock = {}) {
  FailingService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(MakeFailedCallLogInterceptor(&log, std::move(access), std::move(clock)));
  builder.experimental().SetInterceptorCreators(std::move(creators));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  auto stub = drt::v1::Drt::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    drt::v1::SessionInfo info;
    CHECK(stub->GetSession(&context, drt::v1::GetSessionRequest(), &info).error_code() ==
          grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext context;
    drt::v1::ModelInfo info;
    CHECK(stub->GetModelInfo(&context, drt::v1::GetModelInfoRequest(), &info).error_code() ==
          grpc::StatusCode::INTERNAL);
  }
  server->Shutdown();
  server->Wait();
}

TEST_CASE("failed call log: the interceptor logs a real server's failed calls by method",
          "[failed_call_log]") {
  Lines out;
  FailedCallLog log(out.sink(), [] { return std::chrono::steady_clock::now(); });
  RunTwoFailingCalls(log);
  std::lock_guard<std::mutex> lock(out.mutex);
  REQUIRE(out.lines.size() == 1);
  CHECK(out.lines[0] ==
        "drt-server: call /drt.v1.Drt/GetModelInfo failed: INTERNAL: the weights went away");
}

TEST_CASE("failed call log: with an access sink every call gets a line with its peer, code and time",
          "[failed_call_log]") {
  Lines failures;
  Lines access;
  // Each reading of the clock is 0.25 s after the last: a call's time is
  // its creation to its status, two readings apart.
  auto now = std::make_shared<std::chrono::steady_clock::time_point>();
  auto clock = [now] {
    *now += std::chrono::milliseconds(250);
    return *now;
  };
  FailedCallLog log(failures.sink(), [] { return std::chrono::steady_clock::now(); });
  RunTwoFailingCalls(log, access.sink(), clock);
  std::lock_guard<std::mutex> lock(access.mutex);
  REQUIRE(access.lines.size() == 2);
  const std::string peer = "from ipv4:127.0.0.1:";
  CHECK_THAT(access.lines[0],
             Catch::Matchers::StartsWith("drt-server: call /drt.v1.Drt/GetSession " + peer));
  CHECK_THAT(access.lines[0], Catch::Matchers::EndsWith(": NOT_FOUND in 0.250 s"));
  CHECK_THAT(access.lines[1],
             Catch::Matchers::StartsWith("drt-server: call /drt.v1.Drt/GetModelInfo " + peer));
  CHECK_THAT(access.lines[1], Catch::Matchers::EndsWith(": INTERNAL in 0.250 s"));
  // The fault still has its own line.
  std::lock_guard<std::mutex> failures_lock(failures.mutex);
  CHECK(failures.lines.size() == 1);
}

TEST_CASE("failed call log: drt-server --log_requests logs every call, and without it none that "
          "succeeds",
          "[failed_call_log][process]") {
  drt::testing::TempDir logs;
  for (const bool on : {false, true}) {
    INFO("--log_requests " << on);
    std::vector<std::string> args = ServerProcessArgs(/*grace_seconds=*/1, /*http_listen=*/"");
    if (on) args.push_back("--log_requests");
    const std::string stderr_path = logs.File(on ? "on.txt" : "off.txt");
    ServerProcess server(drt::testing::ServerBinary(), args, 60, stderr_path);
    auto stub = drt::v1::Drt::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    {
      grpc::ClientContext context;
      drt::v1::ModelInfo info;
      REQUIRE(stub->GetModelInfo(&context, drt::v1::GetModelInfoRequest(), &info).ok());
    }
    CHECK(GetSession(*stub, "s-no-such-session").status.error_code() ==
          grpc::StatusCode::NOT_FOUND);
    server.Signal(SIGTERM);
    REQUIRE(server.WaitExit(30).has_value());
    std::ifstream in(stderr_path);
    const std::string text(std::istreambuf_iterator<char>(in), {});
    if (on) {
      CHECK_THAT(text, Contains("drt-server: call /drt.v1.Drt/GetModelInfo from "));
      CHECK_THAT(text, Contains(": OK in "));
      CHECK_THAT(text, Contains("drt-server: call /drt.v1.Drt/GetSession from "));
      CHECK_THAT(text, Contains(": NOT_FOUND in "));
    } else {
      CHECK_THAT(text, !Contains("drt-server: call "));
    }
  }
}

TEST_CASE("failed call log: drt-server logs a LoadSession of a damaged file, not an unknown session",
          "[failed_call_log][process]") {
  drt::testing::TempDir files;
  drt::testing::TempDir logs;
  std::ofstream(files.File("damaged"), std::ios::binary) << "hello world, not a session";
  std::vector<std::string> args = ServerProcessArgs(/*grace_seconds=*/1, /*http_listen=*/"");
  args.push_back("--session_files_dir=" + files.path());
  const std::string stderr_path = logs.File("stderr.txt");
  std::string log_text;
  {
    ServerProcess server(drt::testing::ServerBinary(), args, 60, stderr_path);
    auto stub = drt::v1::Drt::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    CHECK(GetSession(*stub, "s-no-such-session").status.error_code() ==
          grpc::StatusCode::NOT_FOUND);
    const InfoResult loaded = LoadSession(*stub, "damaged");
    REQUIRE(loaded.status.error_code() == grpc::StatusCode::DATA_LOSS);
    server.Signal(SIGTERM);
    REQUIRE(server.WaitExit(30).has_value());
    std::ifstream in(stderr_path);
    log_text.assign(std::istreambuf_iterator<char>(in), {});
    // The logged line carries the status's message as the client got it.
    CHECK_THAT(log_text, Contains("drt-server: call /drt.v1.Drt/LoadSession failed: DATA_LOSS: " +
                                  loaded.status.error_message()));
  }
  CHECK_THAT(log_text, !Contains("/drt.v1.Drt/GetSession"));
}

}  // namespace
}  // namespace drt::server
