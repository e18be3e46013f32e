// Every file and directory under a directory, by path relative to it: the
// bytes of each file, "" for each directory (named with a trailing '/').
// Tests compare two snapshots to show that a refusal changed nothing.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace drt::server::testing {

// `skip`: relative paths left out (a state directory's LOCK, whose content is
// the locking process's, not the directory's).
inline std::map<std::string, std::string> DirectorySnapshot(
    const std::string& dir, const std::set<std::string>& skip = {}) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string rel = std::filesystem::relative(entry.path(), dir).string();
    if (skip.contains(rel)) continue;
    if (entry.is_directory()) {
      files[rel + "/"] = "";
      continue;
    }
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    files[rel] = bytes.str();
  }
  return files;
}

}  // namespace drt::server::testing
