// The start-up checks and log line of --bearer_token / DRT_BEARER_TOKEN
// (review-deploy F3): a token no client can send is refused at start, and
// the log says whether authentication is on.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace drt::server {

// OK for a token every client can send in "authorization: Bearer <token>".
// Refused, naming the problem and its byte offset: leading or trailing
// whitespace (the newline `kubectl create secret --from-file` keeps from
// `echo $T > f`), a control character, or a byte outside printable ASCII
// (gRPC metadata and HTTP header values cannot carry them, so every call
// would get UNAUTHENTICATED). It is not trimmed: a silently changed secret
// would differ from what the clients were given. With `required`
// (--require_bearer_token) an empty token is refused too; without it an
// empty token turns authentication off.
absl::Status CheckBearerToken(std::string_view token, bool required);

// One line for the start-up log: "authentication: bearer token required
// (N bytes)", or a WARNING that every call is accepted. Never the token.
std::string BearerTokenLogLine(std::string_view token);

}  // namespace drt::server
