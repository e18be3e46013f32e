#include "server/restore_progress.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace drt::server {
namespace {

int64_t Now() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

void AppendGauge(std::string& out, const char* name, const char* help, int64_t value) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n", name, " ",
                  value, "\n");
}

}  // namespace

void RestoreProgress::Begin() {
  last_progress_.store(Now());
  running_.store(true);
}

void RestoreProgress::End() { running_.store(false); }

void RestoreProgress::AddBytesChecked(int64_t bytes) {
  bytes_checked_.fetch_add(bytes);
  Touch();
}

void RestoreProgress::AddSessionRestored() {
  sessions_restored_.fetch_add(1);
  Touch();
}

void RestoreProgress::Touch() { last_progress_.store(Now()); }

std::chrono::steady_clock::time_point RestoreProgress::last_progress() const {
  return std::chrono::steady_clock::time_point(
      std::chrono::steady_clock::duration(last_progress_.load()));
}

std::string RenderRestoreMetrics(const RestoreProgress& progress) {
  std::string out;
  AppendGauge(out, "drt_restore_running",
              "1 while the --state_dir restore at start-up runs (the server does not yet "
              "listen for gRPC), else 0",
              progress.running() ? 1 : 0);
  AppendGauge(out, "drt_restore_log_bytes_checked",
              "chunk log bytes the restore has checked (lengths and CRC-32C) so far",
              progress.bytes_checked());
  AppendGauge(out, "drt_restore_log_bytes_to_check",
              "chunk log bytes the restore checks in all", progress.bytes_to_check());
  AppendGauge(out, "drt_restore_sessions_restored", "sessions the restore has restored so far",
              progress.sessions_restored());
  AppendGauge(out, "drt_restore_sessions_to_restore",
              "sessions the restore restores in all (those whose files are whole)",
              progress.sessions_to_restore());
  return out;
}

absl::Status RestoreLiveness(const RestoreProgress& progress,
                             std::chrono::steady_clock::time_point now,
                             std::chrono::milliseconds limit) {
  if (limit.count() <= 0 || !progress.running()) return absl::OkStatus();
  const auto idle = now - progress.last_progress();
  if (idle <= limit) return absl::OkStatus();
  return absl::UnavailableError(absl::StrFormat(
      "the --state_dir restore made no progress for %d s (%d of %d chunk log bytes checked, %d of "
      "%d sessions restored): a hung volume?",
      std::chrono::duration_cast<std::chrono::seconds>(idle).count(), progress.bytes_checked(),
      progress.bytes_to_check(), progress.sessions_restored(), progress.sessions_to_restore()));
}

}  // namespace drt::server
