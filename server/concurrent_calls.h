// Runs a few independent calls at once, one thread each, and waits for all:
// the scheduler's group commit (server/scheduler.cc), where the durable
// sessions of one engine step that owe a write are written together, so that
// the step costs one write latency (an fdatasync, an atomic rename and a
// directory fsync: milliseconds) rather than one per session.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace drt::server {

// Runs every call and returns their statuses in the same order, once all
// have returned. The first runs on the calling thread, each other one on a
// thread of its own (started here and joined before returning: a thread
// costs tens of microseconds, a write milliseconds). `concurrent` false runs
// them one after another on the calling thread. The calls must not depend
// on one another.
std::vector<absl::Status> RunConcurrently(absl::Span<const std::function<absl::Status()>> calls,
                                          bool concurrent = true);

}  // namespace drt::server
