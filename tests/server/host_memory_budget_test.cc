// Limits that fit the machine: the default host-memory budget is a stated
// fraction (3/4) of the memory available at start, after the model is
// loaded, capped by a cgroup limit, and the default context limit admits
// 2^24 tokens and more.
#include <catch2/catch.hpp>
#include <csignal>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "server/host_memory.h"
#include "server/server_flags.h"
#include "tests/server/test_util/grpc_harness.h"
#include "tests/test_util/build_paths.h"
#include "tests/test_util/temp_dir.h"

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

TEST_CASE("the budget in force is said with its source, and a flag above the usable memory warns",
          "[server][memory]") {
  MemorySnapshot machine;
  machine.available_bytes = 24 * kGiB;
  SECTION("the default: 3/4 of the usable memory, one line") {
    auto budget = ChooseHostBudget(0, machine);
    REQUIRE(budget.ok());
    CHECK(budget->bytes == 18 * kGiB);
    CHECK(budget->log_lines ==
          std::vector<std::string>{"host memory budget 18.0 GiB (3/4 of 24.0 GiB usable after "
                                   "loading the model; --host_memory_budget_gb sets it)"});
  }
  SECTION("the default without a memory figure is an error naming the flag") {
    auto budget = ChooseHostBudget(0, absl::NotFoundError("cannot read /proc/meminfo"));
    REQUIRE_FALSE(budget.ok());
    CHECK(std::string(budget.status().message()) ==
          "cannot read /proc/meminfo; set --host_memory_budget_gb");
  }
  SECTION("the flag within the usable memory: said, no warning") {
    auto budget = ChooseHostBudget(20 * kGiB, machine);
    REQUIRE(budget.ok());
    CHECK(budget->bytes == 20 * kGiB);
    CHECK(budget->log_lines ==
          std::vector<std::string>{"host memory budget 20.0 GiB (--host_memory_budget_gb; 24.0 "
                                   "GiB usable after loading the model)"});
  }
  SECTION("the flag above the machine's memory: a warning naming both figures") {
    auto budget = ChooseHostBudget(1000 * kGiB, machine);
    REQUIRE(budget.ok());
    CHECK(budget->bytes == 1000 * kGiB);
    REQUIRE(budget->log_lines.size() == 2);
    CHECK(budget->log_lines[1] ==
          "WARNING: --host_memory_budget_gb (1000.0 GiB) is more than the 24.0 GiB this machine "
          "(MemAvailable) offers after loading the model: sessions may grow until the kernel "
          "kills the process (out of memory) instead of being refused with RESOURCE_EXHAUSTED");
  }
  SECTION("the flag above a cgroup's room (limit 8 GiB, 2 GiB used): the cgroup is named") {
    machine.cgroup_limit_bytes = 8 * kGiB;
    machine.cgroup_usage_bytes = 2 * kGiB;
    auto budget = ChooseHostBudget(10 * kGiB, machine);
    REQUIRE(budget.ok());
    REQUIRE(budget->log_lines.size() == 2);
    CHECK(budget->log_lines[0] ==
          "host memory budget 10.0 GiB (--host_memory_budget_gb; 6.0 GiB usable after loading "
          "the model)");
    CHECK_THAT(budget->log_lines[1],
               Catch::Matchers::Contains("(10.0 GiB) is more than the 6.0 GiB this process's "
                                         "memory cgroup (its limit less its usage) offers"));
  }
  SECTION("the flag when the memory cannot be read: said, unchecked, not an error") {
    auto budget = ChooseHostBudget(4 * kGiB, absl::NotFoundError("no /proc/meminfo"));
    REQUIRE(budget.ok());
    CHECK(budget->bytes == 4 * kGiB);
    CHECK(budget->log_lines ==
          std::vector<std::string>{"host memory budget 4.0 GiB (--host_memory_budget_gb; not "
                                   "checked against the memory usable: no /proc/meminfo)"});
  }
}

// drt-server itself prints those lines (server/main.cc used to say nothing
// about an explicit --host_memory_budget_gb).
TEST_CASE("drt-server logs an explicit --host_memory_budget_gb and warns when it is above the "
          "machine's memory",
          "[server][memory][process]") {
  drt::testing::TempDir temp;
  const std::string err_path = temp.path() + "/stderr";
  std::vector<std::string> args = ServerProcessArgs(1, "");
  args.push_back("--host_memory_budget_gb=1000000");  // about 1 PiB
  {
    ServerProcess server(drt::testing::ServerBinary(), args, 60, err_path);
    server.Signal(SIGTERM);
    REQUIRE(server.WaitExit(30).has_value());
  }
  std::ifstream in(err_path);
  const std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO("stderr:\n" << err);
  CHECK_THAT(err, Catch::Matchers::Contains(
                      "drt-server: host memory budget 1000000.0 GiB (--host_memory_budget_gb; "));
  CHECK_THAT(err, Catch::Matchers::Contains(
                      "drt-server: WARNING: --host_memory_budget_gb (1000000.0 GiB) is more than "
                      "the "));
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
