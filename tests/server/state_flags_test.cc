// The durability flags: --state_dir, --state_sync, --state_sync_interval_ms,
// --session_files_dir, as ServerConfigFromFlags converts and checks them, and
// the flags only --state_dir reads, refused without it.
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

// Each flag only --state_dir reads, given a value other than its default
// without --state_dir, is refused naming it and --state_dir; at its
// default, or with --state_dir, it is accepted.
TEST_CASE("state flags without --state_dir are refused and named",
          "[server][flags][state_store]") {
  ScopedFlag model("model", "/models/tiny");
  ScopedFlag budget("host_memory_budget_gb", "1");
  struct Given {
    const char* flag;
    const char* value;    // not the default
    const char* default_value;
  };
  const Given cases[] = {
      {"state_sync", "interval", "step"},
      {"state_sync_interval_ms", "250", "1000"},
      {"state_ack_tokens", "0", nullptr},  // (its default comes from the flag)
      {"disk_tier", "false", "true"},
      {"quarantine_other_model_sessions", "true", "false"},
      {"quarantine_other_version_sessions", "true", "false"},
  };
  for (const Given& g : cases) {
    INFO("--" << g.flag << "=" << g.value);
    {
      ScopedFlag set(g.flag, g.value);
      auto refused = ServerConfigFromFlags();
      REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
      const std::string message(refused.status().message());
      CHECK(message.find(std::string("--") + g.flag + "=" + g.value + " needs --state_dir") !=
            std::string::npos);
      ScopedFlag dir("state_dir", "/var/lib/drt");
      CHECK(ServerConfigFromFlags().ok());
    }
    if (g.default_value != nullptr) {
      ScopedFlag at_default(g.flag, g.default_value);
      CHECK(ServerConfigFromFlags().ok());
    }
  }
  SECTION("two at once are named together") {
    ScopedFlag sync("state_sync", "interval");
    ScopedFlag quarantine("quarantine_other_model_sessions", "true");
    auto refused = ServerConfigFromFlags();
    REQUIRE(!refused.ok());
    CHECK(std::string(refused.status().message())
              .find("--state_sync=interval, --quarantine_other_model_sessions=true need "
                    "--state_dir") != std::string::npos);
  }
}

}  // namespace
}  // namespace drt::server
