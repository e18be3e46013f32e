// The CPU quota of this process's cgroup, found the way the kernel applies
// it: through /proc/self/cgroup, not only at the cgroup mount's root. The
// root is the process's own cgroup only in a private cgroup namespace (the
// Docker default on cgroup v2) or a v1 bind mount; a systemd service with
// CPUQuota= (`0::/system.slice/drt.service`), `docker run --cgroupns=host`
// or `systemd-run -p CPUQuota=400%` sit below it, and on cgroup v2 a
// parent's cpu.max limits every cgroup under it (review-startsig #1).
#pragma once

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace drt::cpu {

struct CgroupQuota {
  std::optional<int> cpus;  // CPUs the quota allows, rounded up, when there is one
  std::string source;       // where it came from ("cgroup v2 cpu.max 400000 100000 at DIR")
  std::string problem;      // a malformed quota file met on the way, if any
  std::string none;         // when there is no quota, why: "max" seen, or no file found
};

// `proc_self_cgroup` is /proc/self/cgroup's text ("ID:CONTROLLERS:PATH"
// lines); `cgroup_root` is where the cgroup file systems are mounted
// (/sys/fs/cgroup; a test passes a directory of its own). Files are read
// under cgroup_root only.
//  - cgroup v2 (the `0::PATH` line): the smallest quota in cpu.max of
//    cgroup_root/PATH and of each directory above it up to cgroup_root.
//    Missing files are skipped (the root cgroup has none; a level without
//    the cpu controller neither). "max" is no quota at that level.
//  - cgroup v1, when no v2 cpu.max is found (hybrid hosts keep the cpu
//    controller on v1): cpu.cfs_quota_us / cpu.cfs_period_us in
//    cgroup_root/cpu/PATH of the line whose controllers hold `cpu` if that
//    directory has them, else in cgroup_root/cpu (Docker on v1 shows
//    /docker/<id> there but bind-mounts that directory at cgroup_root/cpu).
// A PATH without a leading '/' or with a ".." component (a cgroup outside
// this process's cgroup namespace) is read as "/", the mount's root; so is
// a missing line, so that empty text reads the roots only.
CgroupQuota ReadCgroupQuota(absl::string_view proc_self_cgroup, const std::string& cgroup_root);

// ReadCgroupQuota(/proc/self/cgroup's text, or "" if unreadable,
// "/sys/fs/cgroup").
CgroupQuota ReadOwnCgroupQuota();

}  // namespace drt::cpu
