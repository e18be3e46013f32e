// The durability flags: --state_dir, --state_sync, --state_sync_interval_ms,
// --session_files_dir, as ServerConfigFromFlags converts and checks them.
#include <string>

#include <catch2/catch.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "server/server_flags.h"
#include "tests/server/test_util/scoped_flag.h"

namespace drt::server {
namespace {

using testing::ScopedFlag;

TEST_CASE("durability flags are converted and checked", "[server][flags][state_store]") {
  ScopedFlag model("model", "/models/tiny");
  ScopedFlag budget("host_memory_budget_gb", "1");
  {
    auto config = ServerConfigFromFlags();
    REQUIRE(config.ok());
    CHECK(config->state.dir.empty());  // off by default: sessions in memory only
    CHECK(config->state.sync == StateSync::kStep);
    CHECK(config->state.sync_interval_ms == 1000);
    CHECK(config->service.session_files_dir.empty());
  }
  SECTION("all set") {
    ScopedFlag dir("state_dir", "/var/lib/drt");
    ScopedFlag sync("state_sync", "interval");
    ScopedFlag interval("state_sync_interval_ms", "250");
    ScopedFlag files("session_files_dir", "/srv/sessions");
    auto config = ServerConfigFromFlags();
    REQUIRE(config.ok());
    CHECK(config->state.dir == "/var/lib/drt");
    CHECK(config->state.sync == StateSync::kInterval);
    CHECK(config->state.sync_interval_ms == 250);
    CHECK(config->service.session_files_dir == "/srv/sessions");
  }
  SECTION("an unknown sync mode") {
    ScopedFlag sync("state_sync", "sometimes");
    auto config = ServerConfigFromFlags();
    CHECK(config.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(config.status().message().find("--state_sync=sometimes: must be step or interval") !=
          std::string::npos);
  }
  SECTION("an interval below 1 ms") {
    ScopedFlag interval("state_sync_interval_ms", "0");
    auto config = ServerConfigFromFlags();
    CHECK(config.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(config.status().message().find("state_sync_interval_ms") != std::string::npos);
  }
}

}  // namespace
}  // namespace drt::server
