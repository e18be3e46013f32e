// Scheduler test helpers: a claimed session, as a handler holds it while its
// work runs, and a prefill work item.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/scheduler.h"
#include "server/session_manager.h"

namespace drt::server::testing {

// A new session of the manager, claimed for `activity` (the caller's
// activity, as a handler has); throws when either fails.
inline std::shared_ptr<SessionEntry> NewEntry(SessionManager& manager,
                                              Activity activity = Activity::kAppending) {
  auto created = manager.Create({});
  if (!created.ok()) throw std::runtime_error(std::string(created.status().message()));
  if (absl::Status s = (*created)->Begin(activity); !s.ok()) {
    throw std::runtime_error(std::string(s.message()));
  }
  return *created;
}

// "Append these tokens to this session" as one prefill item.
inline WorkItem Prefill(SessionEntry& entry, const std::vector<int32_t>& tokens) {
  WorkItem item;
  item.entry = &entry;
  item.tokens = tokens;
  item.kind = WorkKind::kPrefill;
  return item;
}

}  // namespace drt::server::testing
