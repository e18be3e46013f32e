// The status work ends with when the server stops: the end of a drain's
// grace period (DrtService::StopRunningCalls, through Scheduler::Refuse) or
// the scheduler going away. It is UNAVAILABLE, as any other "try again
// later" is, and carries a payload that says it came from the stop, so that
// a handler can tell it from an UNAVAILABLE of any other origin (a Generate
// cut by the stop is not written; one that failed otherwise is:
// DrtService::Generate).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace drt::server {

inline constexpr absl::string_view kServerStoppingPayload = "type.drt.dev/drt.server.Stopping";

inline absl::Status ServerStoppingError(absl::string_view message) {
  absl::Status status = absl::UnavailableError(message);
  status.SetPayload(kServerStoppingPayload, absl::Cord("stopping"));
  return status;
}

// Whether `status` is ServerStoppingError's (a copy of it: the payload
// travels with the status).
inline bool IsServerStopping(const absl::Status& status) {
  return absl::IsUnavailable(status) && status.GetPayload(kServerStoppingPayload).has_value();
}

}  // namespace drt::server
