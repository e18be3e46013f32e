#include "server/session_id.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace drt::server {

absl::Status CheckSessionIdLength(absl::string_view id) {
  if (id.empty()) {
    return absl::InvalidArgumentError(
        "session_id is required (the id CreateSession returned); it is empty");
  }
  if (id.size() <= kMaxSessionIdBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("session ids are at most ", kMaxSessionIdBytes,
                                                 " bytes; this one has ", id.size(),
                                                 " (use the id CreateSession returned)"));
}

std::string PrintableId(absl::string_view id) { return absl::CHexEscape(id); }

absl::Status SessionNotFound(absl::string_view id, absl::Time server_start,
                             absl::string_view state_dir) {
  const std::string started =
      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", server_start, absl::UTCTimeZone());
  if (!state_dir.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no session '", PrintableId(id),
        "': it was deleted, expired after being idle, or was refused when this server started "
        "at ",
        started, " (sessions are kept in the state directory and restored at start-up; one "
        "refused there is named in the server's log and its files are in ",
        state_dir, "/quarantine/)"));
  }
  return absl::NotFoundError(absl::StrCat(
      "no session '", PrintableId(id),
      "': it was deleted, expired after being idle, or was made before a restart (this server "
      "started at ",
      started, "; sessions are held in memory and do not survive a restart)"));
}

}  // namespace drt::server
