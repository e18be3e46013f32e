// How far the --state_dir restore at start-up has come, written by
// StateStore::RestoreAll (its start-up thread) and read by the HTTP
// endpoint, which serves while the restore runs (review-deploy F5): /metrics
// shows it, and /livez fails when it stops moving.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace drt::server {

class RestoreProgress {
 public:
  // RestoreAll: the restore begins, and ends (also when it fails).
  void Begin();
  void End();
  // The chunk log bytes to check (each record's length and CRC-32C), and
  // those checked so far.
  void AddBytesToCheck(int64_t bytes) { bytes_to_check_.fetch_add(bytes); }
  void AddBytesChecked(int64_t bytes);
  // The sessions to restore (whole ones; set again once the damaged ones
  // are known), and those restored so far.
  void SetSessionsToRestore(int64_t sessions) { sessions_to_restore_.store(sessions); }
  void AddSessionRestored();
  // Any other step of the restore that moved on (a state file read, a chunk
  // read into memory).
  void Touch();

  bool running() const { return running_.load(); }
  int64_t bytes_to_check() const { return bytes_to_check_.load(); }
  int64_t bytes_checked() const { return bytes_checked_.load(); }
  int64_t sessions_to_restore() const { return sessions_to_restore_.load(); }
  int64_t sessions_restored() const { return sessions_restored_.load(); }
  std::chrono::steady_clock::time_point last_progress() const;

 private:
  std::atomic<bool> running_{false};
  std::atomic<int64_t> bytes_to_check_{0};
  std::atomic<int64_t> bytes_checked_{0};
  std::atomic<int64_t> sessions_to_restore_{0};
  std::atomic<int64_t> sessions_restored_{0};
  // steady_clock's count at the last step that moved on.
  std::atomic<int64_t> last_progress_{0};
};

// The restore's figures in Prometheus text (drt_restore_running,
// drt_restore_log_bytes_checked, drt_restore_log_bytes_to_check,
// drt_restore_sessions_restored, drt_restore_sessions_to_restore), for
// /metrics: the last restore's totals once it ended, zeros without one.
std::string RenderRestoreMetrics(const RestoreProgress& progress);

// /livez during the restore: OK while it moves on, UNAVAILABLE once no step
// moved on for longer than `limit` (--engine_stall_seconds: a hung volume);
// OK when no restore runs. A limit of zero or less: always OK.
absl::Status RestoreLiveness(const RestoreProgress& progress,
                             std::chrono::steady_clock::time_point now,
                             std::chrono::milliseconds limit);

}  // namespace drt::server
