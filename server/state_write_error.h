// The status a call gets when its durable session's state could not be
// written to --state_dir (docs/api.md, "Errors"): one rule for the Append
// path (a step's write) and the Generate path (the write at its end).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace drt::server {

// INTERNAL, whatever the cause's code (a full disk's RESOURCE_EXHAUSTED, a
// read-only one's PERMISSION_DENIED, a missing directory's NOT_FOUND: those
// codes mean "wait", "the caller may not" and "no such session" to clients,
// and none is the client's doing). The message names the session, says
// the cause (which names the path), that the tokens are in its memory
// (`tokens_in_memory`, this call's included) and that `tokens_durable` of
// them were on disk when the write failed (what a restart restores unless a
// later write succeeds; negative: none written yet), so that a client
// checks GetSession before it sends them again. (An Append's end retries
// the write, which may succeed before the client reads this.)
absl::Status StateWriteError(std::string_view session_id, const absl::Status& cause,
                             int64_t tokens_in_memory, int64_t tokens_durable);

}  // namespace drt::server
