#include "server/host_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace drt::server {
namespace {

// cgroup v1 reports "no limit" as LONG_MAX rounded down to a page; any
// figure this large means the same.
constexpr int64_t kNoLimitAbove = int64_t{1} << 62;

std::optional<std::string> ReadSmallFile(const char* path) {
  std::ifstream file(path);
  if (!file) return std::nullopt;
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::optional<int64_t> ReadCgroupFile(const char* path) {
  std::optional<std::string> text = ReadSmallFile(path);
  if (!text) return std::nullopt;
  return ParseCgroupBytes(*text);
}

}  // namespace

int64_t UsableBytes(const MemorySnapshot& memory) {
  int64_t usable = memory.available_bytes;
  if (memory.cgroup_limit_bytes) {
    const int64_t left = *memory.cgroup_limit_bytes - memory.cgroup_usage_bytes.value_or(0);
    usable = std::min(usable, left);
  }
  return std::max<int64_t>(usable, 0);
}

int64_t DefaultHostBudgetBytes(const MemorySnapshot& memory) {
  // Divide first: no overflow for any int64 figure.
  const int64_t usable = UsableBytes(memory);
  return usable / kHostBudgetDenominator * kHostBudgetNumerator +
         usable % kHostBudgetDenominator * kHostBudgetNumerator / kHostBudgetDenominator;
}

absl::StatusOr<HostBudget> ChooseHostBudget(int64_t flag_bytes,
                                            const absl::StatusOr<MemorySnapshot>& memory) {
  const auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (int64_t{1} << 30); };
  HostBudget budget;
  if (flag_bytes == 0) {
    if (!memory.ok()) {
      return absl::Status(memory.status().code(), absl::StrCat(memory.status().message(),
                                                               "; set --host_memory_budget_gb"));
    }
    budget.bytes = DefaultHostBudgetBytes(*memory);
    budget.log_lines.push_back(absl::StrFormat(
        "host memory budget %.1f GiB (%d/%d of %.1f GiB usable after loading the model; "
        "--host_memory_budget_gb sets it)",
        gib(budget.bytes), kHostBudgetNumerator, kHostBudgetDenominator, gib(UsableBytes(*memory))));
    return budget;
  }
  budget.bytes = flag_bytes;
  if (!memory.ok()) {
    budget.log_lines.push_back(absl::StrFormat(
        "host memory budget %.1f GiB (--host_memory_budget_gb; not checked against the "
        "memory usable: %s)",
        gib(flag_bytes), memory.status().message()));
    return budget;
  }
  const int64_t usable = UsableBytes(*memory);
  budget.log_lines.push_back(absl::StrFormat(
      "host memory budget %.1f GiB (--host_memory_budget_gb; %.1f GiB usable after loading "
      "the model)",
      gib(flag_bytes), gib(usable)));
  if (flag_bytes > usable) {
    const bool cgroup = memory->cgroup_limit_bytes.has_value() &&
                        *memory->cgroup_limit_bytes - memory->cgroup_usage_bytes.value_or(0) <
                            memory->available_bytes;
    budget.log_lines.push_back(absl::StrFormat(
        "WARNING: --host_memory_budget_gb (%.1f GiB) is more than the %.1f GiB %s offers after "
        "loading the model: sessions may grow until the kernel kills the process (out of "
        "memory) instead of being refused with RESOURCE_EXHAUSTED",
        gib(flag_bytes), gib(usable),
        cgroup ? "this process's memory cgroup (its limit less its usage)"
               : "this machine (MemAvailable)"));
  }
  return budget;
}

absl::StatusOr<int64_t> ParseMemAvailable(absl::string_view meminfo) {
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    line = absl::StripAsciiWhitespace(line);
    const bool kib = absl::ConsumeSuffix(&line, "kB");
    line = absl::StripAsciiWhitespace(line);
    int64_t value = 0;
    if (!absl::SimpleAtoi(line, &value) || value < 0) {
      return absl::InternalError("/proc/meminfo: unreadable MemAvailable line");
    }
    return kib ? value * 1024 : value;
  }
  return absl::InternalError("/proc/meminfo has no MemAvailable line");
}

std::optional<int64_t> ParseCgroupBytes(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  int64_t value = 0;
  if (text == "max" || !absl::SimpleAtoi(text, &value) || value < 0 || value >= kNoLimitAbove) {
    return std::nullopt;
  }
  return value;
}

absl::StatusOr<MemorySnapshot> ReadMemorySnapshot() {
  std::optional<std::string> meminfo = ReadSmallFile("/proc/meminfo");
  if (!meminfo) return absl::UnavailableError("cannot read /proc/meminfo");
  absl::StatusOr<int64_t> available = ParseMemAvailable(*meminfo);
  if (!available.ok()) return available.status();
  MemorySnapshot snapshot;
  snapshot.available_bytes = *available;
  snapshot.cgroup_limit_bytes = ReadCgroupFile("/sys/fs/cgroup/memory.max");
  if (snapshot.cgroup_limit_bytes) {
    snapshot.cgroup_usage_bytes = ReadCgroupFile("/sys/fs/cgroup/memory.current");
  } else {
    snapshot.cgroup_limit_bytes = ReadCgroupFile("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    if (snapshot.cgroup_limit_bytes) {
      snapshot.cgroup_usage_bytes = ReadCgroupFile("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    }
  }
  return snapshot;
}

}  // namespace drt::server
