// How many threads the CPU backend runs when it is not told (--threads=0):
// the CPUs this process may use, which in a container is usually far fewer
// than the host has. std::thread::hardware_concurrency counts the host's
// CPUs, so `docker run --cpus=4` on a 64-core host ran 64 workers in a
// 4-CPU quota (review-deploy #11). The count is the smallest of the host's
// CPUs, the CPUs in the affinity mask (sched_getaffinity: cpusets, taskset,
// Kubernetes' static CPU manager) and the cgroup's CPU bandwidth quota
// rounded up; at least 1.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace drt::cpu {

// cgroup v2's cpu.max ("$QUOTA $PERIOD" in microseconds, or "max $PERIOD"):
// the CPUs the quota allows, rounded up ("400000 100000" and "350000
// 100000" are 4; "50000 100000" is 1), or nullopt for "max" (no quota).
// INVALID_ARGUMENT, naming the text, for anything else.
absl::StatusOr<std::optional<int>> CpusFromCgroupV2(absl::string_view cpu_max);

// cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us (microseconds): as
// CpusFromCgroupV2; a quota of -1 is no quota.
absl::StatusOr<std::optional<int>> CpusFromCgroupV1(absl::string_view quota_us,
                                                    absl::string_view period_us);

// What the choice is made from.
struct CpuCounts {
  int hardware = 0;                // std::thread::hardware_concurrency (0: unknown)
  std::optional<int> affinity;     // CPUs in the affinity mask, when known
  std::optional<int> quota;        // CPUs the cgroup's quota allows, when it has one
  std::string quota_source;        // where `quota` came from ("cgroup v2 cpu.max 400000 100000")
  std::string quota_problem;       // a malformed quota file, if one was met
  std::string quota_none;          // without a quota: why ("max" seen, or no file found)
};

struct CpuThreads {
  int threads = 1;
  std::string why;  // e.g. "the cgroup's CPU quota (cgroup v2 cpu.max 400000 100000); ..."
};

// The smallest of the known counts, at least 1, and which one it was.
CpuThreads ChooseCpuThreads(const CpuCounts& counts);

// Reads the counts as this process sees them: its cgroup's quota
// (ReadOwnCgroupQuota, engine/cpu/cgroup_quota.h: the process's own cgroup
// from /proc/self/cgroup and, on v2, the cgroups above it), the affinity
// mask and hardware_concurrency.
CpuCounts ReadCpuCounts();

// ChooseCpuThreads(ReadCpuCounts()).
CpuThreads DefaultCpuThreads();

}  // namespace drt::cpu
