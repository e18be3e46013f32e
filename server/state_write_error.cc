#include "server/state_write_error.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace drt::server {

absl::Status StateWriteError(std::string_view session_id, const absl::Status& cause,
                             int64_t tokens_in_memory, int64_t tokens_durable) {
  return absl::InternalError(absl::StrFormat(
      "session %s: its state could not be written to the state directory: %s. The session in "
      "memory holds all its %d tokens (this call's included); %d of them were on disk when "
      "this write failed (a restart restores what is on disk; the next write that succeeds, "
      "also the one the call's end tries, writes the rest), so check the session's tokens "
      "(GetSession) before sending any again",
      session_id, cause.message(), tokens_in_memory, std::max<int64_t>(0, tokens_durable)));
}

}  // namespace drt::server
