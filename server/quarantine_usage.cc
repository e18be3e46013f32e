#include "server/quarantine_usage.h"

#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace drt::server {

namespace fs = std::filesystem;

absl::StatusOr<QuarantineUsage> ReadQuarantineUsage(const std::string& state_dir) {
  QuarantineUsage usage;
  const std::string dir = state_dir + "/quarantine";
  std::error_code ec;
  if (!fs::exists(dir, ec)) return usage;
  std::set<std::pair<dev_t, ino_t>> seen;
  for (const auto& session : fs::directory_iterator(dir, ec)) {
    if (!session.is_directory(ec)) continue;
    ++usage.sessions;
    std::error_code inner;
    for (const auto& file : fs::directory_iterator(session.path(), inner)) {
      struct stat st {};
      if (::lstat(file.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (seen.insert({st.st_dev, st.st_ino}).second) usage.bytes += st.st_size;
    }
    if (inner) {
      return absl::InternalError(
          absl::StrFormat("cannot list %s: %s", session.path().string(), inner.message()));
    }
  }
  if (ec) return absl::InternalError(absl::StrFormat("cannot list %s: %s", dir, ec.message()));
  return usage;
}

std::string RenderQuarantineMetrics(const QuarantineUsage& usage) {
  return absl::StrCat(
      "# HELP drt_quarantined_sessions sessions a --state_dir start-up refused and moved to "
      "DIR/quarantine/ (nothing deletes them)\n# TYPE drt_quarantined_sessions gauge\n"
      "drt_quarantined_sessions ",
      usage.sessions,
      "\n# HELP drt_quarantined_bytes bytes of the files in DIR/quarantine/ (each once)\n"
      "# TYPE drt_quarantined_bytes gauge\ndrt_quarantined_bytes ",
      usage.bytes, "\n");
}

}  // namespace drt::server
