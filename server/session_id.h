// Session ids as clients send them back: a length limit (ids the server
// makes are 26 bytes, "s-" and 24 hex digits) so that a huge id is refused
// instead of echoed into a status message (whose metadata gRPC caps at
// 8 KiB, turning the answer into RESOURCE_EXHAUSTED), ids printed escaped,
// and the NOT_FOUND message.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace drt::server {

// Documented in docs/api.md ("Sessions").
inline constexpr size_t kMaxSessionIdBytes = 128;

// INVALID_ARGUMENT for an id longer than kMaxSessionIdBytes, giving its
// length but not the id, and for an empty one ("session_id is required"):
// no session has it, and NOT_FOUND would send the client looking for a
// deleted or expired session.
absl::Status CheckSessionIdLength(absl::string_view id);

// The id as messages show it: control and non-ASCII bytes C-escaped.
std::string PrintableId(absl::string_view id);

// NOT_FOUND for `id`. Without a state directory (`state_dir` empty):
// deleted, expired, or made before this server (started at `server_start`)
// was restarted, since sessions live in memory only. With one, sessions
// survive a restart, so the causes named are deleted, expired, or refused at
// start-up (named in the server's log, files in `state_dir`/quarantine/).
absl::Status SessionNotFound(absl::string_view id, absl::Time server_start,
                             absl::string_view state_dir = "");

}  // namespace drt::server
