#include "engine/cpu/cpu_threads.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/cpu/cgroup_quota.h"

namespace drt::cpu {
namespace {

// ceil(quota / period) for positive microsecond figures, kept in int range.
int CeilCpus(int64_t quota, int64_t period) {
  const int64_t cpus = quota / period + (quota % period != 0 ? 1 : 0);
  return static_cast<int>(std::min<int64_t>(cpus, std::numeric_limits<int>::max()));
}

absl::Status Malformed(absl::string_view what, absl::string_view text) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", absl::StripAsciiWhitespace(text), "' is not a CPU quota"));
}

}  // namespace

absl::StatusOr<std::optional<int>> CpusFromCgroupV2(absl::string_view cpu_max) {
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(cpu_max), absl::ByAnyChar(" \t"),
                     absl::SkipEmpty());
  if (fields.size() != 2) return Malformed("cpu.max", cpu_max);
  int64_t period = 0;
  if (!absl::SimpleAtoi(fields[1], &period) || period <= 0) return Malformed("cpu.max", cpu_max);
  if (fields[0] == "max") return std::optional<int>();
  int64_t quota = 0;
  if (!absl::SimpleAtoi(fields[0], &quota) || quota <= 0) return Malformed("cpu.max", cpu_max);
  return std::optional<int>(CeilCpus(quota, period));
}

absl::StatusOr<std::optional<int>> CpusFromCgroupV1(absl::string_view quota_us,
                                                    absl::string_view period_us) {
  int64_t quota = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(quota_us), &quota) ||
      (quota <= 0 && quota != -1)) {
    return Malformed("cpu.cfs_quota_us", quota_us);
  }
  if (quota == -1) return std::optional<int>();
  int64_t period = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(period_us), &period) || period <= 0) {
    return Malformed("cpu.cfs_period_us", period_us);
  }
  return std::optional<int>(CeilCpus(quota, period));
}

CpuThreads ChooseCpuThreads(const CpuCounts& counts) {
  CpuThreads chosen;
  chosen.threads = 0;
  std::string reason;
  auto consider = [&](std::optional<int> count, std::string what) {
    if (!count.has_value() || *count <= 0) return;
    if (chosen.threads == 0 || *count < chosen.threads) {
      chosen.threads = *count;
      reason = std::move(what);
    }
  };
  // In this order, so that a tie names the wider reason first: the host,
  // then the affinity mask, then the quota, each only when smaller.
  consider(counts.hardware > 0 ? std::optional<int>(counts.hardware) : std::nullopt,
           "the host's CPUs");
  consider(counts.affinity, "the CPUs in the affinity mask");
  consider(counts.quota, absl::StrCat("the cgroup's CPU quota (", counts.quota_source, ")"));
  if (chosen.threads == 0) {
    chosen.threads = 1;
    reason = "no CPU count known";
  }
  std::vector<std::string> figures;
  if (counts.hardware > 0) figures.push_back(absl::StrCat(counts.hardware, " on the host"));
  if (counts.affinity) figures.push_back(absl::StrCat(*counts.affinity, " in the affinity mask"));
  if (counts.quota) {
    figures.push_back(
        absl::StrCat(*counts.quota, " by the cgroup quota (", counts.quota_source, ")"));
    if (!counts.quota_problem.empty()) {
      figures.push_back(absl::StrCat("ignored: ", counts.quota_problem));
    }
  } else if (!counts.quota_problem.empty()) {
    figures.push_back(absl::StrCat("cgroup quota unknown: ", counts.quota_problem));
  } else if (!counts.quota_none.empty()) {
    figures.push_back(absl::StrCat("no cgroup CPU quota (", counts.quota_none, ")"));
  } else {
    figures.push_back("no cgroup CPU quota");
  }
  chosen.why = absl::StrCat(reason, "; CPUs: ", absl::StrJoin(figures, ", "));
  return chosen;
}

CpuCounts ReadCpuCounts() {
  CpuCounts counts;
  counts.hardware = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) counts.affinity = CPU_COUNT(&mask);
  CgroupQuota quota = ReadOwnCgroupQuota();
  counts.quota = quota.cpus;
  counts.quota_source = std::move(quota.source);
  counts.quota_problem = std::move(quota.problem);
  counts.quota_none = std::move(quota.none);
  return counts;
}

CpuThreads DefaultCpuThreads() { return ChooseCpuThreads(ReadCpuCounts()); }

}  // namespace drt::cpu
