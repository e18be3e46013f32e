#include "engine/cpu/cgroup_quota.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/cpu/cpu_threads.h"

namespace drt::cpu {
namespace {

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The cgroup paths of the v2 line and of the v1 line whose controllers hold
// `cpu`; "/" where there is no such line.
struct OwnCgroups {
  std::string v2 = "/";
  std::string v1_cpu = "/";
};

OwnCgroups ParseProcSelfCgroup(absl::string_view text) {
  OwnCgroups own;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    // ID:CONTROLLERS:PATH; PATH may itself hold ':'.
    const std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    const std::string path(absl::StripTrailingAsciiWhitespace(f[2]));
    if (f[0] == "0" && f[1].empty()) {
      own.v2 = path;
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(f[1], ',')) {
      if (controller == "cpu") own.v1_cpu = path;
    }
  }
  return own;
}

// The directory names of a cgroup path below the mount's root; empty (the
// root itself) for "/" and for a path that leaves this namespace's view.
std::vector<std::string> Components(const std::string& path) {
  if (path.empty() || path[0] != '/') return {};
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    if (part == "..") return {};
    parts.emplace_back(part);
  }
  return parts;
}

std::string Dir(const std::string& root, const std::vector<std::string>& parts, size_t depth) {
  std::string dir = root;
  for (size_t i = 0; i < depth; ++i) absl::StrAppend(&dir, "/", parts[i]);
  return dir;
}

// cgroup v2: the smallest cpu.max quota from the cgroup up to the root.
// Returns false when no cpu.max file was found at any level.
bool ReadV2(const std::string& root, const std::string& path, CgroupQuota& out) {
  const std::vector<std::string> parts = Components(path);
  bool found = false;
  std::vector<std::string> max_dirs;
  for (size_t depth = parts.size() + 1; depth-- > 0;) {
    const std::string dir = Dir(root, parts, depth);
    std::optional<std::string> text = ReadSmallFile(dir + "/cpu.max");
    if (!text) continue;
    found = true;
    absl::StatusOr<std::optional<int>> cpus = CpusFromCgroupV2(*text);
    if (!cpus.ok()) {
      if (out.problem.empty()) out.problem = absl::StrCat(cpus.status().message(), " at ", dir);
    } else if (!cpus->has_value()) {
      max_dirs.push_back(dir);
    } else if (!out.cpus || **cpus < *out.cpus) {
      out.cpus = **cpus;
      out.source =
          absl::StrCat("cgroup v2 cpu.max ", absl::StripAsciiWhitespace(*text), " at ", dir);
    }
  }
  if (found && !out.cpus && out.problem.empty()) {
    out.none = absl::StrCat("cgroup v2 cpu.max is max at ", absl::StrJoin(max_dirs, ", "));
  }
  return found;
}

// cgroup v1: the cgroup's own cpu.cfs_* if its directory is visible, else
// the mount's root. Returns the directory whose files were read, or "".
std::string ReadV1(const std::string& root, const std::string& path, CgroupQuota& out) {
  const std::vector<std::string> parts = Components(path);
  for (const std::string& dir : {Dir(root + "/cpu", parts, parts.size()), root + "/cpu"}) {
    std::optional<std::string> quota = ReadSmallFile(dir + "/cpu.cfs_quota_us");
    std::optional<std::string> period = ReadSmallFile(dir + "/cpu.cfs_period_us");
    if (!quota || !period) continue;
    absl::StatusOr<std::optional<int>> cpus = CpusFromCgroupV1(*quota, *period);
    if (!cpus.ok()) {
      out.problem = absl::StrCat(cpus.status().message(), " at ", dir);
    } else if (cpus->has_value()) {
      out.cpus = **cpus;
      out.source =
          absl::StrCat("cgroup v1 cpu.cfs_quota_us ", absl::StripAsciiWhitespace(*quota),
                       " / cpu.cfs_period_us ", absl::StripAsciiWhitespace(*period), " at ", dir);
    } else {
      out.none = absl::StrCat("cgroup v1 cpu.cfs_quota_us is -1 at ", dir);
    }
    return dir;
  }
  return "";
}

}  // namespace

CgroupQuota ReadCgroupQuota(absl::string_view proc_self_cgroup, const std::string& cgroup_root) {
  const OwnCgroups own = ParseProcSelfCgroup(proc_self_cgroup);
  CgroupQuota quota;
  if (ReadV2(cgroup_root, own.v2, quota)) return quota;
  if (!ReadV1(cgroup_root, own.v1_cpu, quota).empty()) return quota;
  const std::vector<std::string> v2 = Components(own.v2);
  const std::vector<std::string> v1 = Components(own.v1_cpu);
  quota.none =
      absl::StrCat("no cpu.max found at ", Dir(cgroup_root, v2, v2.size()),
                   v2.empty() ? "" : " or above", ", no cpu.cfs_quota_us at ",
                   v1.empty() ? "" : absl::StrCat(Dir(cgroup_root + "/cpu", v1, v1.size()), " or "),
                   cgroup_root, "/cpu");
  return quota;
}

CgroupQuota ReadOwnCgroupQuota() {
  return ReadCgroupQuota(ReadSmallFile("/proc/self/cgroup").value_or(""), "/sys/fs/cgroup");
}

}  // namespace drt::cpu
