// The host memory drt-server may give its sessions by default: a stated
// fraction of what the machine (or the process's cgroup) has available when
// the server starts, read after the model is loaded so that the weights are
// not counted twice. --host_memory_budget_gb overrides it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace drt::server {

// The share of the usable memory that sessions may hold. The rest is for
// what the budget does not count: per-step activations, gRPC buffers,
// fragmentation, the page cache, and other processes.
inline constexpr int64_t kHostBudgetNumerator = 3;
inline constexpr int64_t kHostBudgetDenominator = 4;

struct MemorySnapshot {
  int64_t available_bytes = 0;                // MemAvailable of /proc/meminfo
  std::optional<int64_t> cgroup_limit_bytes;  // the memory cgroup's limit, if any
  std::optional<int64_t> cgroup_usage_bytes;  // the cgroup's current usage
};

// What this process can still use: MemAvailable, or less when the cgroup's
// limit minus its usage is smaller. Never negative.
int64_t UsableBytes(const MemorySnapshot& memory);

// kHostBudgetNumerator / kHostBudgetDenominator of UsableBytes, rounded down.
int64_t DefaultHostBudgetBytes(const MemorySnapshot& memory);

// The host budget in force and the start-up lines that say so (main prints
// each after "drt-server: "). `flag_bytes` 0: the default
// (DefaultHostBudgetBytes of `memory`; an error when `memory` could not be
// read). Otherwise --host_memory_budget_gb's value, said with its source,
// and with a WARNING line naming both figures when it is above UsableBytes:
// sessions may then grow until the kernel kills the process instead of
// being refused (RESOURCE_EXHAUSTED). Not an error: over-committing a
// machine can be meant.
struct HostBudget {
  int64_t bytes = 0;
  std::vector<std::string> log_lines;
};
absl::StatusOr<HostBudget> ChooseHostBudget(int64_t flag_bytes,
                                            const absl::StatusOr<MemorySnapshot>& memory);

// The MemAvailable line of /proc/meminfo's text, in bytes.
absl::StatusOr<int64_t> ParseMemAvailable(absl::string_view meminfo);

// A cgroup memory file (memory.max, memory.current, memory.limit_in_bytes,
// memory.usage_in_bytes): the byte count, or nullopt for "max", for the
// value cgroup v1 uses for "no limit" (2^63 rounded down to a page), and for
// anything unreadable.
std::optional<int64_t> ParseCgroupBytes(absl::string_view text);

// Reads /proc/meminfo and the cgroup v2 (/sys/fs/cgroup/memory.{max,current})
// or v1 (/sys/fs/cgroup/memory/memory.{limit,usage}_in_bytes) files as the
// process sees them; the cgroup figures are left empty when absent.
absl::StatusOr<MemorySnapshot> ReadMemorySnapshot();

}  // namespace drt::server
