// The CPU backend's default thread count (engine/cpu/cpu_threads.h): cgroup
// CPU quota files as the kernel writes them, hand-written, and the choice
// among the host's CPUs, the affinity mask and the quota (review-deploy
// #11: `docker run --cpus=4` on a 64-core host ran 64 workers).
#include "engine/cpu/cpu_threads.h"

#include <string>

#include <catch2/catch.hpp>

namespace drt::cpu {
namespace {

TEST_CASE("cgroup v2 cpu.max: the quota's CPUs rounded up, max is no quota", "[cpu_threads]") {
  auto cpus = [](const char* text) {
    absl::StatusOr<std::optional<int>> r = CpusFromCgroupV2(text);
    INFO(text << ": " << r.status().message());
    REQUIRE(r.ok());
    return *r;
  };
  CHECK(cpus("max 100000\n") == std::nullopt);  // docker run without --cpus
  CHECK(cpus("400000 100000\n") == 4);          // --cpus=4
  CHECK(cpus("350000 100000\n") == 4);          // --cpus=3.5: a fraction rounds up
  CHECK(cpus("150000 100000") == 2);
  CHECK(cpus("50000 100000\n") == 1);           // half a CPU: still one thread
  CHECK(cpus("1000 100000\n") == 1);            // the kernel's smallest quota
  CHECK(cpus("200000 50000\n") == 4);           // another period
  CHECK(cpus("  400000   100000  \n") == 4);
  CHECK(cpus("9223372036854775807 1000\n") == std::numeric_limits<int>::max());
}

TEST_CASE("cgroup v2 cpu.max: a malformed file is an error naming its text", "[cpu_threads]") {
  for (const char* text : {"", "\n", "max", "400000", "400000 100000 7", "four 100000",
                           "400000 0", "400000 -100000", "0 100000", "-1 100000",
                           "400000.5 100000", "max max"}) {
    absl::StatusOr<std::optional<int>> r = CpusFromCgroupV2(text);
    INFO("'" << text << "'");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).find("cpu.max") != std::string::npos);
  }
  absl::StatusOr<std::optional<int>> r = CpusFromCgroupV2("four 100000\n");
  CHECK(r.status().message() == "cpu.max 'four 100000' is not a CPU quota");
}

TEST_CASE("cgroup v1 cfs quota and period: -1 is no quota, fractions round up", "[cpu_threads]") {
  auto cpus = [](const char* quota, const char* period) {
    absl::StatusOr<std::optional<int>> r = CpusFromCgroupV1(quota, period);
    INFO(quota << " / " << period << ": " << r.status().message());
    REQUIRE(r.ok());
    return *r;
  };
  CHECK(cpus("-1\n", "100000\n") == std::nullopt);
  CHECK(cpus("-1\n", "garbage") == std::nullopt);  // no quota: the period does not matter
  CHECK(cpus("400000\n", "100000\n") == 4);
  CHECK(cpus("250000\n", "100000\n") == 3);
  CHECK(cpus("20000\n", "100000\n") == 1);

  for (auto [quota, period] : std::initializer_list<std::pair<const char*, const char*>>{
           {"", "100000"}, {"max", "100000"}, {"0", "100000"}, {"-2", "100000"},
           {"400000", ""}, {"400000", "0"}, {"400000", "-1"}, {"4e5", "100000"}}) {
    absl::StatusOr<std::optional<int>> r = CpusFromCgroupV1(quota, period);
    INFO("'" << quota << "' / '" << period << "'");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).find("cpu.cfs_") != std::string::npos);
  }
}

TEST_CASE("the default thread count is the smallest known count, at least 1", "[cpu_threads]") {
  SECTION("a 4-CPU quota on a 64-CPU host") {
    CpuCounts counts{.hardware = 64, .affinity = 64, .quota = 4,
                     .quota_source = "cgroup v2 cpu.max 400000 100000"};
    const CpuThreads t = ChooseCpuThreads(counts);
    CHECK(t.threads == 4);
    CHECK(t.why ==
          "the cgroup's CPU quota (cgroup v2 cpu.max 400000 100000); CPUs: 64 on the host, 64 in "
          "the affinity mask, 4 by the cgroup quota (cgroup v2 cpu.max 400000 100000)");
  }
  SECTION("an affinity mask narrower than the quota") {
    const CpuThreads t =
        ChooseCpuThreads({.hardware = 64, .affinity = 2, .quota = 8, .quota_source = "q"});
    CHECK(t.threads == 2);
    CHECK(t.why.rfind("the CPUs in the affinity mask;", 0) == 0);
  }
  SECTION("no quota: the affinity mask or the host") {
    CHECK(ChooseCpuThreads({.hardware = 16, .affinity = 16}).threads == 16);
    CHECK(ChooseCpuThreads({.hardware = 16, .affinity = 16}).why ==
          "the host's CPUs; CPUs: 16 on the host, 16 in the affinity mask, no cgroup CPU quota");
    CHECK(ChooseCpuThreads({.hardware = 16, .affinity = 6}).threads == 6);
    CHECK(ChooseCpuThreads({.hardware = 16}).threads == 16);
  }
  SECTION("a malformed quota file is said and ignored") {
    const CpuThreads t = ChooseCpuThreads(
        {.hardware = 8, .affinity = 8, .quota_problem = "cpu.max 'x' is not a CPU quota"});
    CHECK(t.threads == 8);
    CHECK(t.why.find("cgroup quota unknown: cpu.max 'x' is not a CPU quota") != std::string::npos);
  }
  SECTION("nothing known: 1") {
    const CpuThreads t = ChooseCpuThreads({.hardware = 0});
    CHECK(t.threads == 1);
    CHECK(t.why.rfind("no CPU count known", 0) == 0);
  }
}

TEST_CASE("the counts read here give a thread count within the machine's CPUs", "[cpu_threads]") {
  // This machine's figures, whatever they are: the choice never exceeds the
  // host's CPUs nor the affinity mask, and the file reading matches the
  // pure choice.
  const CpuCounts counts = ReadCpuCounts();
  const CpuThreads t = DefaultCpuThreads();
  INFO(t.why);
  CHECK(t.threads >= 1);
  CHECK(t.threads == ChooseCpuThreads(counts).threads);
  if (counts.hardware > 0) CHECK(t.threads <= counts.hardware);
  REQUIRE(counts.affinity.has_value());
  CHECK(t.threads <= *counts.affinity);
  WARN("cpu threads here: " << t.threads << " (" << t.why << ")");
}

}  // namespace
}  // namespace drt::cpu
