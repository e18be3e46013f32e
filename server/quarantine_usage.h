// What DIR/quarantine/ holds (docs/state_format.md, "Start-up"): the
// sessions a --state_dir start-up refused (damaged, of another model or
// engine state version, or whose restore failed), one directory each.
// Nothing deletes them; drt-server reports them at start-up and on /metrics
// so that an operator sees what they keep on the volume (docs/deploy.md).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace drt::server {

struct QuarantineUsage {
  int64_t sessions = 0;  // directories in DIR/quarantine/
  // Bytes of the files under them, each file once however many names it has
  // there (hard links); a chunk log a restored session still uses in
  // DIR/chunks/ is counted too, though it takes no space of its own.
  int64_t bytes = 0;
};

// DIR/quarantine/'s usage; a missing DIR/quarantine/ is empty. An error
// names the path it could not read.
absl::StatusOr<QuarantineUsage> ReadQuarantineUsage(const std::string& state_dir);

// drt_quarantined_sessions and drt_quarantined_bytes (gauges) in Prometheus
// text, for /metrics.
std::string RenderQuarantineMetrics(const QuarantineUsage& usage);

}  // namespace drt::server
