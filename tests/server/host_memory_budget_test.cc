// Limits that fit the machine: the default host-memory budget is a stated
// fraction (3/4) of the memory available at start, after the model is
// loaded, capped by a cgroup limit, and the default context limit admits
// 2^24 tokens and more.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "absl/flags/reflection.h"
#include "server/host_memory.h"
#include "server/server_flags.h"
#include "tests/server/test_util/grpc_harness.h"

namespace drt::server {
namespace {

using namespace drt::server::testing;

constexpr int64_t kGiB = int64_t{1} << 30;

TEST_CASE("the default host budget is 3/4 of the usable memory", "[server][memory]") {
  // Hand-computed: 3/4 of each usable figure.
  MemorySnapshot machine;
  machine.available_bytes = 128 * kGiB;
  CHECK(UsableBytes(machine) == 128 * kGiB);
  CHECK(DefaultHostBudgetBytes(machine) == 96 * kGiB);

  // A cgroup limit of 16 GiB with 4 GiB used leaves 12 GiB: budget 9 GiB.
  machine.cgroup_limit_bytes = 16 * kGiB;
  machine.cgroup_usage_bytes = 4 * kGiB;
  CHECK(UsableBytes(machine) == 12 * kGiB);
  CHECK(DefaultHostBudgetBytes(machine) == 9 * kGiB);

  // A cgroup limit above what the machine has left changes nothing.
  machine.cgroup_limit_bytes = 512 * kGiB;
  CHECK(DefaultHostBudgetBytes(machine) == 96 * kGiB);

  // A limit without a usage figure counts as all free.
  machine.cgroup_limit_bytes = 8 * kGiB;
  machine.cgroup_usage_bytes.reset();
  CHECK(DefaultHostBudgetBytes(machine) == 6 * kGiB);

  // Usage at or past the limit: nothing usable.
  machine.cgroup_limit_bytes = 8 * kGiB;
  machine.cgroup_usage_bytes = 9 * kGiB;
  CHECK(UsableBytes(machine) == 0);
  CHECK(DefaultHostBudgetBytes(machine) == 0);

  // Rounds down to a byte: 3/4 of 1003 bytes is 752.25.
  MemorySnapshot tiny;
  tiny.available_bytes = 1003;
  CHECK(DefaultHostBudgetBytes(tiny) == 752);
  // No overflow at the top of the range: 3/4 of 2^62 + 3 is 3 * 2^60 + 2.25.
  MemorySnapshot huge;
  huge.available_bytes = (int64_t{1} << 62) + 3;
  CHECK(DefaultHostBudgetBytes(huge) == 3 * (int64_t{1} << 60) + 2);
}

TEST_CASE("MemAvailable and cgroup files parse", "[server][memory]") {
  const std::string meminfo =
      "MemTotal:       24683620 kB\n"
      "MemFree:        18922552 kB\n"
      "MemAvailable:   22060588 kB\n"
      "Buffers:           58756 kB\n";
  auto available = ParseMemAvailable(meminfo);
  REQUIRE(available.ok());
  CHECK(*available == int64_t{22060588} * 1024);
  CHECK_FALSE(ParseMemAvailable("MemTotal: 5 kB\n").ok());
  CHECK_FALSE(ParseMemAvailable("MemAvailable: lots kB\n").ok());

  CHECK(ParseCgroupBytes("max\n") == std::nullopt);            // v2: no limit
  CHECK(ParseCgroupBytes("17179869184\n") == 16 * kGiB);       // v2/v1 figure
  CHECK(ParseCgroupBytes("9223372036854771712\n") == std::nullopt);  // v1: no limit
  CHECK(ParseCgroupBytes("") == std::nullopt);
  CHECK(ParseCgroupBytes("garbage") == std::nullopt);
}

TEST_CASE("this machine's snapshot is plausible", "[server][memory]") {
  auto snapshot = ReadMemorySnapshot();
  REQUIRE(snapshot.ok());
  CHECK(snapshot->available_bytes > 0);
  CHECK(DefaultHostBudgetBytes(*snapshot) <= snapshot->available_bytes);
  CHECK(DefaultHostBudgetBytes(*snapshot) >= UsableBytes(*snapshot) / 2);
}

TEST_CASE("the default flags derive the budget at start and admit 2^24 tokens",
          "[server][memory][flags]") {
  absl::CommandLineFlag* model = absl::FindCommandLineFlag("model");
  REQUIRE(model != nullptr);
  const std::string saved = model->CurrentValue();
  std::string error;
  REQUIRE(model->ParseFrom("/models/tiny", &error));
  auto config = ServerConfigFromFlags();
  model->ParseFrom(saved, &error);
  REQUIRE(config.ok());
  // 0: main derives it once the model is loaded (DefaultHostBudgetBytes).
  CHECK(config->service.host_memory_budget_bytes == 0);
  CHECK(config->service.max_context_tokens >= (int64_t{1} << 24));
}

TEST_CASE("a session can be configured to 16777216 tokens by default", "[server][memory]") {
  // The service's own defaults, as a server started without flags has them.
  ServiceOptions options;
  options.model_name = "two_groups";
  InProcessServer server(options);
  for (const int64_t tokens : {int64_t{16'777'216}, int64_t{1} << 30}) {
    INFO(tokens << " tokens");
    drt::v1::CreateSessionRequest request;
    request.set_max_context_tokens(tokens);
    CreateResult created = CreateSession(server.stub(), request);
    INFO(created.status.error_message());
    REQUIRE(created.status.ok());
    InfoResult info = GetSession(server.stub(), created.id);
    REQUIRE(info.status.ok());
    CHECK(info.info.max_context_tokens() == tokens);
  }
  // A session that asks for nothing gets at least 2^24.
  InfoResult plain = GetSession(server.stub(), NewSession(server.stub()));
  CHECK(plain.info.max_context_tokens() >= (int64_t{1} << 24));
}

}  // namespace
}  // namespace drt::server
