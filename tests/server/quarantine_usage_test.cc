// What DIR/quarantine/ holds (server/quarantine_usage.h): the refused
// sessions (a directory each) and their files' bytes, each file once (a
// chunk log hard-linked into two sessions' directories is one file).
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "server/quarantine_usage.h"
#include "server/state_store.h"
#include "tests/server/test_util/durable_server.h"
#include "tests/test_util/temp_dir.h"

namespace drt::server {
namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

void WriteBytes(const std::string& path, size_t n) { std::ofstream(path) << std::string(n, 'x'); }

TEST_CASE("quarantine usage counts the refused sessions and each file once",
          "[state_store][quarantine]") {
  drt::testing::TempDir dir;
  SECTION("no quarantine directory: nothing") {
    auto usage = ReadQuarantineUsage(dir.path());
    REQUIRE(usage.ok());
    CHECK(usage->sessions == 0);
    CHECK(usage->bytes == 0);
  }
  SECTION("two sessions sharing a log") {
    const std::string q = dir.path() + "/quarantine";
    fs::create_directories(q + "/s-a-100");
    fs::create_directories(q + "/s-b-101");
    WriteBytes(q + "/s-a-100/s-a.state", 100);
    WriteBytes(q + "/s-a-100/s-a.log", 1000);
    fs::create_hard_link(q + "/s-a-100/s-a.log", q + "/s-b-101/s-a.log");  // a fork's parent log
    WriteBytes(q + "/s-b-101/s-b.state", 50);
    WriteBytes(q + "/README", 7);  // not a session's directory
    auto usage = ReadQuarantineUsage(dir.path());
    REQUIRE(usage.ok());
    CHECK(usage->sessions == 2);
    CHECK(usage->bytes == 100 + 1000 + 50);
    const std::string text = RenderQuarantineMetrics(*usage);
    CHECK_THAT(text, Contains("# TYPE drt_quarantined_sessions gauge\ndrt_quarantined_sessions 2\n"));
    CHECK_THAT(text, Contains("# TYPE drt_quarantined_bytes gauge\ndrt_quarantined_bytes 1150\n"));
  }
}

TEST_CASE("a session the restore refuses shows in the quarantine usage with its state file",
          "[state_store][quarantine]") {
  drt::testing::TempDir dir;
  {
    testing::DurableServer server(dir.path());
    server.Create();  // no chunks: its state file alone
  }
  const std::string damaged = dir.path() + "/sessions/s-zz.state";
  WriteBytes(damaged, 33);  // not a session record
  {
    testing::DurableServer server(dir.path());
    REQUIRE(server.report.quarantined.size() == 1);
  }
  auto usage = ReadQuarantineUsage(dir.path());
  REQUIRE(usage.ok());
  CHECK(usage->sessions == 1);
  CHECK(usage->bytes == 33);
}

}  // namespace
}  // namespace drt::server
