// The cgroup CPU quota found through /proc/self/cgroup
// (engine/cpu/cgroup_quota.h), over fake cgroup trees in a temporary
// directory laid out as the kernel lays out /sys/fs/cgroup: a quota below
// the mount's root (a systemd service, `docker run --cgroupns=host`), a
// tighter parent, levels without the file, cgroup v1 with and without the
// process's own directory (review-startsig #1).
#include "engine/cpu/cgroup_quota.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "engine/cpu/cpu_threads.h"
#include "tests/test_util/temp_dir.h"

namespace drt::cpu {
namespace {

// Writes `text` to root/relative, making the directories on the way.
void Put(const std::string& root, const std::string& relative, const std::string& text) {
  const std::filesystem::path path = std::filesystem::path(root) / relative;
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

constexpr const char* kService = "0::/system.slice/drt.service\n";

TEST_CASE("cgroup v2: the quota is read in the process's own cgroup, not the mount's root",
          "[cpu_threads]") {
  drt::testing::TempDir fs;
  const std::string& root = fs.path();
  Put(root, "system.slice/cpu.max", "max 100000\n");
  Put(root, "system.slice/drt.service/cpu.max", "400000 100000\n");
  const CgroupQuota q = ReadCgroupQuota(kService, root);
  INFO(q.source << " | " << q.problem << " | " << q.none);
  CHECK(q.cpus == 4);
  CHECK(q.source == "cgroup v2 cpu.max 400000 100000 at " + root + "/system.slice/drt.service");
  CHECK(q.problem.empty());
  CHECK(q.none.empty());
}

TEST_CASE("cgroup v2: the smallest quota from the cgroup up to the root counts", "[cpu_threads]") {
  drt::testing::TempDir fs;
  const std::string& root = fs.path();
  SECTION("leaf max, parent 2 CPUs") {
    Put(root, "system.slice/cpu.max", "200000 100000\n");
    Put(root, "system.slice/drt.service/cpu.max", "max 100000\n");
    const CgroupQuota q = ReadCgroupQuota(kService, root);
    CHECK(q.cpus == 2);
    CHECK(q.source == "cgroup v2 cpu.max 200000 100000 at " + root + "/system.slice");
  }
  SECTION("a parent tighter than the leaf") {
    Put(root, "system.slice/cpu.max", "300000 100000\n");
    Put(root, "system.slice/drt.service/cpu.max", "800000 100000\n");
    CHECK(ReadCgroupQuota(kService, root).cpus == 3);
  }
  SECTION("a leaf tighter than the parent, a level without the file between") {
    Put(root, "a/cpu.max", "800000 100000\n");
    Put(root, "a/b/c/cpu.max", "150000 100000\n");  // a/b has no cpu.max
    const CgroupQuota q = ReadCgroupQuota("0::/a/b/c\n", root);
    CHECK(q.cpus == 2);
    CHECK(q.source == "cgroup v2 cpu.max 150000 100000 at " + root + "/a/b/c");
  }
  SECTION("max at every level: no quota, and that is said") {
    Put(root, "system.slice/cpu.max", "max 100000\n");
    Put(root, "system.slice/drt.service/cpu.max", "max 100000\n");
    const CgroupQuota q = ReadCgroupQuota(kService, root);
    CHECK(q.cpus == std::nullopt);
    CHECK(q.none == "cgroup v2 cpu.max is max at " + root + "/system.slice/drt.service, " + root +
                        "/system.slice");
  }
}

TEST_CASE("cgroup v2 in a private cgroup namespace reads the mount's root", "[cpu_threads]") {
  drt::testing::TempDir fs;
  const std::string& root = fs.path();
  Put(root, "cpu.max", "150000 100000\n");
  // What a container sees (docker's default on v2), the line alone, and a
  // path outside the namespace (shown with ".."): all read the root.
  for (const char* text : {"0::/\n", "0::/", "0::/../../other\n", ""}) {
    const CgroupQuota q = ReadCgroupQuota(text, root);
    INFO("'" << text << "': " << q.none);
    CHECK(q.cpus == 2);
    CHECK(q.source == "cgroup v2 cpu.max 150000 100000 at " + root);
  }
}

TEST_CASE("no quota file anywhere is said apart from max", "[cpu_threads]") {
  drt::testing::TempDir fs;
  const std::string& root = fs.path();
  std::filesystem::create_directories(root + "/system.slice/drt.service");
  const CgroupQuota q = ReadCgroupQuota(kService, root);
  CHECK(q.cpus == std::nullopt);
  CHECK(q.problem.empty());
  CHECK(q.none == "no cpu.max found at " + root +
                      "/system.slice/drt.service or above, no cpu.cfs_quota_us at " + root +
                      "/cpu");
  CHECK(ReadCgroupQuota("", root).none ==
        "no cpu.max found at " + root + ", no cpu.cfs_quota_us at " + root + "/cpu");

  // The log line tells the two apart.
  CpuCounts counts{.hardware = 8, .affinity = 8, .quota_none = q.none};
  CHECK(ChooseCpuThreads(counts).why ==
        "the host's CPUs; CPUs: 8 on the host, 8 in the affinity mask, no cgroup CPU quota (" +
            q.none + ")");
}

TEST_CASE("cgroup v1: the cgroup's own directory if present, else the mount's root",
          "[cpu_threads]") {
  drt::testing::TempDir fs;
  const std::string& root = fs.path();
  const char* docker = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/x\n";
  SECTION("own directory absent (docker's bind mount): the root's files") {
    Put(root, "cpu/cpu.cfs_quota_us", "200000\n");
    Put(root, "cpu/cpu.cfs_period_us", "100000\n");
    const CgroupQuota q = ReadCgroupQuota(docker, root);
    CHECK(q.cpus == 2);
    CHECK(q.source ==
          "cgroup v1 cpu.cfs_quota_us 200000 / cpu.cfs_period_us 100000 at " + root + "/cpu");
  }
  SECTION("own directory present: its files, not the root's") {
    Put(root, "cpu/cpu.cfs_quota_us", "-1\n");
    Put(root, "cpu/cpu.cfs_period_us", "100000\n");
    Put(root, "cpu/docker/abc/cpu.cfs_quota_us", "300000\n");
    Put(root, "cpu/docker/abc/cpu.cfs_period_us", "100000\n");
    const CgroupQuota q = ReadCgroupQuota(docker, root);
    CHECK(q.cpus == 3);
    CHECK(q.source == "cgroup v1 cpu.cfs_quota_us 300000 / cpu.cfs_period_us 100000 at " + root +
                          "/cpu/docker/abc");
  }
  SECTION("-1: no quota, and that is said") {
    Put(root, "cpu/cpu.cfs_quota_us", "-1\n");
    Put(root, "cpu/cpu.cfs_period_us", "100000\n");
    const CgroupQuota q = ReadCgroupQuota(docker, root);
    CHECK(q.cpus == std::nullopt);
    CHECK(q.none == "cgroup v1 cpu.cfs_quota_us is -1 at " + root + "/cpu");
  }
  SECTION("hybrid (v2 line, cpu controller on v1): no cpu.max, so v1 counts") {
    Put(root, "unified/cgroup.procs", "");
    Put(root, "cpu/cpu.cfs_quota_us", "50000\n");
    Put(root, "cpu/cpu.cfs_period_us", "100000\n");
    CHECK(ReadCgroupQuota("1:cpu:/\n0::/\n", root).cpus == 1);
  }
}

TEST_CASE("a malformed quota file is named with its directory", "[cpu_threads]") {
  drt::testing::TempDir fs;
  const std::string& root = fs.path();
  Put(root, "system.slice/drt.service/cpu.max", "four 100000\n");
  SECTION("alone: the quota is unknown") {
    const CgroupQuota q = ReadCgroupQuota(kService, root);
    CHECK(q.cpus == std::nullopt);
    CHECK(q.problem ==
          "cpu.max 'four 100000' is not a CPU quota at " + root + "/system.slice/drt.service");
    CHECK(q.none.empty());
  }
  SECTION("with a good parent: the parent's quota, and the bad file still said") {
    Put(root, "system.slice/cpu.max", "200000 100000\n");
    const CgroupQuota q = ReadCgroupQuota(kService, root);
    CHECK(q.cpus == 2);
    CHECK_FALSE(q.problem.empty());
    const CpuThreads t = ChooseCpuThreads({.hardware = 8,
                                           .affinity = 8,
                                           .quota = q.cpus,
                                           .quota_source = q.source,
                                           .quota_problem = q.problem});
    CHECK(t.threads == 2);
    CHECK(t.why.find(", ignored: cpu.max 'four 100000'") != std::string::npos);
  }
}

}  // namespace
}  // namespace drt::cpu
